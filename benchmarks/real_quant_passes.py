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

ExecuTorch's Arm passes (``executorch.backends.arm._passes``) are not among the rows: they import
``tosa_serializer``, which ExecuTorch's wheel does not bring; they need ``pip install tosa-tools`` (about 200 MB,
the ``ethos-u`` / ``vgf`` extras pin ``tosa-tools==2026.5.0``), not installed here.
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
    from executorch.exir.verification.verifier import EXIREdgeDialectVerifier

    gm = copy.deepcopy(ep.graph_module)
    return torch.export.ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=copy.deepcopy(ep.graph_signature), state_dict=dict(ep.state_dict),
        range_constraints=ep.range_constraints, module_call_graph=ep.module_call_graph,
        example_inputs=ep.example_inputs, constants=dict(ep.constants),
        verifiers=[EXIREdgeDialectVerifier(edge_compile_config=get_xnnpack_edge_compile_config(), class_only=True)])


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
          ("fold_redundant_qdq_pass:FoldRedundantDequantizeQuantizePass", "edge_pt2e")))
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
    parser.add_argument("--library", default="", help="comma-separated libraries (torchao, torch, executorch)")
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
