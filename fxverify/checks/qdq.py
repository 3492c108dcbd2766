"""qdq: a pass over a quantized graph leaves its quantize / dequantize nodes as sound as it found them.

What reads a q/dq graph after the pass (a lowering to integer kernels, ExecuTorch's XNNPACK delegate,
Inductor's quantization fusions) trusts what the pairs say: a dequantize reads the parameters its quantize
wrote, scales are positive and finite and zero points inside the range, a per-channel weight is quantized along
its consumer's output channels with one scale a channel, an op that only moves values keeps its input's
parameters, and after ``convert_pt2e`` no observer is left (:mod:`fxverify.analysis.qdq`). A wrong one computes
silently wrong numbers, or is refused only when the program is loaded on the device.

Each problem of the result that the captured graph does not have is the pass's (the quantizer's own are in the
graph it was given, and the capture's tests are where they belong); the first fails the check, naming the node,
the parameter and what it should be. Only under captures of quantized graphs (``pt2e``). A quantizer under test
(form ``quantizer``) is given the float graph, so every problem of its result is its own but ``sharing`` (which ops
share parameters is its choice), and the advice is said in its terms (the ``QuantizationSpec`` to write).
"""

from __future__ import annotations

from typing import Any

from fxverify.analysis.qdq import DEQUANTIZE, QUANTIZE, new_problems, op_of, qdq_problems
from fxverify.checks._common import graph_result, problems_finding
from fxverify.engine.subject import Subject

ADVICE = {
    "pairing": "a pass that moves, merges or re-creates q/dq nodes must carry the quantize's parameters to each "
               "of its dequantizes (copy its args, do not recompute them)",
    "parameters": "compute parameters as the quantizer's observers do (scale > 0, zero point in [qmin, qmax]), or "
                  "copy them from the nodes the pass replaces",
    "axis": "quantize a weight along its consumer's output-channel dimension (conv and linear: 0; a transposed "
            "convolution: 1, per tensor where it has groups), one scale a channel",
    "sharing": "an op that only moves values (cat, a view, a permute, max pooling) keeps the parameters of its input: "
               "give its quantize the dequantize's",
    "observer": "run convert_pt2e after the pass, or have the pass leave the graph converted",
}


QUANTIZER_ADVICE = {  # for a quantizer under test (form quantizer), whose annotations convert_pt2e turned into the nodes
    "pairing": "annotate edges that must agree with one SharedQuantizationSpec, and compute a DerivedQuantizationSpec's "
               "parameters from the observers it derives from",
    "parameters": "give each QuantizationSpec a quant_min / quant_max inside its dtype's range and an observer whose "
                  "eps keeps the scale positive",
    "axis": "give a weight's per-channel QuantizationSpec (and its observer) ch_axis = its consumer's output-channel "
            "dimension (conv and linear: 0; a transposed convolution: 1, per tensor where it has groups)",
    "observer": "annotate with observers or fake quantizes convert_pt2e converts (torchao.quantization.pt2e's)",
}
# which ops share their input's parameters is a quantizer's choice, not a promise: torchao's test XNNPACKQuantizer
# leaves cat unannotated, and its reader quantizes cat's output with its own observer (measured: test_vit)
NOT_A_QUANTIZERS_PROMISE = {"sharing"}


def check(subject: Subject) -> dict[str, Any]:
    applied = subject.applied()
    result = graph_result(applied.result, "no q/dq nodes to check")
    quantizer = subject.transform.form == "quantizer"
    made = [problem for problem in new_problems(applied.original, result)
            if not (quantizer and problem.kind in NOT_A_QUANTIZERS_PROMISE)]
    if made:
        raise problems_finding(made, "the graph's quantize / dequantize nodes", QUANTIZER_ADVICE if quantizer else ADVICE,
                               quantizer=quantizer)
    counted = sum(node.op == "call_function" and op_of(node) in QUANTIZE | DEQUANTIZE for node in result.graph.nodes)
    return {"qdq_nodes": counted, "problems_left_as_given": len(qdq_problems(applied.original))}
