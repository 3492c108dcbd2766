"""Passes inside torch.compile through the plugin (``--fxverify-patterns``, ``--fxverify-backend``,
``--fxverify-graph-cache``): each re-created bug fails the item of the check meant for it, naming the pattern or
model, the variant or input, and the first bad node; its correct twin's items pass.

The runs are subprocesses: torch.compile registers its backends once a process, and pytester's in-process runs
import them again."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUN = ("-p", "no:cacheprovider", "-rf")


@pytest.fixture
def run(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the passes live in the tests package
    return lambda *args: pytester.runpytest_subprocess(*RUN, *args, timeout=600)


def failed(result) -> list[str]:
    return sorted(line.split()[1] for line in result.outlines if line.startswith("FAILED "))


@pytest.mark.slow
def test_pattern_fuzzing_items_fail_the_unsound_pattern_only(run):
    result = run("--fxverify-patterns", "tests.compile_patterns:channel_dim_by_size",
                 "--fxverify-patterns", "tests.compile_patterns:channel_dim_fixed")
    result.assert_outcomes(passed=3, failed=1)
    assert failed(result) == [
        "patterns:tests.compile_patterns:channel_dim_by_size::compile[_channels_last_matmul-patterns-sound]"]
    result.stdout.fnmatch_lines([
        "*patterns-sound failed for pattern _channels_last_matmul of tests.compile_patterns:channel_dim_by_size*",
        "*variant: sizes 8->2 (made equal on purpose)*",
        "*first node the rewrite inserted: %permute_default*",
    ])


@pytest.mark.slow
def test_a_broken_completeness_promise_fails_its_item(run):
    result = run("--fxverify-patterns", "tests.compile_patterns:silu_one_order")
    result.assert_outcomes(passed=1, failed=1)
    assert failed(result) == ["patterns:tests.compile_patterns:silu_one_order::compile[lambda-patterns-complete]"]
    result.stdout.fnmatch_lines(["*NOT fired: aten.mul.Tensor#0 operands swapped*"])


@pytest.mark.slow
@pytest.mark.parametrize(("buggy", "twin", "aspect", "phrase"), [
    ("relu_in_place", "relu_on_copy", "backend-input-unchanged", "*first node: call_function x target=*relu*"),
    ("reshape_at_first_batch", "reshape_at_run_batch", "backend-recompile", "*cannot be multiplied*"),
])
def test_backend_items_fail_the_aspect_meant_for_the_bug(run, buggy, twin, aspect, phrase):
    result = run("--fxverify-corpus=edge_conv_bn_head", "--fxverify-backend", f"tests.compile_backends:{buggy}",
                 "--fxverify-backend", f"tests.compile_backends:{twin}")
    assert failed(result) == [f"backend:tests.compile_backends:{buggy}::compile[edge_conv_bn_head-{aspect}]"]
    result.stdout.fnmatch_lines([phrase])


@pytest.mark.slow
def test_a_stale_graph_cache_entry_fails_its_item_naming_uuid_and_the_state(run):
    result = run("--fxverify-graph-cache", "tests.compile_cache_passes:stale_floors",
                 "--fxverify-graph-cache", "tests.compile_cache_passes:keyed_floors")
    assert failed(result) == ["graph-cache:tests.compile_cache_passes:stale_floors::compile[passes-graph-cache-stale]"]
    result.stdout.fnmatch_lines(["*uuid()*floor*"])


def test_a_spec_that_does_not_load_stops_the_run_naming_it(pytester):
    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify-patterns", "tests.nowhere:register")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*patterns spec 'tests.nowhere:register': cannot import module*"])
