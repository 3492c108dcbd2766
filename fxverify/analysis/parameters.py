"""What became of each parameter and buffer of the original in a transform's result.

A tensor of the original is found in the result in this order:

- by identity: the transform was given a copy of the original, and fxverify knows
  which copy stands for which tensor; the same object anywhere in the result is the
  same tensor, whatever its path (``split_module`` moves every submodule under
  ``submod_0``, a wrapper nests the model under a new attribute);
- by name: a tensor at the same qualified name with the same values (a transform
  that deep-copies its input);
- by value: an unclaimed tensor of the result with the same shape, dtype and values.

Each gets a :class:`Fate`: ``kept`` (same name), ``moved`` (same tensor, another
path: information, not a change), ``frozen`` (a parameter that survives as a buffer, a
plain attribute or an ``nn.Parameter`` with ``requires_grad=False``), ``changed`` (the
name holds other values) or ``removed``.

>>> import copy, torch
>>> from torch import nn
>>> original = nn.Sequential(nn.Linear(2, 2))
>>> memo = {}
>>> given = copy.deepcopy(original, memo)
>>> wrapper = nn.Module(); wrapper.inner = given  # the model nested under a new attribute
>>> [(f.name, f.kind, f.now) for f in tensor_fates(original, wrapper, memo)]
[('0.weight', 'moved', 'inner.0.weight'), ('0.bias', 'moved', 'inner.0.bias')]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import fx, nn

from fxverify.analysis.module_state import resolve, tensor_attributes, tensors_equal

KEPT, MOVED, FROZEN, CHANGED, REMOVED = "kept", "moved", "frozen", "changed", "removed"


@dataclasses.dataclass(frozen=True)
class Fate:
    """What became of the original's tensor ``name``: ``kind`` (kept, moved, frozen, changed,
    removed), where it is now (``now``) and, for a frozen parameter, as what (``how``)."""

    name: str
    is_parameter: bool
    kind: str
    now: str | None = None
    how: str = ""

    @property
    def survives(self) -> bool:
        """The same trainable (or, for a buffer, the same) tensor is in the result."""
        return self.kind in (KEPT, MOVED)

    def describe(self) -> str:
        """e.g. ``parameter 'conv1.weight' moved to 'submod_0.conv1.weight'``."""
        what = f"{'parameter' if self.is_parameter else 'buffer'} {self.name!r}"
        if self.kind == MOVED:
            return f"{what} moved to {self.now!r}"
        if self.kind == FROZEN:
            return f"{what} survives as {self.how} {self.now!r}: it will not train"
        if self.kind == CHANGED:
            return f"{what} changed value or shape"
        if self.kind == REMOVED:
            return f"{what} was removed"
        return f"{what} was kept"


def tensor_fates(original: nn.Module, result: nn.Module, copies: Mapping[int, Any] | None = None) -> list[Fate]:
    """The fate of every parameter and buffer of ``original`` (shared ones once, by their
    first name) in ``result``. ``copies`` maps ``id()`` of the original's objects to the
    copies the transform was given (a ``copy.deepcopy`` memo)."""
    copies = copies or {}
    found = _Tensors(result)
    claimed: set[int] = set()
    fates = []
    state = [(n, t, True) for n, t in original.named_parameters()] + [(n, t, False) for n, t in original.named_buffers()]
    for name, tensor, is_parameter in state:
        fate = _fate(name, tensor, is_parameter, copies.get(id(tensor)), found, claimed)
        fates.append(fate)
    return fates


def rewrites_state(original: nn.Module, result: nn.Module, copies: Mapping[int, Any] | None = None) -> bool:
    """Whether ``result`` holds parameters or buffers other than the original's (new values,
    new tensors, fewer tensors): then its parameters were computed in its dtype.

    >>> from torch import nn
    >>> m = nn.Linear(2, 2)
    >>> rewrites_state(m, m), rewrites_state(m, nn.Linear(2, 2))
    (False, True)
    """
    fates = tensor_fates(original, result, copies)
    if not all(f.survives for f in fates):
        return True
    theirs = {id(t) for _, t in _state(result)}
    return len(theirs) != len(fates)


def _state(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]


class _Tensors:
    """The tensors of a result: its parameters, and its buffers and plain tensor attributes
    (including tensors read by get_attr), by name and by identity."""

    def __init__(self, module: nn.Module) -> None:
        self.parameters = dict(module.named_parameters(remove_duplicate=False))
        self.others: dict[str, tuple[torch.Tensor, str]] = {
            name: (t, "a buffer") for name, t in module.named_buffers(remove_duplicate=False)
        }
        for name, value in tensor_attributes(module):
            if not isinstance(value, nn.Parameter):
                self.others.setdefault(name, (value, "a plain tensor attribute"))
        if isinstance(module, fx.GraphModule):
            for node in module.graph.find_nodes(op="get_attr"):
                try:
                    value = resolve(module, str(node.target))
                except AttributeError:  # lint reports a target that does not resolve
                    continue
                if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                    self.others.setdefault(str(node.target), (value, "a plain tensor read by get_attr"))
        self.parameter_ids: dict[int, list[str]] = {}
        for name, t in self.parameters.items():
            self.parameter_ids.setdefault(id(t), []).append(name)
        self.other_ids = {id(t): name for name, (t, _) in reversed(list(self.others.items()))}


def _fate(name: str, tensor: torch.Tensor, is_parameter: bool, copy_: Any, found: _Tensors, claimed: set[int]) -> Fate:
    frozen_how = "a frozen nn.Parameter (requires_grad=False)"

    def as_parameter(now: str, value: torch.Tensor, same_values: bool) -> Fate:
        claimed.add(id(value))
        if not same_values:
            return Fate(name, is_parameter, CHANGED, now)
        if is_parameter and tensor.requires_grad and not value.requires_grad:
            return Fate(name, is_parameter, FROZEN, now, frozen_how)
        return Fate(name, is_parameter, KEPT if now == name else MOVED, now)

    def as_other(now: str, value: torch.Tensor, how: str) -> Fate:
        claimed.add(id(value))
        if is_parameter:
            return Fate(name, is_parameter, FROZEN, now, how)
        return Fate(name, is_parameter, KEPT if now == name else MOVED, now)

    if isinstance(copy_, torch.Tensor):  # by identity
        names = found.parameter_ids.get(id(copy_))
        if names:
            return as_parameter(name if name in names else names[0], copy_, tensors_equal(copy_, tensor))
        if id(copy_) in found.other_ids:
            now = found.other_ids[id(copy_)]
            return as_other(now, copy_, found.others[now][1])
    pool = found.parameters if is_parameter else {n: t for n, (t, _) in found.others.items()}
    same_name = pool.get(name)
    if same_name is not None and id(same_name) not in claimed and tensors_equal(same_name, tensor):
        return as_parameter(name, same_name, True) if is_parameter else as_other(name, same_name, "")
    for now, value in pool.items():  # by value
        if id(value) not in claimed and tensors_equal(value, tensor):
            return as_parameter(now, value, True) if is_parameter else as_other(now, value, "")
    if is_parameter:
        for now, (value, how) in found.others.items():
            if id(value) not in claimed and tensors_equal(value, tensor):
                return as_other(now, value, how)
    if name in found.parameters or name in found.others:
        return Fate(name, is_parameter, CHANGED, name)
    return Fate(name, is_parameter, REMOVED)
