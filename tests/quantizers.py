"""Quantizers under test (form ``quantizer``), written the way PT2E quantizer authors write them: a ``Quantizer``
subclass whose ``annotate`` sets each node's ``quantization_annotation`` and whose ``validate`` accepts the model.

- ``ConvLinearQuantizer`` quantizes the input, weight and output of each ``conv2d`` and ``linear`` to int8, each
  weight per channel along its output channels (dimension 0 of the weight): correct.
- ``ConvLinearQuantizerInputChannels`` quantizes the weights per channel along dimension 1, the input channels (the
  per-channel axis class: executorch#17842 took the wrong dimension for a transposed convolution): caught by
  ``qdq``, whose ``axis`` problem names the weight's quantize and the dimension to use;
- ``DeadCodeQuantizer`` drops the buffer write-backs before annotating: caught by ``stateful``.
- ``RebuildingQuantizer`` returns a new ``GraphModule`` from ``transform_for_annotation`` (as Arm's pass manager
  does): correct; ``purity`` does not hold it to what ``prepare_pt2e``'s own fold did to the model it consumes.
- ``LayerNormDecomposingQuantizer`` decomposes ``layer_norm`` before annotating (so that each piece can be
  quantized, as Arm's quantizer decomposes ops in ``transform_for_annotation``): correct.
  ``LayerNormDecomposingQuantizerUnbiased`` takes ``torch.var``'s default, the unbiased variance, where
  ``layer_norm`` divides by the count (the class of silent numerics in a rewrite: pytorch#102224 read BN's ``eps``
  from the wrong argument): caught by ``numerics``, on the float graph ``prepare_pt2e`` makes.
- ``TanhQuantizer`` quantizes ``tanh``'s output with fixed parameters covering its range ``[-1, 1)``: correct.
  ``TanhQuantizerSigmoidRange`` gives it sigmoid's, ``[0, 1)``, and clips every negative value (the class of q/dq
  parameters written for another op: executorch#18462 clamped int8 at 0 instead of the zero point): caught by
  ``numerics``, which applies each observer's parameters to what it saw at the calibration inputs.
"""

from __future__ import annotations

import copy

import torch
from torch import fx
from torchao.quantization.pt2e import MinMaxObserver, PerChannelMinMaxObserver
from torchao.quantization.pt2e.quantizer import (
    FixedQParamsQuantizationSpec,
    QuantizationAnnotation,
    QuantizationSpec,
    Quantizer,
)

WEIGHTED = (torch.ops.aten.conv2d.default, torch.ops.aten.linear.default)
ACTIVATION = QuantizationSpec(dtype=torch.int8, quant_min=-128, quant_max=127, qscheme=torch.per_tensor_affine,
                              observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=2**-12))


def weight_spec(axis: int) -> QuantizationSpec:
    """Symmetric int8 per channel along ``axis`` of the weight."""
    return QuantizationSpec(dtype=torch.int8, quant_min=-127, quant_max=127, qscheme=torch.per_channel_symmetric,
                            ch_axis=axis, observer_or_fake_quant_ctr=PerChannelMinMaxObserver.with_args(
                                ch_axis=axis, qscheme=torch.per_channel_symmetric, eps=2**-12))


class ConvLinearQuantizer(Quantizer):
    """int8 for each conv2d / linear: input and output per tensor, weight per channel on :attr:`weight_axis`."""

    weight_axis = 0  # the weight's output channels, for conv2d and linear alike

    def annotate(self, model: fx.GraphModule) -> fx.GraphModule:
        for node in model.graph.nodes:
            if node.op == "call_function" and node.target in WEIGHTED:
                activation, weight = node.args[0], node.args[1]
                node.meta["quantization_annotation"] = QuantizationAnnotation(
                    input_qspec_map={activation: ACTIVATION, weight: weight_spec(self.weight_axis)},
                    output_qspec=ACTIVATION, _annotated=True)
        return model

    def validate(self, model: fx.GraphModule) -> None:
        return None


class ConvLinearQuantizerInputChannels(ConvLinearQuantizer):
    """The bug: weights quantized per channel along the input channels."""

    weight_axis = 1



class DeadCodeQuantizer(ConvLinearQuantizer):
    """The bug (the state class: executorch#7515 eliminated a final ``buffer.copy_``): ``transform_for_annotation``,
    which ``prepare_pt2e`` runs before annotating, removes every node whose value nobody reads, the write-backs of
    the buffers the model updates in forward among them."""

    def transform_for_annotation(self, model: fx.GraphModule) -> fx.GraphModule:
        model.graph.eliminate_dead_code(is_impure_node=lambda node: node.op in ("placeholder", "output"))
        model.recompile()
        return model


class LayerNormDecomposingQuantizer(ConvLinearQuantizer):
    """:class:`ConvLinearQuantizer` after decomposing each ``layer_norm`` into ``(x - mean) * rsqrt(var + eps)``
    (times its weight, plus its bias), the variance with :attr:`correction`."""

    correction = 0  # layer_norm's variance divides by the count

    def transform_for_annotation(self, model: fx.GraphModule) -> fx.GraphModule:
        aten, graph = torch.ops.aten, model.graph
        for node in list(graph.nodes):
            if node.target is not aten.layer_norm.default:
                continue
            x, shape, weight, bias, eps = (*node.args, None, None, 1e-5)[:5]
            dims = list(range(-len(shape), 0))
            with graph.inserting_before(node):
                mean = graph.call_function(aten.mean.dim, (x, dims, True))
                var = graph.call_function(aten.var.correction, (x, dims),
                                          {"correction": self.correction, "keepdim": True})
                scale = graph.call_function(aten.rsqrt.default, (graph.call_function(aten.add.Scalar, (var, eps)),))
                out = graph.call_function(aten.mul.Tensor, (graph.call_function(aten.sub.Tensor, (x, mean)), scale))
                if weight is not None:
                    out = graph.call_function(aten.mul.Tensor, (out, weight))
                if bias is not None:
                    out = graph.call_function(aten.add.Tensor, (out, bias))
            node.replace_all_uses_with(out)
            graph.erase_node(node)
        model.recompile()
        return model


class LayerNormDecomposingQuantizerUnbiased(LayerNormDecomposingQuantizer):
    """The bug: ``torch.var``'s default correction, the unbiased variance."""

    correction = 1


TANH_RANGE = FixedQParamsQuantizationSpec(dtype=torch.int8, scale=2.0 / 256, zero_point=0, quant_min=-128,
                                          quant_max=127, qscheme=torch.per_tensor_affine)  # [-1, 1)
SIGMOID_RANGE = FixedQParamsQuantizationSpec(dtype=torch.int8, scale=1.0 / 256, zero_point=-128, quant_min=-128,
                                             quant_max=127, qscheme=torch.per_tensor_affine)  # [0, 1)


class TanhQuantizer(ConvLinearQuantizer):
    """:class:`ConvLinearQuantizer`, and each ``tanh`` quantized: its input as an activation, its output with the
    fixed parameters :attr:`output_range`."""

    output_range = TANH_RANGE

    def annotate(self, model: fx.GraphModule) -> fx.GraphModule:
        super().annotate(model)
        for node in model.graph.nodes:
            if node.target is torch.ops.aten.tanh.default:
                node.meta["quantization_annotation"] = QuantizationAnnotation(
                    input_qspec_map={node.args[0]: ACTIVATION}, output_qspec=self.output_range, _annotated=True)
        return model


class TanhQuantizerSigmoidRange(TanhQuantizer):
    """The bug: sigmoid's fixed parameters, ``[0, 1)``, for tanh's output."""

    output_range = SIGMOID_RANGE


class RebuildingQuantizer(ConvLinearQuantizer):
    """:class:`ConvLinearQuantizer` whose ``transform_for_annotation`` returns a new ``GraphModule``, as Arm's pass
    manager does: ``prepare_pt2e`` then returns a module over another graph than the one it was given, whose
    parameters its own conv-BN fold has already changed. Correct."""

    def transform_for_annotation(self, model: fx.GraphModule) -> fx.GraphModule:
        return fx.GraphModule(model, copy.deepcopy(model.graph))


class NeedsBackend(ConvLinearQuantizer):
    """A quantizer whose constructor takes an argument: named by its class, fxverify cannot make one."""

    def __init__(self, backend: str) -> None:
        super().__init__()
        self.backend = backend


def conv_linear_quantizer() -> ConvLinearQuantizer:
    """A factory, as ``--fxverify-quantizer`` takes one (not a transform)."""
    return ConvLinearQuantizer()
