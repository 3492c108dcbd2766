"""fxverify on real quantizers and real passes over quantized graphs, written by others (torchao, torch.fx).

    python benchmarks/real_quant_passes.py [--corpus quantization] [--workers 2] [--only reference_repr,...]

Each row runs `pytest -n WORKERS --fxverify SPEC --fxverify-capture pt2e --fxverify-corpus CORPUS` in a scratch
directory: a quantizer as the capture's quantizer (`--fxverify-quantizer`) with the identity as the transform
(every item then judges what the quantizer made against itself: it must capture, run and keep its q/dq
pairs), a pass as the transform over the graph torchao's X86InductorQuantizer made. The failures are printed
grouped by check and finding, with the models that show each; read each as the pass's author would, and
prove it in a few lines of plain torch before calling it a defect (docs/bugs-found.md). Inductor's
``constant_fold`` is not among them: it runs on frozen graphs, where a buffer updated in forward is a
placeholder, and folds such a buffer's update where it is a ``get_attr`` (outside what it is called on).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from torch import fx

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


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    library: str
    transform: str  # the transform's spec
    quantizer: str | None = None  # the pt2e capture's quantizer's spec (None: the default, X86InductorQuantizer)

    def args(self, corpus: str) -> list[str]:
        quantizer = ["--fxverify-quantizer", self.quantizer] if self.quantizer else []
        return ["--fxverify", self.transform, "--fxverify-capture", "pt2e", f"--fxverify-corpus={corpus}", *quantizer]


def _here(name: str) -> str:
    return f"{HERE}:{name}"


ROWS = (
    Row("x86_static", "torchao", IDENTITY),
    *(Row(name, "torchao", IDENTITY, _here(name)) for name in
      ("x86_dynamic", "x86_reduce_range", "xnnpack_static", "xnnpack_dynamic", "arm_inductor")),
    *(Row(name, "torchao", _here(name)) for name in
      ("duplicate_dq", "port_metadata", "reference_representation", "ao_constant_fold")),
    *(Row(name, "torch", _here(name)) for name in
      ("cse", "dead_code", "split_constants")),
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
    args = parser.parse_args()
    wanted = {n.strip() for n in args.only.split(",") if n.strip()}
    rows = [row for row in ROWS if not wanted or row.name in wanted]
    print(f"{len(rows)} rows ({', '.join(sorted({r.library for r in rows}))}), corpus {args.corpus}, capture pt2e, "
          f"-n {args.workers}")
    with tempfile.TemporaryDirectory() as cwd:
        for row in rows:
            found = run(row, args.corpus, args.workers, cwd)
            kind = "quantizer" if row.transform == IDENTITY else "pass"
            print(f"{row.name:26} {row.library:8} {kind:9} {len(found['failed']):3} failed  {found['seconds']:5.0f} s  "
                  f"{found['last']}", flush=True)
            groups: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
            for record in found["failed"]:
                groups[(record["check"], (record["finding"] or record["message"]).splitlines()[0][:220])].append(
                    record["model"])
            for (check, finding), models in groups.items():
                print(f"    {check}: {finding}  [{', '.join(models[:4])}{' ...' if len(models) > 4 else ''}]")


if __name__ == "__main__":
    main()
