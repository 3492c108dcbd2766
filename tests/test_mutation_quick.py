"""The mutation suite in the quick tier: every buggy transform of ``tests/mutations.py`` (symbolic_trace) and
``tests/aten_passes.py`` (export, export_core, make_fx) is caught, through the API, by the one check meant for
it, on the smallest model that shows it, naming the first bad node where its finding has one. The slow tier
runs them on the models that first showed them and through the plugin (``test_checks.py``, ``test_export.py``).

A buggy transform added to ``mutations.BUGGY``, to ``test_export``'s tables, or to ``aten_passes.py`` with a
docstring that names its check (``"meta: ..."``) needs a row here: ``test_every_buggy_transform_has_a_quick_row``
fails until it has one.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
import torch
from torch import nn

import fxverify
from fxverify import checks
from fxverify.checks._digest_server import CrossProcessDigests
from tests import aten_passes, mutations, test_export


@dataclasses.dataclass(frozen=True)
class Row:
    """``check`` must fail ``model`` (a corpus name, or one of :data:`LOCAL_MODELS`) captured with ``capture``, its
    message holding ``phrase`` and, where given, its first bad node starting with ``node``."""

    check: str
    model: str
    phrase: str
    node: str | None = None
    capture: str = "symbolic_trace"
    captures: tuple[str, ...] = ()  # the captures agreement compares


class _DepthwiseOnDoubledBatch(nn.Module):
    """A depthwise convolution of a batch twice the input's: its FakeTensor implementation guards 2*s < 16,
    which the corpus's batch range (at most 8) never makes false on a plain depthwise convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1, groups=8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([x, x]))


LOCAL_MODELS = {
    "depthwise_doubled": lambda: fxverify.case_from_module("depthwise_doubled", _DepthwiseOnDoubledBatch,
                                                           [(2, 8, 8, 8)], batch_sizes=(2, 4)),
}

S = mutations
SYMBOLIC: dict[object, Row] = {
    S.bn_fold_ignores_running_mean: Row("numerics", "layer_conv_bn", "outputs differ", "%act "),
    S.forgets_recompile: Row("lint", "layer_conv_bn", "did not call gm.recompile()"),
    # the in-process reruns hash the nodes in graph order, then reversed: q, k, v are ready at once
    S.set_ordered_schedule: Row("determinism", "layer_root_attention", "fresh traces transformed in the same process "
                                "gave different graphs"),
    # string hashing: only the other process's PYTHONHASHSEED shows it; ten module names, never one order by chance
    S.hash_ordered_names: Row("determinism", "edge_nested_sequential", "in another process with a different "
                              "PYTHONHASHSEED"),
    S.bakes_eval_dropout_away: Row("numerics", "layer_dropouts", "train mode"),
    S.specialises_batch_size: Row("numerics", "edge_conv_bn_head", "raised when run", "%fc "),
    S.unstable_log_exp: Row("numerics", "layer_conv_bn", "inf positions differ"),
    S.plain_tensor_constant: Row("devices", "layer_conv_bn", "tensor attribute 'scale'", "%scale "),
    S.hardcodes_cpu_device: Row("devices", "layer_conv_bn", "hard-coded device 'cpu'", "%zeros"),
    S.freezes_parameters: Row("gradients", "layer_conv_bn", "survives as a plain tensor attribute"),
    S.detaches_output: Row("gradients", "layer_conv_bn", "gradients do not flow"),
    S.mutates_input: Row("purity", "layer_conv_bn", "also mutated the GraphModule it was given"),
    S.transposes_output_layout: Row("purity", "edge_conv_bn_head", "output layout changed"),  # a 2-d output
    S.drops_kept_parameter: Row("gradients", "edge_conv_bn_head", "parameter 'fc.weight' changed value"),  # 2-d weight
    S.bn_fold_default_eps: Row("numerics", "layer_conv_bn_eps", "outputs differ", "%act "),
    S.canonicalises_operand_order: Row("numerics", "edge_inplace_ops", "outputs differ"),
    S.gelu_tanh_decomposition: Row("numerics", "edge_shared_submodule", "outputs differ", "%proj_1 "),
    S.dead_code_elimination_drops_mutations: Row("numerics", "edge_inplace_ops", "outputs differ", "%conv2 "),
    S.legalize_graph_reorders_mutations: Row("numerics", "edge_inplace_ops", "outputs differ", "%relu_ "),
    S.unties_tied_weights: Row("gradients", "edge_tied_weights", "grad of parameter 'a.weight'"),
    S.replace_uses_makes_a_cycle: Row("lint", "layer_conv_bn", "graph.lint() failed"),
    S.casts_output_to_float32: Row("numerics", "layer_conv_bn", "dtype differs: expected torch.float64, got torch.float32"),
    S.calls_unwrapped_kernel: Row("retrace", "edge_conv_bn_head", "gives another graph"),  # functional relu
    S.keeps_a_closure_in_meta: Row("pickle", "layer_conv_bn", "pickle.dumps raised"),
    S.plain_transformer_drops_wraps: Row("retrace", "edge_wrapped_function", "lost node.meta['is_wrapped']"),
    S.torch_normalize_operators: Row("numerics", "edge_integer_inputs", "outputs differ", "%to "),
    S.bakes_training_flag: Row("numerics", "layer_dropouts", "does not follow the switch"),
    S.undeclared_fusion: Row("gradients", "layer_conv_bn", "declare @fxverify.contract(changes_parameters=True)"),
    S.bn_fold_drops_affine_free_bn: Row("numerics", "layer_conv_bn_no_affine", "outputs differ", "%act "),
    S.exits: Row("lint", "layer_conv_bn", "raised SystemExit(3)"),
    S.raises_unprintable: Row("lint", "layer_conv_bn", "its str() raised RuntimeError"),
    S.creates_tensor_without_device: Row("devices", "layer_conv_bn", "moved to the meta device fails to run", "%add "),
    S.wrapper_copy_loses_eval_mode: Row("numerics", "layer_dropouts", "copy.deepcopy(result) already computes something else"),
    S.fused_softmax_without_max: Row("numerics", "layer_root_attention", "appear in float32 only. That is no rounding "
                                     "error", "%matmul_1 "),
}

EX, CORE, MAKE_FX = "export", "export_core", "make_fx"
ATEN: dict[str, Row] = {
    "relu_to_clamp_min_without_meta": Row("meta", "layer_conv_bn", "have no meta['val']", "%clamp_min_default ", EX),
    "rebuilt_with_transformer": Row("meta", "layer_conv_bn", "torch.fx.Transformer", "%x ", EX),
    "relu_in_float64_with_stale_meta": Row("meta", "layer_conv_bn", "says dtype torch.float32, re-propagating FakeTensors "
                                           "gives torch.float64", "%_to_copy_default ", EX),
    "linear_as_addmm_with_weight_meta": Row("meta", "layer_linear_layernorm", "re-propagating FakeTensors gives",
                                            "%t_default ", EX),
    "to_channels_last_with_copied_meta": Row("meta", "layer_conv_bn", "re-propagating FakeTensors gives",
                                             "%clone_default ", EX),
    "relu_as_custom_kernel_without_fake": Row("meta", "layer_conv_bn", "re-propagating FakeTensors through the result "
                                              "raises at %fast_relu_none_fake_default", "%fast_relu_none_fake_default ", EX),
    "relu_as_custom_kernel_with_float16_fake": Row("meta", "layer_conv_bn", "The FakeTensor implementation of its target",
                                                   "%fast_relu_float16_fake_default ", EX),
    "relu_as_custom_kernel_with_branching_fake": Row("dynamic", "layer_conv_bn", "adds the guard",
                                                     "%fast_relu_branching_fake_default ", EX),
    "tests_batch_parity_with_bool": Row("dynamic", "layer_conv_bn", "to the ShapeEnv while it ran", None, EX),
    "reads_batch_as_int": Row("dynamic", "layer_conv_bn", "specialised the symbolic size", None, EX),
    "flatten_as_view_of_example_batch": Row("dynamic", "edge_conv_bn_head", "a size of the example inputs was written",
                                            "%view_default ", EX),
    "flatten_as_view_of_symbolic_batch": Row("dynamic", "edge_conv_bn_head", "holds the symbolic size s",
                                             "%view_default ", EX),
    "meta_recomputed_with_fake_tensor_prop": Row("dynamic", "edge_kwargs_heavy", "without the Python dispatcher",
                                                 "%upsample_bilinear2d ", EX),
    "to_channels_last_recording_guards": Row("dynamic", "depthwise_doubled", "shape_env.suppress_guards()", "%conv2d ", EX),
    "erase_unused_nodes": Row("stateful", "edge_running_statistics", "buffer 'calls' after call 1", "%add_ ", EX),
    "gelu_without_approximate": Row("numerics", "layer_activations", "outputs differ", "%gelu_default ", EX),
    "conv_bn_fold_forgets_mean": Row("numerics", "layer_conv_bn", "outputs differ", "%conv2d ", EX),
    "conv_bn_fold_in_any_mode": Row("numerics", "layer_conv_bn", "train mode, captured in it", None, EX),
    "relu_of_shifted_input": Row("numerics", "layer_conv_bn", "the difference is the float32 rounding", None, EX),
    "relu_to_clamp_min_without_recompile": Row("lint", "layer_conv_bn", "did not call gm.recompile()", None, EX),
    "copied_into_a_new_graph": Row("lint", "layer_conv_bn", "new_graph.set_codegen(copy.deepcopy(gm.graph._codegen))",
                                   None, EX),
    "conv_bn_fold_to_plain_attributes": Row("devices", "layer_conv_bn", "is not a registered parameter or buffer",
                                            "%folded", EX),
    "hoist_parameters_in_set_order": Row("determinism", "layer_conv_bn", "order of a set or dict of nodes", None, EX),
    # string hashing, shown by the other process only: make_fx captures cheapest there, at the example shapes
    "hoist_parameters_in_name_set_order": Row("determinism", "edge_conv_bn_head", "in another process with a different "
                                              "PYTHONHASHSEED", None, MAKE_FX),
    "relu_to_clamp_on_program_changing_the_given": Row("purity", "layer_conv_bn", "also mutated the one it was given",
                                                       None, EX),
    "insert_observer": Row("reexport", "layer_conv_bn", "exporting it again with export", None, EX),
    "relu_to_clamp_on_program_stale_signature": Row("verifier", "edge_running_statistics", "(USER_OUTPUT) names %relu",
                                                    "%clamp_default ", EX),
    "gelu_as_torch_function": Row("opset", "layer_activations", "a torch-level function, not an ATen operator", "%gelu", EX),
    "clamp_min_in_core": Row("opset", "layer_conv_bn", "which is not a core ATen", "%clamp_min_default ", CORE),
    "forgets_meta_in_make_fx": Row("meta", "layer_conv_bn", "have no meta['val']", "%clamp_min_default ", MAKE_FX),
    "pass_manager_losing_meta": Row("meta", "layer_conv_bn", "fails after step 2 of 3", "%clamp_min_default ", EX),
    "relu_times_tensor_literal_on_program": Row("serde", "edge_running_statistics", "torch.export.save raised",
                                                "%mul_tensor ", EX),
    # issue 35's structures: two reads of a buffer around a write through a slice, hand-written swish, a counter
    "cse_ignoring_view_writes": Row("numerics", "edge_buffer_written_through_view", "outputs differ", None, EX),
    "swish_to_silu_without_meta": Row("meta", "edge_hand_written_activations", "have no meta['val'] (%silu_default)",
                                      "%silu_default ", EX),
    "fold_buffer_computations": Row("stateful", "edge_counter_buffer", "call 2 of 3 on fresh modules", None, EX),
    "fake_quantize_training_ir_weights": Row("agreement", "layer_conv_bn", "It rewrote nothing under export_core",
                                             "under export: %conv2d", CORE, (EX, CORE)),
}

ROWS = [pytest.param(transform, row, id=transform.__name__) for transform, row in SYMBOLIC.items()] + [
    pytest.param(getattr(aten_passes, name), row, id=f"aten-{name}") for name, row in ATEN.items()]


def _case(model: str) -> fxverify.ModelCase:
    return LOCAL_MODELS[model]() if model in LOCAL_MODELS else fxverify.load_case(model)


def _run(transform, row: Row) -> fxverify.CheckResult:
    case = _case(row.model)
    if row.capture == "symbolic_trace":
        return fxverify.verify(transform, case, checks=[row.check])[0]
    transform = fxverify.Transform.from_callable(transform)
    # the other process's digest for determinism (fxverify.verify starts one for the case's own capture only)
    digests = CrossProcessDigests(transform, [case], timeout=120, capture=row.capture) if row.check == "determinism" else None
    try:
        return fxverify.Verification(transform, case, capture=case.capture_named(row.capture), captures=row.captures,
                                     cross_process=digests).run(row.check)
    finally:
        if digests is not None:
            digests.close()


@pytest.mark.parametrize(("transform", "row"), ROWS)
def test_each_buggy_transform_is_caught_by_its_check_on_a_small_model(transform, row):
    result = _run(transform, row)
    assert result.outcome == "failed", result.message
    assert (result.check, result.model) == (row.check, row.model), result.message
    assert f"fxverify {row.check} check failed" in result.message, result.message
    assert row.phrase in result.message, result.message
    if row.node is not None:
        assert result.node and result.node.startswith(row.node), result.node


def _tagged_aten_bugs() -> dict[str, str]:
    """The public passes of aten_passes.py whose docstring starts with the check meant to catch them
    (``"meta: ..."``, ``"numerics (train stage): ..."``): the buggy ones, by that module's convention."""
    tagged = {}
    for name, value in vars(aten_passes).items():
        doc = inspect.getdoc(value) if callable(value) and not name.startswith("_") else None
        found = re.match(r"(\w+)(:| \(|,)", doc or "")
        if found and found.group(1) in checks.NAMES:
            tagged[name] = found.group(1)
    return tagged


def test_every_buggy_transform_has_a_quick_row_for_the_check_meant_to_catch_it():
    missing = [f.__name__ for f in mutations.BUGGY if f not in SYMBOLIC]
    assert not missing, f"buggy mutations without a row in SYMBOLIC: {missing}"
    assert {f.__name__: row.check for f, row in SYMBOLIC.items()} == {f.__name__: c for f, c in mutations.BUGGY.items()}
    meant = {**_tagged_aten_bugs(), **{name: spec[0] for name, spec in test_export.BUGGY.items()},
             **{name: spec[0] for name, spec in test_export.BUGGY_PER_CAPTURE.items()}}
    assert "hoist_parameters_in_name_set_order" in meant and "conv_bn_fold_in_any_mode" in meant  # the convention holds
    missing = sorted(set(meant) - set(ATEN))
    assert not missing, f"buggy ATen passes without a row in ATEN: {missing}"
    assert {name: ATEN[name].check for name in meant} == meant
    for name, (_, _, _, capture) in test_export.BUGGY_PER_CAPTURE.items():
        assert ATEN[name].capture == capture, name  # a pass restricted to one capture is run there
    assert all(row.model in LOCAL_MODELS or fxverify.load_case(row.model) for row in [*SYMBOLIC.values(), *ATEN.values()])
