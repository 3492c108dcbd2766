"""observers: a pass over a PT2E prepared graph (before calibration) leaves its observers as ``prepare_pt2e`` made
them promise.

What comes after such a pass (calibration, ``convert_pt2e``, a lowering to quantized kernels) trusts the observers:
every edge the quantizer annotated is observed (else no q/dq pair stands there and the op runs in float), one
observer module a sharing group (else its edges get different scales, and a ``cat`` or ``max_pool2d`` is requantized),
no observer where nobody asked for one and none observing another (:mod:`fxverify.analysis.observers`). Then the flow
must still complete: the result calibrated on the primary inputs and converted gives no quantize / dequantize
problem the original's converted graph lacks (:func:`fxverify.analysis.qdq.new_problems`), and outputs within two
quantization steps of the original's converted graph (:func:`fxverify.capture.pt2e.stepped_tolerance`).

Everything is compared with the prepared graph the pass was given: what the quantizer did there is not the pass's.
A failure names the node, the observer, what is wrong and the fix. Only under ``pt2e_prepared`` (the ``observed``
trait).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from fxverify.analysis.compare import Tolerance, compare_trees
from fxverify.analysis.observers import observer_count, observer_problems
from fxverify.analysis.qdq import new_problems
from fxverify.capture.pt2e import calibrated_and_converted, stepped_tolerance
from fxverify.checks._common import graph_result, problems_finding
from fxverify.checks.qdq import ADVICE as QDQ_ADVICE
from fxverify.core.results import Finding, Skip, exception_summary
from fxverify.engine.subject import Subject

OBSERVED_ATTRS = "_observed_graph_module_attrs"  # gm.meta key prepare_pt2e sets and convert_pt2e asserts

ADVICE = {
    "unobserved": "keep every annotated edge observed: insert a new op before the observer (make the observer read "
                  "the new op, so it observes what the consumer reads), or observe the new op's output with the "
                  "observer module the edge had",
    "split": "let every edge of a sharing group call the same observer module (a new node may call it again: "
             "graph.call_module(node.target, ...)); never give a user a copy.deepcopy of an observer",
    "merged": "give each edge the observer module prepare_pt2e gave it: edges of different groups are calibrated apart",
    "unannotated": "observe only the edges the quantizer annotated (node.meta['quantization_annotation']); a new op "
                   "that needs observing needs an annotation, and prepare_pt2e to place its observer",
    "chained": "observe the value itself, not an observer's output: read the first observer's input",
}


def check(subject: Subject) -> dict[str, Any]:
    applied = subject.applied()
    result = graph_result(applied.result, "no observers to check")
    if observer_count(applied.original)[0] == 0:
        raise Skip("prepare_pt2e placed no observer in this model (its quantizer annotated nothing here): no observer "
                   "for a pass to keep; select models the quantizer quantizes (--fxverify-corpus quantization)")
    made = observer_problems(applied.original, result)
    if made:
        raise problems_finding(made, "the observers prepare_pt2e placed", ADVICE)
    converted = _flow(subject)
    observers, modules = observer_count(result)
    return {"observers": observers, "observer_modules": modules, **converted}


def _flow(subject: Subject) -> dict[str, Any]:
    """The original and the result, each a fresh copy, calibrated on the primary inputs and converted."""
    mode = subject.applied().mode
    source = subject.capture_source(mode)  # never run: both calibrate from the same empty observers
    inputs = subject.primary.make(subject.case.seed)
    try:
        original = calibrated_and_converted(copy.deepcopy(source), inputs)
    except Exception as exc:
        raise Skip(f"the captured prepared graph does not calibrate and convert ({exception_summary(exc)}): the "
                   "quantizer's flow fails on this model before any pass, which says nothing of the pass") from exc
    result = graph_result(subject.transformed_copy(source, mode), "nothing to convert")
    if OBSERVED_ATTRS in source.meta and OBSERVED_ATTRS not in result.meta:
        raise Finding(f"the result lost gm.meta[{OBSERVED_ATTRS!r}], prepare_pt2e's record that convert_pt2e asserts "
                      "(\"incoming model must be produced by prepare_fx\"): its users cannot convert it. Advice: edit "
                      "the prepared GraphModule in place, or copy gm.meta to the GraphModule the pass builds "
                      "(new.meta.update(gm.meta))")
    try:
        converted = calibrated_and_converted(result, inputs)
    except Exception as exc:
        raise Finding(f"the result, calibrated on {subject.primary.describe()}, raises {exception_summary(exc)} in "
                      "calibration or convert_pt2e, where the graph the pass was given converts. Advice: leave a "
                      "graph prepare_pt2e's convert takes: observers as call_module nodes reading the value they "
                      "observe, the quantizer's annotations kept") from exc
    made = new_problems(original, converted)
    if made:
        raise problems_finding(made, "the quantize / dequantize nodes of the result calibrated and converted",
                               QDQ_ADVICE)
    tolerance = stepped_tolerance(original) or Tolerance()
    with torch.no_grad():
        mismatch = compare_trees(converted(*inputs), original(*inputs), tolerance=tolerance)
    if mismatch is not None:
        raise Finding(f"the result calibrated on {subject.primary.describe()} and converted computes other numbers "
                      f"than the graph the pass was given, calibrated and converted alike: {mismatch.describe()} "
                      f"(tolerance: atol {tolerance.atol}, two quantization steps). Advice: a pass before "
                      "calibration must leave what each observer sees as it was, so that convert gives the same "
                      "scales", details={"mismatch": mismatch.describe()})
    return {"converted": f"calibrated on {subject.primary.describe()}, converted and compared (atol {tolerance.atol})"}
