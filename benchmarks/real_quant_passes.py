"""fxverify on real quantizers and real passes over quantized graphs and Edge programs, written by others
(torchao, torch.fx, ExecuTorch).

    python benchmarks/real_quant_passes.py [--corpus quantization] [--workers 2] [--only reference_repr,...]
                                           [--library executorch]

Each row runs `pytest -n WORKERS --fxverify SPEC --fxverify-capture CAPTURE --fxverify-corpus CORPUS` in a scratch
directory: a quantizer as the `pt2e` capture's quantizer (`--fxverify-quantizer`) with the identity as the
transform (every item then judges what the quantizer made against itself: it must capture, run and keep its q/dq
pairs), a quantizer as the transform (rows `NAME@transform`: it quantizes the float export, and its q/dq nodes,
buffers and output shapes are judged), a pass as the transform over the graph torchao's X86InductorQuantizer
made (`pt2e`), and ExecuTorch's own passes over its Edge programs: `edge` (float) and `edge_pt2e` (quantized with
ExecuTorch's XNNPACKQuantizer), each called as ExecuTorch's pipeline calls it (the adapters below say how). The
failures are printed grouped by check and finding, with the models that show each; read each as the pass's author would, and
prove it in a few lines of plain torch before calling it a defect (docs/bugs-found.md). Inductor's
``constant_fold`` is not among them: it runs on frozen graphs, where a buffer updated in forward is a
placeholder, and folds such a buffer's update where it is a ``get_attr`` (outside what it is called on).

ExecuTorch's Arm backend (``--library arm``) needs ``pip install tosa-tools`` (about 200 MB; its ``tosa_serializer``,
which ExecuTorch's wheel does not bring; measured with 2026.8.0 installed ``--no-deps`` beside numpy 2.4, which its
metadata refuses but runs with): Arm's ``TOSAQuantizer`` (INT profile, its symmetric config) as the ``pt2e``
capture's quantizer and as the transform, and Arm's passes run as ``TOSABackend.preprocess`` runs them
(:func:`as_arm`) under ``edge`` (TOSA FP) and ``edge_pt2e`` (TOSA INT, quantized with Arm's quantizer as Arm's
examples call it: :func:`tosa_int_unguarded`).
"""

from __future__ import annotations

import argparse
import collections
import copy
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import fx

import fxverify
from fxverify.capture.pt2e import x86_quantizer

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve()
IDENTITY = "fxverify.examples:identity"

# -- quantizers: factories of no arguments, as --fxverify-quantizer takes them ------------------------------------


def x86_dynamic() -> Any:
    """torchao's X86InductorQuantizer, dynamic activations (choose_qparams at run time)."""
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as x86

    return x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config(is_dynamic=True))


def x86_reduce_range() -> Any:
    """torchao's X86InductorQuantizer with activations in 0..127 (its advice for CPUs without VNNI)."""
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as x86

    return x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config(reduce_range=True))


def xnnpack_static() -> Any:
    """torchao's XNNPACKQuantizer (its test copy of ExecuTorch's), symmetric, per-channel weights."""
    from torchao.testing.pt2e._xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config

    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))


def xnnpack_dynamic() -> Any:
    """The same, dynamic activations."""
    from torchao.testing.pt2e._xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config

    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True))


def arm_inductor() -> Any:
    """torchao's ArmInductorQuantizer, its default config."""
    import torchao.quantization.pt2e.quantizer.arm_inductor_quantizer as arm

    return arm.ArmInductorQuantizer().set_global(arm.get_default_arm_inductor_quantization_config())


# -- quantizers as the transform (form quantizer): instances, as a transform spec names them ----------------------

x86_static_quantizer = x86_quantizer()
xnnpack_static_quantizer = xnnpack_static()


# -- passes over a converted graph, called as their users call them -----------------------------------------------


def duplicate_dq(gm: fx.GraphModule) -> Any:
    """torchao's DuplicateDQPass: one dequantize a user (a PassBase: returns a PassResult)."""
    from torchao.quantization.pt2e.quantizer.duplicate_dq_pass import DuplicateDQPass

    return DuplicateDQPass()(gm)


def port_metadata(gm: fx.GraphModule) -> Any:
    """torchao's PortNodeMetaForQDQ: the quantization tags of q/dq nodes."""
    from torchao.quantization.pt2e.quantizer.port_metadata_pass import PortNodeMetaForQDQ

    return PortNodeMetaForQDQ()(gm)


def reference_representation(gm: fx.GraphModule) -> fx.GraphModule:
    """torchao's reference_representation_rewrite: q/dq patterns as their integer reference computation."""
    from torchao.quantization.pt2e.reference_representation_rewrite import reference_representation_rewrite

    return reference_representation_rewrite(gm)


def ao_constant_fold(gm: fx.GraphModule) -> fx.GraphModule:
    """torchao's constant_fold, as convert_pt2e(fold_quantize=True) runs it: constant subgraphs folded in place."""
    from torchao.quantization.pt2e.constant_fold import constant_fold

    constant_fold(gm)
    return gm


def cse(gm: fx.GraphModule) -> Any:
    """torch.fx's CSEPass (a PassBase)."""
    from torch.fx.passes.dialect.common.cse_pass import CSEPass

    return CSEPass()(gm)


def dead_code(gm: fx.GraphModule) -> fx.GraphModule:
    """torch.fx's Graph.eliminate_dead_code, then recompile."""
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def split_constants(gm: fx.GraphModule) -> Any:
    """torch.fx's split_const_subgraphs, then run_folding (what its users call)."""
    from torch.fx.experimental.const_fold import split_const_subgraphs

    folded = split_const_subgraphs(gm)
    folded.run_folding()
    return folded


# -- ExecuTorch's passes over Edge programs (the edge and edge_pt2e captures) ------------------------------------
# A pass of ExecuTorch's own (exir.passes) with a no-arg constructor is given as its class: the capture builds it
# and runs it through EdgeProgramManager.transform([pass]), as a user's pipeline does, the Edge verifier included.
# XNNPACK's passes are run by the adapters below, as XNNPACK runs them.


def as_xnnpack(ep: torch.export.ExportedProgram, pass_type: type) -> torch.export.ExportedProgram:
    """``pass_type`` run on ``ep`` as XNNPACK runs its passes: ``XnnpackBackend.preprocess`` re-wraps the Edge
    program with XNNPACK's verifier (``EXIREdgeDialectVerifier`` under ``get_xnnpack_edge_compile_config()``:
    ``_check_ir_validity=False``, since its passes make non-core ops such as ``aten.linear``) and calls
    ``XNNPACKPassManager(ep, passes=[pass_type]).transform()``, which builds an ``XNNPACKPass`` from the program
    (``FuseBatchNormPass(ep)``: it reads and deletes the program's parameters), any other ``ExportPass`` with no
    argument, and runs ``_transform(ep, pass)``. XNNPACK's own pass tests (``RunPasses`` of its ``Tester``,
    after ``to_edge`` under the same config) do the same. Its passes edit the program they were built from (the
    graph in place, parameters deleted and added): preprocess gets a partition's program of its own, so the
    pass is given a copy here, as there, and the caller's ``ep`` is left as it was."""
    from executorch.backends.xnnpack._passes import XNNPACKPassManager

    return XNNPACKPassManager(_xnnpack_program(ep), passes=[pass_type]).transform()


def _xnnpack_program(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """A copy of ``ep`` (its graph, signature and tensor dicts; the tensors shared) under XNNPACK's verifier, as
    ``XnnpackBackend.preprocess`` wraps the program it is given."""
    from executorch.backends.xnnpack.utils.configs import get_xnnpack_edge_compile_config

    return _edge_program(ep, get_xnnpack_edge_compile_config())


def _edge_program(ep: torch.export.ExportedProgram, config: Any) -> torch.export.ExportedProgram:
    """A copy of ``ep`` (its graph, signature and tensor dicts; the tensors shared) under the Edge verifier of
    ``config`` (an ``EdgeCompileConfig``)."""
    from executorch.exir.verification.verifier import EXIREdgeDialectVerifier

    gm = copy.deepcopy(ep.graph_module)
    return torch.export.ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=copy.deepcopy(ep.graph_signature), state_dict=dict(ep.state_dict),
        range_constraints=ep.range_constraints, module_call_graph=ep.module_call_graph,
        example_inputs=ep.example_inputs, constants=dict(ep.constants),
        verifiers=[EXIREdgeDialectVerifier(edge_compile_config=config, class_only=True)])


def xnn_fuse_batch_norm(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """XNNPACK's ``FuseBatchNormPass(ep)``: a BatchNorm after a conv or linear folded into its weights (see
    :func:`as_xnnpack`)."""
    from executorch.backends.xnnpack._passes import FuseBatchNormPass

    return as_xnnpack(ep, FuseBatchNormPass)


def xnn_decompose_batch_norm(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """XNNPACK's ``DecomposeBatchNorm(ep)``: a BatchNorm left alone written as a depthwise conv or a mul/add
    (:func:`as_xnnpack`)."""
    from executorch.backends.xnnpack._passes import DecomposeBatchNorm

    return as_xnnpack(ep, DecomposeBatchNorm)


@fxverify.contract(keeps_opset=False)
def xnn_convert_to_linear(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """XNNPACK's ``ConvertToLinearPass``: ``addmm`` / ``mm`` (with their ``permute`` of the weight) back to
    ``aten.linear`` (:func:`as_xnnpack`). ``aten.linear`` is no core ATen op: the result is XNNPACK's own IR,
    for its serializer, under a verifier that does not check the op set, and never lowered again, so it declares
    ``keeps_opset=False`` (``runtime`` skips: undeclared, ``to_backend`` of the result refused ``aten.linear`` on
    the seven models with a linear, outside what the pass is for)."""
    from executorch.backends.xnnpack._passes import ConvertToLinearPass

    return as_xnnpack(ep, ConvertToLinearPass)


@fxverify.contract(keeps_opset=False)
def xnn_remove_getitem(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """ExecuTorch's ``RemoveGetItemPass`` (``backends.transforms``, in XNNPACK's pipeline): ``max_pool2d_with_indices``
    and ``max`` whose indices nobody reads as ``max_pool2d`` / ``amax`` (:func:`as_xnnpack`). ``max_pool2d`` is no
    core ATen op: XNNPACK's IR, as for :func:`xnn_convert_to_linear` (``keeps_opset=False``)."""
    from executorch.backends.xnnpack._passes import RemoveGetItemPass

    return as_xnnpack(ep, RemoveGetItemPass)


@fxverify.contract(keeps_opset=False)
def xnn_channels_last(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """XNNPACK's ``ChannelsLastTaggedReshapePass(ep)``: NHWC-tagged copies inserted around the ops XNNPACK runs
    channels-last (:func:`as_xnnpack`): ``_to_copy`` with a ``memory_format``, an op the Edge verifier refuses in
    dim-order mode: XNNPACK's IR, as for :func:`xnn_convert_to_linear` (``keeps_opset=False``). Its row leaves out
    ``edge_final_buffer_copy``
    and ``edge_size_one_dims``: there the pass raises "Attempting to convert non-NHWC compatible node to NHWC" on a
    ``mean.dim`` of a 2-D / 3-D tensor (it takes every ``mean.dim`` for an NHWC op), which XNNPACK's pipeline
    never hands it: the pass runs in ``preprocess`` on what the partitioner delegated, and ``MeanDimConfig``
    delegates only a 4-D mean over dims 2 and 3 (outside the pass's contract, not a defect)."""
    from executorch.backends.xnnpack._passes import ChannelsLastTaggedReshapePass

    return as_xnnpack(ep, ChannelsLastTaggedReshapePass)


@fxverify.contract(keeps_opset=False)
def xnn_dim_order_revert(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """ExecuTorch's ``DimOrderOpsRevertPass`` (``exir.passes``) as XNNPACK runs it, first in its pipeline:
    ``_to_dim_order_copy`` / ``_clone_dim_order`` back to ``_to_copy`` / ``clone`` with a ``memory_format``, ops
    the Edge verifier refuses in dim-order mode, so only under XNNPACK's verifier (:func:`as_xnnpack`): XNNPACK's IR
    (``keeps_opset=False``, as :func:`xnn_convert_to_linear`)."""
    from executorch.exir.passes.memory_format_ops_pass import DimOrderOpsRevertPass

    return as_xnnpack(ep, DimOrderOpsRevertPass)


# -- Arm's passes (``executorch.backends.arm._passes``; need ``tosa-tools``), run as Arm's backend runs them ---------


def tosa_int() -> Any:
    """Arm's ``TOSAQuantizer`` for the TOSA 1.0 INT profile with its ``get_symmetric_quantization_config()``
    (per-channel weights, int8 activations), as Arm's docs and its test pipelines (``ArmTester.quantize``) set it."""
    from executorch.backends.arm.quantizer import TOSAQuantizer, get_symmetric_quantization_config
    from executorch.backends.arm.tosa.specification import TosaSpecification

    spec = TosaSpecification.create_from_string("TOSA-1.0+INT")
    return TOSAQuantizer(spec).set_global(get_symmetric_quantization_config())


def as_arm(ep: torch.export.ExportedProgram, make: Any) -> torch.export.ExportedProgram:
    """The pass ``make(program, tosa_spec)`` builds run on ``ep`` as Arm's backend runs its passes:
    ``TOSABackend.preprocess`` calls ``ArmPassManager(compile_spec).transform_to_backend_pipeline(edge_program)``,
    which, inside a ``TosaLoweringContext`` of the compile spec's TOSA specification, builds each pass (those
    reading the program are given it) and runs the list through ``ArmPassManager._transform``: each pass wrapped
    in ``_ExportedProgramGraphPassAdapter``, run by ExecuTorch's ``ExportedProgramPassManager`` on the program, its
    graph signature rebuilt after each. Here the list is the one pass, and the specification the one Arm's own
    pass tests (``PassPipeline``) use: ``TOSA-1.0+INT`` for a quantized program (one with q/dq nodes),
    ``TOSA-1.0+FP`` for a float one. The program is a copy under the verifier Arm's flows lower with
    (``EdgeCompileConfig(_check_ir_validity=False)``: ``ArmTester``'s ``to_edge``, Arm's recipes), as
    ``preprocess`` gets a partition's program of its own; the caller's ``ep`` is left as it was."""
    from executorch.backends.arm._passes import ArmPassManager
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from executorch.backends.arm.tosa.specification import TosaSpecification
    from executorch.exir import EdgeCompileConfig

    program = _edge_program(ep, EdgeCompileConfig(_check_ir_validity=False))
    quantized = any("quantized_decomposed" in str(node.target) for node in program.graph.nodes)
    manager = ArmPassManager(TosaCompileSpec(TosaSpecification.create_from_string(
        "TOSA-1.0+INT" if quantized else "TOSA-1.0+FP")))
    with manager._tosa_context(program.graph_module):
        manager.add_pass(make(program, manager.tosa_spec))
        manager._transform(program, program.graph_module)  # sets the program's graph and signature, as there
    return program


def tosa_int_unguarded() -> Any:
    """:func:`tosa_int` as Arm's own examples call it: on ``ep.module(check_guards=False)`` (executorch PR #14524),
    here by dropping the ``_guards_fn`` call ``ep.module()`` inserts before ``transform_for_annotation`` runs (see
    ``docs/bugs-found.md``: Arm's annotation passes refuse that ``call_module``). The quantizer the Arm passes'
    rows quantize with under ``edge_pt2e``, so that they are checked on the models the plain one refuses."""
    from executorch.backends.arm.quantizer import TOSAQuantizer, get_symmetric_quantization_config
    from executorch.backends.arm.tosa.specification import TosaSpecification

    class Unguarded(TOSAQuantizer):  # type: ignore[misc]
        def transform_for_annotation(self, model: fx.GraphModule) -> fx.GraphModule:
            for node in list(model.graph.nodes):
                if node.op == "call_module" and node.target == "_guards_fn":
                    model.graph.erase_node(node)
            model.recompile()
            return super().transform_for_annotation(model)

    spec = TosaSpecification.create_from_string("TOSA-1.0+INT")
    return Unguarded(spec).set_global(get_symmetric_quantization_config())


def __getattr__(name: str) -> Any:
    """``tosa_int_quantizer``, ``tosa_int_unguarded_quantizer``: the quantizers of :func:`tosa_int` and
    :func:`tosa_int_unguarded` as the transform (made when asked for, so that this module imports without
    ``tosa-tools``)."""
    if name in ("tosa_int_quantizer", "tosa_int_unguarded_quantizer"):
        return globals()[name.removesuffix("_quantizer")]()
    raise AttributeError(name)


def _arm_pass(name: str, *, reads_program: bool = False) -> Any:
    """A function over the program running Arm's pass ``name`` (from ``executorch.backends.arm._passes``) through
    :func:`as_arm`, built as ``ArmPassManager`` builds it (``reads_program``: given the program)."""

    def run(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
        import executorch.backends.arm._passes as arm_passes

        pass_type = getattr(arm_passes, name)
        return as_arm(ep, lambda program, spec: pass_type(program) if reads_program else pass_type())

    run.__name__ = run.__qualname__ = name
    run.__annotations__ = {"ep": torch.export.ExportedProgram, "return": torch.export.ExportedProgram}
    return run


def arm_fuse_batch_norm(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """Arm's ``FuseBatchNorm2dPass(ep)``: a BatchNorm after a conv folded into its weight and bias (new
    parameters, the old ones deleted), any other BatchNorm left alone (:func:`as_arm`)."""
    from executorch.backends.arm._passes import FuseBatchNorm2dPass

    return as_arm(ep, lambda program, spec: FuseBatchNorm2dPass(program))


@fxverify.contract(devices=("cpu",))
def arm_decompose_mean_dim(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """Arm's ``DecomposeMeanDimPass(graph_module, tosa_spec)``: ``mean.dim`` as ``sum`` times ``1 / n`` (or as an
    average pool), built from the program's graph and the TOSA specification as ``ArmPassManager`` builds it
    (:func:`as_arm`). Its ``full`` of ``1 / n`` takes the device of the input's value when the pass runs (``"device":
    input_node.data.device``, as ExecuTorch's ``ExportPass``es write new tensors): the program is compiled to TOSA
    ahead of time, on the CPU, in ``preprocess``, and never moved, so it declares ``devices=("cpu",)`` (``devices``
    failed its meta stage on the five models with a mean: "Tensor on device cpu is not on the expected device
    meta", outside what the pass is for)."""
    from executorch.backends.arm._passes import DecomposeMeanDimPass

    return as_arm(ep, lambda program, spec: DecomposeMeanDimPass(program.graph_module, spec))


arm_decompose_grouped_conv = _arm_pass("DecomposeGroupedConvPass")  # a grouped conv as one conv a group, then cat
arm_convert_to_clamp = _arm_pass("ConvertToClampPass")  # relu, hardtanh as clamp
arm_decompose_addmm = _arm_pass("DecomposeAddmmPass")  # addmm as mm, mul and add
arm_fuse_quantized_activation = _arm_pass("FuseQuantizedActivationPass")  # a relu its quantize's range makes a no-op
# quantize / dequantize as mul, round, clamp and casts; its scale and zero point are ``full``s on the default device,
# so it declares devices=("cpu",) as arm_decompose_mean_dim does (its row's 14 failed items were devices' meta stage)
arm_decompose_quant_nodes = fxverify.contract(devices=("cpu",))(_arm_pass("DecomposeQuantNodesPass"))


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    library: str
    transform: str  # the transform's spec
    quantizer: str | None = None  # the capture's quantizer's spec (None: the capture's default)
    capture: str = "pt2e"
    exclude: str = ""  # models the row leaves out (--fxverify-exclude), its adapter's docstring saying why

    def args(self, corpus: str) -> list[str]:
        quantizer = ["--fxverify-quantizer", self.quantizer] if self.quantizer else []
        exclude = [f"--fxverify-exclude={self.exclude}"] if self.exclude else []
        return ["--fxverify", self.transform, "--fxverify-capture", self.capture, f"--fxverify-corpus={corpus}",
                *quantizer, *exclude]


def _here(name: str) -> str:
    return f"{HERE}:{name}"


ROWS = (
    Row("x86_static", "torchao", IDENTITY),
    *(Row(f"{name}@transform", "torchao", _here(f"{name}_quantizer")) for name in ("x86_static", "xnnpack_static")),
    *(Row(name, "torchao", IDENTITY, _here(name)) for name in
      ("x86_dynamic", "x86_reduce_range", "xnnpack_static", "xnnpack_dynamic", "arm_inductor")),
    *(Row(name, "torchao", _here(name)) for name in
      ("duplicate_dq", "port_metadata", "reference_representation", "ao_constant_fold")),
    *(Row(name, "torch", _here(name)) for name in
      ("cse", "dead_code", "split_constants")),
    # ExecuTorch: XNNPACK's passes through the adapters above, exir's own by their classes
    *(Row(f"{name}@edge", "executorch", _here(name), capture="edge") for name in (
        "xnn_fuse_batch_norm", "xnn_decompose_batch_norm", "xnn_convert_to_linear", "xnn_remove_getitem")),
    Row("xnn_channels_last@edge", "executorch", _here("xnn_channels_last"), capture="edge",
        exclude="edge_final_buffer_copy,edge_size_one_dims"),
    Row("xnn_dim_order_revert@edge", "executorch", _here("xnn_dim_order_revert"), capture="edge"),
    *(Row(f"{spec.rpartition(':')[2]}@{capture}", "executorch", f"executorch.exir.passes.{spec}", capture=capture)
      for spec, capture in (
          ("remove_noop_pass:RemoveNoopPass", "edge"), ("memory_format_ops_pass:MemoryFormatOpsPass", "edge"),
          ("spec_prop_pass:SpecPropPass", "edge"), ("cse_pass:CSEPass", "edge"),
          ("constant_prop_pass:constant_prop_pass", "edge"),
          ("fold_redundant_qdq_pass:FoldRedundantDequantizeQuantizePass", "edge_pt2e"))),
    # Arm (ExecuTorch's Arm backend; needs tosa-tools): its TOSAQuantizer, and its passes through as_arm
    Row("tosa_int", "arm", IDENTITY, _here("tosa_int")),
    *(Row(f"{name}@transform", "arm", _here(f"{name}_quantizer")) for name in ("tosa_int", "tosa_int_unguarded")),
    *(Row(f"{name}@edge", "arm", _here(name), capture="edge") for name in (
        "arm_fuse_batch_norm", "arm_decompose_grouped_conv", "arm_decompose_mean_dim", "arm_convert_to_clamp",
        "arm_decompose_addmm")),
    *(Row(f"{name}@edge_pt2e", "arm", _here(name), _here("tosa_int_unguarded"), capture="edge_pt2e") for name in (
        "arm_fuse_quantized_activation", "arm_decompose_quant_nodes")),
)


def run(row: Row, corpus: str, workers: int, cwd: str) -> dict[str, Any]:
    """One pytest run: wall seconds, its last line, and the failed records."""
    report = Path(cwd) / f"{row.name}.json"
    command = [sys.executable, "-m", "pytest", "-q", "-n", str(workers), "-p", "no:cacheprovider",
               *row.args(corpus), f"--fxverify-json={report}"]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env={**_env(), "PYTHONPATH": str(ROOT)})
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if not report.exists():
        raise SystemExit(f"{row.name}: pytest wrote no report (exit {done.returncode}):\n{done.stdout[-3000:]}"
                         f"\n{done.stderr[-2000:]}")
    records = json.loads(report.read_text())["records"]
    return {"seconds": time.perf_counter() - start, "last": lines[-1] if lines else "",
            "failed": [r for r in records if r["outcome"] in ("failed", "error")]}


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="quantization")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated row names")
    parser.add_argument("--library", default="", help="comma-separated libraries (torchao, torch, executorch, arm)")
    args = parser.parse_args()
    wanted = {n.strip() for n in args.only.split(",") if n.strip()}
    libraries = {n.strip() for n in args.library.split(",") if n.strip()}
    rows = [row for row in ROWS if (not wanted or row.name in wanted) and (not libraries or row.library in libraries)]
    print(f"{len(rows)} rows ({', '.join(sorted({r.library for r in rows}))}), corpus {args.corpus}, captures "
          f"{', '.join(sorted({r.capture for r in rows}))}, -n {args.workers}")
    with tempfile.TemporaryDirectory() as cwd:
        for row in rows:
            found = run(row, args.corpus, args.workers, cwd)
            kind = "quantizer" if row.transform == IDENTITY or row.name.endswith("@transform") else "pass"
            print(f"{row.name:40} {row.library:10} {kind:9} {len(found['failed']):3} failed  {found['seconds']:5.0f} s  "
                  f"{found['last']}", flush=True)
            groups: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
            for record in found["failed"]:
                groups[(record["check"], (record["finding"] or record["message"]).splitlines()[0][:220])].append(
                    record["model"])
            for (check, finding), models in groups.items():
                print(f"    {check}: {finding}  [{', '.join(models[:4])}{' ...' if len(models) > 4 else ''}]")


if __name__ == "__main__":
    main()
