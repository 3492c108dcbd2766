"""Each check catches the realistic bugs it is for, through the library API,
and passes the correct transforms."""

from __future__ import annotations

import copy
import operator

import pytest
import torch

import fxverify
from fxverify import checks
from fxverify.api import Verification
from tests import mutations

# Where a bug needs a particular architecture to show, say which model shows it.
MODEL_FOR = {
    mutations.set_ordered_schedule: "resnet18",  # needs branches: several nodes ready at once
    mutations.hash_ordered_names: "resnet18",  # needs many named modules
    mutations.bn_fold_default_eps: "mobilenet_v3_small",  # needs BatchNorm eps other than 1e-5
    mutations.canonicalises_operand_order: "edge_inplace_ops",  # needs a - b of two computed values
    mutations.gelu_tanh_decomposition: "edge_shared_submodule",  # needs GELU
    mutations.dead_code_elimination_drops_mutations: "edge_inplace_ops",  # needs unused in-place ops
    mutations.legalize_graph_reorders_mutations: "edge_inplace_ops",  # needs an in-place write with no users
    mutations.unties_tied_weights: "edge_tied_weights",  # needs a shared Parameter
    mutations.plain_transformer_drops_wraps: "edge_wrapped_function",  # needs a torch.fx.wrap-ed function
    mutations.torch_normalize_operators: "edge_integer_inputs",  # needs torch.div(..., rounding_mode="floor")
    mutations.bn_fold_drops_affine_free_bn: "layer_conv_bn_no_affine",  # needs BatchNorm(affine=False)
    mutations.fused_softmax_without_max: "layer_root_attention",  # needs a softmax of logits beyond 88.7
}


@pytest.mark.slow
@pytest.mark.parametrize("buggy", list(mutations.BUGGY), ids=lambda f: f.__name__)
def test_each_bug_is_caught_by_its_check(buggy):
    check = mutations.BUGGY[buggy]
    model = MODEL_FOR.get(buggy, "edge_conv_bn_head")
    result = fxverify.verify(buggy, model, checks=[check])[0]
    assert result.outcome == "failed", f"{buggy.__name__} not caught by {check}"
    assert (result.check, result.model, result.transform) == (check, model, f"tests.mutations:{buggy.__name__}")
    assert result.finding and result.finding.splitlines()[0] in result.message  # what was found, rendered for people
    assert f"fxverify.assert_{check}('tests.mutations:{buggy.__name__}', '{model}')" in result.message


@pytest.mark.slow
@pytest.mark.parametrize("correct", mutations.CORRECT, ids=lambda f: f.__name__)
def test_correct_transforms_pass_every_check(correct):
    results = fxverify.verify(correct, "edge_conv_bn_head")
    assert tuple(r.check for r in results) == checks.NAMES
    failures = [r.message for r in results if not r.ok]
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize(("transform", "model"), [(t, m) for t, models in mutations.KNOWN_DEFECTS.items() for m in models],
                         ids=lambda x: getattr(x, "__name__", x))
def test_real_defects_of_torch_passes_are_found_on_the_layer_variants(transform, model):
    """torch's fuse, correct on the edge cases and the models, breaks on two layer variants."""
    check, finding = mutations.KNOWN_DEFECTS[transform][model]
    result = fxverify.verify(transform, model, checks=[check])[0]
    assert result.outcome == "failed" and finding in result.finding, result.message


@pytest.mark.parametrize("model", ["layer_conv_bn_no_affine", "layer_conv_bn_batch_stats", "layer_shared_conv"])
def test_the_suites_correct_bn_fold_is_correct_on_the_layer_variants_that_break_folds(model):
    """The layer variants found three defects in the suite's own "correct" fold (affine=False, no
    running statistics, a conv called twice): fixed, it passes where torch's fuse fails."""
    result = fxverify.check_numerics(mutations.bn_fold_correct, model)
    assert result.ok, result.message
    folded = mutations.bn_fold_correct(fxverify.load_case(model).captured())
    modules = dict(folded.named_modules())
    calls = [n for n in folded.graph.nodes if n.op == "call_module" and isinstance(modules[n.target], torch.nn.BatchNorm2d)]
    left = {"layer_conv_bn_no_affine": 0, "layer_conv_bn_batch_stats": 1, "layer_shared_conv": 2}
    assert len(calls) == left[model]  # the fold fired where it may, and only there


def test_numerics_names_input_output_path_and_first_divergent_node():
    result = fxverify.check_numerics(mutations.bn_fold_ignores_running_mean, "edge_conv_bn_head")
    assert result.input.startswith("b2-3x16x16") and result.where == "output"
    assert result.max_abs > 0 and result.max_rel > 0
    # bn1 was folded into conv1; relu kept its name and now reads conv1: the first wrong value
    assert result.divergence["result_node"] == "relu" and "first node: %relu " in result.message


def test_fresh_init_would_hide_the_bn_fold_bug():
    """With BN running_mean = 0 the buggy fold is exact: state randomisation is what catches it."""
    from fxverify.cases.case import ModelCase

    class FreshInit(ModelCase):
        def build(self, *, training=False):
            import torch

            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed)
                from fxverify.cases.case import factory_of

                return factory_of(self.entry)().train(training)

    fresh = FreshInit(fxverify.load_case("edge_conv_bn_head").entry)
    assert fxverify.check_numerics(mutations.bn_fold_ignores_running_mean, fresh).ok
    assert not fxverify.check_numerics(mutations.bn_fold_ignores_running_mean, "edge_conv_bn_head").ok


def test_large_magnitude_inputs_reveal_unstable_rewrites():
    message = fxverify.check_numerics(mutations.unstable_log_exp, "edge_conv_bn_head").message
    assert "-large" in message and "inf positions differ" in message


def test_batch_size_specialisation_is_caught_at_batch_one():
    assert fxverify.check_numerics(mutations.specialises_batch_size, "edge_conv_bn_head").input.startswith("b1-3x16x16")


def test_train_mode_is_checked_unless_the_contract_is_eval_only():
    assert "train mode" in fxverify.check_numerics(mutations.bakes_eval_dropout_away, "edge_conv_bn_head").message
    assert fxverify.check_numerics(fxverify.contract(modes=("eval",))(mutations.bakes_eval_dropout_away), "edge_conv_bn_head").ok


class ConvBnDropout(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.drop = torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.bn(self.conv(x)).relu())


def undeclared_fuse(gm: torch.fx.GraphModule) -> torch.nn.Module:
    """torch's inference-only conv/BN fusion, run under the strict contract (it raises in train mode)."""
    from torch.fx.experimental.optimization import fuse

    return fuse(gm, no_trace=True)


def undeclared_remove_dropout(gm: torch.fx.GraphModule) -> torch.nn.Module:
    """torch's inference-only dropout removal, run under the strict contract (wrong in train mode)."""
    from torch.fx.experimental.optimization import remove_dropout

    return remove_dropout(gm)


EVAL_MATCHED = ("in eval mode, which the contract checks first, the result matched the original at every input "
                "(float32 and float64): only the train-mode promise of the contract (modes=eval+train) is broken. If "
                "the pass is meant for eval mode only")


@pytest.mark.parametrize("inference_only", [undeclared_fuse, undeclared_remove_dropout], ids=lambda f: f.__name__)
def test_an_inference_only_pass_without_a_contract_is_told_its_eval_result_matched(inference_only):
    case = fxverify.case_from_module("conv_bn_dropout", ConvBnDropout, [(2, 3, 8, 8)])
    result = fxverify.check_numerics(inference_only, case)
    assert not result.ok and result.message.count(EVAL_MATCHED) == 1, result.message
    assert "declare @fxverify.contract(modes=('eval',))" in result.message
    assert fxverify.check_numerics(fxverify.contract(modes=("eval",))(inference_only), case).ok


def test_a_pass_wrong_in_eval_mode_too_is_not_told_to_declare_eval_only():
    wrong_in_eval = fxverify.contract(modes=("eval", "train"), changes_parameters=True)(
        mutations.bn_fold_ignores_running_mean.__wrapped__)
    result = fxverify.check_numerics(wrong_in_eval, "edge_conv_bn_head")
    assert not result.ok and "eval mode" in result.input
    assert "modes=('eval',)" not in result.message and "matched the original" not in result.message


class OptionalBias(torch.nn.Module):
    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return x + 1 if bias is None else x + bias


def retraces_twice(gm: torch.fx.GraphModule) -> torch.nn.Module:
    """Re-traces its input twice, as a pipeline of passes that re-trace does."""
    torch.fx.symbolic_trace(gm)
    return torch.fx.symbolic_trace(gm)


def test_a_transform_hit_by_torch_fx_s_unpatchable_wrap_is_told_it_is_a_torch_defect():
    case = fxverify.case_from_module("optional_bias", OptionalBias, [(2, 3)], concrete_args={"bias": None})
    result = fxverify.check_numerics(retraces_twice, case)
    assert not result.ok and "raised KeyError: 'torch.fx._symbolic_trace._assert_is_none'" in result.message
    assert ("known torch behaviour: a torch.fx defect (torch 2.14): code generated for a trace with a None concrete "
            "arg runs torch.fx.wrap('torch.fx._symbolic_trace._assert_is_none')") in result.message
    assert fxverify.check_numerics(mutations.normalize_args, case).ok  # and the next trace works


def test_changed_parameters_need_a_declared_contract():
    undeclared = mutations.bn_fold_correct.__wrapped__
    message = fxverify.check_gradients(undeclared, "edge_conv_bn_head").message
    assert "changes_parameters=True" in message
    assert fxverify.check_gradients(mutations.bn_fold_correct, "edge_conv_bn_head").ok


def test_devices_points_at_the_unmoved_tensor():
    message = fxverify.check_devices(mutations.plain_tensor_constant, "edge_conv_bn_head").message
    assert "tensor attribute 'scale'" in message and "register_buffer" in message
    message = fxverify.check_devices(mutations.hardcodes_cpu_device, "edge_conv_bn_head").message
    assert "hard-coded device 'cpu'" in message and "first node: %zeros" in message


@pytest.mark.slow
def test_determinism_across_processes_catches_hash_order():
    result = fxverify.check_determinism(mutations.hash_ordered_names, "resnet18")
    assert "PYTHONHASHSEED" in result.message


def test_cuda_check_skips_with_a_reason_without_a_gpu():
    import torch

    result = fxverify.check_cuda(fxverify.examples.identity, "edge_conv_bn_head")
    if torch.cuda.is_available():
        assert result.outcome == "passed"
    else:
        assert result.outcome == "skipped" and "CUDA is not available" in result.message


def test_transform_failures_fail_with_the_transform_traceback():
    result = fxverify.check_lint(mutations.raises, "edge_conv_bn_head")
    assert result.outcome == "failed"
    assert "pattern matcher exploded" in result.message and "Traceback" in result.message
    assert "edge_conv_bn_head" in result.message
    wrong = fxverify.check_lint(mutations.returns_graph, "edge_conv_bn_head").message
    assert "returned torch.fx.graph.Graph" in wrong and "accepted:" in wrong


def test_no_op_means_nothing_changed_at_all():
    v = Verification(lambda gm: None, "edge_conv_bn_head")
    assert v.subject.no_op is True and v.subject.changes == [] and v.run("lint").ok
    # a Transformer rebuilds the same graph, but drops the code's annotations and adds node meta
    assert Verification(mutations.transformer_identity, "edge_conv_bn_head").subject.changes == ["code", "meta"]
    assert Verification(mutations.torch_fuse, "edge_conv_bn_head").subject.changes[:2] == ["state", "graph"]


@pytest.mark.slow
def test_assert_helpers_raise_readable_failures():
    with pytest.raises(fxverify.CheckFailed, match="fxverify lint check failed"):
        fxverify.assert_lint(mutations.forgets_recompile, "edge_conv_bn_head")
    with pytest.raises(fxverify.CheckFailed, match="purity"):
        fxverify.assert_transform_ok(mutations.mutates_input, "edge_conv_bn_head")
    fxverify.assert_transform_ok(mutations.normalize_args, "edge_conv_bn_head")


def test_the_reference_is_never_corrupted_by_a_mutating_transform():
    v = Verification(mutations.mutates_input, "edge_conv_bn_head")
    applied = v.subject.applied()
    assert all(not n.name.endswith("_seen") for n in applied.original.graph.nodes)


def test_a_result_that_raises_when_run_is_a_finding_of_every_check_that_runs_it():
    def breaks_at_run_time(gm):
        return mutations._rewrite_output(gm, lambda g, x: g.call_function(torch.mm, (x, x)))  # (2, 10) @ (2, 10)

    for check in ("numerics", "purity"):
        result = fxverify.verify(breaks_at_run_time, "edge_conv_bn_head", checks=[check])[0]
        assert result.outcome == "failed"
        assert "raised when run: RuntimeError" in result.message and "running the check raised" not in result.message


def grow_in_place(x, sizes):
    sizes.append(1)  # mutates the list it was given, as torchvision's swin3d does
    return x * len(sizes)


torch.fx.wrap("grow_in_place")


class MutatesItsListArgument(torch.nn.Module):
    def forward(self, x):
        return grow_in_place(x, [1, 2])


def test_modules_whose_callees_mutate_list_arguments_are_checked_not_blamed():
    # torch.fx.Interpreter passes the node's immutable list: the original fails there too
    case = fxverify.case_from_module("mutates_list", MutatesItsListArgument, [(2, 3)])
    results = fxverify.verify(mutations.transformer_identity, case, checks=["lint", "numerics"])
    assert [r.outcome for r in results] == ["passed", "passed"], [r.message for r in results]
    assert "does not run under torch.fx.Interpreter either" in results[0].details["interpreter"]
    assert results[1].details["kept_nodes_compared"] == 1  # the recording interpreter ran it


def test_an_original_that_cannot_run_a_configuration_is_not_blamed_on_the_transform():
    # BatchNorm1d cannot train on a batch of one
    case = fxverify.case_from_module("bn_b1", lambda: torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)),
                                     [(1, 4)], batch_sizes=(1,))
    message = fxverify.check_numerics(mutations.transformer_identity, case).message
    assert "the original model itself raised when run, before any transform" in message
    assert "train mode" in message and "fix its inputs" in message


class CachesByInputSize(torch.nn.Module):
    """A leaf that caches a tensor sized by its last input, as timm's GPSA (convit) does."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(1), persistent=False)

    def forward(self, x):
        if self.cache.numel() != x.shape[-1]:
            self.cache = torch.arange(x.shape[-1], dtype=x.dtype)
        return x + self.cache


class CachingLeafTracer(torch.fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return isinstance(m, CachesByInputSize) or super().is_leaf_module(m, qualname)


def test_a_result_sharing_a_caching_leaf_with_its_input_is_not_called_impure():
    case = fxverify.case_from_module("caching_leaf", lambda: torch.nn.Sequential(CachesByInputSize()), [(2, 4)],
                                     spatial_sizes=((6,),), tracer="tests.test_checks:CachingLeafTracer")
    assert fxverify.verify(mutations.transformer_identity, case, checks=["numerics", "purity"])[1].ok
    assert fxverify.check_purity(mutations.mutates_input, "edge_conv_bn_head").outcome == "failed"


def _relu_to_clamp(graph: torch.fx.Graph) -> None:
    for node in graph.find_nodes(op="call_function", target=torch.nn.functional.relu):
        with graph.inserting_before(node):
            node.replace_all_uses_with(graph.call_function(torch.clamp_min, (node.args[0], 0.0)))
        graph.erase_node(node)


def rewraps_its_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Rewrites the Graph it was given and returns a new GraphModule over it, as torchao's prepare_pt2e does."""
    _relu_to_clamp(gm.graph)
    return torch.fx.GraphModule(gm, gm.graph)


def rewraps_a_copy_of_its_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Rewrites the Graph it was given, then returns a new GraphModule over a copy of it: two live graphs."""
    _relu_to_clamp(gm.graph)
    return torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))


def test_a_new_module_over_the_graph_it_was_given_works_in_place():
    rewrapped = fxverify.check_purity(rewraps_its_graph, "edge_conv_bn_head")
    assert rewrapped.outcome == "passed" and rewrapped.details["in_place"], rewrapped.message
    copied = fxverify.check_purity(rewraps_a_copy_of_its_graph, "edge_conv_bn_head")
    assert copied.outcome == "failed" and "also mutated the GraphModule it was given" in copied.message


def test_parameter_rewriting_transforms_are_compared_tightly_in_float64():
    # the fold is applied again to a float64 copy, so its new parameters carry no float32 rounding
    v = Verification(mutations.torch_fuse, "edge_conv_bn_head").subject
    assert v.float64_tolerance == v.tolerance

    @fxverify.contract(modes=("eval",), changes_parameters=True)
    def float32_only(gm):
        if next(gm.parameters()).dtype != torch.float32:
            raise TypeError("float32 models only")
        return mutations.torch_fuse(gm)

    fallback = Verification(float32_only, "edge_conv_bn_head")
    assert fallback.subject.float64_tolerance.for_dtype(torch.float64) == fallback.subject.tolerance.for_dtype(torch.float32)
    assert fallback.run("numerics").ok and fallback.run("gradients").ok


class PinsFloat32(torch.nn.Module):
    """Casts to float32 inside forward: converted to float64, its PReLU sees mixed dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.act = torch.nn.PReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x.float()) * 2


def scales_output(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    gm = copy.deepcopy(gm)
    output = next(iter(gm.graph.find_nodes(op="output")))
    with gm.graph.inserting_before(output):
        output.args = (gm.graph.call_function(operator.mul, (output.args[0], 1.5)),)
    gm.recompile()
    return gm


def test_a_model_that_cannot_run_in_float64_is_compared_in_float32_only():
    case = fxverify.case_from_module("pins_float32", PinsFloat32, [(2, 3)])
    numerics, gradients = fxverify.verify(mutations.transformer_identity, case, checks=["numerics", "gradients"])
    assert numerics.outcome == "passed", numerics.message
    assert numerics.details["float64"].startswith("skipped: the original does not run in float64 (RuntimeError")
    assert gradients.outcome == "skipped" and "does not run in float64" in gradients.message
    broken = fxverify.check_numerics(scales_output, case)  # a wrong result is still caught, in float32
    assert broken.outcome == "failed" and "outputs differ" in broken.message


class FloorDivides(torch.nn.Module):
    """Differentiable in name only: torch has no derivative for floor_divide."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.floor_divide(x, 0.5) * x


def test_an_original_that_cannot_be_differentiated_skips_gradients_with_the_reason():
    case = fxverify.case_from_module("floor_divides", FloorDivides, [(2, 3)])
    gradients = fxverify.check_gradients(mutations.transformer_identity, case)
    assert gradients.outcome == "skipped", gradients.message
    assert "backward through the original raised RuntimeError" in gradients.message
    assert "floor_divide" in gradients.message
    assert fxverify.check_numerics(scales_output, case).outcome == "failed"  # the other checks still judge it


class DetachedScale(torch.nn.Module):
    """``w`` scales the input without training (detached); ``z`` only lends its shape."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))
        self.z = torch.nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w.detach() + torch.zeros_like(self.z)


def _rewrite_nodes(gm: torch.fx.GraphModule, matches, replace) -> torch.fx.GraphModule:
    for node in [n for n in gm.graph.nodes if matches(n)]:
        with gm.graph.inserting_before(node):
            node.replace_all_uses_with(replace(gm.graph, node))
        gm.graph.erase_node(node)
    gm.recompile()
    return gm


def test_a_gradient_where_the_original_has_none_must_be_zero():
    case = fxverify.case_from_module("detached_scale", DetachedScale, [(2, 4)])
    zeros_as_product = fxverify.check_gradients(lambda gm: _rewrite_nodes(  # z * 0: a zero gradient, as good as none
        gm, lambda n: n.target is torch.zeros_like, lambda g, n: g.call_function(operator.mul, (n.args[0], 0))), case)
    assert zeros_as_product.ok, zeros_as_product.message
    detach_dropped = fxverify.check_gradients(lambda gm: _rewrite_nodes(  # w trains now: another training run
        gm, lambda n: n.target == "detach", lambda g, n: n.args[0]), case)
    assert detach_dropped.outcome == "failed"
    assert "grad of parameter 'w' (the original's gets no gradient)" in detach_dropped.message


def test_a_gradient_accumulated_in_parts_is_compared_whole():
    """Reentrant checkpointing accumulates a parameter used in two segments in two parts."""
    from torch.utils.checkpoint import checkpoint

    from fxverify.checks.gradients import loss_gradients

    class TwoSegments(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4, dtype=torch.float64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return checkpoint(self.lin, torch.tanh(checkpoint(self.lin, x, use_reentrant=True)), use_reentrant=True)

    module, x, params = TwoSegments(), torch.randn(2, 4, dtype=torch.float64), {"lin.weight": "lin.weight"}
    whole = loss_gradients(module, (x.clone(),), 0, params, lambda m: m.eval())
    kept = loss_gradients(module, (x.clone(),), 0, params, lambda m: m.eval(), keep=lambda label, grad: grad.clone())
    assert whole is not None and kept is not None
    assert torch.equal(kept["parameter 'lin.weight'"], whole["parameter 'lin.weight'"])
    assert torch.equal(kept["input 0"], whole["input 0"])


def test_a_model_built_in_another_dtype_runs_as_built():
    case = fxverify.case_from_module("bf16_linear", lambda: torch.nn.Linear(3, 3, dtype=torch.bfloat16),
                                     [fxverify.InputSpec((2, 3), "bfloat16")])
    for result in fxverify.verify(mutations.transformer_identity, case, checks=["lint", "numerics", "purity"]):
        assert result.outcome == "passed", result.message
    assert fxverify.check_numerics(scales_output, case).outcome == "failed"


def test_an_undeclared_fusion_fails_once_on_the_contract_not_on_numerics():
    numerics, gradients = fxverify.verify(mutations.undeclared_fusion, "resnet18", checks=["numerics", "gradients"])
    assert numerics.outcome == "passed", numerics.message  # the float64 result is the fusion redone in float64
    assert gradients.outcome == "failed" and "declare @fxverify.contract(changes_parameters=True)" in gradients.message


def test_moved_parameters_are_kept_and_said_to_have_moved():
    result = fxverify.check_gradients(mutations.partition_into_submodules, "edge_conv_bn_head")
    assert result.outcome == "passed", result.message
    assert "parameter 'conv1.weight' moved to 'submod_0.conv1.weight'" in result.details["moved"]


def test_a_frozen_parameter_fails_only_a_contract_that_trains():
    frozen = fxverify.check_gradients(mutations.freezes_parameters, "edge_conv_bn_head")
    assert "survives as a plain tensor attribute 'conv1.weight': it will not train" in frozen.message
    inference = fxverify.contract(modes=("eval",), changes_parameters=True)(mutations.freezes_parameters)
    assert fxverify.check_gradients(inference, "edge_conv_bn_head").ok


def test_float32_only_and_backend_specific_results_are_told_apart_from_portability_bugs():
    undeclared = fxverify.verify(mutations.mkldnn_convs.__wrapped__, "edge_conv_bn_head", checks=["numerics", "devices"])
    numerics, devices = undeclared
    assert numerics.ok and numerics.details["float64"].startswith("skipped: the result does not run in float64")
    assert "the result does not run in float64 where the original does" in devices.message
    assert "declare @fxverify.contract(dtypes=('float32',))" in devices.message
    assert "'MkldnnCPU' backend" in devices.message and "This could be because" not in devices.message
    float32_only = fxverify.contract(modes=("eval",), changes_parameters=True, dtypes=("float32",))
    mkldnn = fxverify.check_devices(float32_only(mutations.mkldnn_convs.__wrapped__), "edge_conv_bn_head")
    assert "specific to one backend: it holds mkldnn tensors" in mkldnn.message
    assert "declare @fxverify.contract(devices=('cpu',))" in mkldnn.message and "hard-coded" not in mkldnn.message
    fp16 = fxverify.check_devices(float32_only(mutations.dynamic_fp16_linears.__wrapped__), "edge_conv_bn_head")
    assert "it calls quantized::linear_dynamic_fp16, which has kernels for the CPU only" in fp16.message


def test_a_transform_that_raises_is_blamed_by_every_check_not_the_model():
    for result in fxverify.verify(mutations.raises, "edge_conv_bn_head", checks=["numerics", "gradients", "devices"]):
        assert "the transform failed on this model" in result.message
        assert "the original model itself raised" not in result.message


def test_sys_exit_in_a_transform_is_its_failure_and_ctrl_c_still_stops_the_run():
    message = fxverify.check_lint(mutations.exits, "edge_conv_bn_head").message
    assert "transform tests.mutations:exits raised SystemExit(3)" in message

    def interrupted(gm):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fxverify.Transform.from_callable(interrupted).apply(fxverify.load_case("edge_conv_bn_head").captured())


def test_an_exception_inside_fxverify_is_an_error_not_a_finding(monkeypatch):
    from fxverify.checks import lint

    def broken_check(v):
        return 1 / 0  # a bug in fxverify's own code

    monkeypatch.setattr(lint, "check", broken_check)
    result = Verification(mutations.normalize_args, "edge_conv_bn_head").run("lint")
    assert result.outcome == "error" and not result.ok
    assert result.message.startswith("fxverify error in the lint check (not a finding about the transform)")
    assert "ZeroDivisionError" in result.message and "Please report it" in result.message
    with pytest.raises(fxverify.CheckFailed, match="fxverify error in the lint check"):  # never passes silently
        fxverify.assert_transform_ok(mutations.normalize_args, "edge_conv_bn_head", checks=["lint"])


class DataDependent(torch.nn.Module):
    def forward(self, x):
        return x if x.sum() > 0 else -x  # symbolic_trace cannot branch on a traced value


def test_a_model_that_cannot_be_captured_is_blamed_not_the_transform_nor_fxverify():
    case = fxverify.case_from_module("data_dependent", DataDependent, [(2, 3)])
    for check in ("lint", "numerics", "determinism"):
        result = fxverify.verify(mutations.normalize_args, case, checks=[check])[0]
        assert result.outcome == "failed", result.message
        assert result.finding.startswith("building or capturing model 'data_dependent' (symbolic_trace (tracer plain)) "
                                         "in eval mode raised TraceError"), result.finding
        assert "Not the transform's doing" in result.finding and "report" not in result.message
    assert fxverify.verify(mutations.normalize_args, case, checks=[]) == []  # an empty selection runs nothing


@pytest.mark.slow
def test_set_ordered_schedules_are_caught_every_time():
    """Reruns hash nodes in the order they are made, then in reverse: a set of nodes iterates one way,
    then the other, so detection does not depend on where the allocator put the nodes."""
    for _ in range(50):
        result = Verification(mutations.set_ordered_schedule, "resnet18").run("determinism")
        assert result.outcome == "failed", result.message
    assert "with the nodes hashing in" in result.message


def test_a_divergence_names_the_in_place_writes_the_transform_removed():
    message = fxverify.check_numerics(mutations.dead_code_elimination_drops_mutations, "edge_inplace_ops").message
    assert "the original's nodes the transform removed before it:" in message
    assert "%copy_ (call_method copy_), %relu_ (call_method relu_)" in message


def test_a_result_whose_copy_behaves_differently_is_told_so():
    message = fxverify.check_numerics(mutations.wrapper_copy_loses_eval_mode, "edge_conv_bn_head").message
    assert "copy.deepcopy(result) already computes something else in float32 (the copy is in train mode" in message
    assert "not localised: the result is a CopiesByConstruction, not a GraphModule" in message



def test_a_pass_approximating_by_design_is_held_to_gradients_that_flow_not_to_their_values():
    """Weight-only int8 fake quantization (range_tol=0.05) moves the input gradients of edge_conv_bn_head
    by more than 5% of their scale (ReLU inputs change sign: shown in plain torch on its float64 modules),
    which is no defect of the pass; detaching the output still is one."""
    from tests import aten_passes

    case = fxverify.load_case("edge_conv_bn_head")
    v = Verification(aten_passes.fake_quantize_conv_weights, case, capture=case.capture_named("export"))
    result = v.run("gradients")
    assert result.ok and result.details["values"].startswith("not compared: the contract's range_tol")
    grads = []
    for which in ("original", "result"):
        x = case.configs[0].make(case.seed, dtype=torch.float64)[0].requires_grad_(True)
        weights = torch.randn(v.subject.outputs(which, dtype=torch.float64).shape, dtype=torch.float64)
        grads.append(torch.autograd.grad((v.subject.module(which, torch.float64)(x) * weights).sum(), x)[0])
    scale = grads[0].abs().max()
    assert (grads[1] - grads[0]).abs().max() > 0.05 * scale

    detached = fxverify.contract(range_tol=0.05)(mutations.detaches_output)
    found = Verification(detached, case).run("gradients")
    assert not found.ok and "gradients do not flow" in found.message


def keeps_a_lock(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Leaves a threading.Lock on the module: the result runs, copy.deepcopy of it raises."""
    import threading

    gm.lock = threading.Lock()
    return gm


def test_a_result_deepcopy_cannot_copy_is_reported_once_by_pickle():
    lint, pickled = fxverify.verify(keeps_a_lock, "edge_conv_bn_head", checks=["lint", "pickle"])
    assert lint.ok, lint.message
    assert not pickled.ok and "copy.deepcopy raised TypeError" in pickled.message, pickled.message
    # where pickle skips (the contract declares no serialisation), lint reports the copy
    unsaved = fxverify.contract(serializable=False)(keeps_a_lock)
    lint, pickled = fxverify.verify(unsaved, "edge_conv_bn_head", checks=["lint", "pickle"])
    assert pickled.outcome == "skipped" and "copy.deepcopy of the result raised TypeError" in lint.message


class MovingAverage(torch.nn.Module):
    """Updates a buffer in forward and reads it in the output: each call's output depends on the calls before."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.register_buffer("average", torch.zeros(4))

    def forward(self, x):
        self.average.mul_(0.9).add_(x.mean(0))
        return self.linear(x) + self.average


def drops_the_average_update(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Erases the ``add_`` that feeds the buffer: the output misses the input's mean from the first call on."""
    for node in gm.graph.find_nodes(op="call_method", target="add_"):
        node.replace_all_uses_with(node.args[0])
        gm.graph.erase_node(node)
    gm.recompile()
    return gm


def test_numerics_compares_a_model_whose_output_reads_a_buffer_it_updates_from_one_fresh_pair():
    """The runs before the float64 stage move the original's and the result's buffers apart (the result runs
    more: lint, purity): its copies come from a fresh capture, so the identity passes (it failed with 'the copy
    already computes something else', a false alarm) and a pass dropping the update still fails."""
    case = fxverify.case_from_module("moving_average", MovingAverage, [(2, 4)])
    v = Verification(fxverify.examples.identity, case)
    assert all(v.run(check).ok for check in ("lint", "purity", "numerics", "gradients", "stateful"))
    broken = Verification(drops_the_average_update, case).run("numerics")
    assert broken.outcome == "failed" and "outputs differ" in broken.message, broken.message


def test_stateful_follows_a_buffer_the_result_holds_under_another_name():
    """A result nesting the model (buffers under inner.*) updates the same buffers: passes (it failed with 'no
    longer holds the buffer', a false alarm the detection benchmark showed on edge_running_statistics)."""
    assert Verification(mutations.nest_in_wrapper, "edge_running_statistics").run("stateful").ok
    case = fxverify.case_from_module("moving_average", MovingAverage, [(2, 4)])
    assert Verification(drops_the_average_update, case).run("stateful").outcome == "failed"


def test_lint_holds_a_pass_result_to_its_modified_bit():
    from torch.fx.passes.infra.pass_base import PassBase, PassResult

    class TimesOne(PassBase):
        """Multiplies the output by 1.0 (the graph changes, the numbers do not), then says what it did."""

        def __init__(self, says: bool, rewrites: bool = True) -> None:
            self.says, self.rewrites = says, rewrites

        def call(self, gm: torch.fx.GraphModule) -> PassResult:
            if self.rewrites:
                output = next(n for n in gm.graph.nodes if n.op == "output")
                with gm.graph.inserting_before(output):
                    times = gm.graph.call_function(operator.mul, (output.args[0], 1.0))
                output.args = (times,)
                gm.recompile()
            return PassResult(gm, self.says)

    lint = fxverify.Verification(TimesOne(says=False), "edge_conv_bn_head").run("lint")
    assert lint.outcome == "failed" and "PassResult(modified=False) but changed the module's graph" in lint.finding
    assert fxverify.Verification(TimesOne(says=True), "edge_conv_bn_head").run("lint").details["modified"] is True
    quiet = fxverify.Verification(TimesOne(says=True, rewrites=False), "edge_conv_bn_head").run("lint")
    assert quiet.ok and quiet.details["modified"].startswith("True, with nothing changed")
