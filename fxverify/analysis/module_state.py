"""Module state helpers shared by the checks: resolving a dotted target,
comparing tensors, and snapshots that show what a transform changed.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import fx, nn

from fxverify.analysis.graph_text import canonical_text


def resolve(module: nn.Module, target: str) -> Any:
    """The attribute at dotted ``target`` of ``module``; AttributeError names the missing atom."""
    obj: Any = module
    for i, atom in enumerate(target.split(".")):
        if not hasattr(obj, atom):
            seen = ".".join(target.split(".")[:i]) or "the root module"
            raise AttributeError(f"{seen} has no attribute {atom!r}")
        obj = getattr(obj, atom)
    return obj


def tensors_equal(a: Any, b: Any) -> bool:
    """Same shape, dtype, layout and values (NaNs equal), for any kind of tensor (mkldnn,
    sparse and quantized ones are compared by their values).

    >>> w = torch.randn(2, 2)
    >>> tensors_equal(w, w.clone()), tensors_equal(w.to_mkldnn(), w.to_mkldnn()), tensors_equal(w, w.to_mkldnn())
    (True, True, False)
    """
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor) and bool(a == b)
    if a.shape != b.shape or a.dtype != b.dtype or a.layout != b.layout or a.device.type != b.device.type:
        return False
    if a.device.type == "meta":
        return True  # no values to compare
    a, b = strided(a.detach().cpu()), strided(b.detach().cpu())
    return torch.equal(a, b) or bool(a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                     and torch.equal(a.nan_to_num(), b.nan_to_num()))


def strided(t: torch.Tensor) -> torch.Tensor:
    """A plain dense tensor holding ``t``'s values: mkldnn and sparse tensors made dense, quantized
    ones dequantized (what ``torch.equal`` and the comparisons can read)."""
    if t.is_quantized:
        return t.dequantize()
    if t.layout != torch.strided:
        return t.to_dense()
    return t


def tensor_attributes(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The plain tensor attributes of ``module`` and its submodules, by qualified name: tensors that
    ``module.to(...)`` does not convert (nn.Module keeps parameters and buffers in its own tables,
    not in ``__dict__``).

    >>> m = nn.Sequential(nn.Linear(2, 2)); m[0].scale = torch.ones(())
    >>> [name for name, _ in tensor_attributes(m)]
    ['0.scale']
    """
    for qualname, sub in module.named_modules(remove_duplicate=False):
        for attr, value in vars(sub).items():
            if isinstance(value, torch.Tensor):
                yield ".".join(filter(None, (qualname, attr))), value


def tensor_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor the module holds, by qualified name: parameters, buffers and plain tensor
    attributes (a GraphModule built again registers its plain constants as buffers: the same
    state under the same names).

    >>> m = nn.Linear(2, 2); m.scale = torch.ones(())
    >>> sorted(tensor_state(m))
    ['bias', 'scale', 'weight']
    """
    state: dict[str, torch.Tensor] = dict(module.named_parameters(remove_duplicate=False))
    state.update(module.named_buffers(remove_duplicate=False))
    for name, value in tensor_attributes(module):
        state.setdefault(name, value)
    return state


def buffers_digest(module: nn.Module) -> int:
    """A checksum of every buffer's values: whether running the module changed its state since.

    The bytes are read from a copy: ``.numpy()`` of a view of the buffer itself would leave its storage
    unresizable for good, and an observer that resizes its ``min_val`` on its first call
    (torchao's ``PerChannelMinMaxObserver``) would then raise.

    >>> m = nn.BatchNorm1d(2); before = buffers_digest(m)
    >>> _ = m(torch.randn(4, 2)); buffers_digest(m) == before
    False
    >>> m.running_mean.untyped_storage().resizable()
    True
    >>> m.register_buffer("odd", torch.empty_strided((1, 1), (1, 2)).fill_(1.0))  # "contiguous", stride 2
    >>> isinstance(buffers_digest(m), int)
    True
    """
    digest = 0
    for name, buffer in module.named_buffers(remove_duplicate=False):
        digest = zlib.crc32(name.encode(), digest)
        if buffer.device.type != "meta":  # no values
            flat = strided(buffer.detach().cpu()).reshape(-1).clone(memory_format=torch.contiguous_format)
            data = flat.view(torch.uint8).numpy().tobytes()
            digest = zlib.crc32(data, digest)
    return digest


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A copy of a module's state, graph, code, module classes and node meta keys, to find
    what changed later.

    >>> m = nn.Linear(2, 2); s = Snapshot.take(m)
    >>> _ = m.bias.data.add_(1); s.first_difference(m), s.differences(m)
    ("tensor 'bias' changed", ['state'])
    """

    state: dict[str, torch.Tensor]
    graph: str | None
    structure: str | None  # the graph with nodes numbered, inputs first: what a rename or re-trace keeps
    code: str | None
    modules: tuple[tuple[str, str], ...]
    meta: tuple[tuple[str, ...], ...] | None

    @classmethod
    def take(cls, module: nn.Module) -> Snapshot:
        state = {k: v.detach().clone() for k, v in tensor_state(module).items()}
        modules = _module_classes(module)
        if isinstance(module, fx.GraphModule):
            return cls(state, canonical_text(module.graph), canonical_text(module.graph, anonymous=True), module.code,
                       modules, _meta_keys(module.graph))
        return cls(state, None, None, None, modules, None)

    def first_difference(self, module: nn.Module, *, code: bool = True) -> str | None:
        """What differs in parameters, buffers, graph or (unless ``code=False``) generated code
        between this snapshot and ``module`` now, or None."""
        now = tensor_state(module)
        for name in self.state.keys() - now.keys():
            return f"tensor {name!r} was removed"
        for name in now.keys() - self.state.keys():
            return f"tensor {name!r} was added"
        for name, before in self.state.items():
            if not tensors_equal(before, now[name]):
                return f"tensor {name!r} changed"
        if isinstance(module, fx.GraphModule):
            if self.graph != canonical_text(module.graph):
                return "graph changed: " + first_line_difference(self.graph or "", canonical_text(module.graph))
            if code and self.code != module.code:
                return "generated code changed: " + first_line_difference(self.code or "", module.code)
        elif self.graph is not None:
            return "it is no longer a GraphModule"
        return None

    def differences(self, module: nn.Module) -> list[str]:
        """Which aspects of ``module`` differ from this snapshot, of ``state`` (the tensors it holds,
        by name), ``graph`` (its structure: what the nodes compute from what, whatever their names
        and wherever the placeholders sit), ``code``, ``modules`` (module classes and paths, the
        root's class included) and ``meta`` (the keys of each node's meta); empty when nothing does."""
        found = []
        now = tensor_state(module)
        if now.keys() != self.state.keys() or not all(tensors_equal(v, now[k]) for k, v in self.state.items()):
            found.append("state")
        graph_module = module if isinstance(module, fx.GraphModule) else None
        structure = canonical_text(graph_module.graph, anonymous=True) if graph_module is not None else None
        if structure != self.structure:
            found.append("graph")
        if graph_module is not None and self.code != graph_module.code:
            found.append("code")
        if self.modules != _module_classes(module):
            found.append("modules")
        if graph_module is not None and self.meta != _meta_keys(graph_module.graph):
            found.append("meta")
        return found


def _module_classes(module: nn.Module) -> tuple[tuple[str, str], ...]:
    return tuple((name, f"{type(m).__module__}.{type(m).__qualname__}") for name, m in module.named_modules())


def _meta_keys(graph: fx.Graph) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(sorted(node.meta)) for node in graph.nodes)


def first_line_difference(before: str, after: str) -> str:
    """Where two texts first differ, e.g. ``line 3: 'a' became 'b'``."""
    old, new = before.splitlines(), after.splitlines()
    for i, (a, b) in enumerate(zip(old, new)):
        if a != b:
            return f"line {i + 1}: {a.strip()!r} became {b.strip()!r}"
    if len(old) != len(new):
        return f"{len(old)} lines became {len(new)}"
    return "whitespace only"
