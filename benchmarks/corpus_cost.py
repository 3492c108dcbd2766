"""What a corpus run costs: the wall time of the identity transform over the
`default` profile with `-n 2` (every check), and the time per model of a sample
of the `full` profile run single-process, extrapolated to the whole nightly run.

    python benchmarks/corpus_cost.py [--sample 12] [--workers 2] [--skip-default]

Per-model time is the sum of a model's item durations from pytest's JUnit XML
(its first item also builds, traces and transforms it).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from fxverify.cases import catalogue

TRANSFORM = "fxverify.examples:identity"


def run_pytest(corpus: str, workers: int, junit: Path) -> tuple[float, int, str]:
    """Run fxverify over ``corpus``; wall seconds, exit code, and pytest's last line."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--fxverify", TRANSFORM,
               f"--fxverify-corpus={corpus}", f"--junitxml={junit}"]
    if workers > 1:
        command += ["-n", str(workers)]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as empty:  # a project of its own, as a user would run it
        proc = subprocess.run(command, cwd=empty, capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    return time.perf_counter() - start, proc.returncode, lines[-1] if lines else proc.stderr[-500:]


def seconds_per_model(junit: Path) -> dict[str, float]:
    per_model: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "")
        if name.startswith("fxverify["):
            per_model[name[len("fxverify["):].rpartition("-")[0]] += float(case.get("time", 0))
    return dict(per_model)


def sample_full(size: int) -> list[str]:
    """Every k-th entry of `full` (catalogue order): a fixed sample across families."""
    entries = [e.name for e in catalogue.select("full")]
    step = max(1, len(entries) // size)
    return entries[::step][:size]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample", type=int, default=12, help="models of `full` to time")
    parser.add_argument("--workers", type=int, default=2, help="xdist workers for the default run")
    parser.add_argument("--skip-default", action="store_true", help="only time the `full` sample")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_default:
            models = len(catalogue.select("default"))
            wall, code, last = run_pytest("default", args.workers, Path(tmp) / "default.xml")
            print(f"default profile ({models} models), identity, -n {args.workers}: {wall:.0f} s wall "
                  f"({wall / models:.1f} s per model); exit {code}: {last}")
        sample = sample_full(args.sample)
        wall, code, last = run_pytest(",".join(sample), 1, Path(tmp) / "full.xml")
        per_model = seconds_per_model(Path(tmp) / "full.xml")
    for name in sample:
        print(f"  {name:40s} {per_model.get(name, float('nan')):7.1f} s")
    times = sorted(per_model.values())
    total = len(catalogue.select("full"))
    mean = statistics.fmean(times)
    print(f"full sample ({len(times)} of {total} models, single process): mean {mean:.1f} s, "
          f"median {statistics.median(times):.1f} s, max {times[-1]:.1f} s per model; exit {code}: {last}")
    print(f"estimated full run: {mean * total / 3600:.1f} CPU-hours of one worker; "
          f"{mean * total / 3600 / args.workers:.1f} h with -n {args.workers}")


if __name__ == "__main__":
    main()
