"""How ``torch.compile`` calls AOTAutograd on a model: the flat inputs in Dynamo's order, the state each holds, and
the function AOTAutograd traces. The start of every Inductor capture that runs torch's ``aot_function`` (the
inference graph of :mod:`~fxverify.capture.aot_inference`, the training graphs of :mod:`~fxverify.capture.inductor`).

Dynamo's graph (as :func:`~fxverify.capture.pre_grad.as_aot_receives` gives it) starts with one read for each
placeholder Dynamo made: a ``get_attr`` of each parameter, buffer and tensor attribute, a placeholder of each of the
model's inputs, interleaved as Dynamo met them. AOTAutograd receives them in that order and runs the graph node by
node. Dynamo marks the model's parameters and buffers static inputs, which Inductor's partitioner keeps alive
instead of saving what is computed from them (:attr:`AotCall.static`).

>>> import torch
>>> call = aot_call(torch.nn.Linear(3, 2), (torch.ones(1, 3),))
>>> call.held, call.static
(('weight', 'bias', None), (0, 1))
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

from torch import fx, nn
from torch.nn.utils.stateless import _reparametrize_module

from fxverify.analysis.module_state import resolve
from fxverify.capture.pre_grad import returning

__all__ = ["AotCall", "aot_call"]


@dataclasses.dataclass(frozen=True)
class AotCall:
    """The flat inputs AOTAutograd receives (``flat``), the state each holds (``held``: a dotted name, None for an
    input of the model) and the function it traces (``run``, taking ``flat`` and returning a flat tuple)."""

    held: tuple[str | None, ...]
    flat: tuple[Any, ...]
    run: Callable[..., Any]
    static: tuple[int, ...]  # the flat inputs Dynamo marks static: the model's parameters and buffers

    def codegen(self) -> fx.graph.CodeGen | None:
        """The code generator returning the model's output from the flat tuple, once ``run`` ran (None where the
        model returns one flat tuple of tensors already)."""
        return getattr(self.run, "codegen", None)


def aot_call(module: nn.Module, inputs: tuple[Any, ...], *, state_first: bool = False) -> AotCall:
    """How ``torch.compile`` calls AOTAutograd on ``module`` (Dynamo's graph, or a model Dynamo splits) and its
    ``inputs``. A ``GraphModule`` is run node by node, its first reads the flat inputs in their order.
    ``state_first`` (Dynamo under ``config.freezing`` and ``no_grad``, which makes parameters and buffers graph
    attributes that AOTAutograd lifts first), or a module that is no graph: every parameter and buffer first, then
    the inputs."""
    if state_first or not isinstance(module, fx.GraphModule):
        state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
        held: list[str | None] = [*state, *[None] * len(inputs)]
        flat = (*state.values(), *inputs)
        run = _called(module, list(state))
    else:
        reads = _first_reads(module)
        given = iter(inputs)
        held = [str(node.target) if node.op == "get_attr" else None for node in reads]
        flat = tuple(resolve(module, name) if name is not None else next(given) for name in held)
        run = _interpreted(module, reads)
    owned = {name for name, _ in itertools.chain(module.named_parameters(), module.named_buffers())}
    return AotCall(tuple(held), flat, run, tuple(index for index, name in enumerate(held) if name in owned))


def _first_reads(gm: fx.GraphModule) -> list[fx.Node]:
    """The placeholders and ``get_attr`` nodes ``gm``'s graph starts with: Dynamo's placeholders."""
    return list(itertools.takewhile(lambda node: node.op in ("placeholder", "get_attr"), gm.graph.nodes))


def _called(module: nn.Module, names: list[str]) -> Callable[..., Any]:
    """``module`` called with its parameters and buffers ``names`` the first inputs, the model's inputs after."""
    def run(*flat: Any) -> Any:
        with _reparametrize_module(module, dict(zip(names, flat[:len(names)], strict=True))):
            tensors, codegen = returning(module(*flat[len(names):]))
        run.codegen = codegen  # type: ignore[attr-defined]
        return tensors
    return run


def _interpreted(gm: fx.GraphModule, reads: list[fx.Node]) -> Callable[..., Any]:
    """``gm``'s graph run node by node on one value for each of ``reads``, returning its output node's tuple."""
    def run(*flat: Any) -> Any:
        attributes = {node: value for node, value in zip(reads, flat, strict=True) if node.op == "get_attr"}
        given = [value for node, value in zip(reads, flat, strict=True) if node.op == "placeholder"]
        return fx.Interpreter(gm).run(*given, initial_env=attributes, enable_io_processing=False)
    run.codegen = gm.graph._codegen  # type: ignore[attr-defined]
    return run
