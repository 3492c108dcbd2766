"""fxverify on real FX passes written by others, each with the contract its authors would declare.

    python benchmarks/real_passes.py [--corpus smoke,edge] [--workers 2] [--only fuse,split,...]

Each pass below runs as `pytest -n WORKERS --fxverify benchmarks.real_passes:NAME
--fxverify-corpus CORPUS` in a scratch directory, and its failures are printed grouped by check
and finding, with the models that show each. A verdict is only worth something when every
failure is a real defect of the pass: read each group as the pass's author would, and prove it in
a few lines of plain torch before calling it one.

The wrappers call torch's passes the way their users do, with the model's tracer class where a
pass re-traces its input (timm's leaf modules do not survive a plain `symbolic_trace`).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from torch import fx, nn

import fxverify

ROOT = Path(__file__).resolve().parent.parent

# -- the passes ----------------------------------------------------------------------------------


@fxverify.contract(modes=("eval",), changes_parameters=True)
def fuse(gm: fx.GraphModule) -> nn.Module:
    """torch.fx.experimental.optimization.fuse: conv/BN and linear/BN folding, inference only."""
    from torch.fx.experimental.optimization import fuse as torch_fuse

    return torch_fuse(gm, no_trace=True)


@fxverify.contract(modes=("eval",))
def remove_dropout(gm: fx.GraphModule, tracer_class: type[fx.Tracer] = fx.Tracer) -> nn.Module:
    """torch.fx.experimental.optimization.remove_dropout: dropout is the identity in eval mode."""
    import unittest.mock

    import torch
    from torch.fx.experimental.optimization import remove_dropout as torch_remove_dropout

    with unittest.mock.patch.object(torch.fx, "symbolic_trace", lambda m: fx.GraphModule(m, tracer_class().trace(m))):
        return torch_remove_dropout(gm)


def normalize_args(gm: fx.GraphModule) -> nn.Module:
    """torch.fx.experimental.normalize.NormalizeArgs: calls rewritten to keyword arguments."""
    from torch.fx.experimental.normalize import NormalizeArgs

    return NormalizeArgs(gm).transform()


def split(gm: fx.GraphModule) -> nn.Module:
    """torch.fx.passes.split_module.split_module with a simple callback: the first and the second half."""
    from torch.fx.passes.split_module import split_module

    body = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    half = {node: 2 * i // max(1, len(body)) for i, node in enumerate(body)}
    return split_module(gm, gm, lambda node: half[node])


@fxverify.contract(modes=("eval",), changes_parameters=True)
def quantize_fuse_fx(gm: fx.GraphModule) -> nn.Module:
    """torch.ao.quantization.quantize_fx.fuse_fx: conv/BN/ReLU fusion before quantization, eval mode."""
    from torch.ao.quantization import quantize_fx

    return quantize_fx.fuse_fx(gm)


@fxverify.contract(modes=("eval",), changes_parameters=True, dtypes=("float32",), devices=("cpu",),
                   serializable=False)
def optimize_for_inference(gm: fx.GraphModule, tracer_class: type[fx.Tracer] = fx.Tracer) -> nn.Module:
    """torch.fx.experimental.optimization.optimize_for_inference: fusion, dropout removal and mkldnn
    layouts; a CPU / float32 inference optimisation whose result torch.save cannot write."""
    from torch.fx.experimental.optimization import optimize_for_inference as torch_optimize

    return torch_optimize(gm, tracer=tracer_class)


@fxverify.contract(modes=("eval",), changes_parameters=True)
def split_const_subgraphs(gm: fx.GraphModule) -> nn.Module:
    """torch.fx.experimental.const_fold.split_const_subgraphs: subgraphs of parameters alone folded into
    attributes computed on the first call, an inference optimisation. Its FoldedGraphModule's
    copy.deepcopy loses what its __init__ sets (a torch defect: pickle names it; no other item may fail)."""
    from torch.fx.experimental.const_fold import split_const_subgraphs as torch_split_const_subgraphs

    return torch_split_const_subgraphs(gm)


# the passes of the verdicts issue's acceptance list, in its order, then those of later issues
PASSES = [fuse, remove_dropout, normalize_args, split, quantize_fuse_fx, optimize_for_inference, split_const_subgraphs]

# -- running them ----------------------------------------------------------------------------------

_NUMBERS = re.compile(r"\b\d[\d.e+-]*")


def run(name: str, corpus: str, workers: int) -> dict[str, Any]:
    """Verify ``benchmarks.real_passes:name`` over ``corpus``; its JSON report's records and the run time."""
    with tempfile.TemporaryDirectory(prefix="fxverify-real-passes-") as tmp:
        report = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--fxverify",
                   f"benchmarks.real_passes:{name}", f"--fxverify-corpus={corpus}", f"--fxverify-json={report}"]
        command += ["-n", str(workers)] if workers > 1 else []
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        start = time.time()
        ran = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True)
        seconds = time.time() - start
        records = json.loads(report.read_text())["records"] if report.exists() else []
    if not records:  # pytest did not get to run the items: say why instead of printing empty counts
        raise SystemExit(f"{name}: pytest exited {ran.returncode} without results:\n{ran.stdout[-2000:]}{ran.stderr[-2000:]}")
    return {"records": records, "seconds": seconds}


def finding(record: dict[str, Any]) -> str:
    """What a failed or errored record says is wrong, numbers blanked so alike ones group (a crashed
    worker's items carry no finding: the first line of their message)."""
    lines = (record.get("finding") or record["message"] or "?").splitlines()
    text = lines[0].strip()
    if text.endswith(":") and len(lines) > 1:  # "the transform failed on this model:" and why
        text += " " + lines[1].strip()
    return _NUMBERS.sub("N", text)[:200]


def print_groups(records: list[dict[str, Any]]) -> None:
    """Failed and errored items grouped by outcome and finding, with the checks and models of each."""
    groups: dict[tuple[str, str], list[tuple[str, str]]] = collections.defaultdict(list)
    for r in records:
        if r["outcome"] in ("failed", "error"):
            groups[(r["outcome"], finding(r))].append((r["check"], r["model"]))
    for (kind, text), items in sorted(groups.items(), key=lambda item: -len(item[1])):
        checks = ",".join(dict.fromkeys(check for check, _ in items))
        models = list(dict.fromkeys(model for _, model in items))
        shown = ", ".join(models[:6]) + (f" and {len(models) - 6} more" if len(models) > 6 else "")
        print(f"  {len(items):3d} {kind} items ({checks}): {text}\n      models: {shown}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="smoke,edge", help="corpus selection (profiles, names, globs)")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (-n); 1 runs in-process")
    parser.add_argument("--only", default="", help="comma-separated pass names")
    args = parser.parse_args()
    wanted = [n.strip() for n in args.only.split(",") if n.strip()]
    chosen = [p for p in PASSES if not wanted or p.__name__ in wanted]
    print(f"corpus {args.corpus}, -n {args.workers}")
    for transform in chosen:
        outcome = run(transform.__name__, args.corpus, args.workers)
        records = outcome["records"]
        counts = collections.Counter(r["outcome"] for r in records)
        print(f"\n== {transform.__name__} [{fxverify.contract_of(transform).describe()}]: "
              f"{', '.join(f'{n} {o}' for o, n in sorted(counts.items()))} in {outcome['seconds']:.0f} s")
        print_groups(records)


if __name__ == "__main__":
    main()
