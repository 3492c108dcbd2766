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
@pytest.mark.parametrize("correct", ["double_to_scale", "INDUCTOR_ADDMM", "ADDMM"])
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

    with pytest.raises(TransformLoadError, match="a PatternMatcherPass holds no pattern"):
        fxverify.check_patterns(PatternMatcherPass())
    replacements = PatternMatcherPass()
    double(replacements)
    with pytest.raises(TransformLoadError, match="keeps the patterns it was given but not the search functions"):
        fxverify.check_patterns(replacements)
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


# -- passes written as their authors write them (issue 41): tests/compile_user_patterns.py ---------------------------
USER = "tests.compile_user_patterns:{}"

# (buggy pass, its correct twin, the check meant for it, a phrase of the variant, of the message, the first node)
USER_BUGS = [
    pytest.param("silu_and_mul_one_order", "silu_and_mul_fusion", COMPLETE, "operands swapped (silu, up -> up, silu)",
                 "promises rewrites_spellings=operand_orders", "aten.mul.Tensor#0", id="one-operand-order-promised-both"),
    pytest.param("silu_and_mul_unguarded", "silu_and_mul_fusion", SOUND, "input 0 bfloat16",
                 "dtype differs: expected torch.float32, got torch.bfloat16", "%silu_and_mul", id="missing-dtype-guard"),
    pytest.param("rms_norm_float32_traced", "rms_norm_fusion", COMPLETE, "input 0 bfloat16; input 1 bfloat16",
                 "[dtypes, promised]", None, id="float32-trace-promised-bfloat16"),
    pytest.param("linear_gelu_tanh_kernel", "linear_gelu_fusion", SOUND, "as registered", "values differ",
                 "%linear_gelu_tanh", id="tanh-gelu-kernel"),
    pytest.param("attention_key_by_size", "attention_fusion", SOUND, "made equal on purpose",
                 "the rewrite is wrong only when sizes coincide", None, id="key-layout-told-by-sizes"),
    pytest.param("tokens_silu_mul_view", "tokens_silu_mul_reshape", COMPLETE, "at post_grad_custom_post_pass",
                 "cannot fire at post_grad_custom_post_pass", "aten.view.default", id="view-pattern-at-post-grad-hook"),
]


def user_failures(name: str) -> list[fxverify.CheckResult]:
    return [r for r in fxverify.check_patterns(USER.format(name), max_examples=0, budget_s=10) if not r.ok]


@pytest.mark.slow
@pytest.mark.parametrize(("buggy", "twin", "check", "variant", "finding", "node"), USER_BUGS)
def test_users_passes_fail_through_the_check_for_their_defect_and_their_twins_pass(buggy, twin, check, variant,
                                                                                   finding, node):
    found = user_failures(buggy)
    assert found, f"{buggy} passed pattern fuzzing"
    first = found[0]
    assert (first.check, variant in first.input, finding in first.message) == (check, True, True), first.message
    if node is not None:
        assert first.node is not None and first.node.startswith(node), first.node
    assert user_failures(twin) == []


def _user_pattern(name: str, pattern: str):  # type: ignore[no-untyped-def]
    from fxverify.compile.patterns import promises_every_spelling

    source = fxverify.compile.patterns.load_object(USER.format(name))
    found = next(p for p in pattern_examples(source, name) if p.name == pattern)
    return Fuzzer(found, promises_every_spelling(source))


@pytest.mark.slow
def test_attention_on_transposed_head_views_is_fuzzed_as_registered():
    """The example q, k, v are ``x.view(b, t, h, d).transpose(1, 2)``: their matmuls trace to clones, which the
    search graph holds. Built laid out as registered (not contiguous), the pattern fires on its own program, and
    at coinciding sizes keeps the layout; the twin telling a key stored transposed by its sizes is caught there,
    silently wrong."""
    fuzzer = _user_pattern("attention_fusion", "_attention")
    own = fuzzer.judge(Variant())
    assert own is not None and own.fired and own.problem is None
    from fxverify.compile.pattern_variants import inputs_for

    example = fuzzer.pattern.example_inputs[0]
    built = inputs_for(fuzzer.pattern.example_inputs, Variant())
    assert built is not None and (built[0].stride(), built[0].storage_offset()) == (example.stride(), 0)
    coinciding = inputs_for(fuzzer.pattern.example_inputs, Variant(sizes=((16, 8),)))
    assert coinciding is not None and coinciding[0].shape == (2, 4, 8, 8) and coinciding[0].stride() == (256, 8, 32, 1)
    buggy = _user_pattern("attention_key_by_size", "_attention_kt")
    wrong = buggy.judge(Variant(sizes=((16, 8),)))
    assert wrong is not None and wrong.fired and "values differ" in (wrong.problem or "")
    apart = buggy.judge(Variant())
    assert apart is not None and apart.fired and apart.problem is None


@pytest.mark.slow
def test_mixed_dtypes_layouts_and_a_decompositions_operand_orders_are_for_soundness_only():
    """A dtype guard declining mixed operands is doing its job (no missed spelling); GELU's ``0.5 * x`` is
    multiplied in one order by its decomposition (no spelling either), so Linear+GELU keeps its promise of every
    operand order a user writes."""
    silu = _user_pattern("silu_and_mul_fusion", "_gate_up")
    rows = [variant.describe() for variant, _ in silu.matrix()]
    assert not any("another layout" in row or row == "input 0 bfloat16" for row in rows), rows
    assert any(v.dtypes == ("bfloat16", None) for v in silu.sweep())  # still judged for soundness
    gelu = _user_pattern("linear_gelu_fusion", "_linear_gelu")
    inner = [edit for edit in gelu.edits if edit.kind == "inner_swap"]
    assert inner and "inside aten.gelu.default's decomposition" in inner[0].describe()
    assert not any(edit.kind == "inner_swap" for variant, _ in gelu.matrix() for edit in variant.edits)
    complete = fxverify.check_patterns(USER.format("linear_gelu_fusion"), max_examples=0, checks=(COMPLETE,))[0]
    assert complete.ok and "[dtypes]" in complete.message and "WARNING" in complete.message, complete.message


@pytest.mark.slow
def test_a_pattern_for_the_post_grad_post_hook_is_traced_as_that_hook_receives_graphs():
    """``captures=("inductor_post",)`` on the registering function: each variant goes through Inductor's passes up to
    post_grad_custom_post_pass, where ``aten.view`` is ``aten.reshape``; the fwd_only pattern cannot fire there,
    the failure says where it fires instead; the twin traced with reshape fires at the hook."""
    complete = [r for r in user_failures("tokens_silu_mul_view") if r.check == COMPLETE][0]
    assert "aten.view.default x2 where the hook's graphs hold aten.reshape.default x2" in complete.message
    assert "register it where it fires (joint_custom_pre_pass (capture inductor_joint)" in complete.message
    twin = _user_pattern("tokens_silu_mul_reshape", "_tokens_silu_mul")
    assert twin.hook == "inductor_post"
    fired = twin.judge(Variant(hook="inductor_post"))
    assert fired is not None and fired.fired and fired.problem is None


def test_a_promise_names_what_it_covers_and_is_validated():
    contract = fxverify.Contract(rewrites_spellings=("operand_orders", "declared"), dtypes=("float32", "bfloat16"))
    assert "rewrites_spellings=operand_orders+declared" in contract.describe()
    assert "rewrites_spellings=none" in fxverify.Contract(rewrites_spellings=()).describe()
    with pytest.raises(fxverify.FxVerifyError, match="rewrites_spellings must be a non-empty subset of"):
        fxverify.Contract(rewrites_spellings=("every",))
    from fxverify.compile.patterns import Promise, promises_every_spelling

    promise = promises_every_spelling(fxverify.contract(rewrites_spellings=("operand_orders",), dtypes=("bfloat16",))(
        double))
    assert promise == Promise(frozenset({"operand_orders"}), ("bfloat16",))
    assert promise.covers("operand_orders") and not promise.covers("sizes") and promise.covers("dtypes", "bfloat16")


def test_rewrites_every_occurrence_on_a_registering_function_asks_for_rewrites_spellings():
    """It is the variants check's promise (every occurrence of an op), not a pattern's: pattern fuzzing refuses it
    alone, saying what to declare; beside rewrites_spellings it keeps its meaning for the variants check."""
    both_meanings = fxverify.contract(rewrites_every_occurrence=True)(double)
    with pytest.raises(TransformLoadError, match=r"variants check's promise.*rewrites_spellings=\(\.\.\.\)"):
        fxverify.check_patterns(both_meanings, max_examples=0)
    said = fxverify.contract(rewrites_every_occurrence=True, rewrites_spellings=())(double)
    assert [r.outcome for r in fxverify.check_patterns(said, max_examples=0)] == [Outcome.PASSED] * 2


class RMSNormGate(torch.nn.Module):
    """vLLM's RMSNorm (upcast, normalise, cast back, scale), then a gated product: muls the fusion rightly leaves."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        normed = normed.to(x.dtype) * self.weight
        return normed * torch.sigmoid(normed) * (x * 2.0)


@pytest.mark.slow
def test_an_rms_norm_fusion_promising_its_spellings_is_not_failed_by_the_variants_check():
    """Issue 41's class 6: the fusion rewrites the RMSNorm's muls and rightly leaves the gate's; under
    rewrites_spellings the variants check warns, under rewrites_every_occurrence (its own promise) it fails."""
    import tests.compile_user_patterns as user

    case = fxverify.case_from_module("rms_norm_gate", RMSNormGate, [(4, 16)])
    capture = case.capture_named("inductor")
    kept = fxverify.Verification(user.rms_norm_fusion, case, capture=capture).run("variants")
    assert kept.outcome == "passed", kept.message
    assert "aten.mul.Tensor" in kept.details["rewrote"] and kept.details["left"], kept.details
    every = fxverify.contract(rewrites_every_occurrence=True)(user.rms_norm_fusion)
    assert fxverify.Verification(every, case, capture=capture).run("variants").outcome == "failed"


@pytest.mark.slow
def test_a_handler_pattern_is_derived_or_refused_with_the_line_to_write():
    """register_graph_pattern keeps no search function: it is written from the pattern (Inductor's addmm fusion,
    both operand orders, each fired on its own program); where its inputs cannot be inferred (a size list), the
    error gives the PatternExample line with that search function."""
    from torch._inductor.pattern_matcher import Arg, CallFunction, KeywordArg, PatternMatcherPass, register_graph_pattern

    import tests.compile_patterns as passes

    derived = pattern_examples(passes.ADDMM, "addmm")
    assert [p.name for p in derived] == ["addmm", "addmm_2"]
    assert "torch.ops.aten.mm(arg0, arg1)" in derived[0].search_source()
    fired = judge(derived[0], Variant())
    assert fired is not None and fired.fired and fired.problem is None

    def register(pass_dict: PatternMatcherPass) -> None:
        @register_graph_pattern(CallFunction(torch.ops.aten.view, Arg(), KeywordArg("size")), pass_dict=pass_dict)
        def flatten(match, x, *, size):
            pass

    with pytest.raises(TransformLoadError, match=r"could not infer inputs[\s\S]*def flatten\(arg0, size\):[\s\S]*"
                                                 r"PatternExample\('flatten', flatten, \(<arg0>, <size>,\)"):
        fxverify.check_patterns(register, max_examples=0)


def test_a_bool_mask_is_drawn_so_a_verdict_does_not_depend_on_what_memory_held():
    """Inductor's attention patterns make their example masks with torch.empty: whatever memory held. Two examples
    holding different garbage give the same mask, drawn from the seed, at the example's size and at others."""
    from fxverify.compile.pattern_variants import inputs_for

    for variant in (Variant(), Variant(sizes=((8, 4),))):
        masks = [inputs_for([torch.randn(2, 8, 8), held], variant)[1] for held in
                 (torch.zeros(2, 8, 8, dtype=torch.bool), torch.ones(2, 8, 8, dtype=torch.bool))]
        assert masks[0].dtype == torch.bool and torch.equal(masks[0], masks[1])
        assert 0 < masks[0].float().mean() < 1  # neither masks everything nor nothing
