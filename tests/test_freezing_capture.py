"""The ``inductor_freezing`` capture (issue 42): the inference graph where Inductor's freezing runs its pattern passes
(``freezing_patterns.pass_patterns``, where torchao's x86 quantization lowerings and Inductor's mkldnn weight packing
are registered), checked against a real ``torch.compile`` with ``config.freezing=True``; a correct freezing pattern
and a real torchao lowering pass, a twin dropping the bias fails numerics naming the node it made, and a graph torch
refuses after the loop fails naming the step."""

from __future__ import annotations

import importlib.util
import unittest.mock
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import fx, nn
from torch._inductor.pattern_matcher import CallFunction, KeywordArg, Match, PatternMatcherPass, register_graph_pattern

import fxverify
from fxverify.analysis.cpu_kernels import cpu_capability, int8_gemm_saturates
from fxverify.capture.freezing import Freezing
from fxverify.capture.inductor import fired_in
from fxverify.capture.lowerings import is_lowering
from fxverify.cases.case import ModelCase, case_from_module, load_case
from fxverify.core.results import FAILED, PASSED, SKIPPED

aten = torch.ops.aten
needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")
pytestmark = pytest.mark.cpu_kernels  # oneDNN's int8 GEMM and mkldnn packing: .ci/run runs these again under AVX2


class ConvLinear(nn.Module):
    """A convolution, a BatchNorm folded into it by freezing, a linear head: each frozen to constants."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


def _conv_linear() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return ConvLinear().eval(), (torch.randn(2, 3, 8, 8),)


def _counter_buffer() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    case = load_case("edge_counter_buffer")  # a buffer updated in forward: freezing keeps it a placeholder
    return case.build().eval(), tuple(case.example_inputs())


def _ao_qlinear_relu() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from benchmarks.real_compile_passes import ao_model

    return ao_model("ao_qlinear_relu"), (torch.randn(2, 4),)


def _received(graph: fx.Graph) -> dict[str, Any]:
    """What the loop received: the call targets in order, the constants by name, the placeholders."""
    gm = graph.owning_module
    assert gm is not None
    return {"calls": [str(node.target) for node in graph.nodes if node.op == "call_function"],
            "constants": {str(node.target): getattr(gm, str(node.target)) for node in graph.find_nodes(op="get_attr")},
            "placeholders": len(graph.find_nodes(op="placeholder"))}


def _compiled_at_loop(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[list[dict[str, Any]], Any]:
    """A real ``torch.compile`` with ``config.freezing=True``, its loop's first pass a recording stand-in that then
    runs the pass: what the loop received each time, and what the compiled model returned."""
    from torch._inductor import config
    from torch._inductor.fx_passes import freezing_patterns
    from torch._inductor.virtualized import V
    from torch._subclasses.fake_tensor import FakeTensorMode

    first = freezing_patterns.pass_patterns[0]
    original, seen = first.apply, []

    def record(graph: fx.Graph) -> Any:
        seen.append({**_received(graph), "fake_mode": isinstance(V.fake_mode, FakeTensorMode)})
        return original(graph)

    torch._dynamo.reset()
    try:
        with unittest.mock.patch.object(first, "apply", record), torch.no_grad(), \
                config.patch(freezing=True, force_disable_caches=True, fallback_random=True):
            out = torch.compile(model)(*inputs)
    finally:
        torch._dynamo.reset()
    return seen, out


@pytest.mark.slow
@pytest.mark.parametrize("make", [
    _conv_linear, _counter_buffer, pytest.param(_ao_qlinear_relu, marks=needs_torchao)],
    ids=["conv_linear", "edge_counter_buffer", "ao_qlinear_relu"])
def test_the_capture_is_the_graph_torch_compile_hands_freezings_pattern_loop(make: Callable[..., Any]) -> None:
    model, inputs = make()
    seen, out = _compiled_at_loop(model, inputs)
    with torch.no_grad():  # fresh instances: a counter buffer steps with each call
        expected = make()[0](*inputs)
    if not (make is _ao_qlinear_relu and int8_gemm_saturates()):  # there the compiled int8 GEMM overflows (row 35)
        torch.testing.assert_close(out, expected)
    gm = Freezing().capture(make()[0], training=False, inputs=inputs)
    mine = _received(gm.graph)
    frozen = {name: value for name, value in mine["constants"].items() if name.startswith("_frozen_param")}
    preserved = len(mine["constants"]) - len(frozen)  # the mutated buffers: get_attr of the model's own tensors
    [received] = seen
    assert received["fake_mode"]  # compile_fx sets V.fake_mode around the freezing compiler: the capture does too
    assert mine["calls"] == received["calls"]
    assert frozen.keys() == received["constants"].keys()
    assert all(torch.equal(frozen[name], value) for name, value in received["constants"].items())
    assert mine["placeholders"] + preserved == received["placeholders"]
    assert preserved == (make is _counter_buffer)
    with torch.no_grad():
        torch.testing.assert_close(gm(*inputs), expected)


# -- freezing patterns written as Inductor writes its mkldnn weight packing: a graph pattern on a frozen addmm --------
def addmm_as_linear(patterns: PatternMatcherPass) -> None:
    """``addmm(bias, x, weight_t)`` of a frozen weight becomes ``linear(x, permute(weight_t), bias)``; the permute of
    the constant is folded by ``_freeze``'s ``constant_fold`` after the loop."""
    _register_addmm_as_linear(patterns, keep_bias=True)


def addmm_as_linear_dropping_bias(patterns: PatternMatcherPass) -> None:
    """BUG (a bias dropped): :func:`addmm_as_linear` calling ``linear`` without the bias."""
    _register_addmm_as_linear(patterns, keep_bias=False)


def _register_addmm_as_linear(patterns: PatternMatcherPass, *, keep_bias: bool) -> None:
    @register_graph_pattern(CallFunction(aten.addmm.default, KeywordArg("bias"), KeywordArg("x"), KeywordArg("weight_t")),
                            extra_check=lambda match: match.kwargs["weight_t"].op == "get_attr",
                            pass_dict=patterns)
    def fuse(match: Match, bias: fx.Node, x: fx.Node, weight_t: fx.Node) -> None:
        graph, addmm = match.graph, match.output_node()
        with graph.inserting_before(addmm):
            weight = graph.call_function(aten.permute.default, (weight_t, [1, 0]))
            linear = graph.call_function(aten.linear.default, (x, weight, bias) if keep_bias else (x, weight))
        addmm.replace_all_uses_with(linear)
        graph.erase_node(addmm)


def _verification(transform: Any, case: ModelCase | None = None) -> fxverify.Verification:
    case = case or case_from_module("conv_linear", ConvLinear, [(2, 3, 8, 8)])
    return fxverify.Verification(transform, case, capture=case.capture_named("inductor_freezing"))


@pytest.mark.slow
def test_a_freezing_pattern_passes_and_its_twin_dropping_the_bias_fails_numerics_naming_its_node() -> None:
    correct = _verification(addmm_as_linear)
    assert [correct.run(check).outcome for check in ("numerics", "lint", "meta")] == [PASSED] * 3
    result = correct.subject.applied().result
    assert fired_in(result) == ("inference",)
    linear = result.graph.find_nodes(op="call_function", target=aten.linear.default)[0]
    assert linear.args[1].op == "get_attr"  # the permute of the frozen weight folded after the loop, as torch folds it
    found = _verification(addmm_as_linear_dropping_bias).run("numerics")
    assert found.outcome == FAILED, found.message
    assert "%linear_default" in found.message and "outputs differ" in found.message


def _adds_an_output(graph: fx.Graph) -> None:
    """BUG: returns one more value than the graph it was given."""
    output = graph.output_node()
    returned = output.args[0]
    assert isinstance(returned, tuple), "the loop's graph returns AOTAutograd's flat tuple"
    output.args = ((*returned, returned[0]),)


@pytest.mark.slow
@pytest.mark.parametrize(("spec", "said"), [
    ("tests.inductor_passes:copy_addmm_outputs_cyclic", "torch's stable_topological_sort after the loop raised on it "
                                                        "(a cycle: %clone_default -> %clone_default"),
    (_adds_an_output, "the graph returns 2 values where AOTAutograd's graph returned 1"),
], ids=["cycle", "extra_output"])
def test_a_graph_torch_refuses_after_the_loop_fails_the_transform_naming_why(spec: Any, said: str) -> None:
    found = _verification(spec).run("lint")
    assert found.outcome == FAILED and said in found.message, found.message


@pytest.mark.slow
@pytest.mark.parametrize("name", ["edge_counter_buffer", "edge_running_statistics", "edge_nested_outputs",
                                  "edge_conv_bn_head"])
def test_the_identity_passes_every_check_that_applies(name: str) -> None:
    verification = _verification(fxverify.examples.identity, load_case(name))
    outcomes = {check: verification.run(check).outcome for check in
                ("lint", "numerics", "meta", "opset", "purity", "stateful", "recompile", "interpreter")}
    assert set(outcomes.values()) <= {PASSED, SKIPPED}, outcomes
    assert [outcomes[check] for check in ("lint", "numerics", "meta", "opset")] == [PASSED] * 4
    assert (outcomes["stateful"] == PASSED) == (name in ("edge_counter_buffer", "edge_running_statistics"))


@pytest.mark.slow
@needs_torchao
def test_torchaos_x86_lowering_fires_and_passes_numerics_where_the_int8_gemm_is_exact() -> None:
    """torchao's own config (full-range activations): the int8 program is the q/dq program on a CPU with VNNI and
    differs on one without (docs/bugs-found.md row 35), where the verdict names the CPU and what to change. Each
    branch asserts: CI runs this test under ONEDNN_MAX_CPU_ISA=AVX2 as well as on the machine's own ISA."""
    from benchmarks.real_compile_passes import ao_entries

    case = ModelCase(next(entry for entry in ao_entries() if entry.name == "ao_qlinear_relu"))
    verification = _verification("benchmarks.real_compile_passes:torchao_x86_freezing", case)
    found = verification.run("numerics")
    if int8_gemm_saturates():
        assert found.outcome == FAILED
        assert cpu_capability() in found.message and "reduce_range=True" in found.message, found.message
    else:
        assert found.outcome == PASSED, found.message
    result = verification.subject.applied().result
    assert fired_in(result) == ("inference",)
    assert result.graph.find_nodes(op="call_function", target=torch.ops.onednn.qlinear_pointwise.default)


def test_the_capture_needs_example_inputs_and_says_so() -> None:
    assert Freezing().traits.differentiated is False and Freezing().traits.pickles is False
    with pytest.raises(ValueError, match="needs example inputs"):
        Freezing().capture(nn.Linear(2, 2), training=False)


@pytest.mark.slow
def test_a_stateful_models_float64_copies_are_compared_from_one_state() -> None:
    """Inductor's freezing patterns pack edge_buffer_written_through_view's linear (mkl._mkl_linear), whose float32
    rounding differs from addmm's: numerics runs the float64 reference, and must compare copies in one state."""
    found = _verification("benchmarks.real_compile_passes:inductor_freezing_patterns",
                          load_case("edge_buffer_written_through_view")).run("numerics")
    assert found.outcome == PASSED, found.message


# -- inductor_freezing_post: the same frozen compile at post_grad_custom_post_pass, where torchao's quantized
# concat-linear fusion runs on the qlinear lowering nodes its x86 lowerings left ------------------------------------
def _target(node: fx.Node) -> str:
    """A call's target as text, a lowering handler by its name (its text holds the match it is bound to)."""
    return getattr(node.target, "__name__", "?") if is_lowering(node.target) else str(node.target)


def _at_post_hook(graph: fx.Graph) -> dict[str, Any]:
    return {"calls": [_target(node) for node in graph.nodes if node.op == "call_function"],
            "placeholders": len(graph.find_nodes(op="placeholder"))}


def _ao(name: str, shape: tuple[int, ...]) -> Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    def make() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        from benchmarks.real_compile_passes import ao_model

        torch.manual_seed(1)
        return ao_model(name), (torch.randn(shape),)

    return make


def _ao_case(name: str) -> ModelCase:
    from benchmarks.real_compile_passes import ao_entries

    return ModelCase(next(entry for entry in ao_entries() if entry.name == name))


def _post(transform: Any, case: ModelCase) -> fxverify.Verification:
    return fxverify.Verification(transform, case, capture=case.capture_named("inductor_freezing_post"))


@fxverify.contract(modes=("eval",), devices=("cpu",))
def nothing_in_place(graph: fx.Graph) -> None:
    """A post-grad pass that finds nothing to do: the graph, lowering nodes and their ``meta['val']`` as given (an
    ``fx.Transformer`` rebuild drops that meta, which torch's FakeTensorUpdater then refuses for lowering nodes)."""


@fxverify.contract(modes=("eval",), devices=("cpu",), keeps_opset=False, changes_parameters=True, range_tol=5e-2)
def swapped_query_and_key(graph: fx.Graph) -> None:
    """BUG (the split outputs handed to the wrong users): torchao's concat-linear fusion, then the first two outputs
    of the split of its concatenated projection exchanged, so the query is computed with the key's weights (its
    contract is torchao's pass's)."""
    from benchmarks.real_compile_passes import torchao_quantized_concat_linear

    torchao_quantized_concat_linear(graph)
    for split in graph.find_nodes(op="call_function", target=aten.split_with_sizes.default):
        first, second = (next(user for user in split.users if user.args[1] == index) for index in (0, 1))
        first.args, second.args = second.args, first.args


@pytest.mark.slow
@needs_torchao
@pytest.mark.parametrize(("name", "shape"), [("ao_qlinear", (2, 4)), ("ao_mha", (1, 100, 256))])
def test_the_post_capture_is_the_graph_a_frozen_compile_hands_post_grad_custom_post_pass(
        name: str, shape: tuple[int, ...]) -> None:
    from torch._inductor import config

    make, seen = _ao(name, shape), []
    model, inputs = make()
    torch._dynamo.reset()
    try:
        with torch.no_grad(), config.patch(freezing=True, force_disable_caches=True, fallback_random=True,
                                           post_grad_custom_post_pass=lambda graph: seen.append(_at_post_hook(graph))):
            compiled = torch.compile(model)(*inputs)
    finally:
        torch._dynamo.reset()
    gm = Freezing("inductor_freezing_post").capture(make()[0], training=False, inputs=inputs)
    [received] = seen
    assert _at_post_hook(gm.graph) == received
    assert "qlinear" in received["calls"]  # torchao's x86 lowerings left lowering nodes, which the graph keeps
    with torch.no_grad():  # and which run eagerly the compiled program's oneDNN kernels, on any CPU (row 35)
        torch.testing.assert_close(gm(*inputs), compiled, atol=2e-2, rtol=0)


@pytest.mark.slow
@needs_torchao
def test_a_pass_finding_nothing_at_the_post_hook_passes_every_check_that_applies() -> None:
    verification = _post(nothing_in_place, _ao_case("ao_mha"))
    outcomes = {check: verification.run(check).outcome for check in
                ("lint", "numerics", "meta", "opset", "purity", "stateful", "determinism", "recompile", "interpreter")}
    assert set(outcomes.values()) <= {PASSED, SKIPPED}, outcomes
    assert [outcomes[check] for check in ("lint", "numerics", "meta", "opset", "purity")] == [PASSED] * 5


@pytest.mark.slow
@needs_torchao
def test_torchaos_quantized_concat_linear_fires_and_passes_and_its_twin_swapping_query_and_key_fails() -> None:
    from torch._dynamo.utils import counters

    counters.clear()
    verification = _post("benchmarks.real_compile_passes:torchao_quantized_concat_linear", _ao_case("ao_mha"))
    assert [verification.run(check).outcome for check in ("numerics", "lint", "meta")] == [PASSED] * 3
    assert counters["inductor"]["quantized_concat_linear_fusion"] == 1
    assert fired_in(verification.subject.applied().result) == ("inference",)
    found = _post(swapped_query_and_key, _ao_case("ao_mha")).run("numerics")
    assert found.outcome == FAILED, found.message
    assert "outputs differ" in found.message and "split_with_sizes" in found.message


@pytest.mark.slow
def test_a_rebuilt_graph_at_the_post_hook_fails_saying_its_lowering_nodes_lost_their_meta() -> None:
    """Under freezing on CPU the post hook's graph holds Inductor's mkldnn convolution lowerings; an fx.Transformer
    rebuild drops their meta['val'], which torch's FakeTensorUpdater cannot compute for a lowering: the advice is
    to keep the meta, not to register a FakeTensor implementation."""
    from tests.aten_passes import rebuilt_with_transformer

    found = _post(rebuilt_with_transformer, load_case("edge_conv_bn_head")).run("lint")
    assert found.outcome == FAILED, found.message
    assert "copy each node's meta along, or change the graph in place" in found.message
    assert "register_fake" not in found.message
    assert _post(nothing_in_place, load_case("edge_conv_bn_head")).run("lint").outcome == PASSED
