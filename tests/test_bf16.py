"""bfloat16 corpus entries under the ``inductor`` capture (issue 34): a fusion pass without a dtype guard, right
in float32 and wrong only in bfloat16 (``tests/bf16_passes.py``), fails on the ``_bf16`` entry naming the model,
the check and the node, while its float32 twin passes; the dtype-guarded pass and the one that casts back pass
both."""

from __future__ import annotations

import pytest

import fxverify
from fxverify.core.results import FAILED, PASSED, SKIPPED
from fxverify.core.transform import Transform

FP32, BF16 = "edge_tiny_decoder_block", "edge_tiny_decoder_block_bf16"
CHECKS = ("numerics", "meta", "devices", "lint")  # gradients skip: inductor graphs are inference graphs


def _verification(spec: str, model: str) -> fxverify.Verification:
    case = fxverify.load_case(model)
    return fxverify.Verification(Transform.load(spec), case, capture=case.capture_named("inductor"))


@pytest.mark.slow
def test_an_rms_norm_fusion_without_a_dtype_guard_fails_on_bfloat16_only_naming_the_node():
    wrong = _verification("tests.bf16_passes:RMS_NORM_IN_FLOAT32", BF16)
    found = wrong.run("numerics")
    assert found.outcome == FAILED, found.message
    assert f"model:      {BF16}" in found.message and "numerics check failed" in found.message
    assert "expected m1 and m2 to have the same dtype, but got: float != c10::BFloat16" in found.message
    # the first node that runs wrong: the projection reading the float32 norm with its bfloat16 weight
    assert "target=torch.ops.aten.mm.default" in str(found.node) and f"first node: {found.node}" in found.message
    assert "in inference" in wrong.subject.changes
    float32 = _verification("tests.bf16_passes:RMS_NORM_IN_FLOAT32", FP32)
    assert [float32.run(check).outcome for check in CHECKS] == [PASSED] * len(CHECKS)
    assert "in inference" in float32.subject.changes  # it fired, and is right in float32 (and float64)


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["tests.bf16_passes:RMS_NORM_GUARDED", "tests.bf16_passes:RMS_NORM_CAST_BACK"])
@pytest.mark.parametrize("model", [FP32, BF16])
def test_the_guarded_and_the_cast_back_twins_pass_in_both_dtypes(spec, model):
    twin = _verification(spec, model)
    assert [twin.run(check).outcome for check in CHECKS] == [PASSED] * len(CHECKS)
    assert twin.run("gradients").outcome == SKIPPED
    fires = model == FP32 or spec.endswith("CAST_BACK")  # the guard keeps the bfloat16 norm as it is
    assert ("in inference" in twin.subject.changes) == fires, twin.subject.changes


def test_a_pass_declared_for_float32_is_not_run_on_a_bfloat16_model_and_says_why():
    """A contract's dtypes exclude a model's dtype: every item skips naming it (torch's optimize_for_inference,
    declared float32-only, asserts on a bfloat16 module: that is no defect of the pass)."""
    for model, expected in ((BF16, "skipped"), (FP32, "passed")):
        case = fxverify.load_case(model)
        result = fxverify.Verification(Transform.load("tests.bf16_passes:float32_only"), case).run("numerics")
        assert result.outcome.value == expected, result.message
    assert "the contract declares dtypes=float32: not run on a bfloat16 model" in fxverify.Verification(
        Transform.load("tests.bf16_passes:float32_only"), fxverify.load_case(BF16)).run("lint").message
