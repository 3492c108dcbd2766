"""AOTAutograd's inference graph of a model, as ``torch.compile`` hands it to Inductor: the start of the inference
Inductor captures (``inductor``, ``inductor_joint``, their post hooks, ``inductor_freezing``).

Made by torch's own ``aot_function`` with the options ``compile_fx`` passes (Inductor's decomposition table,
``keep_inference_input_mutations=True``), stopped where AOTAutograd hands the graph to its inference compiler.
So the graph holds what Inductor's hooks receive, and nothing ``make_fx(functionalize(f))`` leaves that
AOTAutograd does not: in-place ops made by a decomposition (RMSNorm's ``add_``) or an in-place update mid-graph
(a padded copy's ``copy_``) where AOTAutograd has functional ones (``add``, ``slice_scatter``), the dead outputs of
a decomposition (BatchNorm's ``empty``, ``full``), an op a decomposition reached only under AOTAutograd's
functionalization (``upsample_bilinear2d``), the model's outputs where AOTAutograd returns a flat tuple.

>>> gm = aot_inference_graph(torch.nn.Linear(3, 2), (torch.ones(1, 3),))
>>> gm.meta[LIFTED], gm.graph.output_node().format_node()
((('arg0_1', 'weight'), ('arg1_1', 'bias'), ('arg2_1', None)), 'return (addmm,)')
>>> gm(torch.ones(2, 3), torch.ones(2), torch.ones(1, 3))  # the model's output, not the tuple
tensor([[4., 4.]])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn

from fxverify.capture.aot_call import aot_call
from fxverify.capture.lifted_buffers import LIFTED
from fxverify.errors import TransformFailed

__all__ = ["HandedReturn", "aot_inference_graph"]


class _Handed(Exception):
    """Raised by the inference compiler once AOTAutograd handed it the graph: nothing is compiled or run."""


def aot_inference_graph(module: nn.Module, inputs: tuple[Any, ...],
                        decompositions: dict[Any, Callable[..., Any]] | None = None, *,
                        state_first: bool = False) -> fx.GraphModule:
    """AOTAutograd's inference graph of ``module`` on ``inputs`` (traced in fake mode: the module's tensors are
    not changed), its parameters and buffers placeholders as Inductor receives them, the buffers the model updates
    written back with ``aten.copy_`` at the end. The graph returns AOTAutograd's flat tuple; the module's generated
    code returns what ``module`` returns. ``gm.meta[LIFTED]`` names the state each placeholder holds
    (:func:`~fxverify.capture.lifted_buffers.state_as_attributes`).

    Its inputs are those :func:`~fxverify.capture.aot_call.aot_call` gives, in that order (``state_first``: every
    parameter and buffer first, as under ``config.freezing``)."""
    from torch._functorch.aot_autograd import aot_function

    call = aot_call(module, inputs, state_first=state_first)
    kept: list[fx.GraphModule] = []

    def handed(gm: fx.GraphModule, example_inputs: Any) -> Any:
        kept.append(gm)
        raise _Handed

    def training(gm: fx.GraphModule, example_inputs: Any) -> Any:
        raise NotImplementedError("AOTAutograd traced a training graph under torch.no_grad(): an output of the model "
                                  "requires grad without autograd; the inference captures cannot take it")

    compiled = aot_function(call.run, fw_compiler=training, inference_compiler=handed, decompositions=decompositions,
                            keep_inference_input_mutations=True)
    try:
        with torch.no_grad():
            compiled(*call.flat)
    except _Handed:
        pass
    gm = kept[0]
    placeholders = [node.name for node in gm.graph.find_nodes(op="placeholder")]
    if len(placeholders) != len(call.held):  # an input that is not one tensor: not built
        raise NotImplementedError(f"AOTAutograd's graph of a model called with {len(inputs)} inputs and "
                                  f"{len(call.held) - len(inputs)} parameters and buffers has {len(placeholders)} "
                                  "inputs: not built")
    gm.meta[LIFTED] = tuple(zip(placeholders, call.held, strict=True))
    codegen = call.codegen()
    if codegen is not None:
        gm.graph.set_codegen(codegen)
        gm.recompile()
    return gm


@dataclasses.dataclass(frozen=True)
class HandedReturn:
    """How an :func:`aot_inference_graph` returns, taken before torch's passes or a transform change it: its code
    generator (the model's output from the graph's flat tuple) and how many values the tuple holds.

    >>> gm = aot_inference_graph(torch.nn.Linear(3, 2), (torch.ones(1, 3),))
    >>> HandedReturn(gm.graph._codegen, 2).restore(gm)
    Traceback (most recent call last):
    fxverify.errors.TransformFailed: the graph returns 1 values where AOTAutograd's graph returned 2: ...
    """

    codegen: fx.graph.CodeGen
    count: int

    @classmethod
    def of(cls, gm: fx.GraphModule) -> HandedReturn:
        """How ``gm`` returns now."""
        return cls(gm.graph._codegen, len(gm.graph.output_node().args[0]))  # type: ignore[arg-type]

    def restore(self, result: fx.GraphModule) -> None:
        """``result`` (what torch's passes or a transform made of the graph) returning what the model returns again:
        the code generator set back where the graph was built anew, as ``torch.compile``'s runtime wrappers build
        the model's output from the graph's flat tuple whatever code the graph has. :class:`TransformFailed` where
        the graph returns another number of values: the wrappers read as many as AOTAutograd's graph returned."""
        returned = result.graph.output_node().args[0]
        found = len(returned) if isinstance(returned, (tuple, list)) else "not a tuple of"
        if found != self.count:
            raise TransformFailed(f"the graph returns {found} values where AOTAutograd's graph returned {self.count}: "
                                  "torch.compile's runtime wrappers read as many as AOTAutograd's graph returned",
                                  "changed the number of graph outputs")
        if result.graph._codegen is not self.codegen:
            result.graph.set_codegen(self.codegen)
            result.recompile()
