"""Giving memory back between models.

A model's items keep its traces, results and float64 copies; once the next model starts they are
garbage. Two things keep that memory from the operating system: GraphModules hold reference
cycles (only the cycle collector frees them), and glibc's malloc keeps freed heap pages for later
allocations. Parameter tensors of a few MiB fall under its adaptive mmap threshold, so a worker
that once held ViT-B/32 in float64 stays at several GiB through every later model unless the
heap is trimmed (``malloc_trim``; the figures are in docs/performance.md, "Memory").

Within a model, the fresh traces a check makes and drops are garbage in cycles too, alive until
Python's cycle collector runs, so the checks that make whole copies of a large model collect
(:meth:`fxverify.engine.subject.Subject.collect_garbage`). A collection examines every tracked
object, torch's and timm's included; after :func:`release_memory` has frozen the survivors
(``gc.freeze``) it examines only what was made since, a fraction of the time.

>>> release_memory() in (True, False)
True
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def trim_heap() -> bool:
    """Return freed heap pages to the operating system where the C library can (glibc's
    ``malloc_trim``); whether it could."""
    libc = _libc()
    if libc is None:  # not glibc (macOS, musl)
        return False
    libc.malloc_trim(0)
    return True


def release_memory() -> bool:
    """Between models: collect reference cycles, freeze what survives (it lives as long as the run:
    later collections skip it), and return freed heap pages to the operating system where the C
    library can (glibc's ``malloc_trim``). Returns whether the heap was trimmed."""
    gc.collect()
    gc.freeze()
    return trim_heap()
