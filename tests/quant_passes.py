"""Passes over converted PT2E graphs, written the way torchao's and ExecuTorch's authors write them (a function
over the converted ``GraphModule``, edited in place, returning it), each buggy one beside its correct twin:

- ``fold_weight_dequants`` computes each constant weight's dequantize once (a float weight in place of the
  ``dequantize_per_channel`` of a frozen int8 weight), as lowering to a float backend does;
  ``fold_weight_dequants_first_scale`` dequantizes with the first channel's scale and zero point for every
  channel (a per-tensor habit): wrong numbers, caught by ``numerics``;
- ``scales_in_float16`` rounds every quantize's and dequantize's scale to float16 (a backend keeping its
  parameters in half precision); ``dequant_scales_in_float16`` rounds the dequantizes' only, so a dequantize
  no longer reads the scale its quantize wrote: caught by ``qdq`` (the numbers move by a fraction of a step);
- ``fold_relu_into_quantize`` drops a ``relu`` between a dequantize and a quantize, clamping the quantize before it
  at its zero point instead (the same numbers), where that quantize's value has no other reader;
  ``fold_relu_into_quantize_any_reader`` folds whatever else reads the value (the unsound-matching class:
  executorch#6894 fused a conv with its ReLU where the conv had another user): the other reader gets clamped
  values, caught by ``numerics``.
"""

from __future__ import annotations

import torch
import torch.ao.quantization.fx._decomposed
from torch import fx

QD = torch.ops.quantized_decomposed
PER_TENSOR = (QD.quantize_per_tensor.default, QD.dequantize_per_tensor.default)


def _fold_weight_dequants(gm: fx.GraphModule, *, first_scale: bool) -> fx.GraphModule:
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target != QD.dequantize_per_channel.default:
            continue
        weight, scales, zero_points = (getattr(gm, str(arg.target)) for arg in node.args[:3])
        axis, qmin, qmax, dtype = node.args[3:7]
        if first_scale:
            folded = (weight.float() - zero_points[0]) * scales[0]
        else:
            folded = QD.dequantize_per_channel.default(weight, scales, zero_points, axis, qmin, qmax, dtype)
        name = f"{node.name}_folded"
        gm.register_buffer(name, folded)
        with gm.graph.inserting_before(node):
            constant = gm.graph.get_attr(name)
        node.replace_all_uses_with(constant)
        gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def fold_weight_dequants(gm: fx.GraphModule) -> fx.GraphModule:
    return _fold_weight_dequants(gm, first_scale=False)


def fold_weight_dequants_first_scale(gm: fx.GraphModule) -> fx.GraphModule:
    return _fold_weight_dequants(gm, first_scale=True)


def _scales_in_float16(gm: fx.GraphModule, targets: tuple[object, ...]) -> fx.GraphModule:
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in targets:
            scale = float(torch.tensor(node.args[1], dtype=torch.float16))
            node.args = (node.args[0], scale, *node.args[2:])
    gm.recompile()
    return gm


def scales_in_float16(gm: fx.GraphModule) -> fx.GraphModule:
    return _scales_in_float16(gm, PER_TENSOR)


def dequant_scales_in_float16(gm: fx.GraphModule) -> fx.GraphModule:
    return _scales_in_float16(gm, PER_TENSOR[1:])


def x86_dynamic_quantizer() -> object:
    """torchao's X86InductorQuantizer with dynamic activations: their scale and zero point computed at run time."""
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as x86

    return x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config(is_dynamic=True))


def _fold_relu_into_quantize(gm: fx.GraphModule, *, any_reader: bool) -> fx.GraphModule:
    for relu in list(gm.graph.nodes):
        dequantize = relu.args[0] if relu.target == torch.ops.aten.relu.default else None
        if dequantize is None or dequantize.target != PER_TENSOR[1] or dequantize.args[0].target != PER_TENSOR[0]:
            continue
        quantize = dequantize.args[0]
        if not any_reader and (len(quantize.users) > 1 or len(dequantize.users) > 1):
            continue  # another reader needs the values below the zero point
        zero_point = quantize.args[2]
        for node in (quantize, *quantize.users):  # the range's low end at the zero point: relu in the integer domain
            node.args = (*node.args[:3], zero_point, *node.args[4:])
        relu.replace_all_uses_with(dequantize)
        gm.graph.erase_node(relu)
    gm.recompile()
    return gm


def fold_relu_into_quantize(gm: fx.GraphModule) -> fx.GraphModule:
    return _fold_relu_into_quantize(gm, any_reader=False)


def fold_relu_into_quantize_any_reader(gm: fx.GraphModule) -> fx.GraphModule:
    return _fold_relu_into_quantize(gm, any_reader=True)


def xnnpack_quantizer() -> object:
    """torchao's XNNPACKQuantizer (its test copy of ExecuTorch's), per-channel: it quantizes between a conv read
    twice and its ReLU."""
    from torchao.testing.pt2e._xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config

    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
