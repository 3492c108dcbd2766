"""fxverify.compile.backend: each buggy backend of tests/compile_backends.py is caught by the aspect meant for it
(the first to fail, in the registry's order), naming the backend, the model and the first bad node or input, while its
correct twin, and the plain correct backends (the identity, aot_eager), pass every aspect, models that update
buffers in forward among them. Tests that compile are slow (0.1-0.8 s a dynamo capture; 2-10 s a backend on a
model)."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

import fxverify
from fxverify.cases.case import case_from_module, load_case
from fxverify.checks import BACKEND, names
from fxverify.compile.backend import GRADIENT_ASPECTS, Recorder, Trial, check_backend, resolve_backend
from fxverify.core.results import FAILED, PASSED, SKIPPED
from fxverify.errors import TransformLoadError
from tests import compile_backends as backends

AOT_EAGER = "torch._dynamo.backends.debugging:aot_eager"  # torch.compile(backend="aot_eager"), as a spec names it
STATEFUL = ["edge_running_statistics", "edge_counter_buffer", "edge_buffer_written_through_view",
            "edge_kv_cache_attention"]  # the edge entries whose forward updates buffers (tag "stateful")


class ConvRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x))


def outcomes(results):
    return {r.check: r.outcome for r in results}


def failed_aspects(results):
    return [r.check for r in results if r.outcome is FAILED]


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
    assert [r.check for r in results] == list(names(BACKEND))


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
    # under dynamic=True too, its cache by code serves the batch-2 artifact to dynamo's recompile at batch 3
    assert failed_aspects(results) == ["backend-recompile", "backend-dynamic-shapes"]
    dynamic = next(r for r in results if r.check == "backend-dynamic-shapes")
    assert "Dynamo compiled the graph again for b3-3x16x16" in dynamic.finding
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
    assert skipped.outcome is SKIPPED and "not an aot_autograd(...) object" in skipped.message
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


def test_the_sizes_varied_are_those_eager_runs_at_one_dimension_at_a_time():
    def varied(model):
        return [what for _, what in Trial(backends.identity, "identity", load_case(model), torch.float32, None).variations]

    # the sequence length (the entry's spatial size 6 -> 9), not the width the norm weights fix at 16
    assert varied("edge_tiny_decoder_block") == ["dimension 1 of x0: 6 -> 9", "the batch: 2 -> 3",
                                                 "the batch (the entry's other batch size): 2 -> 1"]
    # height and width together (one size, one symbol), not the channels a convolution fixes at 3
    assert varied("edge_conv_bn_head")[0] == "dimensions 2, 3 of x0: 16 -> 24"
    # the int64 token input's length, its float input's width (8, read by a Linear) left as it is
    assert varied("edge_integer_inputs")[0] == "dimension 1 of x0: 5 -> 7"
    # features a Linear reads: only the batch varies
    assert varied("layer_linear_layernorm") == ["the batch: 2 -> 3", "the batch (the entry's other batch size): 2 -> 1"]


@pytest.mark.slow
def test_under_dynamic_true_the_dimensions_no_call_varies_are_static():
    # symbolic where no call varies them, maxvit_t's 224 x 224 kept dynamo's shape reasoning busy over 30 minutes
    symbolic = []

    def recording(gm, example_inputs):
        fakes = [node.meta["example_value"] for node in gm.graph.find_nodes(op="placeholder")]
        symbolic.extend(tuple(isinstance(n, torch.SymInt) for n in fake.shape) for fake in fakes
                        if isinstance(fake, torch.Tensor) and fake.dim() == 3)  # the input; parameters are static
        return gm.forward

    results = check_backend(recording, "edge_tiny_decoder_block", aspects=["backend-dynamic-shapes"])
    assert results[0].outcome is PASSED
    # the batch and the sequence symbolic, the width the norm weights fix static; then batch 1, which dynamo
    # specialises
    assert symbolic == [(True, True, False), (False, True, False)]


def test_a_contract_on_an_aot_autograd_backend_keeps_it_observed_and_named():
    declared = fxverify.contract(modes=("eval",))(backends.boxed_aot)
    assert Recorder(declared, "declared").made_by_aot_autograd
    assert resolve_backend(declared)[1].startswith("aot_autograd(fw_compiler=tests.compile_backends:_boxed_forward")


def test_a_backend_declared_for_other_dtypes_is_not_run_on_a_model_in_this_one():
    results = check_backend(backends.float32_linear, "edge_tiny_decoder_block", dtype=torch.bfloat16)
    assert [r.outcome for r in results] == [SKIPPED] * len(names(BACKEND))
    assert all("declares dtypes=float32 (@fxverify.contract): not run on a bfloat16 model" in r.message
               for r in results)


@pytest.mark.slow
@pytest.mark.parametrize("backend", [backends.identity, AOT_EAGER])
def test_correct_backends_pass_every_aspect_on_models_that_update_buffers(backend):
    for model in STATEFUL:
        results = check_backend(backend, model)
        assert_passes_every_aspect(results)
        dynamic = next(r for r in results if r.check == "backend-dynamic-shapes")
        assert dynamic.outcome is PASSED and dynamic.details["configs"] == ["b2-8", "b3-8", "b1-8"]


@pytest.mark.slow
def test_a_backend_losing_the_buffer_updates_fails_outputs_naming_the_buffer():
    results = check_backend(backends.runs_on_copies, "edge_running_statistics", aspects=["backend-outputs"])
    found = results[0]  # the output does not read the buffers: only their state after the call shows it
    assert found.outcome is FAILED and found.where == "buffer['running_mean']"
    assert "buffers of the model compiled with backend tests.compile_backends:runs_on_copies differ" in found.finding
    assert "must make those updates" in found.finding
    results = check_backend(backends.runs_on_copies, "edge_counter_buffer", aspects=["backend-recompile"])
    assert results[0].where == "buffer['count']" and "expected 1, got 0" in results[0].finding


@pytest.mark.slow
def test_a_backend_warming_up_on_its_example_inputs_fails_input_unchanged_and_outputs_name_them():
    aspects = ["backend-outputs", "backend-input-unchanged"]
    outputs, unchanged = check_backend(backends.warms_up_on_its_inputs, "edge_counter_buffer", aspects=aspects)
    assert outputs.outcome is FAILED and unchanged.outcome is FAILED
    assert "changed the values of the example_inputs dynamo handed it (graph 1" in unchanged.finding
    assert "example input" in unchanged.finding and "[x.clone() for x in example_inputs]" in unchanged.finding
    assert "The backend changed the values of the example_inputs" in outputs.finding  # the cause, where it shows
    assert [r.outcome for r in check_backend(backends.warms_up_on_clones, "edge_counter_buffer",
                                             aspects=aspects)] == [PASSED, PASSED]


@pytest.mark.slow
def test_a_backend_specialising_a_dynamic_graph_in_place_fails_input_unchanged_then_dynamic_shapes():
    results = check_backend(backends.specialize_sizes_in_place, "edge_tiny_decoder_block")
    assert failed_aspects(results) == ["backend-input-unchanged", "backend-dynamic-shapes"]
    changed, dynamic = (r for r in results if r.outcome is FAILED)
    assert "changed the GraphModule dynamo handed it under dynamic=True" in changed.finding
    assert "keep its sizes symbolic" in changed.finding
    assert changed.node == "call_method view target=view args=(%linear, %s77, %s27, 4, 4) kwargs={}"
    assert dynamic.input.startswith("b2-9x16 (x0: 2x9x16 float32), float32, eval mode, dynamic=True "
                                    "(dimension 1 of x0: 6 -> 9), after b2-6x16 in float32")
    assert "shape '[2, 6, 4, 4]' is invalid for input of size 288" in dynamic.finding
    assert "dynamo reused the graph it compiled under dynamic=True" in dynamic.finding
    assert "backend-input-unchanged: it changed graph 1" in dynamic.finding
    assert_passes_every_aspect(check_backend(backends.specialize_sizes_with_fallback, "edge_tiny_decoder_block"))


@pytest.mark.slow
def test_a_backend_caching_lowerings_without_dtypes_fails_the_dtype_sequence_and_its_twin_passes():
    results = check_backend(backends.CachedLowering(dtypes=False), "layer_linear_layernorm")
    assert failed_aspects(results) == ["backend-dtypes"]
    found = next(r for r in results if r.outcome is FAILED)
    assert found.input == "b3-8 (x0: 3x8 float32), float32, eval mode, static shapes, after b3-8 in bfloat16"
    assert "dtype differs: expected torch.float32, got torch.bfloat16" in found.finding
    assert "key the cache by the inputs' dtypes too" in found.finding
    assert_passes_every_aspect(check_backend(backends.CachedLowering(dtypes=True), "layer_linear_layernorm"))


@pytest.mark.slow
def test_an_inference_backend_skips_the_gradient_aspects_when_declared_and_fails_gradients_when_not():
    declared = check_backend(backends.inference_linear, "edge_tiny_decoder_block")
    assert_passes_every_aspect(declared)
    for result in declared:
        if result.check in GRADIENT_ASPECTS:
            assert result.outcome is SKIPPED and "declares modes=eval (@fxverify.contract): an inference backend" \
                in result.message
    undeclared = check_backend(backends.lower_linear, "edge_tiny_decoder_block")
    assert failed_aspects(undeclared) == ["backend-gradients"]
    found = next(r for r in undeclared if r.outcome is FAILED)
    assert "no autograd formula was registered" in found.finding
    assert "@fxverify.contract(modes=(\"eval\",))" in found.finding


@pytest.mark.slow
def test_a_float32_backend_skips_the_bfloat16_part_of_the_dtype_sequence_saying_so():
    results = check_backend(backends.float32_linear, "edge_tiny_decoder_block",
                            aspects=["backend-outputs", "backend-dtypes"])
    assert [r.outcome for r in results] == [PASSED, SKIPPED]
    assert "declares dtypes=float32 (@fxverify.contract): the bfloat16 part of the dtype sequence" in results[1].message


class SleepsInForward(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(3)  # dynamo breaks the graph here and runs it, compiled or not
        return x * 2


@pytest.mark.slow
def test_a_timeout_is_the_backends_only_where_a_second_run_times_out_too_and_dynamo_alone_does_not():
    def hangs(gm, example_inputs):
        time.sleep(60)
        return gm

    found = check_backend(hangs, "edge_scalar_output", aspects=["backend-outputs"], timeout=10)[0]
    assert found.outcome is FAILED and "ran out of time at b2-16 in float32" in found.finding
    assert "did not finish within 10 s (raise timeout= if it is just slow) in each of two runs; dynamo alone " \
        "(backend='eager') made the same calls in" in found.finding
    slowed = []

    def slowed_once(gm, example_inputs):  # as a machine busy with other work slows one run
        if not slowed:
            slowed.append(gm)
            time.sleep(60)
        return gm

    retried = check_backend(slowed_once, "edge_scalar_output", aspects=["backend-outputs"], timeout=10)[0]
    assert slowed and retried.outcome is PASSED, retried.finding
    slow = case_from_module("sleeps_in_forward", SleepsInForward, [(2, 4)], batch_sizes=(2,))
    skipped = check_backend(backends.identity, slow, aspects=["backend-outputs"], timeout=2)[0]
    assert skipped.outcome is SKIPPED and "dynamo alone) fails on sleeps_in_forward too" in skipped.message
    assert "does not compile it in time either" in skipped.message


@pytest.mark.slow
def test_a_backend_handing_back_buffers_its_next_call_overwrites_fails_naming_the_later_call_and_its_twin_passes():
    found = check_backend(backends.reusing_output_buffers, "edge_tied_weights", aspects=["backend-dynamic-shapes"])[0]
    assert found.outcome is FAILED, found.message
    assert "returned at b2-" in found.finding and "changed when it was called again at b" in found.finding
    assert "Return tensors the caller owns" in found.finding
    copied = check_backend(backends.copying_output_buffers, "edge_tied_weights", aspects=["backend-dynamic-shapes"])
    assert copied[0].outcome is PASSED, copied[0].finding


def test_dynamo_restarting_its_analysis_inside_a_backend_call_is_not_a_failure_of_the_backend():
    def restarts(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> fx.GraphModule:
        raise torch._dynamo.exc.TensorifyScalarRestartAnalysis  # as AOTAutograd raises it for dynamo to trace again

    def raises(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> fx.GraphModule:
        raise RuntimeError("unsupported op")

    gm = fx.symbolic_trace(lambda x: x + 1)
    restarted, failed = Recorder(restarts, "m:restarts"), Recorder(raises, "m:raises")
    with pytest.raises(torch._dynamo.exc.RestartAnalysis):
        restarted(gm, [torch.ones(2)])
    with pytest.raises(RuntimeError):
        failed(gm, [torch.ones(2)])
    assert restarted.failed is None and failed.failed is not None and "unsupported op" in failed.failed.raised
