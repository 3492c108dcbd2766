"""What a capture costs a whole run: pytest with ``-n 2`` over a corpus, one transform, under each
capture (``--fxverify-capture``), run side by side in rounds (symbolic_trace, export, export_core,
make_fx, then the other way round, so that a machine whose speed drifts during the rounds favours
neither), with wall and CPU time, the median ratio of each capture to ``symbolic_trace`` in the
same round, seconds per model (the items' durations summed per model, from the JSON report) and
the failures, which for a correct transform must be none.

    python benchmarks/captures.py [--corpus default] [--rounds 1] [--transform SPEC]

The default transform is ``tests/aten_passes.py:identity`` (it recompiles and returns the graph it
was given: valid on every capture). The goal (issue 15): ``export`` within 2x the wall time of
``symbolic_trace``. What one export costs per model, with no checks: ``capture_survey.py``.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
from pathlib import Path

from process_tree import timed

ROOT = Path(__file__).resolve().parents[1]
CAPTURES = ("symbolic_trace", "export", "export_core", "make_fx")


def run(capture: str, args: argparse.Namespace, cwd: str) -> dict[str, float | str | int]:
    """One run under ``capture``: wall, CPU, seconds per model, failures and pytest's last line."""
    report = Path(cwd) / f"{capture}.json"
    command = [sys.executable, "-m", "pytest", "-q", "-n", str(args.workers), "-p", "no:cacheprovider",
               "--fxverify", args.transform, f"--fxverify-corpus={args.corpus}", f"--fxverify-capture={capture}",
               f"--fxverify-json={report}"]
    wall, cpu, last = timed(command, cwd)
    records = json.loads(report.read_text())["records"]
    per_model: dict[str, float] = collections.defaultdict(float)
    for record in records:
        per_model[record["model"]] += record["duration"] or 0.0
    failed = [f"{r['model']}-{r['check']}" for r in records if r["outcome"] in ("failed", "error")]
    return {"wall": wall, "cpu": cpu, "per_model": statistics.median(per_model.values()),
            "mean_model": statistics.fmean(per_model.values()), "failed": len(failed),
            "first_failed": ", ".join(failed[:5]), "last": last}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="default")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--captures", default=",".join(CAPTURES))
    parser.add_argument("--transform", default=f"{ROOT / 'tests' / 'aten_passes.py'}:identity")
    args = parser.parse_args()
    captures = args.captures.split(",")
    figures: dict[str, list[dict]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as cwd:
        for index in range(args.rounds):
            for capture in captures if index % 2 == 0 else captures[::-1]:  # ABBA: a drift in speed cancels
                found = run(capture, args, cwd)
                figures[capture].append(found)
                print(f"round {index + 1}, {capture}: {found['wall']:.0f} s wall, {found['cpu']:.0f} s CPU, "
                      f"{found['per_model']:.1f} s per model (median; mean {found['mean_model']:.1f}), "
                      f"{found['failed']} failed {found['first_failed']}; {found['last']}", flush=True)
    base = captures[0]
    for capture in captures:
        runs = figures[capture]
        wall = statistics.median(r["wall"] for r in runs)
        cpu = statistics.median(r["cpu"] for r in runs)
        ratios = [r["wall"] / b["wall"] for r, b in zip(runs, figures[base], strict=True)]
        cpu_ratios = [r["cpu"] / b["cpu"] for r, b in zip(runs, figures[base], strict=True)]
        print(f"{capture}: {wall:.0f} s wall, {cpu:.0f} s CPU, "
              f"{statistics.median(r['per_model'] for r in runs):.1f} s per model; against {base} "
              f"wall {statistics.median(ratios):.2f}x, CPU {statistics.median(cpu_ratios):.2f}x "
              f"({args.rounds} round(s), corpus {args.corpus}, -n {args.workers})")


if __name__ == "__main__":
    main()
