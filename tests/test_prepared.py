"""The ``pt2e_prepared`` capture (a PT2E prepared graph, observers in place, before calibration) and the ``observers``
check: the identity passes every check, each buggy pass over a prepared graph fails first through ``observers``,
naming the node, the observer and the fix, and its correct twin passes; :mod:`fxverify.analysis.observers` on
hand-made graphs. Needs torchao (the ``compile`` extra); the XNNPACK quantizer's twins need ExecuTorch."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import fx, nn

import fxverify
from fxverify.analysis.observers import observed_edges, observer_problems
from fxverify.capture.export import BATCH_RANGE
from fxverify.core.results import FAILED
from tests import mutations, prepared_passes

pytest.importorskip("torchao", reason="the pt2e_prepared capture quantizes with torchao (the compile extra)")

XNNPACK = "fxverify.capture.edge:xnnpack_quantizer"  # shares one observer across cat and max_pool2d


def verification(transform, model: str, quantizer: str | None = None) -> fxverify.Verification:
    case = fxverify.load_case(model)
    capture = case.capture_named("pt2e_prepared")
    if quantizer is not None:
        pytest.importorskip("executorch", reason="the XNNPACK quantizer comes with ExecuTorch (the edge extra)")
        capture = dataclasses.replace(capture, quantizer=quantizer)
    return fxverify.Verification(transform, case, capture=capture)


def test_the_prepared_graph_holds_observers_and_its_batch_range():
    case = fxverify.load_case("layer_conv_bn")
    capture = case.capture_named("pt2e_prepared")
    gm = case.captured(training=False, capture=capture)
    observers = [n for n in gm.graph.nodes if n.op == "call_module" and "Observer" in type(gm.get_submodule(n.target)).__name__]
    assert observers and all("val" not in n.meta for n in observers)  # no meta check: observers carry no meta['val']
    assert "_observed_graph_module_attrs" in gm.meta  # what convert_pt2e asserts
    assert gm.meta[BATCH_RANGE] == (2, 8) and capture.describe().startswith("pt2e_prepared (fxverify.capture.pt2e")


@pytest.mark.parametrize("model", ["layer_conv_bn", "edge_cat_ranges"])
def test_the_identity_passes_every_check_under_pt2e_prepared(model):
    results = verification(fxverify.examples.identity, model).run_all()
    assert [r.message for r in results if not r.ok] == []
    by_check = {r.check: r for r in results}
    assert by_check["numerics"].details["float64"] == "compared"  # observers pass float64 through
    assert by_check["observers"].details["observers"] > 0 and by_check["observers"].details["converted"].startswith(
        "calibrated on")
    assert by_check["stateful"].ok and by_check["stateful"].details["updated_buffers"]  # the observers' own state


TWINS = [  # buggy pass, its correct twin, model, quantizer, words of the finding
    (prepared_passes.name_observers_by_node_copied, prepared_passes.name_observers_by_node, "edge_cat_ranges", XNNPACK,
     "(split). Advice: let every edge of a sharing group call the same observer module"),
    (prepared_passes.clone_after_observer, prepared_passes.clone_before_observer, "layer_conv_bn", None,
     "(unobserved)"),
]


@pytest.mark.parametrize(("buggy", "twin", "model", "quantizer", "words"), TWINS, ids=[t[0].__name__ for t in TWINS])
def test_a_buggy_pass_over_a_prepared_graph_fails_first_through_observers(buggy, twin, model, quantizer, words):
    failed = [r for r in verification(buggy, model, quantizer).run_all() if not r.ok]
    assert failed and failed[0].check == "observers" and failed[0].outcome is FAILED, [(r.check, r.finding) for r in failed]
    assert words in failed[0].finding and failed[0].node
    assert [r.message for r in verification(twin, model, quantizer).run_all() if not r.ok] == []


def test_unobserved_names_the_consumer_the_observer_and_the_fix():
    result = verification(prepared_passes.clone_after_observer, "layer_conv_bn").run("observers")
    assert result.node == "conv2d"
    assert "%conv2d: reads %clone_default unobserved (input 0), where prepare_pt2e observed it with HistogramObserver" \
        in result.finding and "(input_qspec_map of %conv2d)" in result.finding
    assert "Advice: keep every annotated edge observed: insert a new op before the observer" in result.finding


def test_a_pass_returning_a_graph_module_without_the_prepared_meta_cannot_be_converted():
    result = verification(mutations.transformer_identity, "layer_conv_bn").run("observers")
    assert result.outcome is FAILED and "_observed_graph_module_attrs" in result.finding
    assert "copy gm.meta" in result.finding


# -- fxverify.analysis.observers on graphs made by hand ----------------------------------------------------------


def _observed(shared: bool) -> fx.GraphModule:
    """relu(x) and neg(y), each read through an observer: one module under two names (a sharing group) or two."""
    from torchao.quantization.pt2e.observer import MinMaxObserver

    root, graph = nn.Module(), fx.Graph()
    root.obs_x = MinMaxObserver()
    root.obs_y = root.obs_x if shared else MinMaxObserver()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    relu = graph.call_function(torch.relu, (graph.call_module("obs_x", (x,)),))
    neg = graph.call_function(torch.neg, (graph.call_module("obs_y", (y,)),))
    graph.output((relu, neg))
    return fx.GraphModule(root, graph)


def _kinds(before: fx.GraphModule, after: fx.GraphModule) -> list[tuple[str, str]]:
    return [(p.kind, p.node) for p in observer_problems(before, after)]


def test_a_sharing_group_split_or_merged_is_a_problem_and_the_same_graph_is_none():
    shared, apart = _observed(shared=True), _observed(shared=False)
    assert len(observed_edges(shared)) == 2 and _kinds(shared, copy.deepcopy(shared)) == []
    split = copy.deepcopy(shared)
    split.obs_y = copy.deepcopy(split.obs_y)
    assert _kinds(shared, split) == [("split", "obs_y")]
    merged = copy.deepcopy(apart)
    merged.obs_y = merged.obs_x
    assert _kinds(apart, merged) == [("merged", "obs_y")]


def test_one_value_observed_apart_for_each_reader_is_no_split():
    """Two readers of one value sharing its observer, each given its own copy: both see the same values."""
    from torchao.quantization.pt2e.observer import MinMaxObserver

    root, graph = nn.Module(), fx.Graph()
    root.obs = MinMaxObserver()
    x = graph.placeholder("x")
    observed = graph.call_module("obs", (x,))
    graph.output((graph.call_function(torch.relu, (observed,)), graph.call_function(torch.neg, (observed,))))
    before = fx.GraphModule(root, graph)
    after = copy.deepcopy(before)
    after.add_submodule("obs_copy", copy.deepcopy(after.obs))
    neg = next(n for n in after.graph.nodes if n.target is torch.neg)
    with after.graph.inserting_before(neg):
        neg.args = (after.graph.call_module("obs_copy", (neg.args[0].args[0],)),)
    after.recompile()
    assert _kinds(before, after) == []


def test_an_observer_on_an_unannotated_edge_or_on_an_observer_is_a_problem():
    from torchao.quantization.pt2e.observer import MinMaxObserver
    from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, QuantizationSpec

    before = _observed(shared=False)
    after = copy.deepcopy(before)
    after.add_submodule("extra", MinMaxObserver())
    relu = next(n for n in after.graph.nodes if n.target is torch.relu)
    with after.graph.inserting_after(relu):
        observed = after.graph.call_module("extra", (relu,))
    relu.replace_all_uses_with(observed, delete_user_cb=lambda user: user is not observed)
    observer_x = relu.args[0]
    with after.graph.inserting_after(observer_x):
        twice = after.graph.call_module("extra", (observer_x,))
    relu.args = (twice,)
    after.recompile()
    kinds = _kinds(before, after)
    assert ("unannotated", "extra") in kinds and ("chained", "extra_1") in kinds, kinds
    spec = QuantizationSpec(dtype=torch.uint8, observer_or_fake_quant_ctr=MinMaxObserver)
    relu.meta["quantization_annotation"] = QuantizationAnnotation(output_qspec=spec)  # now the quantizer asked
    assert ("unannotated", "extra") not in _kinds(before, after)


def test_a_consumer_replaced_by_a_new_node_reading_the_same_observer_is_no_problem():
    """A pass swapping an op for another (no meta copied) leaves the new op reading the observer the old one read."""
    before = _observed(shared=False)
    after = copy.deepcopy(before)
    relu = next(n for n in after.graph.nodes if n.target is torch.relu)
    with after.graph.inserting_before(relu):
        clamped = after.graph.call_function(torch.clamp_min, (relu.args[0], 0.0))
    relu.replace_all_uses_with(clamped)
    after.graph.erase_node(relu)
    after.recompile()
    assert _kinds(before, after) == []
    dropped = copy.deepcopy(after)  # the new node reading the value unobserved, its observer read by nobody, is one
    clamped = next(n for n in dropped.graph.nodes if n.target is torch.clamp_min)
    clamped.args = (clamped.args[0].args[0], 0.0)
    dropped.recompile()
    assert _kinds(before, dropped) == [("unobserved", "clamp_min")]
