"""qdq: a pass over a quantized graph leaves its quantize / dequantize nodes as sound as it found them.

What reads a q/dq graph after the pass (a lowering to integer kernels, ExecuTorch's XNNPACK delegate,
Inductor's quantization fusions) trusts what the pairs say: a dequantize reads the parameters its quantize
wrote, scales are positive and finite and zero points inside the range, a per-channel weight is quantized along
its consumer's output channels with one scale a channel, an op that only moves values keeps its input's
parameters, and after ``convert_pt2e`` no observer is left (:mod:`fxverify.analysis.qdq`). A wrong one computes
silently wrong numbers, or is refused only when the program is loaded on the device.

Each problem of the result that the captured graph does not have is the pass's (the quantizer's own are in the
graph it was given, and the capture's tests are where they belong); the first fails the check, naming the node,
the parameter and what it should be. Only under captures of quantized graphs (``pt2e``).
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


def check(subject: Subject) -> dict[str, Any]:
    applied = subject.applied()
    result = graph_result(applied.result, "no q/dq nodes to check")
    made = new_problems(applied.original, result)
    if made:
        raise problems_finding(made, "the graph's quantize / dequantize nodes", ADVICE)
    counted = sum(node.op == "call_function" and op_of(node) in QUANTIZE | DEQUANTIZE for node in result.graph.nodes)
    return {"qdq_nodes": counted, "problems_left_as_given": len(qdq_problems(applied.original))}
