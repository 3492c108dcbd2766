"""The ``export``, ``export_core`` and ``make_fx`` captures: the capture seam, the pass forms
(``ep.module()``, the ``ExportedProgram``, its lifted graph), the ``meta``, ``dynamic``,
``stateful``, ``verifier``, ``opset`` and ``agreement`` checks, expected failures per capture, and the ATen-level
mutation suite (``tests/aten_passes.py``) through the plugin."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sympy
import torch
from fxverify.corpus.edge_cases import RunningStatistics
from torch import fx, nn
from torch._export.verifier import SpecViolationError
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp
from torch.utils import _pytree as pytree

import fxverify
from fxverify import checks
from fxverify.analysis.graph_text import canonical_text
from fxverify.analysis.repropagation import repropagate, shape_env_of, violation
from fxverify.capture import Export, MakeFx, SymbolicTrace
from fxverify.capture.copies import retyped_copy
from fxverify.capture.export import PROGRAM, named_as_exported
from fxverify.checks import _shapes
from fxverify.checks._digest_server import CrossProcessDigests
from fxverify.checks.agreement import capture_outputs
from fxverify.checks.determinism import cross_process_capture
from fxverify.core.contracts import Contract
from fxverify.core.results import FAILED, PASSED, SKIPPED, XFAILED
from fxverify.diagnose.repro_script import EXIT_DIFFERS
from fxverify.engine.subject import Settings
from tests import aten_passes, mutations
from tests.pinned import tied_to_pins

ATEN = Path(__file__).with_name("aten_passes.py")
MODELS = "edge_conv_bn_head,edge_running_statistics,layer_activations"

# pass -> (the check meant to catch it, the model it is caught on, a phrase of the finding)
BUGGY = {
    "relu_to_clamp_min_without_meta": ("meta", "edge_conv_bn_head", "have no meta['val']"),
    "rebuilt_with_transformer": ("meta", "edge_conv_bn_head", "torch.fx.Transformer"),
    "relu_in_float64_with_stale_meta": ("meta", "edge_conv_bn_head", "says dtype torch.float32, re-propagating "
                                                                      "FakeTensors gives torch.float64"),
    "linear_as_addmm_with_weight_meta": ("meta", "edge_conv_bn_head", "says shape 10x8, re-propagating FakeTensors "
                                                                      "gives 8x10 (and so does a real run)"),
    "to_channels_last_with_copied_meta": ("meta", "edge_conv_bn_head", "says strides (768, 256, 16, 1), "
                                                                       "re-propagating FakeTensors gives (768, 1, 48, 3)"),
    "relu_as_custom_kernel_without_fake": ("meta", "edge_conv_bn_head", "re-propagating FakeTensors through the "
                                                                        "result raises at %fast_relu_none_fake_default"),
    "relu_as_custom_kernel_with_float16_fake": ("meta", "edge_conv_bn_head", "The FakeTensor implementation of its "
                                                                             "target"),
    "relu_as_custom_kernel_with_branching_fake": ("dynamic", "edge_conv_bn_head", "adds the guard s77 <= 4, false at "
                                                                                  "s77 = 5"),
    "tests_batch_parity_with_bool": ("dynamic", "edge_conv_bn_head", "to the ShapeEnv while it ran, false at s77 = 3"),
    "flatten_as_view_of_example_batch": ("dynamic", "edge_conv_bn_head", "a size of the example inputs was written"),
    "flatten_as_view_of_symbolic_batch": ("dynamic", "edge_conv_bn_head", "holds the symbolic size s"),
    "erase_unused_nodes": ("stateful", "edge_running_statistics", "buffer 'calls' after call 1"),
    "gelu_without_approximate": ("numerics", "layer_activations", "outputs differ"),
    "conv_bn_fold_forgets_mean": ("numerics", "edge_conv_bn_head", "outputs differ"),
    "relu_to_clamp_min_without_recompile": ("lint", "edge_conv_bn_head", "did not call gm.recompile()"),
    "copied_into_a_new_graph": ("lint", "edge_conv_bn_head", "new_graph.set_codegen(copy.deepcopy(gm.graph._codegen))"),
    "conv_bn_fold_in_any_mode": ("numerics", "edge_conv_bn_head", "train mode, captured in it"),
    "conv_bn_fold_to_plain_attributes": ("devices", "edge_conv_bn_head", "_weight' (torch.float32, cpu) is not a "
                                         "registered parameter or buffer"),
}
# passes restricted to one capture by their contract or form: (check, model, phrase, capture)
BUGGY_PER_CAPTURE = {
    "relu_to_clamp_on_program_stale_signature": ("verifier", "edge_running_statistics",
                                                 "output_specs[0] (USER_OUTPUT) names %relu", "export"),
    "gelu_as_torch_function": ("opset", "layer_activations", "a torch-level function, not an ATen operator", "export"),
    "clamp_min_in_core": ("opset", "edge_conv_bn_head", "aten.clamp_min.default, which is not a core ATen", "export_core"),
    "forgets_meta_in_make_fx": ("meta", "edge_conv_bn_head", "have no meta['val']", "make_fx"),
    "pass_manager_losing_meta": ("meta", "edge_conv_bn_head", "fails after step 2 of 3, ", "export"),
    "relu_times_tensor_literal_on_program": ("serde", "edge_running_statistics", "torch.export.save raised ",
                                             "export"),
    "fake_quantize_training_ir_weights": ("agreement", "edge_conv_bn_head", "It rewrote nothing under export_core",
                                          "export_core"),
}
CORRECT = ("identity", "relu_to_clamp_min", "relu_to_clamp", "swap_add_operands", "decompose_hardtanh",
           "dead_code_elimination", "conv_bn_fold", "lifted_relu_to_clamp", "relu_to_clamp_on_program", "move_to_cpu",
           "fake_quantize_conv_weights", "to_channels_last", "relu_as_custom_kernel")

# correct on MODELS, with a real defect a newer corpus entry shows: (model, check, phrase of the finding)
KNOWN_DEFECTS = {
    # torch's move_to_device_pass copies each parameter, so an embedding and a head sharing one weight stop sharing it
    "move_to_cpu": ("edge_tied_embedding_head", "gradients", "grad of parameter 'embed.weight': expected tensor"),
}


def verification(transform, model: str, capture: str = "export") -> fxverify.Verification:
    case = fxverify.load_case(model)
    return fxverify.Verification(transform, case, capture=case.capture_named(capture))


# -- the capture ---------------------------------------------------------------------------------
def test_a_model_checked_at_several_batch_sizes_is_exported_with_a_dynamic_batch():
    case = fxverify.load_case("edge_conv_bn_head")
    capture = case.capture_named("export")
    assert capture == Export(core=False, dynamic_batch=True)
    gm = case.captured(capture=capture)
    (x,) = gm.graph.find_nodes(op="placeholder")
    assert isinstance(x.meta["val"].shape[0], torch.SymInt)
    assert all(node.meta.get("val") is not None for node in gm.graph.nodes if node.op == "call_function")
    for batch in (1, 3, 8):  # the exported module runs at other batch sizes
        assert gm(torch.randn(batch, 3, 16, 16)).shape == (batch, 10)
    assert case.capture_named("symbolic_trace") is case.capture and isinstance(case.capture, SymbolicTrace)
    with pytest.raises(fxverify.FxVerifyError, match="unknown capture 'dynamo'"):
        case.capture_named("dynamo")


def test_make_fx_gives_a_functional_aten_graph_with_meta_at_static_shapes():
    case = fxverify.load_case("edge_conv_bn_head")
    capture = case.capture_named("make_fx")
    assert capture == MakeFx() and capture.traits.opset == "functional"
    gm = case.captured(capture=capture)
    calls = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.convolution.default)
    assert calls and all(node.meta.get("val") is not None for node in calls)
    assert not capture.accepts([(1, 3, 16, 16)], [(2, 3, 16, 16)]) and not capture.traits.dynamic_batch
    assert checks.not_applicable("dynamic", capture.traits, capture.name) == "make_fx graphs have no dynamic batch " \
        "dimension (captures whose graphs have one: export, export_core, pt2e, pt2e_prepared)"
    stateful = verification(aten_passes.identity, "edge_running_statistics", "make_fx").run("lint")
    assert stateful.outcome == PASSED, stateful.message  # its buffers lifted, updates written back (test_make_fx_state)


class _DataDependent(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if x.sum() > 0 else -x


def test_a_model_that_does_not_capture_is_its_failure_not_an_error_of_fxverify():
    case = fxverify.case_from_module("data_dependent", _DataDependent, [(2, 3)])
    v = fxverify.Verification(aten_passes.identity, case, capture=case.capture_named("make_fx"))
    assert v.subject.changes is None  # what the plugin records for the summary: unknown, not a crash
    found = v.run("lint")
    assert found.outcome == FAILED and "GuardOnDataDependentSymNode" in found.message
    assert "Not the transform's doing: fix the model or how it is captured" in found.message


def test_a_static_export_runs_at_the_exported_shapes_only():
    static, dynamic = Export(dynamic_batch=False), Export()
    assert static.accepts([(2, 3)], [(2, 3)]) and not static.accepts([(1, 3)], [(2, 3)])
    assert dynamic.accepts([(1, 3)], [(2, 3)]) and dynamic.accepts([(8, 3)], [(2, 3)])
    assert not dynamic.accepts([(9, 3)], [(2, 3)]) and not dynamic.accepts([(2, 4)], [(2, 3)])
    assert "checked at one batch size" in checks.not_applicable("dynamic", static.traits, static.name)
    assert checks.not_applicable("dynamic", dynamic.traits, dynamic.name) is None
    v = verification(fxverify.examples.identity, "edge_conv_bn_head")
    assert [c.name for c in v.case.configs] == ["b2-3x16x16", "b1-3x16x16", "b2-3x24x24", "b2-3x16x16-large"]
    assert [c.name for c in v.subject.configs] == ["b2-3x16x16", "b1-3x16x16", "b2-3x16x16-large"]  # not 24x24


def test_checks_that_do_not_apply_to_exported_modules_skip_saying_why():
    v = verification(aten_passes.identity, "edge_conv_bn_head")
    results = {name: v.run(name) for name in ("pickle", "to_folder", "retrace", "golden", "cuda")}
    assert all(r.outcome == SKIPPED for r in results.values()), {n: r.message for n, r in results.items()}
    assert "export graphs are not pickled or written to a folder where they come from" in results["pickle"].message
    numerics = v.run("numerics")  # the train stage exports the model in train mode: on by default
    assert numerics.outcome == PASSED and "fixes the mode" in numerics.details["switched_modes"]
    assert numerics.details["other_modes"] == ["train"]
    case = fxverify.load_case("edge_conv_bn_head")
    untrained = fxverify.Verification(aten_passes.identity, case, capture=case.capture_named("export"),
                                      train_capture=False).run("numerics")
    assert untrained.outcome == PASSED and "--fxverify-train-capture off" in untrained.details["other_modes"]
    symbolic = fxverify.check_meta(aten_passes.identity, "edge_conv_bn_head")
    assert symbolic.outcome == SKIPPED and "captures whose graphs do: export, export_core, make_fx" in symbolic.message


def test_the_float64_reference_is_described_in_float64():
    v = verification(aten_passes.identity, "edge_conv_bn_head")
    original = v.subject.module("original", torch.float64)
    x = original.graph.find_nodes(op="placeholder")[0]
    assert x.meta["val"].dtype == torch.float64  # not a float32 graph's description of float64 tensors
    assert v.subject.float64_exact


class _DtypeMix(nn.Module):
    """In float64, the parameter follows the model; the tensor constant and the default-dtype factory stay
    float32, so one output is float64 (promoted) and the other float32."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.offset = torch.arange(4.0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.fc(x) + self.offset, torch.full((4,), 0.5) * self.offset


class _FactoryMix(nn.Module):
    """In float64, the parameter follows the model and the default-dtype factory stays float32: one output
    is float64, the other float32."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("offset", torch.arange(4.0))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.fc(x) + self.offset, torch.full((4,), 0.5) * torch.full((4,), 2.0)


def _described(gm: fx.GraphModule) -> dict[str, list[str]]:
    return {n.name: [f"{t.dtype} {tuple(t.shape)}" for t in pytree.tree_leaves(n.meta.get("val"))
                     if isinstance(t, torch.Tensor)] for n in gm.graph.nodes}


@pytest.mark.parametrize("core", [False, True], ids=["export", "export_core"])
def test_a_retyped_export_is_what_exporting_the_float64_model_gives(core):
    capture, x = Export(core=core), torch.randn(3, 4)
    model = _FactoryMix().eval()
    exported = capture.capture(copy.deepcopy(model).double(), training=False, inputs=(x.double(),))
    retyped = capture.in_dtype(capture.capture(model, training=False, inputs=(x,)), torch.float64)
    assert retyped is not None and retyped.code == exported.code
    assert _described(retyped) == _described(exported)  # the factories and their product stay float32
    assert retyped.graph.output_node().args[0][1].meta["val"].dtype == torch.float32
    assert isinstance(retyped.graph.find_nodes(op="placeholder")[0].meta["val"].shape[0], torch.SymInt)
    torch.testing.assert_close(retyped(x[:2].double()), exported(x[:2].double()), rtol=0, atol=0)


@pytest.mark.parametrize("core", [False, True], ids=["export", "export_core"])
def test_a_tensor_constant_stays_float32_in_the_float64_result(core):
    # the float64 result was once converted with .to(float64), which converts the constant that copy.deepcopy of
    # an ep.module() registers as a buffer: its float32 output became float64 and an identity failed numerics
    case = fxverify.case_from_module("dtype_mix", _DtypeMix, [(3, 4)])
    v = fxverify.Verification(aten_passes.identity, case, capture=Export(core=core, dynamic_batch=False))
    numerics = v.run("numerics")
    assert numerics.outcome == PASSED, numerics.message
    assert v.subject.module("result", torch.float64).offset.dtype == torch.float32


def test_an_export_baking_a_float_dtype_is_exported_again_in_float64():
    x = torch.arange(6).reshape(2, 3)
    gm = Export().capture(nn.Flatten(0), training=False, inputs=(x,))
    assert Export().in_dtype(gm, torch.float64) is not None  # integer inputs: nothing floating to retype
    baking = Export().capture(_Floats(), training=False, inputs=(x,))
    assert Export().in_dtype(baking, torch.float64) is None
    _, why = retyped_copy(baking, torch.float64)
    assert "bakes torch.float32" in why
    # a floating tensor constant: a plain attribute stays float32 in the float64 model, a tensor made in forward
    # (swin's lifted_tensor) follows the input; which one the graph cannot say, so the model is exported again
    constant = Export().capture(_DtypeMix(), training=False, inputs=(torch.randn(3, 4),))
    _, why = retyped_copy(constant, torch.float64)
    assert why == "node offset reads the floating tensor constant offset"
    v = verification(aten_passes.identity, "edge_integer_inputs")
    assert v.run("numerics").outcome == PASSED  # its float64 original: the float64 model exported again
    assert any(n.meta["val"].dtype == torch.float64 for n in v.subject.module("original", torch.float64).graph.nodes
               if isinstance(n.meta.get("val"), torch.Tensor))


class _Floats(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float() * 2


def test_an_expected_failure_is_per_capture():
    flow = verification(fxverify.examples.identity, "edge_data_dependent_flow").run("lint")
    assert flow.outcome == XFAILED and "GuardOnDataDependentSymNode" in flow.message
    # symbolic tracing cannot trace the slice assignment; torch.export can, and the checks run on it
    sliced = verification(aten_passes.identity, "edge_slice_assignment").run("numerics")
    assert sliced.outcome == PASSED, sliced.message
    assert fxverify.check_lint(fxverify.examples.identity, "edge_slice_assignment").outcome == XFAILED


def test_a_contract_names_the_captures_a_pass_is_for():
    @fxverify.contract(captures=("export_core",))
    def core_only(gm: fx.GraphModule) -> fx.GraphModule:
        assert not gm.graph.find_nodes(op="call_function", target=torch.ops.aten.conv2d.default), "core ATen only"
        return gm

    case = fxverify.load_case("edge_conv_bn_head")
    assert fxverify.Verification(core_only, case, capture=case.capture_named("export_core")).run("lint").ok
    for capture in ("symbolic_trace", "export"):  # it would raise there: not a failure, it is not written for them
        skipped = fxverify.Verification(core_only, case, capture=case.capture_named(capture)).run("lint")
        assert skipped.outcome == SKIPPED
        assert f"the contract declares the transform for export_core graphs: not run on {capture}" in skipped.message
    assert "captures=export_core" in fxverify.contract_of(core_only).describe()
    calls = []
    counted = fxverify.contract(captures=("export_core",))(lambda gm: calls.append(gm))
    assert fxverify.Verification(counted, case).subject.changes is None and not calls  # not even called
    with pytest.raises(fxverify.FxVerifyError, match="captures must be a non-empty subset"):
        fxverify.contract(captures=("dynamo",))


def test_a_numerics_failure_on_an_export_capture_is_repro_d_by_a_minimised_saved_program_and_the_pass_call(tmp_path):
    case = fxverify.load_case("edge_conv_bn_head")
    v = fxverify.Verification(aten_passes.conv_bn_fold_forgets_mean, case, capture=case.capture_named("export"),
                              repro_dir=tmp_path)
    found = v.run("numerics")
    assert found.outcome == FAILED and found.repro, found.message
    script = Path(found.repro)
    assert re.search(r"a subgraph's export program, \d+ nodes, minimised from \d+ in \d+ s, \d+ tries, and the pass call",
                     found.message), found.message
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{script.stem}{s}" for s in (".py", ".pt2", ".pt"))
    program = torch.export.load(script.with_suffix(".pt2"))
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert targets == [torch.ops.aten.conv2d.default, torch.ops.aten.batch_norm.default], targets  # the fold's pair
    root = Path(__file__).resolve().parents[1]  # where tests.aten_passes imports
    run = subprocess.run([sys.executable, str(script)], cwd=root, capture_output=True, text=True, timeout=300)
    assert run.returncode == EXIT_DIFFERS and "outputs differ" in run.stderr, run.stderr[-2000:]
    fixed = script.with_name("fixed.py")  # the same program and call with the correct fold: no failure
    source = script.read_text()
    assert "TRANSFORM = 'tests.aten_passes:conv_bn_fold_forgets_mean'\n" in source
    fixed.write_text(source.replace("TRANSFORM = 'tests.aten_passes:conv_bn_fold_forgets_mean'",
                                    "TRANSFORM = 'tests.aten_passes:conv_bn_fold'"))
    run = subprocess.run([sys.executable, str(fixed)], cwd=root, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "no failure" in run.stdout, run.stderr[-2000:]


def test_verify_each_names_the_step_that_breaks_what_a_later_step_repairs():
    assert verification(aten_passes.repairing_pipeline, "edge_conv_bn_head").run("meta").outcome == PASSED
    verified = verification(aten_passes.repairing_pipeline_verified_each, "edge_conv_bn_head")
    found = verified.run("meta")
    assert found.outcome == FAILED, found.message
    assert "verify-each (the contract declares verify_each=True): step 1 of 2 leaves a graph that fails the meta " \
           "check, which the whole pipeline passes" in found.message
    assert "have no meta['val']" in found.message and "fails after step 1 of 2" in found.message
    assert found.node and "clamp" in found.node
    assert verified.run("numerics").outcome == PASSED  # verify-each covers the structural checks only


def test_a_numerics_failure_on_make_fx_is_repro_d_by_a_minimised_graph_traced_again_with_make_fx(tmp_path):
    # the pass reads its inputs' meta['val'] (relu(x + 1e4 - 1e4), each new node described by its op on FakeTensors):
    # every candidate subgraph, and the file, give it a graph traced with make_fx again
    case = fxverify.load_case("edge_conv_bn_head")
    v = fxverify.Verification(aten_passes.relu_of_shifted_input, case, capture=case.capture_named("make_fx"),
                              repro_dir=tmp_path)
    found = v.run("numerics")
    assert found.outcome == FAILED and found.repro, found.message
    assert re.search(r"\(3 nodes, minimised from \d+ in \d+ s", found.message), found.message
    script = Path(found.repro)
    assert script.name == "edge_conv_bn_head.make_fx-numerics-tests.aten_passes.relu_of_shifted_input.py"
    source = script.read_text()
    assert re.search(r"def forward\(self, \w+\):\n +relu\w* = torch.ops.aten.relu.default\(", source), source
    assert "make_fx(torch.func.functionalize(Repro(saved)), tracing_mode=\"fake\"" in source
    root = Path(__file__).resolve().parents[1]  # where tests.aten_passes imports
    run = subprocess.run([sys.executable, str(script)], cwd=root, capture_output=True, text=True, timeout=300)
    assert run.returncode == EXIT_DIFFERS and "outputs differ" in run.stderr, run.stderr[-2000:]
    fixed = script.with_name("fixed.py")  # the same graph and call with a correct pass: no failure
    assert "TRANSFORM = 'tests.aten_passes:relu_of_shifted_input'\n" in source
    fixed.write_text(source.replace("TRANSFORM = 'tests.aten_passes:relu_of_shifted_input'",
                                    "TRANSFORM = 'tests.aten_passes:relu_to_clamp'"))
    run = subprocess.run([sys.executable, str(fixed)], cwd=root, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "no failure" in run.stdout, run.stderr[-2000:]


def test_determinism_reruns_copy_the_capture_so_the_exporters_own_order_is_not_blamed():
    assert verification(aten_passes.identity, "edge_conv_bn_head", "export_core").run("determinism").ok
    found = verification(aten_passes.hoist_parameters_in_set_order, "edge_conv_bn_head").run("determinism")
    assert found.outcome == FAILED and "order of a set or dict of nodes" in found.message


def test_the_reruns_transform_copies_of_the_kept_capture_and_leave_it_as_exported():
    v = verification(aten_passes.hoist_parameters_in_set_order, "edge_conv_bn_head")  # it moves nodes in place
    kept = v.subject.capture_source("eval")
    exported = canonical_text(kept.graph)
    assert v.run("determinism").outcome == FAILED
    assert v.subject.capture_source("eval") is kept and canonical_text(kept.graph) == exported


@pytest.mark.slow
def test_the_cross_process_run_of_a_dynamic_export_transforms_the_static_train_capture_numerics_makes_anyway():
    # the other process exports the model in train mode at the example shapes, half what a dynamic eval export costs
    case = fxverify.load_case("edge_conv_bn_head")
    assert cross_process_capture(Contract(), case.capture_named("export"), train_capture=True) == ("train", True)
    for transform, caught in ((aten_passes.identity, False), (aten_passes.hoist_parameters_in_name_set_order, True)):
        transform = fxverify.Transform.from_callable(transform)
        digests = CrossProcessDigests(transform, [case], timeout=120, capture="export")
        try:
            v = fxverify.Verification(transform, case, capture=case.capture_named("export"), cross_process=digests)
            found = v.run("determinism")
        finally:
            digests.close()
        assert (found.outcome == FAILED) == caught, found.message
        assert v.subject._captured.keys() == {("eval", "None", False), ("train", "None", True)}  # no other export
        if caught:
            assert "PYTHONHASHSEED (on the model captured in train mode at the example shapes)" in found.message
        else:
            assert found.details["cross_process"] == "same digest (on the model captured in train mode at the example shapes)"
    # where numerics makes no train-mode capture, the other process exports what lint judges
    transform = fxverify.Transform.from_callable(aten_passes.hoist_parameters_in_name_set_order)
    digests = CrossProcessDigests(transform, [case], timeout=120, capture="export")
    try:
        v = fxverify.Verification(transform, case, capture=case.capture_named("export"), cross_process=digests,
                                  train_capture=False)
        found = v.run("determinism")
    finally:
        digests.close()
    assert found.outcome == FAILED and "PYTHONHASHSEED (node order" in found.message, found.message
    assert v.subject._captured.keys() == {("eval", "None", False)}


# -- pass forms -------------------------------------------------------------------------------------
def test_the_form_of_a_pass_is_declared_or_read_from_its_first_parameter():
    def on_program(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
        return ep

    assert fxverify.Transform.from_callable(on_program).form == "program"
    assert fxverify.Transform.from_callable(aten_passes.lifted_relu_to_clamp).form == "lifted"
    assert fxverify.Transform.from_callable(aten_passes.identity).form == "module"
    skipped = verification(on_program, "edge_conv_bn_head", "symbolic_trace").run("lint")
    assert skipped.outcome == SKIPPED and "--fxverify-capture export,export_core" in skipped.message
    with pytest.raises(fxverify.FxVerifyError, match="contract form must be one of"):
        fxverify.contract(form="tree")


def test_a_program_pass_returning_something_else_fails_naming_what_it_accepts():
    def returns_the_module(ep: torch.export.ExportedProgram):
        return ep.module()

    found = verification(returns_the_module, "edge_conv_bn_head").run("lint")
    assert found.outcome == FAILED and "takes an ExportedProgram (form=program)" in found.message
    assert "accepted: a torch.export.ExportedProgram, or None" in found.message


def test_a_pipeline_names_the_first_step_after_which_a_check_fails():
    pipeline = [fxverify.examples.identity, mutations.bn_fold_ignores_running_mean, fxverify.examples.identity]
    found = fxverify.check_numerics(pipeline, "edge_conv_bn_head")
    assert found.outcome == FAILED
    assert "fails after step 2 of 3, pipeline[1] bn_fold_ignores_running_mean; step 1 passes it" in found.message
    assert fxverify.check_numerics(pipeline[::2], "edge_conv_bn_head").ok
    with pytest.raises(fxverify.TransformLoadError, match="empty pipeline"):
        fxverify.Transform.from_callable([])
    with pytest.raises(fxverify.TransformLoadError, match="must all take the same argument"):
        fxverify.Transform.from_callable([aten_passes.identity, aten_passes.relu_to_clamp_on_program])


@tied_to_pins("torch", regenerate="if copy.deepcopy(program) now validates, fxverify's renaming is no longer needed")
def test_a_program_is_copied_for_the_pass_with_the_names_its_signature_gives():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())  # forward(input): a builtin's name
    program = torch.export.export(model, (torch.randn(2, 3),), strict=False)
    copied = copy.deepcopy(program)
    with pytest.raises(SpecViolationError, match="does not match node name input_1"):
        copied.validate()  # torch renames the placeholder as it copies the graph
    named_as_exported(copied).validate()


def test_a_program_pass_and_a_lifted_pass_are_checked_on_the_program_they_return():
    for correct in (aten_passes.relu_to_clamp_on_program, aten_passes.lifted_relu_to_clamp):
        v = verification(correct, "edge_running_statistics")
        assert v.subject.changes and v.run("verifier").ok and v.run("numerics").ok and v.run("serde").ok
    module = verification(aten_passes.identity, "edge_running_statistics")
    assert module.run("verifier").outcome == SKIPPED and "returns no ExportedProgram" in module.run("verifier").message
    # a capture carries its program only for a pass that takes one: it doubles what each copy costs
    assert PROGRAM not in module.subject.applied().original.meta and not module.subject.capture.keeps_program


# -- the checks, each catching what it is for ----------------------------------------------------
def test_reexport_exports_the_result_again_as_the_model_was():
    assert verification(aten_passes.relu_to_clamp, "edge_conv_bn_head", "export_core").run("reexport").ok
    unchanged = verification(aten_passes.identity, "edge_conv_bn_head", "export_core").run("reexport")
    assert unchanged.outcome == SKIPPED and "exporting the capture again" in unchanged.message  # an export spared
    baked = verification(aten_passes.flatten_as_view_of_example_batch, "edge_conv_bn_head").run("reexport")
    assert baked.outcome == FAILED and "exporting it again with export" in baked.message
    assert "Constraints violated (batch)" in baked.message  # the dynamic batch no longer exports
    symbolic = fxverify.check_reexport(fxverify.examples.identity, "edge_conv_bn_head")
    assert symbolic.outcome == SKIPPED and "symbolic_trace graphs come with no ExportedProgram" in symbolic.message


class _LstmKeepingOutputOnly(nn.Module):
    """An LSTM whose state nothing reads: its export keeps a getitem for each output all the same."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return out


def test_reexport_does_not_count_the_unused_outputs_dead_code_elimination_removed():
    case = fxverify.case_from_module("lstm", _LstmKeepingOutputOnly, [(2, 3, 4)], batch_sizes=(2, 4))
    v = fxverify.Verification(aten_passes.dead_code_elimination, case, capture=case.capture_named("export"))
    unused = [n for n in v.subject.applied().original.graph.nodes if n.op == "call_function" and not n.users]
    assert len(unused) == 2 and "graph" in v.subject.changes  # the capture's getitems of h and c, which DCE drops
    found = v.run("reexport")
    assert found.outcome == PASSED, found.message  # exporting the result again writes them back: not other operators


def test_opset_judges_only_targets_the_capture_did_not_already_have():
    training_ir = verification(aten_passes.relu_to_clamp_min, "edge_running_statistics").run("opset")
    assert training_ir.outcome == PASSED and training_ir.details["new_targets_checked"] >= 1  # clamp_min_ is ATen
    core = verification(aten_passes.relu_to_clamp, "edge_conv_bn_head", "export_core").run("opset")
    assert core.outcome == PASSED, core.message  # aten.clamp is core ATen
    assert verification(aten_passes.identity, "edge_running_statistics", "make_fx").run("opset").outcome == PASSED
    assert fxverify.check_opset(fxverify.examples.identity, "edge_conv_bn_head").outcome == SKIPPED
    by_design = fxverify.contract(keeps_opset=False)(aten_passes.gelu_as_torch_function)  # as prepare_pt2e declares
    declared = verification(by_design, "layer_activations").run("opset")
    assert declared.outcome == SKIPPED and "keeps_opset=False" in declared.message


def test_purity_catches_a_program_pass_that_changes_the_program_it_was_given():
    found = verification(aten_passes.relu_to_clamp_on_program_changing_the_given, "edge_conv_bn_head").run("purity")
    assert found.outcome == FAILED, found.message
    assert "returned a new ExportedProgram but also mutated the one it was given: the program's graph changed" \
        in found.message and "_transform_do_not_use changes the program it is called on" in found.message
    in_place = verification(aten_passes.relu_to_clamp_on_program, "edge_conv_bn_head").run("purity")
    assert in_place.outcome == PASSED and in_place.details["in_place"]
    lifted = verification(aten_passes.lifted_relu_to_clamp, "edge_conv_bn_head").run("purity")
    assert lifted.outcome == PASSED  # fxverify runs it through _transform_do_not_use, as its users do


def test_dynamic_catches_a_pass_that_specialises_the_batch_while_it_runs():
    found = verification(aten_passes.reads_batch_as_int, "edge_conv_bn_head").run("dynamic")
    assert found.outcome == FAILED, found.message
    assert re.search(r"specialised the symbolic size s\d+ \(in \[2, 8\] as captured\)", found.message), found.message
    assert "statically_known_true" in found.message
    assert verification(aten_passes.identity, "edge_conv_bn_head").run("dynamic").outcome == PASSED
    # what the message says, in plain torch: the caller's own program is static after the pass ran on a copy
    model = fxverify.load_case("edge_conv_bn_head").build()
    program = torch.export.export(model, (torch.randn(2, 3, 16, 16),),
                                  dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=8)},))
    aten_passes.reads_batch_as_int(copy.deepcopy(program.module()))
    with pytest.raises(AssertionError, match=r"Guard failed: .*size\(\)\[0\] == 2"):
        program.run_decompositions().module()(torch.randn(5, 3, 16, 16))


def test_numerics_says_when_only_float32_rounding_differs_and_what_to_declare():
    v = verification(aten_passes.relu_of_shifted_input, "edge_conv_bn_head")
    found = v.run("numerics")
    assert found.outcome == FAILED, found.message
    assert "in float64 the result agrees with the original at this input" in found.message
    assert "the difference is the float32 rounding of the kernels the result runs" in found.message
    assert re.search(r"declare the error it may add: @fxverify.contract\(atol=\.\.\.\) \(max abs err [0-9.e-]+ here; "
                     r"other inputs and modes may need more\)", found.message), found.message
    assert found.node == "not localised: in float64 no node computes something else"
    declared = fxverify.contract(atol=1e-3)(aten_passes.relu_of_shifted_input)  # the advice, taken
    assert verification(declared, "edge_conv_bn_head").run("numerics").ok
    wrong = verification(aten_passes.conv_bn_fold_forgets_mean, "edge_conv_bn_head").run("numerics")
    assert wrong.outcome == FAILED and "float32 rounding" not in wrong.message  # wrong in float64 too


def test_float64_agreement_allows_what_float32_rounding_of_the_original_could_not_double():
    from fxverify.checks._outputs import agrees_in_float64

    v = verification(aten_passes.identity, "edge_conv_bn_head").subject
    exact = torch.linspace(-1, 1, 1000, dtype=torch.float64)
    rounded = exact + 1e-3 * torch.sin(exact * 97)  # an ill-conditioned model's float32 run: rmse 7e-4 from float64
    assert agrees_in_float64(v, exact + 1e-4, exact, rounded)  # 1e-4 in float64: far below that, rounding
    assert not agrees_in_float64(v, exact + 1e-3, exact, rounded)  # as large as the rounding: it computes otherwise
    assert not agrees_in_float64(v, (exact,), exact, rounded)  # another structure


def test_dynamic_does_not_blame_a_written_size_for_float32_rounding_at_another_batch():
    # a kernel picking a less accurate float32 algorithm above batch 4 (as oneDNN's channels-last convolutions on
    # fcn_resnet50 do on some CPUs), where the float64 outputs agree: not a size written into the graph
    found = verification(aten_passes.relu_as_size_dependent_kernel, "edge_conv_bn_head").run("dynamic")
    assert found.outcome == PASSED, found.message
    assert found.details["float32_rounding_only"].startswith("at batch 6, 8 the float32 outputs differ")
    # what it tells apart: the same batches fail where a size of the example inputs is written into the graph
    written = verification(aten_passes.flatten_as_view_of_example_batch, "edge_conv_bn_head").run("dynamic")
    assert written.outcome == FAILED and "a size of the example inputs was written" in written.message


def test_dynamic_catches_a_guard_the_pass_adds_while_it_runs():
    v = verification(aten_passes.tests_batch_parity_with_bool, "edge_conv_bn_head")
    assert v.subject.changes == ["guards"]  # the graph is as captured: the summary says what it changed
    found = v.run("dynamic")
    assert found.outcome == FAILED, found.message
    assert re.search(r"added the guard Eq\(Mod\(s\d+, 2\), 0\) to the ShapeEnv while it ran, false at s\d+ = 3, "
                     r"inside the range", found.message), found.message
    assert "statically_known_true" in found.message
    # in plain torch: the caller's own program rejects an odd batch once the pass ran on a copy of its module
    model = fxverify.load_case("edge_conv_bn_head").build()
    program = torch.export.export(model, (torch.randn(2, 3, 16, 16),),
                                  dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=8)},))
    aten_passes.tests_batch_parity_with_bool(copy.deepcopy(program.module()))
    with pytest.raises(AssertionError, match=r"Guard failed: .*size\(\)\[0\] % 2 == 0"):
        program.run_decompositions().module()(torch.randn(3, 3, 16, 16))


def test_dynamic_names_the_node_whose_kernel_specialised_the_batch_when_a_pass_re_propagated_meta():
    found = verification(aten_passes.meta_recomputed_with_fake_tensor_prop, "edge_kwargs_heavy").run("dynamic")
    assert found.outcome == FAILED and "%upsample_bilinear2d" in found.node, found.message
    assert "without the Python dispatcher, as torch.fx.passes.fake_tensor_prop.FakeTensorProp does, adds it at " \
           "%upsample_bilinear2d" in found.message
    fixed = verification(aten_passes.meta_recomputed_with_the_python_dispatcher, "edge_kwargs_heavy")
    assert fixed.run("dynamic").ok and fixed.run("meta").ok  # what the message advises


class _DepthwiseOnDoubledBatch(nn.Module):
    """A depthwise convolution of a batch twice the input's: its FakeTensor implementation guards 2*s < 16."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1, groups=8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([x, x]))


def test_dynamic_names_the_op_whose_fake_implementation_guards_when_a_pass_computes_meta_with_it():
    case = fxverify.case_from_module("depthwise_doubled", _DepthwiseOnDoubledBatch, [(2, 8, 8, 8)], batch_sizes=(2, 4))
    capture = case.capture_named("export")
    found = fxverify.Verification(aten_passes.to_channels_last_recording_guards, case, capture=capture).run("dynamic")
    assert found.outcome == FAILED and "%conv2d" in found.node, found.message
    assert re.search(r"added the guard 2\*s\d+ < 16 to the ShapeEnv while it ran, false at s\d+ = 8", found.message)
    assert "shape_env.suppress_guards()" in found.message
    fixed = fxverify.Verification(aten_passes.to_channels_last, case, capture=capture)
    assert fixed.run("dynamic").ok and fixed.run("meta").ok  # what the message advises
    for transform, rejects in ((aten_passes.to_channels_last_recording_guards, True), (aten_passes.to_channels_last, False)):
        program = torch.export.export(_DepthwiseOnDoubledBatch().eval(), (torch.randn(2, 8, 8, 8),),
                                      dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=8)},))
        transform(copy.deepcopy(program.module()))  # in plain torch: the caller's own program, after a pass on a copy
        decomposed = program.run_decompositions().module()
        if rejects:
            with pytest.raises(AssertionError, match=r"Guard failed: 2 \* x.size\(\)\[0\] < 16"):
                decomposed(torch.randn(8, 8, 8, 8))
        else:
            assert decomposed(torch.randn(8, 8, 8, 8)).shape == (16, 8, 8, 8)


def test_dynamic_names_the_node_whose_fake_tensors_guard_the_batch():
    baked = verification(aten_passes.flatten_as_view_of_example_batch, "edge_conv_bn_head").run("dynamic")
    assert baked.outcome == FAILED and "a size of the example inputs was written" in baked.message
    assert re.search(r"%view_default adds the guard Eq\(s\d+, 2\), false at s\d+ = 3", baked.message), baked.message
    v = verification(aten_passes.relu_as_custom_kernel_with_branching_fake, "edge_conv_bn_head")
    assert v.run("numerics").ok  # the kernel itself is right at every batch
    tiled = v.run("dynamic")
    assert tiled.outcome == FAILED and "%fast_relu_branching_fake_default" in tiled.node
    assert re.search(r"adds the guard s\d+ <= 4, false at s\d+ = 5: traced with symbolic sizes", tiled.message)
    assert "statically_known_true" in tiled.message
    # in plain torch: the result exported again with the capture's dynamic batch is rejected
    result = v.subject.applied().result
    with pytest.raises(torch._dynamo.exc.UserError, match="Constraints violated"):
        torch.export.export(result, (torch.randn(2, 3, 16, 16),),
                            dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=8)},))
    assert verification(aten_passes.relu_as_custom_kernel, "edge_conv_bn_head").run("dynamic").ok
    batch = sympy.Symbol("s77", positive=True, integer=True)
    assert violation(sympy.Lt(batch, 16), {batch: (2, 8)}) is None  # true over the whole range: not a finding
    assert violation(sympy.Le(batch, 4), {batch: (2, 8)}) == {"s77": 5}


def test_meta_compares_strides_and_symbolic_sizes_with_fake_tensors_re_propagated():
    for capture in ("export", "make_fx"):
        v = verification(aten_passes.to_channels_last_with_copied_meta, "edge_conv_bn_head", capture)
        stale = v.run("meta")
        assert stale.outcome == FAILED and "%clone_default" in stale.node, stale.message
        assert "meta['val'] says strides (768, 256, 16, 1), re-propagating FakeTensors gives (768, 1, 48, 3)" in \
            stale.message
        assert v.run("numerics").ok  # the values are right: only what reads the layout from meta is misled
        assert verification(aten_passes.to_channels_last, "edge_conv_bn_head", capture).run("meta").ok

    def describes_relu_as_channels_last(gm: fx.GraphModule) -> fx.GraphModule:  # meta['val'] alone changed
        relu = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.relu.default)[0]
        with relu.meta["val"].fake_mode:
            relu.meta["val"] = relu.meta["val"].contiguous(memory_format=torch.channels_last)
        return gm

    v = verification(describes_relu_as_channels_last, "edge_conv_bn_head")
    assert v.subject.applied().changes == [] and not _shapes.described_as_captured(v.subject)
    assert v.run("meta").outcome == FAILED and "%relu" in v.run("meta").node
    untouched = verification(aten_passes.identity, "edge_conv_bn_head")
    assert _shapes.described_as_captured(untouched.subject) and "not needed" in untouched.run("meta").details["repropagated"]


def test_meta_catches_a_result_that_does_not_run_on_fake_tensors():
    v = verification(aten_passes.relu_as_custom_kernel_without_fake, "edge_conv_bn_head")
    found = v.run("meta")
    assert found.outcome == FAILED and "%fast_relu_none_fake_default" in found.node, found.message
    assert "re-propagating FakeTensors through the result raises at %fast_relu_none_fake_default" in found.message
    assert "register_fake" in found.message and v.run("numerics").ok
    with pytest.raises(RuntimeError, match="no fake impl registered"):  # in plain torch
        mode = FakeTensorMode(allow_non_fake_inputs=True)  # the parameters stay real
        FakeTensorProp(v.subject.applied().result, mode).propagate(torch.randn(2, 3, 16, 16))
    assert verification(aten_passes.relu_as_custom_kernel, "edge_conv_bn_head").run("meta").ok
    # meta['val'] and a real run agree, re-propagating does not: the op's FakeTensor implementation is to blame
    lying = verification(aten_passes.relu_as_custom_kernel_with_float16_fake, "edge_conv_bn_head").run("meta")
    assert lying.outcome == FAILED and "%fast_relu_float16_fake_default" in lying.node, lying.message
    assert "meta['val'] says dtype torch.float32, re-propagating FakeTensors gives torch.float16, where a real run " \
           "gives what meta['val'] says. The FakeTensor implementation of its target" in lying.message
    assert "kept the old description" not in lying.message


def test_re_propagation_touches_neither_the_shape_env_it_copies_nor_the_buffers():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()  # updates its buffers in place
    program = torch.export.export(model, (torch.randn(2, 3, 8, 8),),
                                  dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=8)},))
    gm = program.module()
    out = gm.graph.output_node()
    with gm.graph.inserting_before(out):
        pinned = gm.graph.call_function(torch.ops.aten.view.default, (out.args[0][0], [2, -1]))
    pinned.meta["val"] = out.args[0][0].meta["val"]
    before = {name: t.clone() for name, t in gm.state_dict().items()}
    found = repropagate(gm)
    assert [(g.node, str(g.expr)) for g in found.guards] == [("view_default", f"Eq({next(iter(found.ranges))}, 2)")]
    shared = shape_env_of(gm)
    assert not shared.guards and not shared.replacements  # the program's own ShapeEnv is untouched
    assert all(torch.equal(before[name], t) for name, t in gm.state_dict().items())  # add_ ran on a fake


def test_reexport_skips_a_result_that_leaves_the_opset_by_design():
    strict = verification(aten_passes.insert_observer, "edge_conv_bn_head").run("reexport")
    assert strict.outcome == FAILED and "GuardOnDataDependentSymNode" in strict.message, strict.message
    as_prepare_pt2e = fxverify.contract(modes=("eval",), keeps_opset=False)(aten_passes.insert_observer)
    declared = verification(as_prepare_pt2e, "edge_conv_bn_head").run("reexport")
    assert declared.outcome == SKIPPED and "keeps_opset=False" in declared.message


def test_meta_names_the_node_without_meta_and_leaves_out_what_torch_itself_leaves_out():
    found = verification(aten_passes.relu_to_clamp_min_without_meta, "edge_conv_bn_head", "export_core").run("meta")
    assert found.outcome == FAILED and "%clamp_min_default" in found.node
    assert "edge_conv_bn_head (edge, export_core" in found.message
    # core ATen graphs hold _assert_tensor_metadata nodes without meta['val']: not the pass's doing
    core = verification(aten_passes.identity, "layer_activations", "export_core")
    assert core.run("meta").outcome == PASSED


def test_meta_lists_new_nodes_without_provenance_as_information():
    # to_channels_last's clones have a right meta['val'] and no nn_module_stack, stack_trace or from_node
    untraced = verification(aten_passes.to_channels_last, "edge_conv_bn_head", "export").run("meta")
    assert untraced.outcome == PASSED
    assert untraced.details["without_provenance"] == [f"%clone_default{s}" for s in ("", "_1", "_2", "_3")]
    # the relu swap copies the replaced node's meta, provenance included
    copied = verification(aten_passes.relu_to_clamp, "edge_conv_bn_head", "export").run("meta")
    assert copied.outcome == PASSED and "without_provenance" not in copied.details


def test_meta_compares_each_node_with_a_real_run_with_the_dynamic_batch_bound():
    stale = verification(aten_passes.relu_in_float64_with_stale_meta, "edge_conv_bn_head").run("meta")
    assert stale.outcome == FAILED and "%_to_copy_default" in stale.node
    assert "says dtype torch.float32, re-propagating FakeTensors gives torch.float64 (and so does a real run)" in \
        stale.message
    assert verification(aten_passes.relu_to_clamp_min, "edge_conv_bn_head").run("meta").ok


def test_memory_an_aten_graph_fills_later_is_not_compared_as_it_was_before():
    """Core ATen's circular padding writes an aten.empty piece by piece: what the memory held before must
    not make the float64 stage name %empty as the first divergent node of an identity."""
    numerics = verification(aten_passes.identity, "layer_conv_bn_circular", "export_core").run("numerics")
    assert numerics.outcome == PASSED, numerics.message
    assert not torch.are_deterministic_algorithms_enabled()  # switched on for the comparison only


def test_dynamic_runs_the_result_across_the_batch_range_and_skips_what_numerics_reports():
    ok = verification(aten_passes.relu_to_clamp_min, "edge_conv_bn_head").run("dynamic")
    # torch.export assumes a dynamic size is not 0 or 1: the range it records starts at 2
    assert ok.outcome == PASSED and ok.details["batch_range"] == [2, 8] and 8 in ok.details["batch_sizes"]
    # a transform that changed nothing: its result is the capture as made, and running it proves nothing
    unchanged = verification(aten_passes.identity, "edge_conv_bn_head")
    assert unchanged.run("dynamic").details["batch_sizes"].startswith("not run: the transform changed nothing")
    assert not any(key[1].startswith("b8") for key in unchanged.subject._outputs)
    wrong = verification(aten_passes.gelu_without_approximate, "layer_activations").run("dynamic")
    assert wrong.outcome == SKIPPED and "already differs" in wrong.message
    static = fxverify.case_from_module("one_batch", lambda: torch.nn.Linear(3, 3), [(2, 3)], batch_sizes=(2,))
    assert fxverify.Verification(aten_passes.identity, static, capture=static.capture_named("export")).run(
        "dynamic").outcome == SKIPPED


def test_stateful_compares_the_buffers_a_model_updates_in_forward_on_every_capture():
    for capture in ("symbolic_trace", "export", "export_core"):
        assert verification(aten_passes.identity if capture != "symbolic_trace" else fxverify.examples.identity,
                            "edge_running_statistics", capture).run("stateful").outcome == PASSED

    def drops_the_counter(gm: fx.GraphModule) -> fx.GraphModule:  # symbolic trace: the call_method add_
        for node in list(gm.graph.nodes):
            if node.op == "call_method" and node.target == "add_" and node.args[0].target == "calls":
                gm.graph.erase_node(node)
        gm.recompile()
        return gm

    found = fxverify.check_stateful(drops_the_counter, "edge_running_statistics")
    assert found.outcome == FAILED and "buffer 'calls'" in found.message
    assert "the original updates it at %add_ (add_), which the result no longer has" in found.message, found.message
    assert found.node and found.node.startswith("%add_ : "), found.node  # the update the pass dropped
    for capture, writer in (("export", "%add_ (aten.add_.Tensor)"), ("export_core", "(aten.copy_.default)")):
        dropped = verification(aten_passes.erase_unused_nodes, "edge_running_statistics", capture).run("stateful")
        assert dropped.outcome == FAILED and writer in dropped.message and dropped.node, dropped.message
    unchanged = fxverify.check_stateful(fxverify.examples.identity, "edge_conv_bn_head")
    assert unchanged.outcome == SKIPPED and "no buffer of the original changed in one call in eval mode" in unchanged.message
    # a user's own model that updates buffers in forward needs no tag: running it once tells
    untagged = fxverify.case_from_module("my_kv_cache", RunningStatistics, [(2, 8)])
    assert "stateful" not in untagged.entry.tags
    assert fxverify.check_stateful(fxverify.examples.identity, untagged).outcome == PASSED
    found = fxverify.check_stateful(drops_the_counter, untagged)
    assert found.outcome == FAILED and "buffer 'calls'" in found.message, found.message


def test_a_dropped_integer_counter_is_never_explained_as_float32_rounding():
    # erase_unused_nodes drops BatchNorm's num_batches_tracked.add_ in a train-mode export; the float64
    # run of the result agrees with the original on every floating value, which once made the finding
    # advise declaring an atol for "the float32 rounding of the kernels the result runs"
    v = verification(aten_passes.erase_unused_nodes, "edge_conv_bn_head")
    assert v.subject.changes == [], "the eval-mode capture has nothing for it to erase"
    found = v.run("numerics")
    assert found.outcome == FAILED and "buffer 'bn1.num_batches_tracked'" in found.message, found.message
    assert "float32 rounding" not in found.message and "atol" not in found.message, found.message
    # what it changed in train mode, where numerics ran it, is no longer reported as a no-op
    assert "graph" in v.subject.changes, v.subject.changes


def test_a_result_that_raises_names_the_node_it_raises_at_and_dynamic_the_node_that_caused_it():
    v = verification(aten_passes.flatten_as_view_of_example_batch, "edge_conv_bn_head")
    raised = v.run("numerics")  # at batch 1, the view the pass wrote still says 2
    assert raised.outcome == FAILED and "mat1 and mat2 shapes cannot be multiplied" in raised.message
    assert raised.node and raised.node.startswith("%linear : "), raised.node
    assert v.run("dynamic").node.startswith("%view_default : "), "the guard's node, not where a run raised"


def test_numerics_on_a_stateful_model_compares_fresh_modules_once_the_shared_ones_ran_unequally():
    v = fxverify.Verification(fxverify.examples.identity, "edge_running_statistics")
    assert v.run("lint").ok  # runs the result, not the original: their buffers part
    assert v.subject.applied().state_advanced
    assert v.run("numerics").ok


def test_agreement_catches_a_pass_whose_change_of_the_outputs_only_one_capture_gets():
    captures = ("export", "export_core")
    case = fxverify.load_case("edge_conv_bn_head")

    def run(transform, capture: str, check: str, **kwargs) -> fxverify.CheckResult:
        kwargs.update({} if "settings" in kwargs else {"captures": captures})
        return fxverify.Verification(transform, case, capture=case.capture_named(capture), **kwargs).run(check)

    buggy = aten_passes.fake_quantize_training_ir_weights
    assert run(buggy, "export_core", "numerics").ok  # within its range_tol under both: numerics cannot tell
    found = run(buggy, "export_core", "agreement")
    assert found.outcome == FAILED
    assert "changes the outputs differently under export_core than under export" in found.message
    assert "It rewrote nothing under export_core" in found.message
    assert found.node == ("under export: %conv2d = aten.conv2d.default, %conv2d_1 = aten.conv2d.default, "
                          "%linear = aten.linear.default; under export_core: no node rewritten")
    reference = run(buggy, "export", "agreement")
    assert reference.outcome == SKIPPED and "the capture the others are compared with" in reference.message
    alone = fxverify.Verification(buggy, case, capture=case.capture_named("export_core")).run("agreement")
    assert alone.outcome == SKIPPED and "one capture selected" in alone.message

    correct = run(aten_passes.fake_quantize_conv_weights, "export_core", "agreement")
    assert correct.outcome == PASSED and correct.details["judged"] == "the transform changes the outputs alike under both"
    assert correct.details["largest_change"]["export"] > 1e-4  # it did move the outputs, by design

    # outputs handed over from the reference capture's own run are used, not made again
    handed = fxverify.Verification(buggy, case, capture=case.capture_named("export"))
    outputs = capture_outputs(handed.subject)
    asked = []
    handing = Settings(captures=captures, services={"agreement": lambda capture: asked.append(capture) or outputs})
    again = run(buggy, "export_core", "agreement", settings=handing)
    assert asked == ["export"] and again.outcome == FAILED and again.message == found.message


# -- the mutation suite through the plugin --------------------------------------------------------
def _records(pytester, passes, *args) -> dict[tuple[str, str, str], dict]:
    report = pytester.path / "report.json"
    options = [arg for name in passes for arg in ("--fxverify", f"{ATEN}:{name}")]
    result = pytester.runpytest("-p", "no:cacheprovider", *options, f"--fxverify-corpus={MODELS}",
                                f"--fxverify-json={report}", *args)
    records = json.loads(report.read_text())["records"]
    return result, {(r["transform"].rpartition(":")[2], r["model"], r["check"]): r for r in records}


def test_an_unknown_capture_stops_at_start_up_naming_the_option(pytester):
    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", f"{ATEN}:identity",
                                "--fxverify-capture=export,dynamo")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--fxverify-capture (ini fxverify_capture) names unknown captures [[]'dynamo'[]]; "
                                 "known: symbolic_trace, export, export_core*"])


@pytest.mark.slow
def test_every_buggy_aten_pass_is_caught_by_its_check_naming_model_capture_and_node(pytester):
    result, records = _records(pytester, BUGGY, "--fxverify-capture=export",
                               "--fxverify-checks=lint,numerics,stateful,meta,dynamic,devices")
    assert result.ret == 1
    for name, (check, model, phrase) in BUGGY.items():
        found = records[name, f"{model}@export", check]
        assert found["outcome"] == "failed", (name, found["message"])
        assert f"fxverify {check} check failed" in found["message"] and phrase in found["message"], found["message"]
        assert f"model:      {model} (edge, export (torch.export" in found["message"]
        assert found["capture"] == "export" and found["nodeid"].endswith(f"[{model}@export-{check}]")
    for (name, _, check), found in records.items():  # no finding where the pass changed nothing
        # (in any mode: erase_unused_nodes drops only the num_batches_tracked update of a model exported
        # in train mode, and the numerics item that finds it reports that change)
        if found["changed"] == []:
            assert found["outcome"] != "failed", (name, check, found["message"])


@pytest.mark.slow
def test_passes_for_one_capture_or_form_are_caught_there_by_their_check(pytester):
    result, records = _records(pytester, BUGGY_PER_CAPTURE, "--fxverify-capture=export,export_core,make_fx",
                               "--fxverify-checks=meta,verifier,opset,serde,agreement")
    assert result.ret == 1
    for name, (check, model, phrase, capture) in BUGGY_PER_CAPTURE.items():
        found = records[name, f"{model}@{capture}", check]
        assert found["outcome"] == "failed", (name, found["message"])
        assert phrase in found["message"] and found["node"], found["message"]
        assert f"model:      {model} (edge, {capture} " in found["message"]


@pytest.mark.slow
def test_correct_aten_passes_pass_every_check_on_every_aten_capture(pytester):
    captures = ("export", "export_core", "make_fx")
    result, records = _records(pytester, CORRECT, f"--fxverify-capture={','.join(captures)}", "-k",
                               "not determinism")
    failed = {key: r["message"] for key, r in records.items() if r["outcome"] not in ("passed", "skipped", "xfailed")}
    assert result.ret == 0 and not failed, failed
    assert {key[1] for key in records} == {f"{m}@{c}" for m in MODELS.split(",") for c in captures}
    changed = {(name, model) for (name, model, _), r in records.items() if r["changed"]}
    assert ("conv_bn_fold", "edge_conv_bn_head@export_core") in changed  # the passes did rewrite something
    assert ("relu_to_clamp_min", "edge_running_statistics@export") in changed
    assert ("relu_to_clamp_on_program", "edge_running_statistics@export_core") in changed
    assert ("conv_bn_fold", "edge_conv_bn_head@make_fx") in changed
    result.stdout.fnmatch_lines(["*aten_passes.py:conv_bn_fold*", "edge_conv_bn_head@export * pass *"])


def copies_the_program(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """A program pass working on copy.deepcopy(ep), as many do: torch renames the copy's `input` placeholder."""
    copied = copy.deepcopy(ep)
    copied.validate()
    return copied


def test_a_pass_deep_copying_a_program_is_told_what_torch_renames_and_the_way_around():
    model = lambda: torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())  # forward(input)
    case = fxverify.case_from_module("sequential", model, [(2, 3)])
    result = fxverify.Verification(copies_the_program, case, capture=case.capture_named("export")).run("numerics")
    assert result.outcome == FAILED and "raised SpecViolationError: Input spec name input does not match node " \
                                       "name input_1" in result.message, result.message
    assert ("known torch behaviour: torch's copy.deepcopy of an ExportedProgram renames the placeholder 'input' "
            "(a Python builtin's name, as a forward(self, input) gives it) to input_1") in result.message
    program = torch.export.export(model(), (torch.randn(2, 3),), strict=False)
    copy.deepcopy(program).run_decompositions({}).validate()  # the way around it the hint gives works


@pytest.mark.parametrize("name", sorted(KNOWN_DEFECTS))
def test_a_correct_aten_pass_with_a_real_defect_is_caught_where_the_corpus_shows_it(name):
    model, check, phrase = KNOWN_DEFECTS[name]
    result = verification(getattr(aten_passes, name), model).run(check)
    assert result.outcome == FAILED and phrase in result.message, result.message
