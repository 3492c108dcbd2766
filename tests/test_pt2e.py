"""The ``pt2e`` capture (a converted PT2E graph) and the ``qdq`` check: the identity passes, each buggy pass over a
converted graph fails first through the check meant for its class, naming the node and the parameter, and its
correct twin passes; :mod:`fxverify.analysis.qdq` on hand-made graphs. Needs torchao (the ``compile`` extra)."""

from __future__ import annotations

import pytest
import torch
from torch import fx, nn

import fxverify
from fxverify.analysis.qdq import new_problems, qdq_problems, quantization_step
from fxverify.capture.pt2e import Pt2e
from fxverify.core.results import FAILED
from tests import quant_passes

pytest.importorskip("torchao", reason="the pt2e capture quantizes with torchao (the compile extra)")

QD = torch.ops.quantized_decomposed
MODELS = ("edge_linear_bn", "layer_conv_bn")


def verification(transform, model: str) -> fxverify.Verification:
    case = fxverify.load_case(model)
    return fxverify.Verification(transform, case, capture=case.capture_named("pt2e"))


@pytest.mark.parametrize("model", MODELS)
def test_the_identity_passes_every_check_under_pt2e(model):
    results = verification(fxverify.examples.identity, model).run_all()
    assert [r.message for r in results if not r.ok] == []
    numerics = next(r for r in results if r.check == "numerics")
    assert numerics.details["float64"].startswith("skipped")  # q/dq ops take float32 only
    assert next(r for r in results if r.check == "qdq").details["qdq_nodes"] > 0


TWINS = [  # buggy pass, its correct twin, the check that must fail first, words of its finding
    (quant_passes.fold_weight_dequants_first_scale, quant_passes.fold_weight_dequants, "numerics", "outputs differ"),
    (quant_passes.dequant_scales_in_float16, quant_passes.scales_in_float16, "qdq",
     "scale 0.0"),
]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("buggy", "twin", "check", "words"), TWINS, ids=[t[0].__name__ for t in TWINS])
def test_a_buggy_pass_over_a_converted_graph_fails_first_through_its_check(model, buggy, twin, check, words):
    failed = [r for r in verification(buggy, model).run_all() if not r.ok]
    assert failed and failed[0].check == check and failed[0].outcome is FAILED, [(r.check, r.finding) for r in failed]
    assert words in failed[0].finding
    assert [r.message for r in verification(twin, model).run_all() if not r.ok] == []


def test_a_model_counting_its_calls_is_compared_from_one_fresh_state():
    """No float64 run rescues float32 outputs that earlier checks' runs (lint's interpreter) stepped apart: the
    comparison restarts from a fresh pair, and still sees a pass that changes what the counter multiplies."""
    def doubled_weight(gm: fx.GraphModule) -> fx.GraphModule:
        for node in gm.graph.nodes:
            if node.target == torch.ops.aten.mul.Tensor and 0.25 in node.args:
                node.args = (node.args[0], 0.5)
        gm.recompile()
        return gm

    for transform, outcome in ((fxverify.examples.identity, "passed"), (doubled_weight, "failed")):
        counted = verification(transform, "edge_counter_buffer")
        assert counted.run("lint").ok
        assert counted.run("numerics").outcome == outcome


def test_qdq_names_the_node_the_parameter_and_the_fix():
    result = verification(quant_passes.dequant_scales_in_float16, "edge_linear_bn").run("qdq")
    assert result.node is not None and result.node.startswith("dequantize_per_tensor")
    assert "where its quantize %quantize_per_tensor" in result.finding and "(pairing)" in result.finding
    assert "Advice: a pass that moves, merges or re-creates q/dq nodes" in result.finding


# -- fxverify.analysis.qdq on graphs made by hand --------------------------------------------------------------


def _graph(build) -> fx.GraphModule:
    root, graph = nn.Module(), fx.Graph()
    output = build(root, graph, graph.placeholder("x"))
    graph.output(output)
    return fx.GraphModule(root, graph)


def _weight(root: nn.Module, graph: fx.Graph, axis: int, scales: int) -> fx.Node:
    root.register_buffer("w", torch.zeros(6, 4, dtype=torch.int8))
    root.register_buffer("s", torch.ones(scales))
    root.register_buffer("z", torch.zeros(scales, dtype=torch.int64))
    w, s, z = (graph.get_attr(name) for name in ("w", "s", "z"))
    return graph.call_function(QD.dequantize_per_channel.default, (w, s, z, axis, -128, 127, torch.int8))


@pytest.mark.parametrize(("axis", "scales", "words"), [(1, 4, "axis 1 where %linear"), (0, 3, "3 scales for the 6 output")])
def test_a_per_channel_weight_off_its_output_channels_is_an_axis_problem(axis, scales, words):
    gm = _graph(lambda root, graph, x: graph.call_function(torch.ops.aten.linear.default,
                                                           (x, _weight(root, graph, axis, scales))))
    (problem,) = qdq_problems(gm)
    assert problem.kind == "axis" and words in problem.what


def test_parameters_out_of_range_and_an_op_moving_values_with_new_parameters():
    def build(root, graph, x):
        q = graph.call_function(QD.quantize_per_tensor.default, (x, -0.5, 300, 0, 255, torch.uint8))
        dq = graph.call_function(QD.dequantize_per_tensor.default, (q, -0.5, 300, 0, 255, torch.uint8))
        flat = graph.call_function(torch.ops.aten.flatten.using_ints, (dq, 1))
        return graph.call_function(QD.quantize_per_tensor.default, (flat, 0.25, 3, 0, 255, torch.uint8))

    kinds = [(p.kind, p.what.split(":")[0]) for p in qdq_problems(_graph(build))]
    assert ("parameters", "scale -0.5") in kinds and ("parameters", "zero point 300 outside its range [0, 255]") in kinds
    assert any(kind == "sharing" for kind, _ in kinds)


def test_only_the_problems_a_pass_made_are_new_and_the_step_is_the_coarsest_activations():
    def build(scale):
        def made(root, graph, x):
            q = graph.call_function(QD.quantize_per_tensor.default, (x, 0.1, 3, 0, 255, torch.uint8))
            return graph.call_function(QD.dequantize_per_tensor.default, (q, scale, 3, 0, 255, torch.uint8))
        return _graph(made)

    before, after = build(0.2), build(0.3)
    assert len(qdq_problems(before)) == 1 and new_problems(before, before) == []
    assert [p.what.split(" where")[0] for p in new_problems(before, after)] == ["scale 0.3"]
    assert quantization_step(after) == 0.3


def test_dynamic_quantization_parameters_computed_at_run_time_are_read_by_their_node():
    from fxverify.analysis.qdq import params
    from fxverify.capture.pt2e import Pt2e

    case = fxverify.load_case("edge_linear_bn")
    capture = Pt2e(quantizer="tests.quant_passes:x86_dynamic_quantizer", dynamic_batch=case.capture_named("pt2e").dynamic_batch)
    dynamic = fxverify.Verification(fxverify.examples.identity, case, capture=capture)
    assert [r.message for r in dynamic.run_all() if not r.ok] == []
    graph = dynamic.subject.applied().original
    runtime = [params(graph, n).scale for n in graph.graph.nodes if n.target == QD.quantize_per_tensor.tensor]
    assert runtime and all(isinstance(scale[0], str) and scale[0].startswith("%") for scale in runtime)
    assert quantization_step(graph) is None  # no activation step known before it runs: no extra tolerance


def test_a_relu_folded_into_the_quantize_a_second_reader_shares_fails_numerics_and_its_sole_reader_twin_passes():
    """The unsound-matching class: the quantize before a ReLU clamped at its zero point where the conv's value has
    another reader (a skip connection), which then reads clamped values."""
    case = fxverify.load_case("layer_conv_two_readers")
    capture = Pt2e(quantizer="tests.quant_passes:xnnpack_quantizer")  # it quantizes between the conv and its ReLU
    failed = [r for r in fxverify.Verification(quant_passes.fold_relu_into_quantize_any_reader, case,
                                               capture=capture).run_all() if not r.ok and r.outcome is FAILED]
    assert failed and failed[0].check == "numerics" and "outputs differ" in failed[0].finding, failed
    results = fxverify.Verification(quant_passes.fold_relu_into_quantize, case, capture=capture).run_all()
    assert [r.message for r in results if not r.ok and r.outcome is FAILED] == []


def test_the_sole_reader_fold_drops_the_relu_and_computes_the_same():
    graph = fx.Graph()
    x = graph.placeholder("x")
    q = graph.call_function(QD.quantize_per_tensor.default, (x, 0.05, 10, -128, 127, torch.int8))
    dq = graph.call_function(QD.dequantize_per_tensor.default, (q, 0.05, 10, -128, 127, torch.int8))
    relu = graph.call_function(torch.ops.aten.relu.default, (dq,))
    q2 = graph.call_function(QD.quantize_per_tensor.default, (relu, 0.05, 10, -128, 127, torch.int8))
    graph.output(graph.call_function(QD.dequantize_per_tensor.default, (q2, 0.05, 10, -128, 127, torch.int8)))
    original = fx.GraphModule(nn.Module(), graph)
    inputs = torch.linspace(-8, 8, 101)
    expected = original(inputs)
    folded = quant_passes.fold_relu_into_quantize(original)
    assert torch.ops.aten.relu.default not in {node.target for node in folded.graph.nodes}
    assert torch.equal(folded(inputs), expected) and qdq_problems(folded) == []


def test_a_dequantize_whose_range_holds_its_quantizes_reads_what_was_written():
    """As ExecuTorch's Arm backend fuses a ReLU: the quantize's qmin narrowed to the zero point, its dequantize left
    at the dtype's range, which holds every integer written; a dequantize narrower than its quantize is a problem."""
    def build(dq_range):
        def made(root, graph, x):
            q = graph.call_function(QD.quantize_per_tensor.default, (x, 0.1, -20, -20, 127, torch.int8))
            return graph.call_function(QD.dequantize_per_tensor.default, (q, 0.1, -20, *dq_range, torch.int8))
        return _graph(made)

    assert qdq_problems(build((-128, 127))) == []
    (narrower,) = qdq_problems(build((-20, 100)))
    assert narrower.kind == "pairing" and narrower.what.startswith("qmax 100 where its quantize")
