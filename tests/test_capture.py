"""The capture seam: everything fxverify does with graphs goes through a ``Capture``. Toy ones
(symbolic tracing with another leaf policy; a registered capture of its own, the worked example of
docs/architecture.md) are plugged in here, and the checks run on their graphs as on any other."""

from __future__ import annotations

import dataclasses

from torch import fx, nn

import fxverify
from fxverify.capture import Capture, SymbolicTrace
from fxverify.core import captures
from fxverify.core.captures import CaptureSpec, CaptureTraits, ModelFacts
from tests import mutations


class EveryModuleALeaf(fx.Tracer):
    """Keeps every submodule a ``call_module`` node (torch.fx only keeps torch.nn's own)."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return True


@dataclasses.dataclass(frozen=True)
class AllLeaves(SymbolicTrace):
    """``symbolic_trace`` with every submodule kept a leaf: a capture with another leaf policy."""

    name = "symbolic_trace_all_leaves"

    @property
    def tracer_class(self) -> type[fx.Tracer]:
        return EveryModuleALeaf

    def describe(self) -> str:
        return self.name


def test_a_new_capture_plugs_in_and_the_checks_run_on_its_graphs():
    capture: Capture = AllLeaves()
    v = fxverify.Verification(fxverify.examples.identity, "edge_nested_sequential", capture=capture)
    graph = v.subject.applied().original.graph
    assert [n.target for n in graph.find_nodes(op="call_module")] == ["features", "head"]  # not flattened
    assert v.run("lint").ok and v.run("retrace").ok  # retrace re-captures with the same leaf policy
    broken = fxverify.Verification(mutations.forgets_recompile, "edge_nested_sequential", capture=capture)
    result = broken.run("lint")
    assert result.outcome == "failed" and "symbolic_trace_all_leaves" in result.message


def test_the_symbolic_capture_gives_the_tracer_class_to_transforms_that_take_it():
    seen = []

    def takes_tracer(gm: fx.GraphModule, tracer_class: type[fx.Tracer]) -> fx.GraphModule:
        seen.append(tracer_class)
        return gm

    fxverify.Verification(takes_tracer, "edge_custom_leaf").run("lint")
    fxverify.Verification(takes_tracer, "edge_nested_sequential", capture=AllLeaves()).run("lint")
    assert [cls.__name__ for cls in seen] == ["EdgeLeafTracer", "EveryModuleALeaf"]


class TrainOnlyDoubling(nn.Module):
    def forward(self, x):
        return x * 2 if self.training else x


def test_the_symbolic_capture_traces_in_the_mode_it_is_asked_for_whatever_the_modules_mode():
    import torch

    for training, factor in ((True, 2.0), (False, 1.0)):
        gm = SymbolicTrace().capture(TrainOnlyDoubling().train(not training), training=training)
        assert gm.training is training and gm(torch.ones(1)).item() == factor


# -- a capture added as docs/architecture.md says: this module (its class and factory) and one registry row --


@dataclasses.dataclass(frozen=True)
class ConcreteBatchTrace(Capture):
    """Symbolic tracing through ``torch.fx.symbolic_trace``, described as a separate capture whose graphs are
    not captured again: a capture written from the base class, two members and a factory."""

    name = "toy_trace"

    def capture(self, module: nn.Module, *, training: bool, inputs: tuple = ()) -> fx.GraphModule:
        return fx.symbolic_trace(module.train(training))


def toy_for_model(facts: ModelFacts) -> ConcreteBatchTrace:
    return ConcreteBatchTrace()


TOY_ROW = CaptureSpec("toy_trace", __name__, "toy_for_model", "fx.symbolic_trace, not captured again",
                      CaptureTraits(recaptures=False))


def test_a_capture_added_with_one_registry_row_runs_through_the_api_and_the_plugin(monkeypatch, pytester):
    monkeypatch.setattr(captures, "REGISTRY", (*captures.REGISTRY, TOY_ROW))
    case = fxverify.load_case("edge_nested_sequential")
    capture = case.capture_named("toy_trace")
    assert isinstance(capture, ConcreteBatchTrace) and capture.traits == TOY_ROW.traits
    assert fxverify.Verification(fxverify.examples.identity, case, capture=capture).run("numerics").ok
    retrace = fxverify.Verification(fxverify.examples.identity, case, capture=capture).run("retrace")
    assert retrace.outcome == "skipped" and "toy_trace graphs are not captured again" in retrace.message
    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", "tests.mutations:forgets_recompile",
                                "--fxverify-corpus", "edge_nested_sequential", "--fxverify-capture", "toy_trace",
                                "--fxverify-checks", "lint,retrace,meta", "-v")
    result.assert_outcomes(failed=1)  # retrace and meta need what its graphs lack: not collected
    result.stdout.fnmatch_lines(["*edge_nested_sequential@toy_trace-lint*FAILED*", "*did not call gm.recompile()*"])
    assert "@toy_trace-retrace" not in result.stdout.str() and "@toy_trace-meta" not in result.stdout.str()
