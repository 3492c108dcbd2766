"""What ``numerics`` holds a quantizer under test (form ``quantizer``) to: its result is the float model quantized, so
its outputs are not the float model's, and the error quantization accumulates over a model is no defect (measured in
docs/quantization.md: up to half the output's range on a model updating a buffer, 140 steps at another batch size,
with every quantizer tried). What is held to the float model instead, each with a tolerance that holds:

- **the quantized graph runs**: at every input configuration the result runs where the original runs, with outputs
  of the same structure, shapes and dtypes, finite where the original's are;
- **its float graph computes the float model's values**: ``prepare_pt2e`` with the quantizer (its
  ``transform_for_annotation``, the conv-BN fold, its observers, which pass values through) is a float transform,
  judged by ``numerics`` itself at every input configuration, to the first node that computes something else
  (where ``prepare_pt2e`` with a quantizer annotating nothing differs as well, the fault is torchao's own conv-BN
  fold, docs/bugs-found.md row 43, and that part is not judged on the model);
- **its parameters fit the values they quantize**: at the calibration inputs, each observer's parameters (those
  ``convert_pt2e`` writes into the quantize it becomes) represent the values it sees within rounding's half step,
  all but a few an observer may clip on purpose (:data:`CLIPPED`; :mod:`fxverify.analysis.clipping`).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from fxverify.analysis.clipping import clipping
from fxverify.analysis.compare import ANY_VALUE, compare_trees
from fxverify.capture.pt2e import CALIBRATION, Pt2e, prepared_with
from fxverify.checks._outputs import finding_of
from fxverify.core.contracts import Contract
from fxverify.core.results import Finding, ModuleRaised, Skip
from fxverify.core.transform import Transform
from fxverify.engine.subject import Subject

# the most of the values an observer sees at the calibration inputs that its parameters may clip: measured, a
# HistogramObserver (torchao's X86 and XNNPACK configs) clips at most 0.5% (mobilenet_v2); an observer calibrating on
# min / max clips none; parameters written for another range (sigmoid's for tanh) clip about half
CLIPPED = 0.1
VALUES = ("its outputs are the float model quantized, and quantization error accumulates over a model beyond any "
          "tolerance that would still catch a defect (docs/quantization.md): held to the float model instead are its "
          "float graph (prepare_pt2e) and its parameters at the calibration inputs")
NOT_THE_QUANTIZERS = ("prepare_pt2e changes this model's values with a quantizer annotating nothing too (its own "
                      "conv-BN fold: docs/bugs-found.md), so what the quantizer changes cannot be told apart here")
ADVICE = {
    "float": "a quantizer's transform_for_annotation must keep the model's values: rewrite or decompose an op into ops "
             "computing the same in float (quantization comes after, from the annotations)",
    "clipped": "give that edge a QuantizationSpec whose range covers its values: an observer that calibrates "
               "(MinMaxObserver, HistogramObserver), or fixed parameters written for that op's output range (sigmoid's "
               "[0, 1) does not fit tanh's [-1, 1)); a DerivedQuantizationSpec must derive the scale its consumer "
               "computes with (a bias: the input's scale times the weight's)",
}


def check(subject: Subject, *, float_check: Callable[[Subject], dict[str, Any]]) -> dict[str, Any]:
    """``numerics`` for a quantizer under test: the three promises of this module, in its order, the float graph
    judged by ``float_check`` (``numerics`` for a float transform)."""
    configs = _runs_alike(subject)
    try:
        judged = float_check(_prepared_subject(subject, subject.transform.fn, subject.transform.spec))
        float_graph: Any = {key: judged[key] for key in ("configs", "float64", "kept_nodes_compared")}
    except Finding as finding:
        try:  # prepare_pt2e's own steps (its conv-BN and linear-BN folds), which every quantizer gets
            float_check(_prepared_subject(subject, _annotating_nothing(), "a quantizer annotating nothing"))
        except Finding:
            float_graph = f"not judged: {NOT_THE_QUANTIZERS}"
        else:
            finding.what = (f"the quantizer's float graph (prepare_pt2e with it, before calibration) computes other "
                            f"numbers than the float model it was given: {finding.what}\nAdvice: {ADVICE['float']}")
            raise
    return {"configs": configs, "values": f"not compared: {VALUES}", "float_graph": float_graph,
            **_parameters_fit(subject)}


def _runs_alike(subject: Subject) -> list[str]:
    """The result at every input configuration: runs where the original runs, outputs of its structure, shapes and
    dtypes, finite where the original's are."""
    for config in subject.configs:
        where = f"{config.describe()}, {subject.dtype}, {subject.contract.primary_mode} mode"
        with torch.no_grad():
            expected = subject.outputs("original", config)
            actual = ModuleRaised.guard("result", where, functools.partial(subject.outputs, "result", config))
        found = compare_trees(actual, expected, tolerance=ANY_VALUE)
        if found is not None:
            finding = finding_of(found, where)
            finding.what += f"\n(values are not compared: {VALUES})"
            raise finding
    return [config.name for config in subject.configs]


def _prepared_subject(subject: Subject, quantizer: Any, named: str) -> Subject:
    """``prepare_pt2e`` with ``quantizer`` (``named``), as a float transform of the model's float export."""
    if not isinstance(subject.capture, Pt2e):
        raise Skip(f"a quantizer is judged under the pt2e capture, not {subject.capture.name}")
    prepare = Transform(fn=functools.partial(prepared_with, quantizer), spec=f"prepare_pt2e with {named}",
                        contract=Contract(modes=subject.contract.modes, changes_parameters=True),
                        takes_tracer_class=False)
    return Subject(prepare, subject.case, timeout=subject.timeout, settings=subject.settings,
                   capture=subject.capture.float_export())


def _annotating_nothing() -> Any:
    """A PT2E quantizer that annotates nothing: ``prepare_pt2e`` with it runs its own steps alone."""
    from torchao.quantization.pt2e.quantizer import Quantizer

    class AnnotatesNothing(Quantizer):
        def annotate(self, model: fx.GraphModule) -> fx.GraphModule:
            return model

        def validate(self, model: fx.GraphModule) -> None:
            return None

    return AnnotatesNothing()


def _parameters_fit(subject: Subject) -> dict[str, Any]:
    """Each observer's parameters against the values it sees at the calibration inputs (a fresh prepared graph,
    calibrated as the quantizer under test was)."""
    source = subject.capture_source(subject.contract.primary_mode)
    inputs = source.meta[CALIBRATION]
    found = clipping(prepared_with(subject.transform.fn, copy.deepcopy(source)), inputs)
    clipped = [each for each in found if each.fraction > CLIPPED]
    if clipped:
        first = clipped[0]
        also = "".join(f"\n  also: {each.describe()}" for each in clipped[1:4])
        raise Finding(f"at the calibration inputs ({subject.primary.describe()}), the parameters of {len(clipped)} of "
                      f"the quantizer's {len(found)} observers clip more than {CLIPPED:.0%} of the values it sees, by "
                      f"more than a step (rounding moves a value half a step); the first: {first.describe()}{also}. "
                      f"Advice: {ADVICE['clipped']}", input=subject.primary.describe(), node=first.source,
                      details={"clipped": [each.describe() for each in clipped]})
    worst = max(found, key=lambda each: each.fraction, default=None)
    return {"observers_judged": len(found),
            "most_clipped": f"{worst.fraction:.2%} ({worst.target})" if worst is not None else "none"}
