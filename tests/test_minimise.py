"""Minimisation and repro files: a failing model shrinks to the few nodes that
still fail, written as a file that fails alone, with torch and the transform only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fxverify
from fxverify.errors import FxVerifyError
from fxverify.minimise import minimise_failure, minimise_module
from tests import mutations

MUTATIONS = Path(__file__).with_name("mutations.py")


def test_a_broken_bn_fold_shrinks_to_conv_and_bn():
    found = minimise_failure(fxverify.Verification(mutations.bn_fold_ignores_running_mean, "edge_conv_bn_head"))
    assert found.complete and found.kind == "differs"
    assert (found.nodes_before, found.nodes_after) == (12, 4)
    ops = [(n.op, n.target) for n in found.module.graph.nodes]
    assert ops[1:3] == [("call_module", "conv1"), ("call_module", "bn1")]
    assert found.inputs[0].dtype == torch.float64 and found.tolerance == (1e-7, 1e-7)
    assert "outputs differ" in found.failure and "4 nodes, minimised from 12" in found.describe()


def test_the_time_budget_returns_the_smallest_failing_candidate_so_far():
    v = fxverify.Verification(mutations.bn_fold_ignores_running_mean, "edge_conv_bn_head")
    found = minimise_failure(v, budget_s=0.0)  # spent before the first try: the whole model
    assert not found.complete and found.nodes_after == found.nodes_before == 12
    assert "time budget spent" in found.describe()


def test_a_transform_that_does_not_fail_has_nothing_to_minimise():
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
    with pytest.raises(FxVerifyError, match="does not fail on this module"):
        minimise_module(lambda m: m, gm, (torch.ones(2),))


def test_repro_dir_writes_a_small_repro_that_fails_alone_and_none_for_a_correct_transform(pytester):
    repros = pytester.path / "repros"
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--fxverify-corpus=edge_conv_bn_head", "--fxverify-checks=numerics",
        "--fxverify", f"{MUTATIONS}:bn_fold_ignores_running_mean", "--fxverify", f"{MUTATIONS}:bn_fold_correct",
        f"--fxverify-repro-dir={repros}",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*repro:      python *edge_conv_bn_head-numerics-bn_fold_ignores_running_mean.py"
                                 "  (4 nodes, minimised from 12 in *"])
    [script] = repros.glob("*.py")  # none for the correct fold
    assert script.name == "edge_conv_bn_head-numerics-bn_fold_ignores_running_mean.py"
    assert script.with_suffix(".pt").is_file()
    code = script.read_text()
    assert not [line for line in code.splitlines() if line.startswith(("import", "from")) and "fxverify" in line]
    assert "weights_only=True" in code and "weights_only=False" not in code
    run = subprocess.run([sys.executable, str(script)], cwd=pytester.path, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "torch.testing.assert_close" in run.stderr and "AssertionError: Tensor-likes are not close!" in run.stderr
