"""Pattern fuzzing (``fxverify.check_patterns``): each re-created bug class of issue 34 is caught by the check
meant for it, naming the pattern, the variant and the first bad node, while its correct twin and the correct
passes give no failure. The passes are in ``tests/compile_patterns.py``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis.database import DirectoryBasedExampleDatabase
from torch._inductor.pattern_matcher import fwd_only, register_replacement

import fxverify
from fxverify.compile.pattern_sources import pattern_examples
from fxverify.compile.pattern_variants import Variant
from fxverify.compile.patterns import COMPLETE, SOUND, Fuzzer, UnsoundRewrite, judge, soundness_test
from fxverify.core.results import Outcome
from fxverify.errors import TransformLoadError

ROOT = Path(__file__).resolve().parent.parent
SPEC = "tests.compile_patterns:{}"

# (buggy pass, its correct twin, the check meant for it, a phrase of the variant, of the finding, the first node)
BUGS = [
    pytest.param("channel_dim_by_size", "channel_dim_fixed", SOUND, "made equal on purpose", "values differ",
                 "%permute", id="unsound-on-coinciding-sizes"),
    pytest.param("rms_norm_unguarded", "rms_norm_guarded", SOUND, "bfloat16", "expected torch.float32",
                 "%fused_rms_norm", id="missing-dtype-guard"),
    pytest.param("leaky_relu_slope_dropped", "leaky_relu_slope_kept", SOUND, "as registered", "values differ",
                 "%gt", id="dropped-constant"),
    pytest.param("silu_one_order", "silu_both_orders", COMPLETE, "operands swapped", "NOT fired",
                 "aten.mul.Tensor#0", id="never-fires-on-a-spelling"),
    pytest.param("scaled_two_outputs", "scaled_one_output_each", SOUND, "computed just before its first use",
                 "used before it has been defined", "%mul", id="multi-output-out-of-order"),
    pytest.param("silu_native_only", "silu_native_and_custom_op", COMPLETE, "spelled as custom_op", "NOT fired",
                 None, id="never-fires-on-a-custom-op-spelling"),
    pytest.param("gelu_detached_backward", "gelu_fused", SOUND, "as registered", "output['gradient of input 0']",
                 "%mul_tensor", id="training-pattern-wrong-backward"),
]


def failures(spec: str, **kwargs: object) -> list[fxverify.CheckResult]:
    return [r for r in fxverify.check_patterns(spec, max_examples=10, **kwargs) if not r.ok]  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize(("buggy", "twin", "check", "variant", "finding", "node"), BUGS)
def test_each_bug_class_is_caught_by_its_check_and_its_twin_passes(buggy, twin, check, variant, finding, node):
    found = failures(SPEC.format(buggy))
    assert found, f"{buggy} passed pattern fuzzing"
    first = found[0]
    assert first.check == check, first.message
    assert variant in first.input and finding in first.message, first.message
    assert first.model in first.message and "search function" in first.message or check == COMPLETE
    if node is not None:
        assert first.node is not None and first.node.startswith(node), first.node
    assert failures(SPEC.format(twin)) == []


@pytest.mark.slow
@pytest.mark.parametrize("correct", ["double_to_scale", "INDUCTOR_ADDMM"])
def test_correct_passes_give_no_failure(correct):
    results = fxverify.check_patterns(SPEC.format(correct), max_examples=20)
    assert [r.outcome for r in results] == [Outcome.PASSED] * len(results)
    assert results[0].details["fired"] > 0  # the pass was exercised, not silently skipped


def double(pass_dict):
    register_replacement(lambda x: x + x, lambda x: x * 2, [torch.randn(4, 3)], fwd_only, pass_dict)


def relu_to_clamp(pass_dict):
    register_replacement(lambda x: x.relu(), lambda x: x.clamp_min(0.5), [torch.randn(4, 3)], fwd_only, pass_dict)


def test_a_sound_pass_passes_and_says_what_it_judged():
    sound, complete = fxverify.check_patterns(double, max_examples=0)
    assert (sound.check, sound.outcome, complete.outcome) == (SOUND, Outcome.PASSED, Outcome.PASSED)
    assert sound.details["fired"] == sound.details["judged"] > 5


def test_a_wrong_replacement_fails_on_its_own_program_naming_the_inserted_node():
    sound = fxverify.check_patterns(relu_to_clamp, max_examples=0)[0]
    assert sound.outcome is Outcome.FAILED and sound.input == "as registered (the example inputs)"
    assert sound.node == "%clamp_min_default (aten.clamp_min.default)"
    assert "does not compute what the search function computes" in sound.message


def test_a_pattern_that_never_fires_on_its_own_program_fails_completeness():
    def same_tensor_twice(pass_dict):  # the same example tensor for both inputs binds x and y to one name
        inputs = [torch.randn(4, 8)] * 2
        register_replacement(lambda x, y: x * y + y, lambda x, y: torch.addcmul(y, x, y), inputs, fwd_only, pass_dict)

    complete = fxverify.check_patterns(same_tensor_twice, max_examples=0)[1]
    assert complete.outcome is Outcome.FAILED and "does not fire on its own search function" in complete.message


def test_forms_that_keep_no_search_function_are_refused_with_what_to_give():
    from torch._inductor.pattern_matcher import PatternMatcherPass

    with pytest.raises(TransformLoadError, match="keeps the patterns it was given but not the search functions"):
        fxverify.check_patterns(PatternMatcherPass())
    with pytest.raises(TransformLoadError, match="registered no pattern"):
        fxverify.check_patterns(lambda pass_dict: None)
    with pytest.raises(TransformLoadError, match="raised ValueError: broken"):
        fxverify.check_patterns(_raises)
    with pytest.raises(TransformLoadError, match="patterns spec 'tests.nowhere:x': cannot import"):
        fxverify.check_patterns("tests.nowhere:x")


def _raises(pass_dict):
    raise ValueError("broken")


@pytest.mark.slow
def test_hypothesis_shrinks_a_failing_combination_and_keeps_it_in_the_database(tmp_path):
    pattern = pattern_examples(fxverify.compile.patterns.load_object(SPEC.format("channel_dim_by_size")), "channel")[0]
    database = DirectoryBasedExampleDatabase(str(tmp_path / "db"))
    test = soundness_test(Fuzzer(pattern), max_examples=200, database=database, sweep=False)
    with pytest.raises(UnsoundRewrite) as raised:
        test()
    shrunk = raised.value.variant
    assert shrunk.sizes and not shrunk.edits and shrunk.strided is None and shrunk.broadcast is None, shrunk
    assert any((tmp_path / "db").rglob("*")), "the failing variant was not saved"


@pytest.mark.slow
def test_the_repro_script_fails_alone_while_the_pattern_is_unsound(tmp_path):
    sound = fxverify.check_patterns(SPEC.format("channel_dim_by_size"), max_examples=0, repro_dir=tmp_path)[0]
    assert sound.repro is not None and Path(sound.repro).exists()
    ran = subprocess.run([sys.executable, sound.repro], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ran.returncode != 0 and "AssertionError" in ran.stderr and "values differ" in ran.stderr


@pytest.mark.slow
def test_inductors_attention_fusion_matches_a_key_it_does_not_transpose_when_sizes_coincide():
    """pytorch issue 195320's root cause: the shipped (serialized) SDPA pattern leaves the key's permutation
    unpinned. With head_dim == seq_len, ``q @ k.permute(0, 1, 2, 3)`` (a key stored transposed) is fused as
    ``q @ k.transpose(-2, -1)``; torch.compile of the same program is off by about 5 here."""
    from torch._inductor.fx_passes import fuse_attention

    rows = [row for row in fuse_attention._get_sfdp_patterns() if row[0] == "_sfdp_pattern_1_inference"]
    pattern = pattern_examples(rows, "sfdp")[0]
    untransposed = next(e for e in Fuzzer(pattern).edits if e.kind == "dims" and e.value == (0, 1, 2, 3))
    coinciding = judge(pattern, Variant(sizes=((16, 8),), numbers=True, edits=(untransposed,)))
    assert coinciding is not None and coinciding.fired and "values differ" in (coinciding.problem or "")
    as_written = judge(pattern, Variant(sizes=((16, 8),), numbers=True))
    assert as_written is not None and as_written.fired and as_written.problem is None


def _sfdp(name: str):  # type: ignore[no-untyped-def]
    from torch._inductor.fx_passes import fuse_attention

    return pattern_examples([row for row in fuse_attention._get_sfdp_patterns() if row[0] == name], "sfdp")[0]


@pytest.mark.slow
def test_inductors_training_attention_patterns_are_fuzzed_on_the_joint_graph():
    """A joint_fwd_bwd pattern is judged on the joint graph (outputs and gradients): pattern 1's training twin
    fires on coinciding sizes and is sound there, and does not fire on the untransposed key its inference twin
    fuses (the backward's permutation pins it); pattern 4 draws dropout's random numbers, so its rewrite is
    judged by dtype and shape, saying so."""
    attention = _sfdp("_sfdp_pattern_1_training")
    untransposed = next(e for e in Fuzzer(attention).edits if e.kind == "dims" and e.value == (0, 1, 2, 3))
    coinciding = judge(attention, Variant(sizes=((16, 8),), numbers=True))
    assert coinciding is not None and coinciding.fired and coinciding.problem is None and coinciding.how == ""
    keyed = judge(attention, Variant(sizes=((16, 8),), numbers=True, edits=(untransposed,)))
    assert keyed is not None and not keyed.fired
    dropout = judge(_sfdp("_sfdp_pattern_4_training"), Variant(numbers=True))
    assert dropout is not None and dropout.fired and dropout.how == "random" and dropout.problem is None


def test_scalar_workaround_arguments_are_traced_as_torch_traces_them():
    """register_replacement's scalar_workaround values join the example inputs at their own parameters (before,
    a search function taking one failed to trace at all)."""
    scaled = _sfdp("_sfdp_pattern_5_inference")
    assert [type(value).__name__ for value in scaled.traced_inputs()] == ["Tensor"] * 4 + ["float"]
    verdict = judge(scaled, Variant(numbers=True))
    assert verdict is not None and verdict.fired and verdict.problem is None


def test_a_mutable_spelling_is_traced_as_inductor_meets_it_and_judged():
    """A declared spelling calling a mutable op arrives functionalized (auto_functionalized_v2), as in the graphs
    Inductor's post-grad passes get, so a pattern written for that form fires on it and is judged there."""
    import tests.compile_patterns as passes
    from fxverify.compile.pattern_variants import build, compiled_trace

    program, _ = build(passes._silu_into_buffer, compiled_trace, [torch.randn(4, 8)], Variant(spelling="mutable"))
    assert "auto_functionalized_v2" in program.code
    complete = [r for r in fxverify.check_patterns(SPEC.format("silu_out_to_native"), max_examples=0)
                if r.check == COMPLETE][0]
    assert ("spelled as mutable", True) in complete.details["matrix"], complete.message
