"""Compile backends for the tests of :mod:`fxverify.compile.backend`: two correct plain ones, and each buggy
backend beside its correct twin, with the aspect meant to catch it.

- :func:`relu_in_place` (caught by ``backend-input-unchanged``) rewrites the GraphModule it is handed, as
  ``compile_fx`` did (pytorch#138980); :func:`relu_on_copy` rewrites a copy.
- :class:`ReshapeAtFirstBatch` (caught by ``backend-recompile``) lowers ``flatten(x, 1)`` to ``reshape(B, -1)``
  with ``B`` the batch size it compiled for, and caches what it compiled by the graph's code, which a
  recompile at another batch size shares; :class:`ReshapeAtRunBatch` reads the batch size when it runs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from functorch.compile import make_boxed_func
from torch import fx
from torch._dynamo.backends.common import aot_autograd


def returns_forward(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
    """The simplest correct backend: run the graph dynamo captured."""
    return gm.forward


def _boxed_forward(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
    return make_boxed_func(gm.forward)


boxed_aot = aot_autograd(fw_compiler=_boxed_forward, bw_compiler=_boxed_forward)  # forward and backward graphs


def _relu_to_torch_relu(gm: fx.GraphModule) -> fx.GraphModule:
    for node in gm.graph.find_nodes(op="call_function", target=F.relu):
        node.target, node.kwargs = torch.relu, {}
    gm.recompile()
    return gm


def relu_in_place(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
    """BUGGY: rewrites ``F.relu`` to ``torch.relu`` in the GraphModule dynamo handed it (outputs stay right)."""
    return _relu_to_torch_relu(gm).forward


def relu_on_copy(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
    """The twin: the same rewrite on a copy."""
    return _relu_to_torch_relu(copy.deepcopy(gm)).forward


def _flatten_as_reshape(gm: fx.GraphModule, batch: Callable[[fx.Graph, fx.Node], Any]) -> fx.GraphModule:
    """A copy of ``gm`` with each ``torch.flatten(x, 1)`` written ``x.reshape(batch(graph, x), -1)``."""
    gm = copy.deepcopy(gm)
    for node in gm.graph.find_nodes(op="call_function", target=torch.flatten):
        if node.args[1:] == (1,) and not node.kwargs:
            with gm.graph.inserting_before(node):
                source = node.args[0]
                assert isinstance(source, fx.Node)
                reshaped = gm.graph.call_method("reshape", (source, batch(gm.graph, source), -1))
            node.replace_all_uses_with(reshaped)
            gm.graph.erase_node(node)
    gm.recompile()
    return gm


class ReshapeAtFirstBatch:
    """BUGGY: bakes the batch size of the example input into the reshape and caches by ``gm.code`` only."""

    def __init__(self) -> None:
        self.compiled: dict[str, Callable[..., Any]] = {}

    def __call__(self, gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
        if gm.code not in self.compiled:
            self.compiled[gm.code] = _flatten_as_reshape(
                gm, lambda graph, x: int(x.meta["example_value"].shape[0])).forward
        return self.compiled[gm.code]


class ReshapeAtRunBatch:
    """The twin: the reshape reads ``x.size(0)`` when it runs, so what it caches by ``gm.code`` fits any batch."""

    def __init__(self) -> None:
        self.compiled: dict[str, Callable[..., Any]] = {}

    def __call__(self, gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
        if gm.code not in self.compiled:
            self.compiled[gm.code] = _flatten_as_reshape(
                gm, lambda graph, x: graph.call_method("size", (x, 0))).forward
        return self.compiled[gm.code]


# as users name a backend in a spec: one instance for the whole run (its cache outlives a model)
reshape_at_first_batch = ReshapeAtFirstBatch()
reshape_at_run_batch = ReshapeAtRunBatch()
