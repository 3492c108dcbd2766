"""An ``Interpreter`` that records the values of chosen nodes as it runs."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree


class RecordingInterpreter(fx.Interpreter):
    """Runs a GraphModule and keeps a copy of each recorded node's value;
    ``current`` is the node being run (the culprit when a run raises).

    >>> gm = fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
    >>> rec = RecordingInterpreter(gm, {"_0"})
    >>> _ = rec.run(torch.tensor([-1.0, 2.0]))
    >>> rec.values["_0"]
    tensor([0., 2.])
    """

    def __init__(self, module: fx.GraphModule, record: set[str] = frozenset()) -> None:
        super().__init__(module)
        self.record = record
        self.values: dict[str, Any] = {}
        self.current: fx.Node | None = None

    def run_node(self, n: fx.Node) -> Any:
        self.current = n
        value = super().run_node(n)
        if n.name in self.record:
            # later in-place ops must not change what was recorded
            self.values[n.name] = pytree.tree_map_only(torch.Tensor, lambda t: t.detach().clone(), value)
        return value
