"""Quantizers under test (form ``quantizer``), written the way PT2E quantizer authors write them: a ``Quantizer``
subclass whose ``annotate`` sets each node's ``quantization_annotation`` and whose ``validate`` accepts the model.

- ``ConvLinearQuantizer`` quantizes the input, weight and output of each ``conv2d`` and ``linear`` to int8, each
  weight per channel along its output channels (dimension 0 of the weight): correct.
- ``ConvLinearQuantizerInputChannels`` quantizes the weights per channel along dimension 1, the input channels (the
  per-channel axis class: executorch#17842 took the wrong dimension for a transposed convolution): caught by
  ``qdq``, whose ``axis`` problem names the weight's quantize and the dimension to use;
- ``DeadCodeQuantizer`` drops the buffer write-backs before annotating: caught by ``stateful``.
"""

from __future__ import annotations

import torch
from torch import fx
from torchao.quantization.pt2e import MinMaxObserver, PerChannelMinMaxObserver
from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, QuantizationSpec, Quantizer

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


class NeedsBackend(ConvLinearQuantizer):
    """A quantizer whose constructor takes an argument: named by its class, fxverify cannot make one."""

    def __init__(self, backend: str) -> None:
        super().__init__()
        self.backend = backend


def conv_linear_quantizer() -> ConvLinearQuantizer:
    """A factory, as ``--fxverify-quantizer`` takes one (not a transform)."""
    return ConvLinearQuantizer()
