"""Each round-trip check catches a transform built to break it, names what broke, and does not
blame the transform for what the original trace fails too."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import fx, nn

import fxverify
from fxverify.checks import NAMES
from tests import mutations

ROUND_TRIPS = ["recompile", "retrace", "to_folder", "pickle", "interpreter"]


def plain_mlp() -> fxverify.ModelCase:
    """A model whose trace survives every round trip, to_folder included (no annotations, no wraps)."""
    return fxverify.case_from_module("mlp", lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)),
                                     [(2, 4)])


def test_round_trips_run_after_the_other_checks_in_order():
    # reexport and serde are the export captures' round trips, so they are not in ROUND_TRIPS
    assert list(NAMES)[-8:] == [*ROUND_TRIPS[:2], "reexport", *ROUND_TRIPS[2:4], "serde", ROUND_TRIPS[4], "golden"]


def test_a_correct_transform_passes_every_round_trip():
    results = fxverify.verify(mutations.torch_fuse, "edge_conv_bn_head", checks=ROUND_TRIPS)
    outcomes = [r.outcome for r in results]
    assert outcomes == ["passed", "passed", "skipped", "passed", "passed"], [r.message for r in results]
    # torch's to_folder cannot export the `_torch_Tensor_` annotations of the traced code: not the transform's doing
    assert "the original trace fails this round trip too" in results[2].message
    assert all(r.ok for r in fxverify.verify(mutations.normalize_args, plain_mlp(), checks=ROUND_TRIPS))


def test_recompile_catches_a_graph_edited_without_recompile():
    message = fxverify.check_recompile(mutations.forgets_recompile, "edge_conv_bn_head").message
    assert "recompile() changes the generated code" in message and "first diff: line" in message


def patched_forward(gm: fx.GraphModule) -> nn.Module:
    """Edits the generated source (relu -> relu6, 'activations stay small') and re-executes it as forward,
    leaving the graph saying relu: the module computes what its graph does not say."""
    gm = copy.deepcopy(gm)
    namespace: dict = {"torch": torch}
    exec(gm.code.replace("torch.relu(", "torch.nn.functional.relu6("), namespace)
    type(gm).forward = namespace["forward"]
    return gm


class ScaledRelu(nn.Module):
    def forward(self, x):
        return torch.relu(x * 10.0)


def scaled_relu_case() -> fxverify.ModelCase:
    return fxverify.case_from_module("scaled_relu", ScaledRelu, [(2, 5)])


def test_interpreter_catches_a_forward_that_is_not_its_graph():
    message = fxverify.check_interpreter(patched_forward, scaled_relu_case()).message
    assert "torch.fx.Interpreter running the graph and the generated forward disagree" in message
    assert "first diff: output" in message and "max abs err" in message
    # the next recompile() would silently drop the patch: the recompile check says so too
    assert "after recompile() the module computes something else" in fxverify.check_recompile(
        patched_forward, scaled_relu_case()).message


def test_retrace_catches_a_helper_that_is_not_wrapped():
    message = fxverify.check_retrace(mutations.calls_unwrapped_kernel, "edge_conv_bn_head").message
    assert "gives another graph" in message and "torch.fx.wrap" in message
    assert "target=tests.mutations._relu_kernel" in message and "call_method 3 target=clamp" in message


def test_retrace_explains_wraps_lost_by_torch_transformer():
    # torch.fx.Transformer does not copy node.meta['is_wrapped']: the result's code stops registering
    # the wrapped function, and re-tracing (or unpickling) traces into it
    result = fxverify.check_retrace(mutations.plain_transformer_drops_wraps, "edge_wrapped_function")
    assert result.outcome == "failed"
    assert "%pad_to_multiple" in result.message and "node.meta['is_wrapped']" in result.message


def test_retrace_ignores_the_order_of_attribute_reads():
    # NormalizeArgs binds arange(..., dtype=x.dtype, device=x.device) by keyword but creates the
    # x.device read first; a re-trace reads in argument order. Same graph, other order: no finding.
    for check in (fxverify.check_retrace, fxverify.check_pickle):
        result = check(mutations.normalize_args, "edge_shape_factories")
        assert result.outcome == "passed", result.message


def test_to_folder_skips_code_that_registers_wrapped_functions():
    # torch's to_folder writes the torch.fx.wrap registration into the class body, where wrap() raises:
    # a torch limitation, whether or not the original had the registration
    result = fxverify.check_to_folder(fxverify.examples.identity, "edge_wrapped_function")
    assert result.outcome == "skipped" and "cannot export code that registers torch.fx.wrap" in result.message


def test_pickle_catches_an_unpicklable_attribute():
    result = fxverify.check_pickle(mutations.keeps_a_closure_in_meta, "edge_conv_bn_head")
    assert result.outcome == "failed"
    assert "pickle.dumps raised" in result.message and "<lambda>" in result.message
    assert fxverify.check_lint(mutations.keeps_a_closure_in_meta, "edge_conv_bn_head").ok  # deepcopy is fine


def rescales_with_a_local_closure(gm: fx.GraphModule) -> nn.Module:
    """Multiplies the output by a factor through a closure defined inside the transform."""
    factor = 1.0

    def rescale(x):
        return x * factor

    return mutations._rewrite_output(gm, lambda g, x: g.call_function(rescale, (x,)))


def test_to_folder_catches_code_that_cannot_be_imported_again():
    result = fxverify.check_to_folder(rescales_with_a_local_closure, plain_mlp())
    assert result.outcome == "failed"
    assert "to_folder" in result.message and "NameError" in result.message and "rescale" in result.message


def test_what_the_original_fails_too_is_a_skip_with_both_reasons():
    def rebuilds_then_rescales(gm):  # a Transformer drops the annotations that torch's to_folder cannot export
        return rescales_with_a_local_closure(fxverify.examples.identity(gm))

    result = fxverify.check_to_folder(rebuilds_then_rescales, "edge_conv_bn_head")
    assert result.outcome == "skipped"
    assert "the original trace fails this round trip too" in result.message
    assert "name '_torch_Tensor_' is not defined (the result: " in result.message
    assert "rescale' is not defined" in result.message


def test_a_result_that_is_not_a_graph_module_is_skipped():
    results = fxverify.verify(lambda gm: nn.Sequential(*gm.children()), plain_mlp(), checks=ROUND_TRIPS)
    assert {r.outcome for r in results} == {"skipped"}
    assert "not a GraphModule" in results[0].message


def test_round_trips_leave_the_shared_result_alone():
    # pickling a GraphModule recompiles it: the checks work on copies, so a later check still sees the bug
    v = fxverify.Verification(mutations.forgets_recompile, "edge_conv_bn_head")
    before = v.subject.applied().result.code
    # pickle sees deepcopy regenerate the code; the interpreter runs the graph as the forward does
    assert [v.run(c).outcome for c in ("pickle", "interpreter")] == ["failed", "passed"]
    assert v.subject.applied().result.code == before
    assert v.run("lint").outcome == "failed"


@pytest.mark.parametrize("check", ROUND_TRIPS)
def test_train_only_contracts_round_trip_in_train_mode(check):
    train_only = fxverify.contract(modes=("train",))(mutations.normalize_args)
    case = fxverify.case_from_module(
        "dropout_mlp", lambda: nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 3)), [(2, 4)])
    result = fxverify.verify(train_only, case, checks=[check])[0]
    assert result.outcome == "passed", result.message  # dropout reseeded per run, so outputs compare
    assert result.details["mode"] == "train"


class OptionalMask(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x, mask=None):  # no annotations: to_folder cannot export those of the traced code
        return self.b(self.a(x)) if mask is None else x * mask


def split_in_halves(gm: fx.GraphModule) -> fx.GraphModule:
    """torch's split_module with a simple callback: the first and the second half of the nodes."""
    from torch.fx.passes.split_module import split_module

    body = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    half = {node: 2 * i // len(body) for i, node in enumerate(body)}
    return split_module(gm, gm, lambda node: half[node])


def test_a_result_torch_fx_cannot_load_is_failed_with_the_torch_defect_explained_and_the_next_model_traces():
    """split_module of a trace with mask=None puts torch.fx's `_assert_is_none` call in a submodule:
    loading it runs torch.fx.wrap('torch.fx._symbolic_trace._assert_is_none'), after which every trace
    in the process raises KeyError (hiera_tiny_224 under split_module). The original pickles fine
    alone, so the failure is not skipped as the original's; one trip must not poison the next."""
    case = fxverify.case_from_module("optional_mask", OptionalMask, [(2, 4)], concrete_args={"mask": None})
    split = split_in_halves
    for result in fxverify.verify(split, case, checks=["to_folder", "pickle"]):
        assert result.outcome == "failed", result.message
        assert "KeyError: 'torch.fx._symbolic_trace._assert_is_none': a torch.fx defect" in result.finding
        assert result.finding.endswith("declare serializable=False")
    assert fxverify.check_pickle(fxverify.examples.identity, case).ok  # the original's own trip is fine
    assert fxverify.check_lint(split, plain_mlp()).ok  # and tracing works again


def folds_constants(gm: fx.GraphModule) -> nn.Module:
    """torch's constant folding: a FoldedGraphModule, which runs, recompiles, pickles, switches mode and runs
    after .to(torch.float64), but whose copy.deepcopy loses has_folding_been_run and raises when run."""
    from torch.fx.experimental.const_fold import split_const_subgraphs

    return split_const_subgraphs(gm)


class Uncopyable(fx.GraphModule):
    """A GraphModule that copy.deepcopy cannot copy."""

    def __deepcopy__(self, memo: dict[int, object]) -> Uncopyable:
        raise TypeError("Uncopyable cannot be copied")


def returns_uncopyable(gm: fx.GraphModule) -> nn.Module:
    return Uncopyable(gm, gm.graph)


def test_a_result_whose_deepcopy_is_broken_fails_pickle_alone_naming_the_copy():
    gm = fx.symbolic_trace(nn.Sequential(nn.Linear(3, 3), nn.ReLU()))
    folded, x = folds_constants(gm), torch.randn(2, 3)
    torch.testing.assert_close(folded.to(torch.float64)(x.double()), gm.double()(x.double()))  # plain torch: it runs
    with pytest.raises(AttributeError, match="has_folding_been_run"):
        copy.deepcopy(folded)(x.double())  # the copy does not
    checks = ["numerics", "gradients", "devices", *ROUND_TRIPS]
    results = {r.check: r for r in fxverify.verify(folds_constants, "edge_conv_bn_head", checks=checks)}
    assert [c for c, r in results.items() if not r.ok] == ["pickle"], [r.message for r in results.values()]
    assert ("running the module copy.deepcopy made raised AttributeError: 'GraphModule' object has no attribute "
            "'has_folding_been_run'; the copy lacks") in results["pickle"].finding
    assert "unless a subclass overrides _deepcopy_init (a torch defect" in results["pickle"].finding
    for check in ("numerics", "gradients", "devices", "recompile"):
        assert results[check].outcome == "passed", results[check].message
        assert results[check].details["result_copies"].startswith(
            "fxverify's copies of the result here are the transform applied to fresh captures, not "
            "copy.deepcopy(result): the module copy.deepcopy(result) makes raises AttributeError")
    assert results["devices"].details["float64"] == "runs" and results["devices"].details["meta_run"] == "runs"
    assert results["numerics"].details["float64"] == "compared"
    assert results["numerics"].details["switched_modes"] == ["train->eval", "eval->train"]


def test_a_result_deepcopy_cannot_copy_is_recompiled_and_switched_on_a_fresh_result():
    results = {r.check: r for r in fxverify.verify(returns_uncopyable, "edge_conv_bn_head",
                                                   checks=["numerics", "recompile", "pickle"])}
    assert results["numerics"].outcome == results["recompile"].outcome == "passed", results
    assert results["numerics"].details["switched_modes"] == ["train->eval", "eval->train"]
    assert results["pickle"].finding == "copy.deepcopy raised TypeError: Uncopyable cannot be copied"
