"""Module state helpers shared by the checks: resolving a dotted target,
comparing tensors, and snapshots that show what a transform changed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import fx, nn

from fxverify.graph_text import canonical_text


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
    """Same shape, dtype and values (NaNs equal)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor) and bool(a == b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().cpu(), b.detach().cpu()
    return torch.equal(a, b) or bool(a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                     and torch.equal(a.nan_to_num(), b.nan_to_num()))


def tensor_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers by qualified name (shared ones once)."""
    state = dict(module.named_parameters(remove_duplicate=False))
    state.update(module.named_buffers(remove_duplicate=False))
    return state


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A copy of a module's state, graph and code, to find what changed later.

    >>> m = nn.Linear(2, 2); s = Snapshot.take(m)
    >>> _ = m.bias.data.add_(1); s.first_difference(m)
    "tensor 'bias' changed"
    """

    state: dict[str, torch.Tensor]
    graph: str | None
    code: str | None

    @classmethod
    def take(cls, module: nn.Module) -> Snapshot:
        state = {k: v.detach().clone() for k, v in tensor_state(module).items()}
        if isinstance(module, fx.GraphModule):
            return cls(state, canonical_text(module.graph), module.code)
        return cls(state, None, None)

    def first_difference(self, module: nn.Module, *, code: bool = True) -> str | None:
        """What differs between this snapshot and ``module`` now, or None.

        ``code=False`` ignores differences in generated code alone (type
        annotations that a ``Transformer`` drops, for example)."""
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


def first_line_difference(before: str, after: str) -> str:
    """Where two texts first differ, e.g. ``line 3: 'a' became 'b'``."""
    old, new = before.splitlines(), after.splitlines()
    for i, (a, b) in enumerate(zip(old, new)):
        if a != b:
            return f"line {i + 1}: {a.strip()!r} became {b.strip()!r}"
    if len(old) != len(new):
        return f"{len(old)} lines became {len(new)}"
    return "whitespace only"
