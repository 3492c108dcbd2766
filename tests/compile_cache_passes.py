"""Inductor ``CustomGraphPass`` classes whose ``uuid()`` breaks the FX graph cache contract, each with its correct twin,
for ``tests/test_compile_graph_cache.py``. Each bug is one a pass author writes following torch's docstring.

Every pass turns ``aten.relu`` into ``aten.clamp_min(x, floor)`` in the post-grad graph: a "leaky floor" that
changes the output wherever ``x < floor``, so two instances with different floors compute different results.
The module-level functions are the specs ``check_graph_cache`` takes (``tests.compile_cache_passes:NAME``).
"""

from __future__ import annotations

import hashlib
import inspect

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

FLOORS = (0.0, 0.5)


def floor_relu(graph: torch.fx.Graph, floor: float) -> None:
    """Rewrite every ``aten.relu.default`` of ``graph`` into ``aten.clamp_min.default(x, floor)``."""
    for node in graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.relu.default:
            node.target = torch.ops.aten.clamp_min.default
            node.args = (node.args[0], floor)


class FileHashFloor(CustomGraphPass):
    """BUG (the cache probe of compile-passes.md 1.4): ``uuid()`` follows torch's recommended recipe, the hash of
    this file, and so misses the constructor's ``floor``: an instance with another floor hits the first's entry."""

    def __init__(self, floor: float) -> None:
        self.floor = floor

    def __call__(self, graph: torch.fx.Graph) -> None:
        floor_relu(graph, self.floor)

    def uuid(self) -> bytes:
        return get_hash_for_files((__file__,))


class KeyedFloor(FileHashFloor):
    """The correct twin: the file's hash and the state the pass reads."""

    def uuid(self) -> tuple[bytes, float]:
        return get_hash_for_files((__file__,)), self.floor


class NoUuidFloor(FileHashFloor):
    """``uuid()`` returns None, torch's documented opt-out: Inductor bypasses the FX graph cache for every graph."""

    def uuid(self) -> None:
        return None


class HasherFloor(FileHashFloor):
    """BUG: returns the hash *object*, ``.hexdigest()`` forgotten; a ``_hashlib.HASH`` does not pickle, so Inductor
    fails to pickle its cache key and bypasses the cache, with only a logged warning."""

    def uuid(self) -> object:
        return hashlib.sha256(repr(self.floor).encode())


class BuiltinHashFloor(FileHashFloor):
    """BUG: ``hash()`` of the class's source and state: a str hash differs with each process's ``PYTHONHASHSEED``,
    so no process ever reads an entry another process wrote (results stay right; every compile is a cold one)."""

    def uuid(self) -> int:
        return hash(inspect.getsource(type(self)) + repr(self.floor))


def stale_floors() -> list[FileHashFloor]:
    return [FileHashFloor(f) for f in FLOORS]


def keyed_floors() -> list[KeyedFloor]:
    return [KeyedFloor(f) for f in FLOORS]


def unstable_floors() -> list[BuiltinHashFloor]:
    return [BuiltinHashFloor(f) for f in FLOORS]


NO_UUID_FLOORS = [NoUuidFloor(f) for f in FLOORS]
HASHER_FLOORS = [HasherFloor(f) for f in FLOORS]
