"""fxverify.compile.backend: each buggy backend of tests/compile_backends.py is caught by the aspect meant for it,
naming the backend, the model and the first bad node or input, while its correct twin, and the plain correct
backends, pass every aspect. Tests that compile are slow (0.1-0.8 s a dynamo capture; 1-5 s a backend on a model)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from fxverify.compile.backend import ASPECTS, Recorder, check_backend, resolve_backend
from fxverify.core.results import FAILED, PASSED, SKIPPED
from fxverify.errors import TransformLoadError
from tests import compile_backends as backends


class ConvRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x))


def outcomes(results):
    return {r.check: r.outcome for r in results}


def test_the_recorder_names_the_node_a_backend_rewrote_in_the_graph_it_was_handed():
    gm = fx.symbolic_trace(ConvRelu())
    x = torch.randn(1, 3, 8, 8)
    buggy, twin = Recorder(backends.relu_in_place, "relu_in_place"), Recorder(backends.relu_on_copy, "relu_on_copy")
    assert torch.equal(twin(gm, [x])(x), gm(x))
    assert twin.calls[0].changed is None and twin.calls[0].node is None
    assert torch.equal(buggy(gm, [x])(x), F.relu(gm.conv(x)))  # right outputs...
    call = buggy.calls[0]  # ...from the graph it was handed, rewritten
    assert call.changed.startswith('graph changed: line 3: "call_function relu target=torch.nn.functional.relu')
    assert call.changed.endswith("became 'call_function relu target=torch.relu users=[output] args=(%conv,) kwargs={}'")
    assert call.node == "call_function relu target=torch.nn.functional.relu args=(%conv,) kwargs={'inplace': False}"


def test_the_recorder_says_what_a_backend_returned_that_is_not_callable():
    recorder = Recorder(lambda gm, example_inputs: gm.graph, "returns_graph")
    with pytest.raises(TypeError, match="backend returns_graph returned Graph for graph 1"):
        recorder(fx.symbolic_trace(ConvRelu()), [torch.randn(1, 3, 8, 8)])
    assert recorder.failed is not None and recorder.failed.raised == "it returned Graph, which is not callable"


def test_backend_specs_resolve_and_a_spec_naming_no_callable_is_refused_by_name():
    backend, name = resolve_backend("tests.compile_backends:relu_on_copy")
    assert backend is backends.relu_on_copy and name == "tests.compile_backends:relu_on_copy"
    with pytest.raises(TransformLoadError, match=r"backend spec 'tests.compile_backends:F' names a module, not a callable"):
        resolve_backend("tests.compile_backends:F")
    with pytest.raises(TransformLoadError, match="unknown backend aspect"):
        check_backend(backends.returns_forward, "edge_conv_bn_head", aspects=["backend-speed"])


def assert_passes_every_aspect(results):
    bad = [r.message for r in results if r.outcome not in (PASSED, SKIPPED)]
    assert not bad, "\n\n".join(bad)
    assert [r.check for r in results] == list(ASPECTS)


@pytest.mark.slow
def test_a_backend_rewriting_the_graph_it_is_handed_fails_input_unchanged_and_its_twin_passes():
    results = check_backend(backends.relu_in_place, "edge_conv_bn_head")
    assert {check for check, outcome in outcomes(results).items() if outcome is FAILED} == {"backend-input-unchanged"}
    found = next(r for r in results if r.check == "backend-input-unchanged")
    assert found.model == "edge_conv_bn_head" and found.transform == "tests.compile_backends:relu_in_place"
    assert found.node == "call_function x target=torch.nn.functional.relu args=(%batch_norm,) kwargs={}"
    assert "backend:    tests.compile_backends:relu_in_place" in found.message
    assert "became 'call_function x target=torch.relu" in found.finding and "copy.deepcopy(gm)" in found.finding
    assert_passes_every_aspect(check_backend(backends.relu_on_copy, "edge_conv_bn_head"))


@pytest.mark.slow
def test_a_backend_reusing_what_it_compiled_at_the_first_batch_size_fails_recompile_and_its_twin_passes():
    results = check_backend(backends.ReshapeAtFirstBatch(), "edge_conv_bn_head")
    assert {check for check, outcome in outcomes(results).items() if outcome is FAILED} == {"backend-recompile"}
    found = next(r for r in results if r.check == "backend-recompile")
    assert found.transform == "tests.compile_backends:ReshapeAtFirstBatch" and found.model == "edge_conv_bn_head"
    assert found.input.startswith("b1-3x16x16 (x0: 1x3x16x16 float32), float32, eval mode, static shapes")
    assert "mat1 and mat2 shapes cannot be multiplied (2x4 and 8x10)" in found.finding
    assert "right at b2-3x16x16, run first. Dynamo compiled the graph again for b1-3x16x16" in found.finding
    assert "graph 2 (25 nodes, example inputs 8x3x3x3, 8, 1x3x16x16" in found.finding  # the call it got wrong
    assert_passes_every_aspect(check_backend(backends.ReshapeAtRunBatch(), "edge_conv_bn_head"))


@pytest.mark.slow
@pytest.mark.parametrize("model, dtype", [("edge_conv_bn_head", torch.float32),
                                          ("edge_data_dependent_flow", torch.float32),
                                          ("edge_tiny_decoder_block", torch.float32),
                                          ("edge_tiny_decoder_block", torch.bfloat16)])
def test_correct_plain_and_aot_autograd_backends_pass_every_aspect(model, dtype):
    plain = check_backend(backends.returns_forward, model, dtype=dtype)
    assert_passes_every_aspect(plain)
    skipped = next(r for r in plain if r.check == "backend-backward-graph")
    assert skipped.outcome is SKIPPED and "not made by aot_autograd" in skipped.message
    aot = check_backend(backends.boxed_aot, model, dtype=dtype)
    assert_passes_every_aspect(aot)
    backward = next(r for r in aot if r.check == "backend-backward-graph")
    assert backward.outcome is PASSED and backward.details["backward_graphs"] >= 1
    breaks = next(r for r in aot if r.check == "backend-graph-breaks")
    assert (breaks.outcome is PASSED) == (model == "edge_data_dependent_flow"), breaks.message
    if breaks.outcome is PASSED:
        assert breaks.details["graphs"] == 2


@pytest.mark.slow
def test_resnet18_passes_every_aspect_with_an_aot_autograd_backend():
    assert_passes_every_aspect(check_backend(backends.boxed_aot, "resnet18"))


@pytest.mark.slow
def test_a_backend_that_raises_or_detaches_fails_naming_itself():
    def no_kernel(gm, example_inputs):
        raise NotImplementedError("no kernel for aten.convolution")

    raised = check_backend(no_kernel, "edge_conv_bn_head", aspects=["backend-outputs"])[0]
    assert raised.outcome is FAILED
    assert "no_kernel failed on graph 1 (25 nodes" in raised.finding
    assert "NotImplementedError: no kernel for aten.convolution" in raised.finding

    def detaches(gm, example_inputs):
        return lambda *args: tuple(out.detach() for out in gm(*args))

    gradients = check_backend(detaches, "edge_conv_bn_head", aspects=["backend-outputs", "backend-gradients"])
    assert [r.outcome for r in gradients] == [PASSED, FAILED]
    assert "outputs do not require grad, where eager's do" in gradients[1].finding
