"""Minimisation and repro files: a failing model shrinks to the few nodes that
still fail, written as a file that fails alone, with torch and the transform only."""

from __future__ import annotations

import dataclasses
import operator
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fxverify.core.transform import Transform
from fxverify.diagnose.minimise import DIFFERS, minimise_failure, minimise_module
from fxverify.diagnose.repro import repro_stem, write_repro
from fxverify.diagnose.repro_script import EXIT_DIFFERS, EXIT_RAISES
from fxverify.engine.subject import Subject
from fxverify.errors import FxVerifyError
from tests import mutations

MUTATIONS = Path(__file__).with_name("mutations.py")
ROOT = Path(__file__).parents[1]  # where ``tests.test_minimise`` imports


def test_a_broken_bn_fold_shrinks_to_conv_and_bn():
    found = minimise_failure(Subject(mutations.bn_fold_ignores_running_mean, "edge_conv_bn_head"))
    assert found.complete and found.kind == "differs"
    assert (found.nodes_before, found.nodes_after) == (12, 4)
    ops = [(n.op, n.target) for n in found.module.graph.nodes]
    assert ops[1:3] == [("call_module", "conv1"), ("call_module", "bn1")]
    assert found.inputs[0].dtype == torch.float64 and found.tolerance == (1e-7, 1e-7)
    assert "outputs differ" in found.failure and "4 nodes, minimised from 12" in found.describe()


def test_the_time_budget_returns_the_smallest_failing_candidate_so_far():
    # the budget is spent before the first try: the whole model
    found = minimise_failure(Subject(mutations.bn_fold_ignores_running_mean, "edge_conv_bn_head"), budget_s=0.0)
    assert not found.complete and found.nodes_after == found.nodes_before == 12
    assert "time budget spent" in found.describe()


def test_a_transform_that_does_not_fail_has_nothing_to_minimise():
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
    with pytest.raises(FxVerifyError, match="does not fail on this module"):
        minimise_module(lambda m: m, gm, (torch.ones(2),))


@pytest.mark.slow
def test_repro_dir_writes_a_small_repro_that_fails_alone_and_none_for_a_correct_transform(pytester):
    repros = pytester.path / "repros"
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--fxverify-corpus=edge_conv_bn_head", "--fxverify-checks=numerics",
        "--fxverify", f"{MUTATIONS}:bn_fold_ignores_running_mean", "--fxverify", f"{MUTATIONS}:bn_fold_correct",
        f"--fxverify-repro-dir={repros}",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*repro:      python *edge_conv_bn_head-numerics-mutations.bn_fold_ignores_running_mean"
                                 ".py  (4 nodes, minimised from 12 in *"])
    [script] = repros.glob("*.py")  # none for the correct fold
    assert script.name == "edge_conv_bn_head-numerics-mutations.bn_fold_ignores_running_mean.py"
    assert script.with_suffix(".pt").is_file()
    code = script.read_text()
    assert not [line for line in code.splitlines() if line.startswith(("import", "from")) and "fxverify" in line]
    assert "weights_only=True" in code and "weights_only=False" not in code
    run = subprocess.run([sys.executable, str(script)], cwd=pytester.path, capture_output=True, text=True, timeout=120)
    assert run.returncode == EXIT_DIFFERS
    assert "torch.testing.assert_close" in run.stderr and "AssertionError: Tensor-likes are not close!" in run.stderr


def test_repro_stems_of_two_transforms_of_the_same_name_differ():
    stems = {repro_stem("resnet18", "numerics", spec) for spec in ("pkg.a:fuse", "pkg.b:fuse", "src/passes.py:fuse")}
    assert stems == {"resnet18-numerics-pkg.a.fuse", "resnet18-numerics-pkg.b.fuse", "resnet18-numerics-passes.fuse"}


def scales_what_a_wrapped_function_returns(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Multiplies the output of every torch.fx.wrap-ed pad_to_multiple by 1.5."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and getattr(node.target, "__name__", "") == "pad_to_multiple":
            with gm.graph.inserting_after(node):
                scaled = gm.graph.call_function(operator.mul, (node, 1.5))
            node.replace_all_uses_with(scaled, delete_user_cb=lambda user, scaled=scaled: user is not scaled)
    gm.recompile()
    return gm


@pytest.mark.slow
def test_a_repro_of_a_wrapped_function_registers_the_wrap_at_module_level_and_fails_alone(tmp_path):
    found = minimise_failure(Subject(scales_what_a_wrapped_function_returns, "edge_wrapped_function"))
    assert [n.op for n in found.module.graph.nodes] == ["placeholder", "call_function", "output"]
    script = write_repro(found, tmp_path, "wrapped")
    wraps = [line for line in script.read_text().splitlines() if ".wrap(" in line]
    assert wraps == ['torch.fx._symbolic_trace.wrap("fxverify_corpus_edge_cases_pad_to_multiple")']  # not indented
    assert "repro_transform" not in sys.modules  # checked in a fresh process, not imported here
    run = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == EXIT_DIFFERS, run.stderr
    assert "AssertionError: Tensor-likes are not close!" in run.stderr


ASSERTS_FALSE = """
import torch

def asserts_false(gm):
    first = next(n for n in gm.graph.nodes if n.op == "call_module")
    with gm.graph.inserting_before(first):
        gm.graph.call_function(torch._assert, (False, "the pass broke it"))
    gm.recompile()
    return gm
"""


@pytest.mark.slow
def test_a_repro_that_fails_for_another_reason_than_the_failure_is_rejected_and_deleted(tmp_path):
    passes = tmp_path / "passes.py"
    passes.write_text(ASSERTS_FALSE)
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh()))
    found = minimise_module(Transform.load(f"{passes}:asserts_false"), gm, (torch.ones(2),))
    assert (found.kind, found.raised) == ("raises", "AssertionError")
    script = write_repro(found, tmp_path / "ok", "asserts")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode == EXIT_RAISES and "AssertionError: the pass broke it" in run.stderr
    wrong = [
        (dataclasses.replace(found, kind=DIFFERS), "outputs that differ"),  # an AssertionError, not assert_close's
        (dataclasses.replace(found, raised="ValueError"), "the transformed module raising ValueError"),  # another type
    ]
    for mismatched, expected in wrong:
        with pytest.raises(FxVerifyError, match=f"exited with {EXIT_RAISES} instead of failing with {expected}"):
            write_repro(mismatched, tmp_path / "wrong", "asserts")
    passes.write_text("raise ImportError('the transform moved')")  # the repro can no longer import it
    with pytest.raises(FxVerifyError, match="(?s)exited with 1 .*ImportError: the transform moved"):
        write_repro(found, tmp_path / "wrong", "asserts")
    assert list((tmp_path / "wrong").iterdir()) == []  # no repro written
