"""An ``Interpreter`` that records the values of chosen nodes as it runs."""

from __future__ import annotations

import copy
from collections.abc import Callable, Set
from typing import Any

import torch
from torch import fx
from torch.fx.immutable_collections import immutable_dict, immutable_list
from torch.utils import _pytree as pytree


class RecordingInterpreter(fx.Interpreter):
    """Runs a GraphModule and keeps a copy of each recorded node's value;
    ``current`` is the node being run (the culprit when a run raises). With
    ``retain_grad``, the live values are kept instead, with their ``.grad`` retained,
    so a backward pass fills in each recorded node's gradient. With ``observe``, nothing
    is kept: it is called with each recorded node and its value as the node runs (a
    comparison that needs no copy of every value at once).

    >>> gm = fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
    >>> rec = RecordingInterpreter(gm, {"_0"})
    >>> _ = rec.run(torch.tensor([-1.0, 2.0]))
    >>> rec.values["_0"]
    tensor([0., 2.])
    >>> rec = RecordingInterpreter(gm, {"_0"}, retain_grad=True)
    >>> rec.run(torch.tensor([-1.0, 2.0], requires_grad=True)).sum().backward()
    >>> rec.values["_0"].grad
    tensor([1., 1.])
    """

    def __init__(self, module: fx.GraphModule, record: Set[str] = frozenset(), *, retain_grad: bool = False,
                 observe: Callable[[fx.Node, Any], None] | None = None) -> None:
        super().__init__(module)
        self.record = record
        self.retain_grad = retain_grad
        self.observe = observe
        self.values: dict[str, Any] = {}
        self.current: fx.Node | None = None

    def fetch_args_kwargs_from_env(self, n: fx.Node) -> tuple[tuple[Any, ...], dict[str, Any]]:
        # generated code builds fresh lists and dicts on every call, and some callees
        # mutate them (torchvision's swin3d pads a window-size list in place)
        args, kwargs = super().fetch_args_kwargs_from_env(n)
        return _mutable(args), _mutable(kwargs)

    def run_node(self, n: fx.Node) -> Any:
        self.current = n
        value = super().run_node(n)
        if n.name in self.record and self.observe is not None:
            self.observe(n, value)
        elif n.name in self.record and self.retain_grad:
            for t in pytree.tree_leaves(value):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.retain_grad()
            self.values[n.name] = value
        elif n.name in self.record:
            # later in-place ops must not change what was recorded
            self.values[n.name] = pytree.tree_map_only(torch.Tensor, lambda t: t.detach().clone(), value)
        return value


def _mutable(value: Any) -> Any:
    """``value`` with FX's immutable lists and dicts replaced by plain ones, recursively."""
    if isinstance(value, immutable_list):
        return [_mutable(v) for v in value]
    if isinstance(value, immutable_dict):
        return {k: _mutable(v) for k, v in value.items()}
    if type(value) in (tuple, list):
        return type(value)(_mutable(v) for v in value)
    if type(value) is dict:
        return {k: _mutable(v) for k, v in value.items()}
    return value


def run_recorded(module: torch.nn.Module, inputs: tuple[Any, ...]) -> tuple[Exception | None, fx.Node | None]:
    """Run ``module`` on ``inputs`` without gradients (a GraphModule under :class:`RecordingInterpreter`):
    the exception it raised and, for a GraphModule, the node it raised at; ``(None, None)`` when it ran.

    >>> gm = fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(3, 2)))
    >>> error, node = run_recorded(gm, (torch.ones(1, 4),))
    >>> type(error).__name__, node.name
    ('RuntimeError', '_1')
    """
    interpreter = RecordingInterpreter(module) if isinstance(module, fx.GraphModule) else None
    try:
        with torch.no_grad():
            interpreter.run(*inputs) if interpreter else module(*inputs)
    except Exception as exc:
        return exc, interpreter.current if interpreter else None
    return None, None


def raising_node(module: fx.GraphModule, inputs: tuple[Any, ...]) -> fx.Node | None:
    """The node at which a copy of ``module`` run under the Interpreter on ``inputs`` raises (the module's
    own state is left as it is), or None where it does not raise there or cannot be copied.

    >>> gm = fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(3, 2)))
    >>> raising_node(gm, (torch.ones(1, 4),)).name
    '_1'
    """
    try:
        copied = copy.deepcopy(module)
    except Exception:  # a module that cannot be copied: no node named, the finding stands without it
        return None
    return run_recorded(copied, inputs)[1]
