"""Inductor ``CustomGraphPass`` classes whose ``uuid()`` breaks the FX graph cache contract, each with its correct twin,
for ``tests/test_compile_graph_cache.py``. Each bug is one a pass author writes following torch's docstring.

The floor passes turn ``aten.relu`` into ``aten.clamp_min(x, floor)`` in the post-grad graph: a "leaky floor" that
changes the output wherever ``x < floor``, so two instances with different floors compute different results. The
matmul passes run each ``aten.mm`` / ``aten.addmm`` in a lower precision chosen when the pass is made (bfloat16 or
float16), as mixed-precision passes do; they change nothing on the default ``relu(x) * 2 + x``, and act on
:func:`mlp`, a small user model with matmuls given as ``check_graph_cache`` takes a factory.
The module-level functions are the specs ``check_graph_cache`` takes (``tests.compile_cache_passes:NAME``).
"""

from __future__ import annotations

import hashlib
import inspect

import torch
from torch import nn
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


class LabelledFloor(KeyedFloor):
    """Correct: a label for its logs, which changes nothing the pass does, is left out of ``uuid()``."""

    def __init__(self, floor: float, label: str) -> None:
        super().__init__(floor)
        self.label = label


def stale_floors() -> list[FileHashFloor]:
    return [FileHashFloor(f) for f in FLOORS]


def keyed_floors() -> list[KeyedFloor]:
    return [KeyedFloor(f) for f in FLOORS]


def unstable_floors() -> list[BuiltinHashFloor]:
    return [BuiltinHashFloor(f) for f in FLOORS]


NO_UUID_FLOORS = [NoUuidFloor(f) for f in FLOORS]
HASHER_FLOORS = [HasherFloor(f) for f in FLOORS]


MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
PRECISIONS = (torch.bfloat16, torch.float16)


def matmuls_in(graph: torch.fx.Graph, dtype: torch.dtype) -> None:
    """Run every ``aten.mm`` / ``aten.addmm`` of ``graph`` in ``dtype``: its tensor operands cast to ``dtype``, its
    result cast back, each new node's ``meta['val']`` set as Inductor's own passes leave it."""
    cast = torch.ops.prims.convert_element_type.default
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in MATMULS:
            continue
        result = node.meta["val"]
        with graph.inserting_before(node):
            args = []
            for arg in node.args:
                if isinstance(arg, torch.fx.Node):
                    arg = graph.call_function(cast, (arg, dtype))
                    arg.meta["val"] = arg.args[0].meta["val"].to(dtype)
                args.append(arg)
        node.args, node.meta["val"] = tuple(args), result.to(dtype)
        with graph.inserting_after(node):
            back = graph.call_function(cast, (node, result.dtype))
        back.meta["val"] = result
        node.replace_all_uses_with(back, delete_user_cb=lambda user, back=back: user is not back)


class MatmulPrecision(CustomGraphPass):
    """BUG: the precision its matmuls run in is a constructor argument, and ``uuid()`` is torch's recommended recipe,
    the hash of this file: an instance choosing float16 is served the graph compiled for one choosing bfloat16."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __call__(self, graph: torch.fx.Graph) -> None:
        matmuls_in(graph, self.dtype)

    def uuid(self) -> bytes:
        return get_hash_for_files((__file__,))


class KeyedMatmulPrecision(MatmulPrecision):
    """The correct twin: the file's hash and the precision."""

    def uuid(self) -> tuple[bytes, torch.dtype]:
        return get_hash_for_files((__file__,)), self.dtype


def stale_matmuls() -> list[MatmulPrecision]:
    return [MatmulPrecision(d) for d in PRECISIONS]


def keyed_matmuls() -> list[KeyedMatmulPrecision]:
    return [KeyedMatmulPrecision(d) for d in PRECISIONS]


class MLP(nn.Module):
    """Two linear layers around a GELU (``aten.addmm`` twice in the post-grad graph), with its example inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.gelu(self.up(x)))

    def example_inputs(self) -> tuple[torch.Tensor]:
        return (torch.randn(4, 16),)


def mlp() -> tuple[MLP, tuple[torch.Tensor]]:
    """The factory form: ``(module, inputs)``."""
    model = MLP()
    return model, model.example_inputs()
