"""What a run keeps and gives back: the original's reference outputs kept for other transforms and
later runs (and never used when anything they depend on changed), a model's memory freed when the
next starts, and localisation holding the original's recorded values only until they are compared."""

from __future__ import annotations

import copy
import dataclasses
import weakref
from pathlib import Path

import pytest
import torch
from torch import fx, nn

import fxverify
import fxverify.analysis.localise as localise_module
from fxverify.analysis.compare import Tolerance
from fxverify.capture import for_entry
from fxverify.capture.symbolic import SymbolicTrace
from fxverify.cases.case import ModelCase, load_case
from fxverify.engine.references import REFERENCES_DIR, ReferenceStore
from fxverify.engine.subject import Settings, Subject
from fxverify.plugin.items import FxVerifyRun
from fxverify.plugin.options import RunOptions
from tests import mutations

EDGE = "edge_conv_bn_head"


class CountingSubject(Subject):
    """A subject that counts the modules it runs, by which one and in which dtype."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.runs: list[tuple[str, str]] = []

    def _run(self, which, config, dtype, threads):
        self.runs.append((which, str(dtype)))
        return super()._run(which, config, dtype, threads)


def test_a_second_transform_reads_the_originals_outputs_instead_of_running_it(tmp_path):
    store = ReferenceStore(tmp_path)
    first = CountingSubject(fxverify.examples.identity, EDGE, settings=Settings(references=store))
    expected = [first.outputs("original", config) for config in first.case.configs]
    first.outputs("original", dtype=torch.float64)
    assert first.runs.count(("original", "None")) == len(first.case.configs)
    assert len(list(tmp_path.glob("*.pt"))) == len(first.case.configs) + 1

    second = CountingSubject(mutations.bn_fold_ignores_running_mean, EDGE, settings=Settings(references=store))
    again = [second.outputs("original", config) for config in second.case.configs]
    second.outputs("original", dtype=torch.float64)
    assert second.runs == []  # every reference came from the store
    for a, b in zip(again, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_bug_is_still_caught_when_the_references_come_from_the_store(tmp_path):
    for _ in range(2):  # the first run fills the store, the second reads it
        result = fxverify.Verification(mutations.bn_fold_ignores_running_mean, EDGE,
                                       references=fxverify.ReferenceStore(tmp_path)).run("numerics")
        assert result.outcome.value == "failed"
        assert result.divergence["result_node"] == "relu"
    assert list(tmp_path.glob("*.pt"))


def test_the_key_changes_with_everything_the_outputs_depend_on(tmp_path, monkeypatch):
    store = ReferenceStore(tmp_path)
    case = load_case(EDGE)
    capture = SymbolicTrace()
    config = case.configs[0]
    key = store.key(case, capture, config, None, "eval")
    assert key == store.key(load_case(EDGE), SymbolicTrace(), config, None, "eval")  # the same: found again
    changed = [
        store.key(load_case(EDGE, seed=1), capture, config, None, "eval"),
        store.key(case, capture, case.configs[1], None, "eval"),
        store.key(case, capture, config, torch.float64, "eval"),
        store.key(case, capture, config, None, "train"),
        store.key(case, capture, config, None, "eval", threads=torch.get_num_threads() + 1),
        store.key(case, for_entry("timm"), config, None, "eval"),
        store.key(case, for_entry("plain", {"x": None}), config, None, "eval"),
    ]
    assert key not in changed and len(set(changed)) == len(changed)
    import fxverify.engine.references as references

    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")  # a global setting changed during the run
        assert store.key(case, capture, config, None, "eval") != key
    finally:
        torch.set_float32_matmul_precision(previous)
    monkeypatch.setattr(references, "_environment", lambda: "torch 9.9.9")  # another torch, say
    assert store.key(case, capture, config, None, "eval") != key


def test_only_what_loads_back_as_it_was_is_kept_and_a_damaged_file_is_recomputed(tmp_path):
    store = ReferenceStore(tmp_path)
    case = load_case(EDGE)
    key = store.key(case, SymbolicTrace(), case.configs[0], None, "eval")
    Pair = __import__("collections").namedtuple("Pair", "a b")
    assert not store.save(key, Pair(torch.ones(1), torch.ones(1)))  # would load back as a plain tuple
    assert not store.save(key, torch.ones(2).to_sparse())
    assert store.save(key, {"logits": torch.ones(2), "aux": [torch.zeros(1), None]})
    path = tmp_path / f"{key}.pt"
    path.write_bytes(path.read_bytes()[:20])  # truncated, as by a full disk
    assert store.load(key) is None and not path.exists()


def test_a_users_own_models_tracers_and_changed_entries_are_never_kept(tmp_path):
    """Their outputs may depend on code the key does not cover."""
    store = ReferenceStore(tmp_path)
    case = fxverify.case_from_module("mine", lambda: nn.Sequential(nn.Linear(3, 3)), [(2, 3)])
    assert store.key(case, case.capture, case.configs[0], None, "eval") is None
    shipped = load_case(EDGE)
    posing = ModelCase(dataclasses.replace(shipped.entry, factory="my_package.models:Net"))  # same name and source
    changed = ModelCase(dataclasses.replace(shipped.entry, batch_sizes=(3,)))
    for other in (posing, changed):
        assert store.key(other, SymbolicTrace(), other.configs[0], None, "eval") is None
    users_tracer = for_entry("torch.fx:Tracer")  # plain tracing, but any class could be named
    assert store.key(shipped, users_tracer, shipped.configs[0], None, "eval") is None
    assert store.key(shipped, SymbolicTrace(), shipped.configs[0], None, "eval") is not None


def test_a_store_that_cannot_be_written_keeps_nothing_and_the_run_goes_on(tmp_path):
    case = load_case(EDGE)
    store = ReferenceStore("/proc/no-such-store")
    key = store.key(case, SymbolicTrace(), case.configs[0], None, "eval")
    assert not store.save(key, (torch.ones(2),)) and store.load(key) is None


def test_the_plugin_keeps_references_in_pytests_cache_and_cache_clear_drops_them(pytester):
    identity, edge = "fxverify.examples:identity", f"--fxverify-corpus={EDGE}"
    store = pytester.path / ".pytest_cache" / "d" / REFERENCES_DIR
    pytester.runpytest("--fxverify", identity, edge, "--fxverify-checks=numerics").assert_outcomes(passed=1)
    kept = {path: path.stat().st_mtime_ns for path in store.glob("*.pt")}
    assert kept
    result = pytester.runpytest("--fxverify", spec("bn_fold_ignores_running_mean"), edge, "--fxverify-checks=numerics")
    result.assert_outcomes(failed=1)  # found with the kept references
    # read, not computed and written again (a failure adds the original's outputs on other threads)
    assert {path: path.stat().st_mtime_ns for path in kept} == kept
    pytester.runpytest("--fxverify", identity, edge, "--collect-only", "--cache-clear")
    assert not list(store.glob("*.pt"))
    pytester.runpytest("--fxverify", identity, edge, "--fxverify-checks=numerics", "--fxverify-reference-cache=off")
    assert not list(store.glob("*.pt"))


def spec(name: str) -> str:
    return f"{Path(mutations.__file__)}:{name}"


def test_the_previous_models_modules_are_freed_when_the_next_starts(pytestconfig):
    run = FxVerifyRun([fxverify.Transform.load("fxverify.examples:identity")], [], RunOptions.from_config(pytestconfig))
    first = run.verification(run.transforms[0], load_case(EDGE), "symbolic_trace")
    first.run("lint")
    original = weakref.ref(first.subject.applied().original)
    del first
    run.verification(run.transforms[0], load_case("edge_same_op_three_ways"), "symbolic_trace")
    assert original() is None  # reference cycles collected: a large model's memory does not pile up


def chain(depth: int) -> fx.GraphModule:
    return fx.symbolic_trace(nn.Sequential(*[nn.Linear(64, 64) for _ in range(depth)]))


def test_localisation_holds_the_originals_values_only_until_the_result_reaches_them(monkeypatch):
    original = chain(40)
    result = copy.deepcopy(original)
    inputs = (torch.randn(256, 64),)
    monkeypatch.setattr(localise_module, "AHEAD_BYTES", 0)
    held = []
    take = localise_module._SteppedRun.take

    def watched(self, name):
        held.append(self.held)
        return take(self, name)

    monkeypatch.setattr(localise_module._SteppedRun, "take", watched)
    located = localise_module.localise(original, result, inputs, Tolerance())
    assert located.compared == 40 and located.divergence is None and located.outputs is None
    one_value = 256 * 64 * 4
    assert max(held) <= 2 * one_value  # not 40 values, as when the whole run was recorded first


def test_localisation_in_stretches_still_names_the_first_divergent_node(monkeypatch):
    original = fx.symbolic_trace(nn.Sequential(*[nn.Linear(64, 64) if i % 2 else nn.ReLU() for i in range(8)]))
    broken = copy.deepcopy(original)  # a "cleanup" that removes a relu as if it were a no-op
    relu = broken.graph.find_nodes(op="call_module", target="4")[0]
    relu.replace_all_uses_with(relu.args[0])
    broken.graph.erase_node(relu)
    broken.recompile()
    inputs = (torch.randn(8, 64),)
    found = []
    for ahead in (0, 2**30):  # stretch by stretch, and the whole original first
        monkeypatch.setattr(localise_module, "AHEAD_BYTES", ahead)
        located = localise_module.localise(original, broken, inputs, Tolerance())
        assert located.divergence is not None
        found.append((located.divergence.result_node.name, located.divergence.mismatch, located.compared))
    assert found[0] == found[1] and found[0][0] == "_5"


def test_localisation_reports_its_own_comparison_errors_as_its_own(monkeypatch):
    """Nodes are compared as the result runs, inside the guard that makes the result's exceptions
    findings: an error of fxverify's comparison must still come out as itself."""
    original = chain(3)

    def broken_comparison(*args, **kwargs):
        raise ValueError("fxverify's own bug")

    def guard(run):
        try:
            return run()
        except Exception as exc:
            raise AssertionError(f"blamed on the result: {exc}") from exc

    monkeypatch.setattr(localise_module, "compare_trees", broken_comparison)
    with pytest.raises(ValueError, match="fxverify's own bug"):
        localise_module.localise(original, copy.deepcopy(original), (torch.randn(2, 64),), Tolerance(), guard=guard)


def test_gradients_are_compared_after_numerics_ran_a_model_that_caches_under_no_grad():
    """timm's EfficientViT caches its attention biases at the first eval run; made under no_grad, the
    cache later cuts the gradient: fxverify's own runs must not leave one module with it and the other
    without (a false alarm once, after the float64 original was rebuilt for the gradients)."""
    v = fxverify.Verification(fxverify.examples.identity, "efficientvit_m0")
    assert v.run("numerics").ok
    result = v.run("gradients")
    assert result.ok, result.message
    assert result.details["inputs_and_parameters_compared"] > 100


@pytest.mark.parametrize("trimmed", [True, False])
def test_release_memory_says_whether_the_heap_was_trimmed(monkeypatch, trimmed):
    import fxverify.core.memory as memory

    libc = type("Libc", (), {"malloc_trim": staticmethod(lambda pad: 1)})()
    monkeypatch.setattr(memory, "_libc", lambda: libc if trimmed else None)
    assert memory.release_memory() is trimmed


def test_gradients_run_first_backpropagates_the_original_without_the_results_float64_copy(monkeypatch):
    """Run before numerics (a check that failed last time runs first), gradients must not keep the
    float64 result that learning whether the float64 stages apply made: vit_b_32 reached 3.6 GiB."""
    import fxverify.checks.gradients as gradients_module

    v = fxverify.Verification(fxverify.examples.identity, EDGE)
    alive = []
    real = gradients_module.loss_gradients

    def watched(module, *args, **kwargs):
        alive.append(sorted(v.subject._float64))
        return real(module, *args, **kwargs)

    monkeypatch.setattr(gradients_module, "loss_gradients", watched)
    assert v.run("gradients").ok
    assert alive == [["original-torch.float64"], ["result-torch.float64"]]


def test_a_released_fusion_result_made_again_sets_the_float64_tolerance_anew():
    """A fusion's float64 result is the transform applied to a float64 copy; released and made again,
    the transform may fail where it did not (then the float32 result is converted, and its rounded
    parameters need float32 tolerances): the tolerance follows the copy last made."""
    calls = []

    def flaky_fold(gm):
        calls.append(next(p.dtype for p in gm.parameters()))
        if len(calls) == 3:  # the float32 result, the first float64 copy, then this failure
            raise RuntimeError("no float64 this time")
        return mutations.bn_fold_correct(gm)

    v = fxverify.Verification(fxverify.contract(modes=("eval",), changes_parameters=True)(flaky_fold), EDGE)
    v.subject.module("result", torch.float64)
    tight = v.subject.float64_tolerance
    v.subject.release_copy("result", torch.float64)
    v.subject.module("result", torch.float64)
    assert calls == [torch.float32, torch.float64, torch.float64]
    assert not v.subject.float64_exact and v.subject.float64_tolerance != tight
