"""The original's reference outputs, kept between transforms and runs.

What the untransformed trace of a model computes depends on the model, its seed, the input
configuration, the dtype, the capture and the libraries, never on the transform, so a run
verifying several transforms, and the next run, need not compute it again. A
:class:`ReferenceStore` keeps such outputs as files named by a hash of everything they depend on:

- the corpus entry (every field), the seed, the input configuration, the dtype, the mode and the
  capture;
- the versions of Python, torch, torchvision and timm, the CPU's model and instruction-set flags,
  the variables that cap the kernels torch, oneDNN and MKL pick (``ATEN_CPU_CAPABILITY``,
  ``ONEDNN_MAX_CPU_ISA``, ``MKL_ENABLE_INSTRUCTIONS``) and torch's thread count (float32 kernels,
  and so their rounding, change with each), and torch's global numerics settings (default dtype,
  float32 matmul precision, oneDNN, deterministic algorithms, timm's and torch's fused-attention
  switches);
- the source of fxverify and of its shipped corpus modules (state randomisation, input making, the
  edge-case modules).

Only shipped catalogue entries, unchanged and captured by fxverify's own symbolic tracing with a
plain or timm tracer, are kept: a user's factory, tracer or capture may depend on code no hash here
covers. What the key leaves out is what no one is expected to change between two runs on one
machine (a library patched in place, say); ``--cache-clear`` empties the store, and the plugin keeps
it in pytest's cache directory (``--fxverify-reference-cache off`` leaves it unused).

>>> import tempfile, torch
>>> from fxverify.cases.case import load_case
>>> from fxverify.capture.symbolic import SymbolicTrace
>>> store = ReferenceStore(tempfile.mkdtemp())
>>> case = load_case("edge_conv_bn_head")
>>> key = store.key(case, SymbolicTrace(), case.configs[0], None, "eval")
>>> store.load(key) is None
True
>>> store.save(key, (torch.ones(2),))
True
>>> store.load(key)
(tensor([1., 1.]),)
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from fxverify.analysis.cpu_kernels import cpu_capability
from fxverify.capture import Capture
from fxverify.capture.symbolic import SymbolicTrace
from fxverify.cases.case import ModelCase
from fxverify.cases.catalogue import TRACERS, catalogue
from fxverify.cases.inputs import InputConfig
from fxverify.core.contracts import Mode

REFERENCES_DIR = "fxverify-references"  # the store's folder in pytest's cache directory
MAX_BYTES = 64 * 2**20  # larger outputs are computed each time


class ReferenceStore:
    """Reference outputs in ``directory``, one file per key (see the module's docstring)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def key(self, case: ModelCase, capture: Capture, config: InputConfig, dtype: torch.dtype | None, mode: Mode,
            *, threads: int | None = None) -> str | None:
        """The name of the outputs of ``case`` captured by ``capture``, on ``config`` in ``dtype`` and
        ``mode``, with torch on ``threads`` threads (default: as now); None when they are not to be
        kept: anything but a shipped catalogue entry, as shipped, captured by fxverify's own
        symbolic tracing with a plain or timm tracer (a user's model, tracer or capture may depend on
        code the key does not cover)."""
        if not _shipped(case, capture):
            return None
        parts = (_environment(), _settings(), repr(case.entry), str(case.seed), repr(config), str(dtype), mode,
                 repr(capture), str(threads or torch.get_num_threads()))
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def load(self, key: str | None) -> Any:
        """The outputs kept under ``key``, or None when there are none (or they cannot be read)."""
        path = self._path(key)
        if path is None or not path.exists():
            return None
        try:
            return torch.load(path, weights_only=True)
        except Exception:  # a truncated or foreign file: forget it, the outputs are computed again
            path.unlink(missing_ok=True)
            return None

    def save(self, key: str | None, outputs: Any) -> bool:
        """Keep ``outputs`` under ``key`` if they are plain (tensors, numbers and strings in tuples, lists
        and dicts, as they load back) and small enough; returns whether they were kept. Written to a
        temporary file and renamed, so that a reader in another process sees all of it or nothing."""
        path = self._path(key)
        if path is None or not _plain(outputs) or _bytes(outputs) > MAX_BYTES:
            return False
        temporary = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(handle, "wb") as file:
                torch.save(outputs, file)
            os.replace(temporary, path)
        except Exception:  # a full or read-only disk (torch reports some as RuntimeError): the run goes on
            if temporary is not None:
                Path(temporary).unlink(missing_ok=True)
            return False
        return True

    def _path(self, key: str | None) -> Path | None:
        return None if key is None else self.directory / f"{key}.pt"


def _shipped(case: ModelCase, capture: Capture) -> bool:
    """Whether ``case`` is a shipped catalogue entry, unchanged, captured by fxverify's symbolic tracing."""
    return (type(case) is ModelCase and case.entry in catalogue()
            and type(capture) is SymbolicTrace and capture.tracer in TRACERS)


def _settings() -> str:
    """torch's global numerics settings now (they may change during a run)."""
    return "\n".join([str(torch.get_default_dtype()), torch.get_float32_matmul_precision(),
                      str(torch.backends.mkldnn.enabled), str(torch.are_deterministic_algorithms_enabled()),
                      os.environ.get("TIMM_FUSED_ATTN", ""), os.environ.get("TORCH_FUSED_ATTN", "")])


@functools.cache
def _environment() -> str:
    """Everything a reference depends on beyond its own entry and configuration (see the module's docstring)."""
    versions = []
    for package in ("torch", "torchvision", "timm"):
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{package} absent")
    digest = hashlib.sha256()
    corpus = Path(str(resources.files("fxverify.corpus")))  # the shipped edge-case and layer modules
    for root in (Path(__file__).resolve().parents[1], corpus):
        for source in sorted(root.rglob("*.py")):
            digest.update(str(source.relative_to(root)).encode() + b"\0" + source.read_bytes())
    return "\n".join([sys.version, platform.machine(), _processor(), cpu_capability(), *versions, digest.hexdigest()])


def _processor() -> str:
    """The CPU's model and instruction-set flags (another CPU may pick other float32 kernels)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = ("model name", "flags", "Features", "CPU implementer", "CPU part")
    return "\n".join(sorted({line for line in lines if line.split(":")[0].strip() in wanted}))


def _plain(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return type(value) is torch.Tensor and value.layout == torch.strided and value.device.type == "cpu"
    if value is None or type(value) in (bool, int, float, str):
        return True
    if type(value) in (tuple, list):
        return all(_plain(v) for v in value)
    if type(value) is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())
    return False


def _bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):  # torch.save writes a view's whole storage
        return value.untyped_storage().nbytes()
    if isinstance(value, (tuple, list)):
        return sum(_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_bytes(v) for v in value.values())
    return 0
