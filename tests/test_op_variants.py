"""Op-variant coverage (issue 35): the ops a transform rewrote and the variants of them it left untouched,
counted by fxverify.analysis.op_variants, judged per model by the variants check (a failure only under the
contract's rewrites_every_occurrence promise) and added up over the models into the summary's warning, the
JSON report's op_coverage and a line of the HTML report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

import fxverify
from fxverify.analysis.op_variants import OP_COUNTS, coverage, op_counts, spelled_target, spelling, variant_kind
from fxverify.core.results import CheckResult
from fxverify.reports.html import render_html
from fxverify.reports.records import json_report, record
from tests import aten_passes

ATEN = Path(__file__).with_name("aten_passes.py")


class ReluTwins(nn.Sequential):
    """Both ATen spellings under export: ``nn.ReLU()`` is ``aten.relu.default``, ``nn.ReLU(inplace=True)``
    ``aten.relu_.default``."""

    def __init__(self) -> None:
        super().__init__(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(inplace=True))


class ThreeSpellings(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x) + F.relu(x - 1) + torch.relu(x * 2) + (x + 1).relu()


def f_relu_only(gm: fx.GraphModule) -> fx.GraphModule:
    """A torch-level pass matching ``F.relu`` only: nn.ReLU, torch.relu and x.relu() are left."""
    for node in gm.graph.find_nodes(op="call_function", target=F.relu):
        node.target, node.kwargs = torch.clamp, {"min": 0.0}
    gm.recompile()
    return gm


def _twins_case() -> fxverify.ModelCase:
    return fxverify.case_from_module("relu_twins", ReluTwins, [(2, 4)])


def _variants(transform, case, capture=None) -> CheckResult:
    return fxverify.Verification(transform, case, capture=capture).run("variants")


# -- the analysis ----------------------------------------------------------------------------------
def test_targets_are_named_by_their_spelling_and_counted():
    gm = fx.symbolic_trace(ThreeSpellings())
    assert op_counts(gm) == {"nn.ReLU": 1, "operator.sub": 1, "F.relu": 1, "operator.mul": 1, "torch.relu": 1,
                             "operator.add": 4, "Tensor.relu": 1}
    assert [spelled_target(n, gm) for n in gm.graph.nodes][:2] == [None, "nn.ReLU"]  # a placeholder calls nothing
    assert {spelling(name).family for name in ("nn.ReLU", "F.relu", "torch.relu", "Tensor.relu", "Tensor.relu_")} == \
        {"relu"}
    assert spelling("aten.relu_.default").family == spelling("aten.relu.default").family != spelling("F.relu").family


@pytest.mark.parametrize(("rewritten", "left", "kind"), [
    ("aten.relu.default", "aten.relu_.default", "in-place twin"),
    ("aten.relu_.default", "aten.relu.default", "functional twin"),
    ("aten.add.Tensor", "aten.add.Scalar", "other overload"),
    ("aten.add.Tensor", "aten.add.out", "out= variant"),
    ("aten.add.Tensor", "aten.add.Tensor", "the same op"),
    ("F.relu", "nn.ReLU", "module spelling"),
    ("nn.ReLU", "Tensor.relu", "method spelling"),
    ("nn.ReLU", "torch.relu", "function spelling"),
    ("Tensor.add", "operator.iadd", "in-place twin"),
    ("nn.BatchNorm2d", "F.batch_norm", "function spelling"),
    ("operator.truediv", "torch.div", "function spelling"),
    ("aten.relu.default", "aten.gelu.default", None),
    ("aten.relu.default", "F.relu", None),
    ("aten.__and__.Tensor", "aten.__and__.Scalar", "other overload"),
])
def test_variant_kinds(rewritten, left, kind):
    assert variant_kind(rewritten, left) == kind


def test_a_variant_left_in_one_model_counts_against_an_op_rewritten_in_another():
    found = coverage({
        "small": {"before": {"aten.relu.default": 2, "aten.mm.default": 1},
                  "after": {"aten.clamp_min.default": 2, "aten.mm.default": 1}},
        "resnet": {"before": {"aten.relu_.default": 17}, "after": {"aten.relu_.default": 17}},
        "both": {"before": {"aten.relu.default": 1, "aten.relu_.default": 2},
                 "after": {"aten.clamp_min.default": 1, "aten.relu_.default": 2}},
    })
    assert [(r.op, r.count, r.models) for r in found.rewrote] == [("aten.relu.default", 3, ("small", "both"))]
    assert [(f.op, f.kind, f.of, f.count, f.models) for f in found.left] == [
        ("aten.relu_.default", "in-place twin", "aten.relu.default", 19, ("resnet", "both"))]
    assert found.describe().startswith("rewrote aten.relu.default x3 in 2 models; left aten.relu_.default x19 in 2 "
                                       "models: in-place twin (resnet, both)")


def test_what_a_transform_rewrites_to_and_what_it_rewrote_everywhere_are_never_left():
    made_functional = {"m": {"before": {"aten.relu_.default": 2, "aten.relu.default": 1},
                             "after": {"aten.relu.default": 3}}}
    assert coverage(made_functional).left == () and coverage(made_functional).describe() == ""
    both = {"m": {"before": {"aten.relu_.default": 2, "aten.relu.default": 1},
                  "after": {"aten.clamp_min_.default": 2, "aten.clamp_min.default": 1}}}
    assert coverage(both).left == () and [r.op for r in coverage(both).rewrote] == ["aten.relu_.default",
                                                                                    "aten.relu.default"]
    assert coverage({"m": {"before": {"aten.mm.default": 1}, "after": {"aten.mm.default": 1}}}).rewrote == ()


# -- the check, through the API --------------------------------------------------------------------
def test_a_pass_keyed_on_one_overload_is_warned_by_default_and_fails_under_the_promise():
    case = _twins_case()
    export = case.capture_named("export")
    default = _variants(aten_passes.relu_default_only, case, export)
    assert default.outcome == "passed", default.message
    assert default.details["left"] == ["aten.relu_.default x1: in-place twin of aten.relu.default"]
    assert default.details[OP_COUNTS]["before"]["aten.relu.default"] == 1
    promised = _variants(aten_passes.relu_default_only_every_occurrence, case, export)
    assert promised.outcome == "failed"
    assert ("rewrote aten.relu.default x1 and left aten.relu_.default x1 untouched (in-place twin of "
            "aten.relu.default)") in promised.message
    assert promised.node and "torch.ops.aten.relu_.default" in promised.node
    assert promised.details[OP_COUNTS]  # still handed to the summary


def test_a_pass_rewriting_every_overload_passes_under_the_promise():
    case = _twins_case()
    every = fxverify.contract(rewrites_every_occurrence=True)(aten_passes._relu_to_clamp_min_pass)
    result = _variants(every, case, case.capture_named("export"))
    assert result.outcome == "passed", result.message
    assert result.details["rewrote"] == {"aten.relu.default": 1, "aten.relu_.default": 1}
    assert result.details["left"] == []


def test_torch_level_spellings_left_by_a_pass_matching_one_fail_under_the_promise():
    case = fxverify.case_from_module("three_spellings", ThreeSpellings, [(2, 4)])
    assert _variants(f_relu_only, case).outcome == "passed"
    result = _variants(fxverify.contract(rewrites_every_occurrence=True)(f_relu_only), case)
    assert result.outcome == "failed"
    assert "rewrote F.relu x1 and left" in result.message
    for left in ("nn.ReLU x1 (module spelling of F.relu)", "torch.relu x1 (function spelling of F.relu)",
                 "Tensor.relu x1 (method spelling of F.relu)"):
        assert left in result.message.replace("untouched (", "("), result.message


def test_the_contract_promise_is_described_and_validated():
    assert "rewrites_every_occurrence=yes" in fxverify.Contract(rewrites_every_occurrence=True).describe()
    assert "rewrites_every_occurrence" not in fxverify.Contract().describe()
    with pytest.raises(fxverify.FxVerifyError, match="rewrites_every_occurrence must be True or False"):
        fxverify.Contract(rewrites_every_occurrence="yes")


def test_the_html_report_prints_the_warning_above_the_matrix():
    counts = {"before": {"aten.relu.default": 2, "aten.relu_.default": 5}, "after": {"aten.relu_.default": 5}}
    found = record(CheckResult("variants", "m", "my:pass", "passed", "", capture="export", details={OP_COUNTS: counts}))
    assert found[OP_COUNTS] == counts
    page = render_html([found])
    assert "left aten.relu_.default x5 in 1 model: in-place twin" in page
    assert json_report([found])["op_coverage"]["my:pass"]["left"][0]["count"] == 5
    assert "op_coverage" in json_report([]) and json_report([])["op_coverage"] == {}


# -- through the plugin ----------------------------------------------------------------------------
TWINS_CONFTEST = """
    import fxverify

    def pytest_fxverify_models(config):
        return [fxverify.CorpusEntry(name="relu_twins", source="user", factory="twin_models:ReluTwins",
                                     inputs=(fxverify.InputSpec((2, 4)),))]
"""
TWINS_MODELS = """
    from torch import nn

    class ReluTwins(nn.Sequential):
        def __init__(self):
            super().__init__(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(inplace=True))
"""


@pytest.mark.slow
def test_the_summary_warns_per_transform_and_the_promise_fails_the_models_with_both(pytester, monkeypatch):
    pytester.makeconftest(TWINS_CONFTEST)
    pytester.makepyfile(twin_models=TWINS_MODELS)
    monkeypatch.setenv("PYTHONPATH", str(pytester.path))
    report = pytester.path / "report.json"
    passes = ("relu_default_only", "relu_default_only_every_occurrence", "relu_to_clamp_min")
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", *[arg for name in passes for arg in ("--fxverify", f"{ATEN}:{name}")],
        "--fxverify-corpus=edge_conv_bn_head,edge_inplace_ops,relu_twins", "--fxverify-capture=export",
        "--fxverify-checks=variants", f"--fxverify-json={report}")
    warning = ("WARNING: {}:{} rewrote aten.relu.default x3 in 2 models; left aten.relu_.default x4 in 2 models: "
               "in-place twin (edge_inplace_ops@export, relu_twins@export)")
    result.stdout.fnmatch_lines([warning.format(ATEN, "relu_default_only") + "*",
                                 warning.format(ATEN, "relu_default_only_every_occurrence") + "*"])
    assert f"WARNING: {ATEN}:relu_to_clamp_min" not in result.stdout.str()  # it rewrote both: nothing left
    records = json.loads(report.read_text())
    outcomes = {(r["transform"].rpartition(":")[2], r["model"]): r for r in records["records"]}
    failed = {key for key, r in outcomes.items() if r["outcome"] == "failed"}
    assert failed == {("relu_default_only_every_occurrence", "relu_twins@export")}, failed
    found = outcomes["relu_default_only_every_occurrence", "relu_twins@export"]
    assert "left aten.relu_.default x1 untouched" in found["message"] and "aten.relu_.default" in found["node"]
    left = records["op_coverage"][f"{ATEN}:relu_default_only"]["left"]
    assert [(f["op"], f["kind"], f["count"]) for f in left] == [("aten.relu_.default", "in-place twin", 4)]
    assert records["op_coverage"][f"{ATEN}:relu_to_clamp_min"]["left"] == []
    assert result.ret == 1
