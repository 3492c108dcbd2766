"""The ``edge`` and ``edge_pt2e`` captures (ExecuTorch Edge programs): the identity passes, passes written as
ExecuTorch's authors write them are called as ``EdgeProgramManager.transform`` calls them, and each buggy pass of
:mod:`tests.edge_passes` fails first through the check meant for its class while its correct twin passes. Needs
executorch (the ``edge`` extra)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch", reason="the edge captures lower with ExecuTorch (the edge extra)")

import fxverify
from fxverify.capture.export import program_of
from fxverify.core.results import FAILED
from fxverify.core.transform import Transform
from fxverify.errors import TransformLoadError
from tests import edge_passes


def verification(transform, model: str, capture: str = "edge") -> fxverify.Verification:
    case = fxverify.load_case(model)
    return fxverify.Verification(transform, case, capture=case.capture_named(capture))


def failures(transform, model: str, capture: str = "edge") -> list[fxverify.CheckResult]:
    return [r for r in verification(transform, model, capture).run_all() if not r.ok]


@pytest.mark.parametrize("model", ["edge_conv_bn_head", "edge_channels_last_clone", "edge_counter_buffer"])
def test_the_identity_passes_every_check_under_edge(model):
    results = verification(fxverify.examples.identity, model).run_all()
    assert [r.message for r in results if not r.ok] == []
    numerics = next(r for r in results if r.check == "numerics")
    assert "eval mode only" in str(numerics.details["other_modes"])  # an Edge program is for inference


@pytest.mark.slow
def test_the_identity_passes_every_check_under_edge_pt2e():
    results = verification(fxverify.examples.identity, "edge_conv_bn_head", "edge_pt2e").run_all()
    assert [r.message for r in results if not r.ok] == []
    assert next(r for r in results if r.check == "qdq").details["qdq_nodes"] > 0  # Edge q/dq ops are read


TWINS = [  # buggy pass, its correct twin, the model, the check that must fail first, words of its finding
    (edge_passes.Relu6ForRelu, edge_passes.ClampForRelu, "edge_conv_bn_head", "numerics", "outputs differ"),
    (edge_passes.FoldViewsIntoMeansStaleMeta, edge_passes.FoldViewsIntoMeans, "edge_conv_bn_head", "meta",
     "%aten_mean_dim: meta['val'] says shape 2x8x1x1, re-propagating FakeTensors gives 2x8"),
    (edge_passes.ContiguousClones, edge_passes.ClonesInTheirInputsOrder, "edge_channels_last_clone", "purity",
     "layout changed"),
    (edge_passes.DropUnreadOutputs, edge_passes.DropDeadCode, "edge_counter_buffer", "stateful",
     "buffer 'count' after call 1"),
    (edge_passes.ClampForReluClaimingNoChange, edge_passes.ClampForRelu, "edge_conv_bn_head", "lint",
     "PassResult(modified=False) but changed"),
    (edge_passes.CopyOutputsEveryRun, edge_passes.CopyOutputsOnce, "edge_conv_bn_head", "idempotence",
     "running the pass again on its own result changes it again"),
]


@pytest.mark.parametrize(("buggy", "twin", "model", "check", "words"), TWINS, ids=[t[0].__name__ for t in TWINS])
def test_a_buggy_edge_pass_fails_first_through_its_check(buggy, twin, model, check, words):
    failed = failures(buggy, model)
    assert failed and failed[0].check == check and failed[0].outcome is FAILED, [(r.check, r.finding) for r in failed]
    assert words in failed[0].finding
    assert [r.message for r in failures(twin, model)] == []


@pytest.mark.slow
def test_a_dequantize_reading_another_scale_than_its_quantize_fails_qdq_under_edge_pt2e():
    failed = failures(edge_passes.DequantScalesInFloat16, "edge_conv_bn_head", "edge_pt2e")
    assert failed and failed[0].check == "qdq", [(r.check, r.finding) for r in failed]
    assert "a dequantize must read the parameters its quantize wrote" in failed[0].finding
    assert failures(edge_passes.ScalesInFloat16, "edge_conv_bn_head", "edge_pt2e") == []


def test_a_pass_class_is_instantiated_and_run_as_edge_program_manager_transform_runs_it():
    transform = Transform.load("tests.edge_passes:ClampForRelu")
    assert isinstance(transform.fn, edge_passes.ClampForRelu) and transform.reloadable
    applied = verification(transform, "edge_conv_bn_head").subject.applied()
    program = program_of(applied.result)
    targets = {str(node.target) for node in program.graph.nodes}
    assert any("clamp" in t for t in targets) and not any("relu" in t for t in targets)


def test_a_pass_class_needing_arguments_is_refused_naming_what_to_give():
    class NeedsProgram(edge_passes.ExportPass):
        def __init__(self, exported_program: torch.export.ExportedProgram) -> None:
            super().__init__()

    with pytest.raises(TransformLoadError, match="name an instance instead"):
        Transform.from_callable(NeedsProgram, "my_passes:NeedsProgram")


def test_a_result_the_edge_verifier_rejects_is_the_transform_raising_with_the_verifiers_words():
    class PlainAtenRelu(edge_passes.ExportPass):
        def call_operator(self, op, args, kwargs, meta):  # type: ignore[no-untyped-def]
            if op is edge_passes.EDGE.aten.relu.default:
                op = torch.ops.aten.relu.default  # not an Edge op
            return super().call_operator(op, args, kwargs, meta)

    failed = failures(PlainAtenRelu(), "edge_conv_bn_head")
    assert failed and failed[0].check == "lint"
    assert "aten.relu.default" in failed[0].finding and "raised" in failed[0].finding
