"""Which corpus models each ATen-level front-end can capture (issue 15): for every entry,
``torch.export.export`` (training IR, ``strict=False``), the same with a dynamic batch dimension,
``run_decompositions()`` of the static export (core ATen), and ``make_fx`` of the functionalized
model, with the entry's own symbolic trace timed alongside for the cost ratio.

    python benchmarks/capture_survey.py [--corpus default] [--timeout 300] [--json PATH]

Each model runs in a child process of its own, one torch thread, after a warm-up of every
front-end on a tiny module (so no capture pays the first import of the export machinery); a
model that outlives ``--timeout`` seconds or kills its process is reported ``timeout`` /
``crashed``. Per capture: ok or the exception, capture seconds (model build excluded), node
count, ``call_function`` nodes without ``meta['val']``, and whether the captured program's outputs
match eager ones on the primary inputs (``torch.testing.assert_close``, default tolerances;
``ok ≠`` when they differ). ``export_dynamic`` exports with ``Dim("batch", min=1, max=1024)`` on
dim 0 of every input (at the first configuration with a batch of 2 or more, so that the batch
is not specialised to 1) and runs ``ep.module()`` at every batch size of the entry's
configurations; ``export_core`` seconds are the export plus the decomposition.
Prints a markdown table, a summary and every failure's reason.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fxverify.cases.catalogue import CorpusEntry, select

CAPTURES = ("export", "export_dynamic", "export_core", "make_fx")
COLUMNS = ("symbolic_trace", *CAPTURES)
MAX_BATCH = 1024
Result = dict[str, Any]
Capture = tuple[Result, Any, list[Any]]  # what a capture measured, the program it made, configurations to run it on


def one_line(text: str, limit: int = 160) -> str:
    """The message's lines joined, cut at ``limit`` (some messages open with a generic line)."""
    joined = " / ".join(line.strip() for line in str(text).splitlines() if line.strip())
    return joined if len(joined) <= limit else joined[: limit - 1] + "…"


def failure(error: BaseException, seconds: float, where: str = "") -> Result:
    return {"status": "fail", "error": type(error).__name__, "reason": where + one_line(str(error)), "seconds": seconds}


# --- the child: one model, every capture -------------------------------------------------------


def graph_figures(graph: Any) -> Result:
    """Node count, and ``call_function`` nodes lacking ``meta['val']`` with their targets."""
    nodes = list(graph.nodes)
    missing = [str(n.target) for n in nodes if n.op == "call_function" and "val" not in n.meta]
    return {"nodes": len(nodes), "missing_val": len(missing), "missing_val_targets": sorted(set(missing))}


def difference(actual: Any, expected: Any) -> str | None:
    """None when the flattened outputs match (default tolerances), else why not, in one line."""
    import torch
    from torch.utils._pytree import tree_leaves

    try:
        torch.testing.assert_close(tree_leaves(actual), tree_leaves(expected))
    except Exception as error:  # AssertionError, or a TypeError for leaves of different kinds
        return one_line(str(error), 200)
    return None


def warm_up() -> None:
    """Every front-end once on a tiny module: imports and first-call caches off the clock."""
    import torch
    from torch import nn
    from torch.export import Dim, export
    from torch.fx.experimental.proxy_tensor import make_fx

    tiny, x = nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.randn(2, 4),)
    torch.fx.symbolic_trace(tiny)
    export(tiny, x).run_decompositions().module()(*x)
    export(tiny, x, dynamic_shapes=({0: Dim("batch", min=1, max=MAX_BATCH)},)).module()(*x)
    make_fx(torch.func.functionalize(lambda *a: tiny(*a)))(*x)


def survey_model(name: str, record: Callable[[str, Result], None]) -> None:
    """Every capture of corpus entry ``name``, each result passed to ``record`` as soon as known."""
    import torch
    from torch.export import Dim, export
    from torch.fx.experimental.proxy_tensor import make_fx

    import fxverify

    torch.set_num_threads(1)
    warm_up()
    case = fxverify.load_case(name)
    primary = case.configs[0]
    by_batch = {}  # batch size -> its first configuration (the primary spatial size)
    for config in case.configs:
        by_batch.setdefault(config.specs[0].shape[0], config)
    eager: dict[str, Any] = {}

    def expected(config: Any) -> Any:
        if config.name not in eager:
            with torch.no_grad():
                eager[config.name] = case.build(training=False)(*config.make(case.seed))
        return eager[config.name]

    def check(program: Callable[..., Any], config: Any) -> str | None:
        with torch.no_grad():
            return difference(program(*config.make(case.seed)), expected(config))

    def attempt(capture: str, step: Callable[[Any], Capture], *, fresh: bool = True) -> None:
        """Capture with ``step`` (given a fresh model unless ``fresh`` is false; its build is off the
        clock), then run the captured program on its configurations against eager outputs."""
        module = case.build(training=False) if fresh else None
        start = time.perf_counter()
        try:
            measured, program, configs = step(module)
        except Exception as error:
            record(capture, failure(error, time.perf_counter() - start))
            return
        differs = []
        for config in configs:
            try:
                why = check(program, config)
            except Exception as error:
                ran = failure(error, measured["seconds"], f"running it at {config.name}: ")
                record(capture, {**measured, **ran, "stage": "run"})
                return
            if why:
                differs.append(f"{config.name}: {why}")
        record(capture, {"status": "ok", **measured, "differs": "; ".join(differs) or None})

    def timed(make: Callable[[], Any]) -> tuple[Any, float]:
        start = time.perf_counter()
        made = make()
        return made, time.perf_counter() - start

    def symbolic(module: Any) -> Capture:
        gm, seconds = timed(lambda: case.capture.capture(module, training=False))
        return {"seconds": seconds, **graph_figures(gm.graph)}, gm, [primary]

    exported: dict[str, Any] = {}

    def static(module: Any) -> Capture:
        ep, seconds = timed(lambda: export(module, primary.make(case.seed)))
        exported["ep"], exported["seconds"] = ep, seconds
        return {"seconds": seconds, **graph_figures(ep.graph)}, ep.module(), [primary]

    def dynamic(module: Any) -> Capture:
        example = next(c for b, c in by_batch.items() if b >= 2)
        batch = Dim("batch", min=1, max=MAX_BATCH)
        inputs = example.make(case.seed)
        ep, seconds = timed(lambda: export(module, inputs, dynamic_shapes=tuple({0: batch} for _ in inputs)))
        measured = {"seconds": seconds, **graph_figures(ep.graph), "example": example.name}
        return measured, ep.module(), [by_batch[b] for b in sorted(by_batch)]

    def core(_: Any) -> Capture:
        ep, seconds = timed(lambda: exported["ep"].run_decompositions())
        measured = {"seconds": exported["seconds"] + seconds, "decompose_seconds": seconds, **graph_figures(ep.graph)}
        return measured, ep.module(), [primary]

    def functional(module: Any) -> Capture:
        f = torch.func.functionalize(lambda *args: module(*args))
        gm, seconds = timed(lambda: make_fx(f)(*primary.make(case.seed)))
        return {"seconds": seconds, **graph_figures(gm.graph)}, gm, [primary]

    attempt("symbolic_trace", symbolic)
    attempt("export", static)
    if len(by_batch) < 2:
        record("export_dynamic", {"status": "n/a", "reason": "checked at one batch size"})
    else:
        attempt("export_dynamic", dynamic)
    if "ep" in exported:
        attempt("export_core", core, fresh=False)
    else:
        record("export_core", {"status": "n/a", "reason": "the static export failed"})
    attempt("make_fx", functional)


def child_main(name: str, out: Path) -> None:
    with out.open("a", encoding="utf-8") as sink:
        def record(capture: str, result: Result) -> None:
            sink.write(json.dumps({"capture": capture, **result}) + "\n")
            sink.flush()

        survey_model(name, record)


# --- the parent: a child per model, then the report --------------------------------------------


def run_child(entry: CorpusEntry, timeout: float, folder: Path) -> dict[str, Result]:
    """Each capture's result for ``entry``; captures its child never reached are ``timeout`` / ``crashed``."""
    out = folder / f"{entry.name}.jsonl"
    command = [sys.executable, __file__, "--child", entry.name, "--child-out", str(out)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        code, tail = proc.returncode, (proc.stderr.strip().splitlines() or [""])[-1]
    except subprocess.TimeoutExpired:
        code, tail = None, ""
    results: dict[str, Result] = {}
    if out.exists():
        for line in out.read_text(encoding="utf-8").splitlines():
            data = json.loads(line)
            results[data.pop("capture")] = data
    for capture in COLUMNS:
        if capture not in results:
            if code is None:
                results[capture] = {"status": "timeout", "reason": f"model over {timeout:.0f} s"}
            else:
                results[capture] = {"status": "crashed", "reason": f"exit {code}: {one_line(tail)}"}
    return results


def duration(value: float) -> str:
    return f"{value:.2f}s" if value < 10 else f"{value:.1f}s"


def cell(result: Result) -> str:
    status = result["status"]
    if status == "ok":
        return f"ok{' ≠' if result.get('differs') else ''} {duration(result['seconds'])}"
    if status == "fail":
        return f"{'captured, run fails' if result.get('stage') == 'run' else 'fail'}: {result['error']}"
    return "—" if status == "n/a" else status


def family(entry: CorpusEntry) -> str:
    first = entry.tags[0] if entry.tags else entry.source
    return entry.source if first == entry.source else f"{entry.source}/{first}"


def print_table(entries: list[CorpusEntry], results: dict[str, dict[str, Result]]) -> None:
    print("| model | source | " + " | ".join(COLUMNS) + " |")
    print("|---|---|" + "---|" * len(COLUMNS))
    for entry in entries:
        cells = " | ".join(cell(results[entry.name][c]) for c in COLUMNS)
        print(f"| {entry.name} | {family(entry)} | {cells} |")


def print_summary(entries: list[CorpusEntry], results: dict[str, dict[str, Result]]) -> None:
    traced = {e.name: results[e.name]["symbolic_trace"] for e in entries}
    print("\n| capture | ok | outputs differ | fail | timeout / crashed | not run | median s | max s | total s "
          "| median / median symbolic_trace | nodes (median) | call_function nodes without meta['val'] |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for capture in COLUMNS:
        rows = {e.name: results[e.name][capture] for e in entries}
        ok = {n: r for n, r in rows.items() if r["status"] == "ok"}
        count = collections.Counter(r["status"] for r in rows.values())
        durations = [r["seconds"] for r in ok.values()]
        timed = [r["seconds"] for r in rows.values() if "seconds" in r]
        both = [n for n in ok if traced[n]["status"] == "ok"]
        ratio = "—"
        if both and capture != "symbolic_trace":
            mine = statistics.median(ok[n]["seconds"] for n in both)
            ratio = f"{mine / statistics.median(traced[n]['seconds'] for n in both):.1f}x ({len(both)} models)"
        missing = [n for n, r in ok.items() if r.get("missing_val")]
        targets = sorted({t for n in missing for t in ok[n]["missing_val_targets"]})
        without_val = f"{sum(ok[n]['missing_val'] for n in missing)} in {len(missing)} models"
        without_val += f" ({', '.join(f'`{t}`' for t in targets)})" if targets else ""
        if capture == "symbolic_trace":
            without_val = "— (symbolic tracing records no values)"
        print(f"| {capture} | {len(ok)} | {sum(1 for r in ok.values() if r.get('differs'))} | {count['fail']} "
              f"| {count['timeout'] + count['crashed']} | {count['n/a']} "
              f"| {statistics.median(durations) if durations else float('nan'):.3f} | {max(durations, default=float('nan')):.2f} "
              f"| {sum(timed):.1f} | {ratio} | {statistics.median(r['nodes'] for r in ok.values()) if ok else '—'} "
              f"| {without_val} |")


def print_reasons(entries: list[CorpusEntry], results: dict[str, dict[str, Result]]) -> None:
    print("\nFailures and differences:")
    for capture in COLUMNS:
        print(f"\n{capture}:")
        shown = False
        for entry in entries:
            result = results[entry.name][capture]
            if result["status"] in ("fail", "timeout", "crashed"):
                what = result.get("error", result["status"])
                print(f"- {entry.name}: {what}: {result.get('reason', '')}")
                shown = True
            elif result["status"] == "ok" and result.get("differs"):
                print(f"- {entry.name}: outputs differ: {result['differs']}")
                shown = True
        if not shown:
            print("- none")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="default", help="profiles, names or globs, comma-separated")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per model (all its captures)")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child, args.child_out)
        return
    entries = select(args.corpus)
    results: dict[str, dict[str, Result]] = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for position, entry in enumerate(entries, 1):
            began = time.perf_counter()
            results[entry.name] = run_child(entry, args.timeout, Path(tmp))
            statuses = " ".join(f"{c}={cell(results[entry.name][c])}" for c in CAPTURES)
            print(f"[{position}/{len(entries)}] {entry.name} {time.perf_counter() - began:.0f}s {statuses}",
                  file=sys.stderr, flush=True)
    wall = time.perf_counter() - start
    print_table(entries, results)
    print_summary(entries, results)
    print_reasons(entries, results)
    print(f"\n{len(entries)} models of `{args.corpus}`, wall {wall:.0f} s")
    if args.json:
        raw = {e.name: {"source": family(e), **results[e.name]} for e in entries}
        args.json.write_text(json.dumps({"corpus": args.corpus, "wall": wall, "models": raw}, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
