"""The capture seam: everything fxverify does with graphs goes through a ``Capture``. A toy one
(symbolic tracing with another leaf policy, the worked example of docs/architecture.md) is
plugged in here, and the checks run on its graphs as on any other."""

from __future__ import annotations

import dataclasses

from torch import fx, nn

import fxverify
from fxverify.capture import Capture, SymbolicTrace
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

    def skips(self, check: str) -> str | None:
        if check == "golden":
            return "the golden files were written from plain traces, not from all-leaves ones"
        return None

    def describe(self) -> str:
        return self.name


def test_a_new_capture_plugs_in_and_the_checks_run_on_its_graphs():
    capture: Capture = AllLeaves()
    v = fxverify.Verification(fxverify.examples.identity, "edge_nested_sequential", capture=capture)
    graph = v.subject.applied().original.graph
    assert [n.target for n in graph.find_nodes(op="call_module")] == ["features", "head"]  # not flattened
    assert v.run("lint").ok and v.run("retrace").ok  # retrace re-captures with the same leaf policy
    golden = v.run("golden")
    assert golden.outcome == "skipped" and "written from plain traces" in golden.message
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
