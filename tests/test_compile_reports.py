"""The items of passes inside torch.compile are items like every other: the JSON and HTML reports hold them with
their outcome and finding, the summary shows them, ``--fxverify-checks`` selects them, fxverify's own error in one
is an ERROR, ``--fxverify-repro-dir`` receives a pattern's repro, and a new check of theirs is one registry row
plus its function.

The runs are subprocesses (see tests/test_compile_plugin.py); a conftest.py adds the toy rows to the registry
there, before the plugin reads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import fxverify.plugin.items  # noqa: F401  imported once (see tests/test_compile_plugin.py)
from fxverify import checks
from fxverify.checks import PATTERN, CheckSpec
from fxverify.compile.patterns import Fuzzer, check_patterns
from fxverify.core.results import ERROR, FAILED, PASSED, Finding

ROOT = Path(__file__).resolve().parent.parent
PATTERNS, BACKEND = "tests.compile_patterns:channel_dim_by_size", "tests.compile_backends:relu_in_place"
CACHE = ("--fxverify-graph-cache", "tests.compile_cache_passes:stale_matmuls", "--fxverify-graph-cache-model",
         "tests.compile_cache_passes:mlp")
FAILING = {  # the items of those specs that fail (tests/test_compile_plugin.py says why)
    f"patterns:{PATTERNS}::fxverify[_channels_last_matmul-patterns-sound]",
    f"backend:{BACKEND}::fxverify[edge_conv_bn_head-backend-input-unchanged]",
    "graph-cache:tests.compile_cache_passes:stale_matmuls::fxverify[passes-graph-cache-stale]",
}


def one_input(fuzzer: Fuzzer) -> dict[str, Any]:
    """A toy pattern check: the search function takes one input."""
    taken = len(fuzzer.example)
    if taken != 1:
        raise Finding(f"the search function takes {taken} inputs, not one", input=fuzzer.pattern.name)
    return {"inputs": taken}


def broken(fuzzer: Fuzzer) -> dict[str, Any]:
    """A toy pattern check whose own code raises."""
    raise ZeroDivisionError("a bug of the check")


TOYS = (CheckSpec("patterns-one-input", __name__, "one_input", "the search function takes one input", subject=PATTERN),
        CheckSpec("patterns-broken", __name__, "broken", "raises", subject=PATTERN))
CONFTEST = """
from fxverify import checks
from tests.test_compile_reports import TOYS

checks.REGISTRY = (*checks.REGISTRY, *TOYS)
"""


@pytest.fixture
def run(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    return lambda *args: pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rfE", *args, timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("also", [(), ("--fxverify", "fxverify.examples:identity", "-n", "2")],
                         ids=["alone", "with-a-transform-under-xdist"])
def test_compile_items_reach_the_reports_and_the_summary(run, pytester, also):
    result = run("--fxverify-patterns", PATTERNS, "--fxverify-backend", BACKEND, *CACHE, "--fxverify-corpus",
                 "edge_conv_bn_head", "--fxverify-json", "out.json", "--fxverify-html", "out.html", *also)
    records = {r["nodeid"]: r for r in json.loads((pytester.path / "out.json").read_text())["records"]}
    compile_items = {nodeid for nodeid in records if nodeid.split(":", 1)[0] in ("patterns", "backend", "graph-cache")}
    assert len(compile_items) == 2 + 8 + 3  # a pattern's 2 checks, a backend's 8 on one model, the graph cache's 3
    assert {nodeid for nodeid in compile_items if records[nodeid]["outcome"] == FAILED} == FAILING
    assert all(records[nodeid]["finding"] for nodeid in FAILING)
    assert records[f"backend:{BACKEND}::fxverify[edge_conv_bn_head-backend-outputs]"]["transform"] == BACKEND
    if also:  # the transform's items are there too
        assert any(nodeid.startswith("fxverify.examples:identity::") for nodeid in records)
    html = (pytester.path / "out.html").read_text()
    assert all(records[nodeid]["check"] in html for nodeid in FAILING) and "MatmulPrecision.uuid() is equal" in html
    result.stdout.fnmatch_lines(["*fxverify summary*", f"patterns {PATTERNS}", "subject*patterns-sound*",
                                 "_channels_last_matmul*FAIL*", f"backend {BACKEND}", "edge_conv_bn_head*pass*FAIL*"])


@pytest.mark.slow
def test_the_checks_option_selects_a_compile_check_and_the_repro_dir_receives_its_repro(run, pytester):
    result = run("--fxverify-patterns", PATTERNS, "--fxverify-checks", "patterns-sound", "--fxverify-repro-dir",
                 "repros")
    result.assert_outcomes(failed=1)  # patterns-complete is not collected
    (repro,) = (pytester.path / "repros").glob("pattern-_channels_last_matmul-*.py")
    result.stdout.fnmatch_lines([f"*repro: python {repro}*"])


def test_a_new_compile_check_is_one_row_and_its_function_and_its_own_error_is_an_error(run, pytester, monkeypatch):
    monkeypatch.setattr(checks, "REGISTRY", (*checks.REGISTRY, *TOYS))
    specs = ("tests.compile_patterns:silu_one_order", "tests.compile_patterns:rms_norm_guarded")  # 1 and 2 inputs
    toys = [toy.name for toy in TOYS]
    results = [result for spec in specs for result in check_patterns(spec, max_examples=0, checks=toys)]
    assert [(r.check, r.outcome) for r in results] == [(toys[0], PASSED), (toys[1], ERROR), (toys[0], FAILED),
                                                       (toys[1], ERROR)]

    pytester.makeconftest(CONFTEST)
    result = run(*(arg for spec in specs for arg in ("--fxverify-patterns", spec)), "--fxverify-checks", ",".join(toys))
    result.assert_outcomes(passed=1, failed=1, errors=2)
    result.stdout.fnmatch_lines(["*fxverify error in the patterns-broken check (not a finding about the pattern)*"])
    result.stdout.fnmatch_lines(["*fxverify patterns-one-input check failed*", "*2 inputs, not one*"])


def test_every_check_has_its_pair_and_the_compile_ones_take_their_subject():
    import fxverify
    from fxverify.errors import CheckFailed, TransformLoadError

    assert all(hasattr(fxverify, f"{kind}_{name.replace('-', '_')}") for name in checks.names(None)
               for kind in ("check", "assert"))
    complete = fxverify.check_patterns_complete("tests.compile_patterns:silu_one_order")
    assert complete.outcome is FAILED and complete.check == "patterns-complete" and complete.model == "lambda"
    with pytest.raises(CheckFailed, match="promises rewrites_spellings=operand_orders"):
        fxverify.assert_patterns_complete("tests.compile_patterns:silu_one_order")
    with pytest.raises(TransformLoadError, match="register leaky_relu, leaky_relu_2: name one of them"):
        fxverify.check_patterns_sound("tests.compile_patterns:leaky_relu_slope_dropped")
    sound = fxverify.check_patterns_sound("tests.compile_patterns:leaky_relu_slope_dropped", "leaky_relu", budget_s=5)
    assert sound.outcome is PASSED and sound.details["judged"] > 0
