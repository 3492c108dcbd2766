"""What a corpus run costs: the wall time of the identity transform over the
`default` profile with `-n 2` (every check), and the time per model of a sample
of the `full` profile run single-process, extrapolated to a whole nightly run.

    python benchmarks/corpus_cost.py [--sample 30] [--workers 2] [--skip-default]

The sample takes models of every family in turn (a fixed shuffle within each family, one
family after another), so that it spans the zoo's architectures. Per-model time is the sum of a
model's item durations from pytest's JUnit XML (its first item also builds, traces and transforms
it). The extrapolation weighs the sample's mean by the number of entries of each kind: the
`large_input` profile (images larger than 224x224, which a nightly can leave out with
`--fxverify-exclude large_input`), the other runnable entries, and the expected failures
(`xfail`: only checked to still fail).
"""

from __future__ import annotations

import argparse
import random
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


def sample_full(size: int, seed: int = 0) -> list[str]:
    """``size`` runnable entries of `full`, taking one of each family in turn (families in catalogue
    order, a fixed shuffle within each)."""
    families: dict[str, list[str]] = defaultdict(list)
    for entry in catalogue.select("full"):
        if not entry.xfail:
            families[entry.tags[0] if entry.tags else entry.name].append(entry.name)
    rng = random.Random(seed)
    for names in families.values():
        rng.shuffle(names)
    chosen: list[str] = []
    while len(chosen) < size and any(families.values()):
        for names in families.values():
            if names and len(chosen) < size:
                chosen.append(names.pop())
    return chosen


def extrapolate(per_model: dict[str, float], workers: int) -> None:
    """Print the nightly estimate: each kind of entry's count times the sample's mean for that kind."""
    large = {e.name for e in catalogue.select("large_input")}
    full = catalogue.select("full")
    kinds = {
        "large_input": [e.name for e in full if e.name in large and not e.xfail],
        "other runnable": [e.name for e in full if e.name not in large and not e.xfail],
    }
    hours: dict[str, float] = {}
    for kind, names in kinds.items():
        measured = [per_model[n] for n in names if n in per_model]
        if not measured:
            print(f"  {kind}: {len(names)} entries, none in the sample")
            continue
        mean = statistics.fmean(measured)
        hours[kind] = mean * len(names) / 3600
        print(f"  {kind}: {len(names)} entries x mean {mean:.1f} s ({len(measured)} sampled, median "
              f"{statistics.median(measured):.1f} s, max {max(measured):.1f} s) = {hours[kind]:.1f} worker-hours")
    xfail = sum(1 for e in full if e.xfail)
    print(f"  xfail: {xfail} entries (each only traced to see it still fails: seconds)")
    total = sum(hours.values())
    print(f"estimated nightly run of `full`: {total:.1f} worker-hours ({total / workers:.1f} h with -n {workers}); "
          f"without `large_input`: {hours.get('other runnable', float('nan')):.1f} worker-hours")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample", type=int, default=30, help="models of `full` to time (across families)")
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
    large = {e.name for e in catalogue.select("large_input")}
    for name in sample:
        note = " (large_input)" if name in large else ""
        print(f"  {name:40s} {per_model.get(name, float('nan')):7.1f} s{note}")
    print(f"full sample: {len(per_model)} of {len(sample)} models timed, single process, {wall:.0f} s wall; "
          f"exit {code}: {last}")
    extrapolate(per_model, args.workers)


if __name__ == "__main__":
    main()
