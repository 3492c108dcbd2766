"""Localisation: numerics names the first node whose value diverges, however the
transform named its nodes (name, provenance in node.meta, topological position)."""

from __future__ import annotations

import json
import threading

import torch
from torch import fx

import fxverify
from fxverify.analysis.compare import Tolerance
from fxverify.analysis.localise import changed_upstream, code_line, localise
from fxverify.analysis.node_map import correspondence
from tests import mutations

DIVERGENCE_KEYS = {"result_node", "original_node", "op", "target", "code_line", "shape", "dtype", "max_abs",
                   "max_rel", "how_mapped", "changed", "removed"}


def test_the_first_divergent_node_of_a_broken_bn_fold_is_the_relu_reading_the_folded_conv():
    result = fxverify.check_numerics(mutations.bn_fold_ignores_running_mean, "edge_conv_bn_head")
    divergence = result.divergence
    assert set(divergence) == DIVERGENCE_KEYS
    assert divergence == json.loads(json.dumps(divergence))  # JSON as it is, for the reports
    assert divergence["result_node"] == divergence["original_node"] == "relu"
    assert (divergence["op"], divergence["target"], divergence["how_mapped"]) == (
        "call_function", "torch.nn.functional.relu", "name")
    assert divergence["code_line"].startswith("relu = torch.nn.functional.relu(conv1")
    assert (divergence["shape"], divergence["dtype"]) == ([2, 8, 16, 16], "float64")
    assert divergence["max_abs"] > 0.1  # the running mean the fold dropped, scaled
    assert "code: relu = torch.nn.functional.relu(conv1" in result.message
    assert "reads nodes the transform changed: %conv1 (call_module conv1)" in result.message
    assert (divergence["changed"], divergence["removed"]) == (["conv1"], ["bn1"])  # the fold removed the BN
    assert "the original's nodes the transform removed before it: %bn1 (call_module bn1)" in result.message
    assert result.max_abs > 0  # the output numbers stay


def renamed_by_a_transformer(gm: fx.GraphModule) -> torch.nn.Module:
    """The buggy fold, then a torch.fx.Transformer copy whose nodes are renamed: only
    node.meta["from_node"] (which Transformer records) still names the original nodes."""
    result = fx.Transformer(mutations.bn_fold_ignores_running_mean(gm)).transform()
    for node in result.graph.nodes:
        if node.op != "placeholder":
            node.name = f"t_{node.name}"
    result.recompile()
    return result


def renamed_without_provenance(gm: fx.GraphModule) -> torch.nn.Module:
    """The buggy fold, then every node renamed and its meta dropped: only position is left."""
    result = mutations.bn_fold_ignores_running_mean(gm)
    for i, node in enumerate(result.graph.nodes):
        node.meta = {}
        if node.op != "placeholder":
            node.name = f"v{i}"
    result.recompile()
    return result


def conv_bn_relu() -> torch.nn.Module:
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1))


def test_renamed_nodes_are_mapped_by_provenance_or_by_position():
    case = fxverify.case_from_module("conv_bn_relu", conv_bn_relu, [(2, 3, 8, 8)])
    for transform, name, how in ((renamed_by_a_transformer, "t__2", "provenance"),
                                 (renamed_without_provenance, "v2", "position")):
        contracted = fxverify.contract(modes=("eval",), changes_parameters=True)(transform)
        divergence = fxverify.check_numerics(contracted, case).divergence
        # the BN _1 was folded into the conv _0; the ReLU module _2 now reads _0
        assert (divergence["result_node"], divergence["original_node"], divergence["how_mapped"]) == (name, "_2", how)


def test_correspondence_prefers_name_then_provenance_then_position():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            return torch.relu(self.lin(x)) + torch.tanh(x)

    original = fx.symbolic_trace(Net())
    result = fx.symbolic_trace(Net())
    nodes = {n.name: n for n in result.graph.nodes}
    nodes["lin"].name = "renamed_lin"  # still in module "lin": nn_module_stack says so
    nodes["tanh"].name, nodes["tanh"].meta = "renamed_tanh", {}  # nothing left but its place
    matches = correspondence(original, result)
    found = {new.name: (m.original.name, m.how) for new, m in matches.items()}
    assert found["relu"] == ("relu", "name")
    assert found["renamed_lin"] == ("lin", "provenance")
    assert found["renamed_tanh"] == ("tanh", "position")


def test_code_line_and_changed_upstream():
    gm = fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh()))
    relu, tanh, output = list(gm.graph.nodes)[1:]
    assert code_line(gm, output) == "return _1"
    assert code_line(gm, tanh).startswith("_1 = getattr(self, \"1\")(_0)")
    assert changed_upstream(tanh, kept=set()) == ("input_1", "_0")
    assert changed_upstream(tanh, kept={relu}) == ()


def test_a_correct_result_has_no_divergence_and_compares_every_kept_node():
    gm = fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU()))
    located = localise(gm, fx.Transformer(gm).transform(), (torch.randn(2, 3),), Tolerance())
    assert located.outputs is None and located.divergence is None and located.compared == 2


def detaches_before_relu(gm: fx.GraphModule) -> fx.GraphModule:
    """Same values, but a .detach() before the ReLU module cuts the gradient of all before it."""
    relu = next(n for n in gm.graph.find_nodes(op="call_module") if isinstance(gm.get_submodule(n.target), torch.nn.ReLU))
    with gm.graph.inserting_before(relu):
        relu.args = (gm.graph.call_method("detach", (relu.args[0],)),)
    gm.recompile()
    return gm


def test_gradients_name_the_kept_node_nearest_the_outputs_whose_gradient_differs():
    case = fxverify.case_from_module("conv_bn_relu", conv_bn_relu, [(2, 3, 8, 8)])
    assert fxverify.check_numerics(detaches_before_relu, case).ok  # the values are right
    result = fxverify.check_gradients(detaches_before_relu, case)
    divergence = result.divergence
    assert (divergence["result_node"], divergence["how_mapped"], divergence["max_abs"]) == ("_1", "name", None)
    assert "feeds nodes the transform changed: %detach (call_method detach)" in result.message


def scales_output_and_keeps_a_lock(gm: fx.GraphModule) -> torch.nn.Module:
    """Doubles the output and leaves a threading.Lock on the module, which copy.deepcopy cannot copy:
    the float64 copy that localisation needs cannot be made."""
    output = next(iter(gm.graph.find_nodes(op="output")))
    with gm.graph.inserting_before(output):
        output.args = (gm.graph.call_function(torch.mul, (output.args[0], 2.0)),)
    gm.recompile()
    gm.lock = threading.Lock()
    return gm


def test_a_result_without_a_float64_copy_is_localised_in_float32():
    result, devices = fxverify.verify(scales_output_and_keeps_a_lock, "edge_conv_bn_head", checks=["numerics", "devices"])
    assert not result.ok and "outputs differ" in result.message and "Traceback" not in result.message
    assert ("first node: no kept node diverged: the difference arises in nodes the transform changed: "
            "%mul (call_function torch.mul)") in result.message
    # fxverify could not copy it: that says nothing of whether it runs in float64 (lint reports the copy)
    assert devices.ok and devices.details["float64"].startswith("not judged: copy.deepcopy raised TypeError")
