"""Passes over ExecuTorch Edge programs written as ExecuTorch's authors write them (an ``ExportPass`` subclass
rewriting ``call_operator``, a ``PassBase`` editing the lifted graph in place, an ``ExportedProgramPassBase`` over
the program), each buggy one beside its correct twin: one a class of real defect (docs/quantization.md).
Importable by spec (``tests.edge_passes:ClampForRelu``): fxverify instantiates a pass class of no arguments."""

from __future__ import annotations

import torch
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult, ExportPass
from torch import fx
from torch.export.graph_signature import OutputKind
from torch.fx.passes.infra.pass_base import PassBase, PassResult

EDGE = exir_ops.edge


class ClampForRelu(ExportPass):
    """numerics, correct: ``relu(x)`` as ``clamp(x, 0)``."""

    bounds: tuple[float, float | None] = (0.0, None)

    def call_operator(self, op, args, kwargs, meta):  # type: ignore[no-untyped-def]
        if op is EDGE.aten.relu.default:
            return super().call_operator(EDGE.aten.clamp.default, (args[0], *self.bounds), {}, meta)
        return super().call_operator(op, args, kwargs, meta)


class Relu6ForRelu(ClampForRelu):
    """numerics, buggy: ``relu(x)`` as ``clamp(x, 0, 6)``, relu6's bounds (silent where an activation passes 6)."""

    bounds = (0.0, 6.0)


def _fold_views_into_means(graph_module: fx.GraphModule, *, update_meta: bool) -> PassResult:
    """``view_copy(mean(x, dims, keepdim=True), shape)`` as ``mean(x, dims)`` where the view only drops the kept
    dimensions (the head of a CNN), edited in place."""
    modified = False
    for view in list(graph_module.graph.nodes):
        mean = view.args[0] if view.target is EDGE.aten.view_copy.default else None
        if not isinstance(mean, fx.Node) or mean.target is not EDGE.aten.mean.dim or len(mean.users) > 1 \
                or mean.args[2:] != (True,):
            continue
        dropped = torch.ops.aten.mean.dim(mean.args[0].meta["val"], mean.args[1])  # what the mean gives without them
        if list(dropped.shape) != list(view.meta["val"].shape):
            continue
        mean.args = mean.args[:2]
        if update_meta:
            mean.meta = {**mean.meta, "val": dropped}
        view.replace_all_uses_with(mean)
        graph_module.graph.erase_node(view)
        modified = True
    graph_module.recompile()
    return PassResult(graph_module, modified)


class FoldViewsIntoMeans(PassBase):
    """meta, correct: a mean keeping the reduced dimensions then viewed without them, as one mean; its
    ``meta['val']`` says what it now gives."""

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        return _fold_views_into_means(graph_module, update_meta=True)


class FoldViewsIntoMeansStaleMeta(PassBase):
    """meta, buggy: the same, the mean keeping the ``meta['val']`` it had, with the kept dimensions (executorch#19154,
    #7997; the Edge verifier accepts it, a later pass or the memory planner reads the wrong shape)."""

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        return _fold_views_into_means(graph_module, update_meta=False)


class ClonesInTheirInputsOrder(ExportPass):
    """layout, correct: each ``_clone_dim_order`` in its input's dim order, as ``memory_format=preserve_format`` says."""

    def order(self, value: torch.Tensor) -> list[int]:
        return list(value.dim_order())

    def call_operator(self, op, args, kwargs, meta):  # type: ignore[no-untyped-def]
        if op is EDGE.dim_order_ops._clone_dim_order.default:
            kwargs = {**kwargs, "dim_order": self.order(args[0].to_tensor())}
        return super().call_operator(op, args, kwargs, meta)


class ContiguousClones(ClonesInTheirInputsOrder):
    """layout, buggy: each ``_clone_dim_order`` contiguous, whatever its input's layout (executorch#16032: a copy
    without ``memory_format`` made contiguous instead of ``preserve_format``; channels-last inputs then come out
    in another layout)."""

    def order(self, value: torch.Tensor) -> list[int]:
        return list(range(value.dim()))


class DequantScalesInFloat16(ExportPass):
    """q/dq parameters, buggy: each per-tensor dequantize reads its scale rounded to float16 (its quantize wrote
    the float32 one); the outputs move by less than a quantization step, the pair no longer matches."""

    def call_operator(self, op, args, kwargs, meta):  # type: ignore[no-untyped-def]
        if op is EDGE.quantized_decomposed.dequantize_per_tensor.default:
            args = (args[0], float(torch.tensor(args[1]).half()), *args[2:])
        return super().call_operator(op, args, kwargs, meta)


class ScalesInFloat16(ExportPass):
    """q/dq parameters, correct: each per-tensor quantize and dequantize reads its scale rounded to float16."""

    def call_operator(self, op, args, kwargs, meta):  # type: ignore[no-untyped-def]
        if op in (EDGE.quantized_decomposed.dequantize_per_tensor.default,
                  EDGE.quantized_decomposed.quantize_per_tensor.default):
            args = (args[0], float(torch.tensor(args[1]).half()), *args[2:])
        return super().call_operator(op, args, kwargs, meta)


class DropUnreadOutputs(ExportedProgramPassBase):
    """state, buggy: drops the outputs no user output reads, buffer updates among them ("only user outputs
    matter"): the buffer stops changing (executorch#7515: a final ``buffer.copy_`` eliminated)."""

    kinds = (OutputKind.USER_OUTPUT,)

    def call(self, exported_program: torch.export.ExportedProgram) -> ExportedProgramPassResult:
        signature = exported_program.graph_signature
        output = exported_program.graph.output_node()
        kept = [i for i, spec in enumerate(signature.output_specs) if spec.kind in self.kinds]
        if len(kept) == len(signature.output_specs):
            return ExportedProgramPassResult(exported_program, False)
        output.args = (tuple(output.args[0][i] for i in kept),)
        signature.output_specs[:] = [signature.output_specs[i] for i in kept]
        exported_program.graph.eliminate_dead_code()
        exported_program.graph_module.recompile()
        return ExportedProgramPassResult(exported_program, True)


class DropDeadCode(PassBase):
    """state, correct: dead-code elimination, which keeps buffer updates (they are outputs)."""

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        modified = graph_module.graph.eliminate_dead_code()
        graph_module.recompile()
        return PassResult(graph_module, modified)


class ClampForReluClaimingNoChange(PassBase):
    """hygiene, buggy: rewrites ``relu`` as ``clamp(x, 0)`` in place and says ``modified=False`` (executorch#16065,
    #15470): ExecuTorch's pass manager then keeps the program it had, whose graph the pass changed."""

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        for node in graph_module.graph.nodes:
            if node.target is EDGE.aten.relu.default:
                node.target, node.args = EDGE.aten.clamp.default, (node.args[0], 0.0)
        graph_module.recompile()
        return PassResult(graph_module, False)


def _copy_outputs(graph_module: fx.GraphModule, *, every_run: bool) -> PassResult:
    """Each tensor output read through a ``_clone_dim_order`` in its own dim order (a copy the runtime may hand
    out), edited in place."""
    output = graph_module.graph.output_node()
    values = list(output.args[0])
    for position, value in enumerate(values):
        val = value.meta.get("val") if isinstance(value, fx.Node) else None
        if not isinstance(val, torch.Tensor) or (not every_run and value.target is EDGE.dim_order_ops._clone_dim_order.default):
            continue
        with graph_module.graph.inserting_before(output):
            copied = graph_module.graph.call_function(EDGE.dim_order_ops._clone_dim_order.default, (value,),
                                                      {"dim_order": list(val.dim_order())})
        copied.meta = {**value.meta, "val": val.clone()}
        values[position] = copied
    output.args = (tuple(values),)
    graph_module.recompile()
    return PassResult(graph_module, True)


class CopyOutputsOnce(PassBase):
    """idempotence, correct: each output copied once; an output that is a copy already is left."""

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        return _copy_outputs(graph_module, every_run=False)


class CopyOutputsEveryRun(PassBase):
    """idempotence, buggy: each output copied again on every run (a pass that does not recognise its own rewrite,
    as a pad or q/dq insertion wrapping what it already wrapped)."""

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        return _copy_outputs(graph_module, every_run=True)
