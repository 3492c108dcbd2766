"""Passes inside torch.compile through the plugin (``--fxverify-patterns``, ``--fxverify-backend``,
``--fxverify-graph-cache``): each re-created bug fails the item of the check meant for it, naming the pattern or
model, the variant or input, and the first bad node; its correct twin's items pass.

The runs are subprocesses: torch.compile registers its backends once a process, and pytester's in-process runs
import them again."""

from __future__ import annotations

from pathlib import Path

import pytest

import fxverify.plugin.items  # noqa: F401  imported once: each in-process run keeps it and does not import it again

ROOT = Path(__file__).resolve().parent.parent
RUN = ("-p", "no:cacheprovider", "-rf")


@pytest.fixture
def run(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the passes live in the tests package
    return lambda *args: pytester.runpytest_subprocess(*RUN, *args, timeout=600)


def failed(result) -> list[str]:
    return sorted(line.split()[1] for line in result.outlines if line.startswith("FAILED "))


# buggy pass -> its correct twin, the item that must fail, and lines of its message (variant, first node)
PATTERN_BUGS = {
    "channel_dim_by_size": ("channel_dim_fixed", "_channels_last_matmul-patterns-sound",
                            ["*input:      sizes 8->2 (made equal on purpose)*",
                             "*first node: %permute_default*"]),
    "rms_norm_unguarded": ("rms_norm_guarded", "_rms_norm-patterns-sound",
                           ["*input:      input 0 bfloat16*", "*first node: %fused_rms_norm*"]),
    "leaky_relu_slope_dropped": ("leaky_relu_slope_kept", "leaky_relu_2-patterns-sound",
                                 ["*input:      as registered (the example inputs)*",
                                  "*first node: %gt_scalar*"]),
    "silu_one_order": ("silu_both_orders", "lambda-patterns-complete",
                       ["*NOT fired: aten.mul.Tensor#0 operands swapped*"]),
    "scaled_two_outputs": ("scaled_one_output_each", "_scaled-patterns-sound",
                           ["*input:      input 2 computed just before its first use*",
                            "*first node: %mul_tensor*", "*used before it has been defined*"]),
}


@pytest.mark.slow
def test_each_pattern_bug_fails_the_item_meant_for_it_and_its_twin_passes(run):
    specs = [f"tests.compile_patterns:{name}" for bug, (twin, *_) in PATTERN_BUGS.items() for name in (bug, twin)]
    result = run(*(arg for spec in specs for arg in ("--fxverify-patterns", spec)))
    assert failed(result) == sorted(f"patterns:tests.compile_patterns:{bug}::fxverify[{item}]"
                                    for bug, (_, item, _) in PATTERN_BUGS.items())
    for bug, (_, item, lines) in PATTERN_BUGS.items():
        result.stdout.fnmatch_lines([f"*fxverify patterns-{item.rpartition('-patterns-')[2]} check failed*",
                                     f"*patterns:*tests.compile_patterns:{bug}", *lines])


@pytest.mark.slow
@pytest.mark.parametrize(("buggy", "twin", "aspects", "phrase"), [
    ("relu_in_place", "relu_on_copy", ["input-unchanged"], "*first node: call_function x target=*relu*"),
    # a size read from the first call's example without a guard: wrong at the next batch, and at any size
    # dynamic shapes vary
    ("reshape_at_first_batch", "reshape_at_run_batch", ["dynamic-shapes", "recompile"], "*cannot be multiplied*"),
])
def test_backend_items_fail_the_aspect_meant_for_the_bug(run, buggy, twin, aspects, phrase):
    result = run("--fxverify-corpus=edge_conv_bn_head", "--fxverify-backend", f"tests.compile_backends:{buggy}",
                 "--fxverify-backend", f"tests.compile_backends:{twin}")
    assert failed(result) == [f"backend:tests.compile_backends:{buggy}::fxverify[edge_conv_bn_head-backend-{aspect}]"
                              for aspect in aspects]
    result.stdout.fnmatch_lines([phrase])


@pytest.mark.slow
def test_a_stale_graph_cache_entry_fails_its_item_on_the_model_the_passes_act_on(run):
    spec = "tests.compile_cache_passes:"
    result = run("--fxverify-graph-cache", spec + "stale_matmuls", "--fxverify-graph-cache", spec + "keyed_matmuls",
                 "--fxverify-graph-cache-model", spec + "mlp")
    assert failed(result) == [f"graph-cache:{spec}stale_matmuls::fxverify[passes-graph-cache-stale]"]
    result.assert_outcomes(failed=1, passed=5)  # the correct twin passes all three
    result.stdout.fnmatch_lines([
        "*model:      tests.compile_cache_passes:mlp",
        "*first node: *convert_element_type*torch.bfloat16) kwargs={}  (served, as passes[[]0] left it)",
        "*MatmulPrecision.uuid() is equal for instances whose `dtype` differs (torch.bfloat16, torch.float16)*"
        "put `dtype` into uuid()*",
        f"*reproduce:*model='{spec}mlp'*",
    ])


BAD_INPUTS = {  # arguments -> the one line that must say what is wrong
    "passes that are no CustomGraphPass": (
        ["--fxverify-graph-cache", "tests.compile_cache_passes:FLOORS"],
        "ERROR: fxverify: graph-cache passes 'tests.compile_cache_passes:FLOORS'[[]0] is a float, not a "
        "torch._inductor.custom_graph_pass.CustomGraphPass*Subclass CustomGraphPass*"),
    "passes from a function that needs arguments": (
        ["--fxverify-graph-cache", "tests.compile_cache_passes:floor_relu"],
        "ERROR: fxverify: graph-cache passes 'tests.compile_cache_passes:floor_relu': calling it raised TypeError*"
        "give a sequence of two or more CustomGraphPass instances*"),
    "a backend that is not callable": (
        ["--fxverify-backend", "tests.compile_cache_passes:FLOORS"],
        "ERROR: fxverify: backend spec 'tests.compile_cache_passes:FLOORS' names a tuple, not a callable*"),
    "an unknown corpus entry as the model": (
        ["--fxverify-graph-cache", "tests.compile_cache_passes:keyed_matmuls", "--fxverify-graph-cache-model",
         "edge_tiny_decoder"],
        "ERROR: fxverify: --fxverify-graph-cache-model (ini fxverify_graph_cache_model) does not load: no corpus entry "
        "named 'edge_tiny_decoder'; did you mean edge_tiny_decoder_block*returns (module, inputs)*"),
    "a factory that does not import": (
        ["--fxverify-graph-cache", "tests.compile_cache_passes:keyed_matmuls", "--fxverify-graph-cache-model",
         "tests.nowhere:mlp"],
        "ERROR: fxverify: --fxverify-graph-cache-model (ini fxverify_graph_cache_model) does not load: graph-cache "
        "model spec 'tests.nowhere:mlp': cannot import module 'tests.nowhere'*"),
    "a factory giving no module and inputs": (
        ["--fxverify-graph-cache", "tests.compile_cache_passes:keyed_matmuls", "--fxverify-graph-cache-model",
         "tests.compile_cache_passes:FLOORS"],
        "ERROR: fxverify: --fxverify-graph-cache-model*gives (0.0, 0.5): give 'package.module:factory' naming a function "
        "of no arguments that returns (module, inputs)*"),
    "a model without graph-cache passes to compile it": (
        ["--fxverify-graph-cache-model", "tests.compile_cache_passes:mlp"],
        "ERROR: fxverify: --fxverify-graph-cache-model (ini fxverify_graph_cache_model) names the model "
        "--fxverify-graph-cache compiles, and no --fxverify-graph-cache passes were given*"),
}


@pytest.mark.parametrize("bad", list(BAD_INPUTS))
def test_bad_input_to_a_compile_option_is_one_line_before_anything_runs(pytester, bad):
    args, line = BAD_INPUTS[bad]
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert len([text for text in result.outlines + result.errlines if text.strip()]) == 1, result.errlines
    result.stderr.fnmatch_lines([line])


def test_the_graph_cache_model_is_read_from_the_ini_file(pytester):
    pytester.makeini("[pytest]\nfxverify_graph_cache = tests.compile_cache_passes:keyed_matmuls\n"
                     "fxverify_graph_cache_model = edge_tiny_decoder\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--fxverify-graph-cache-model (ini fxverify_graph_cache_model) does not load: no "
                                 "corpus entry named 'edge_tiny_decoder'*"])


def test_a_spec_that_does_not_load_stops_the_run_naming_it(pytester):
    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify-patterns", "tests.nowhere:register")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*patterns spec 'tests.nowhere:register': cannot import module*"])
