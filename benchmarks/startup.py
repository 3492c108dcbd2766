"""Start-up cost of the installed plugin: `pytest --collect-only` in a small
unrelated project, with fxverify loaded against `-p no:fxverify`, measured
side by side in pairs (A B A B ..., whole processes) in one go. Prints the median
wall-time difference and the ratios of wall time and of CPU time (user + system of
the process and what it waited for): on a noisy machine the CPU ratio is the steadier
of the two, since another process's load stretches wall time but not CPU time.

    python benchmarks/startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from process_tree import children_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        for i in range(5):
            (project / f"test_mod{i}.py").write_text(
                "\n".join(f"def test_{j}():\n    assert {j} == {j}\n" for j in range(20))
            )
        base = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        wall: dict[str, list[float]] = {"with fxverify": [], "-p no:fxverify": []}
        cpu: dict[str, list[float]] = {"with fxverify": [], "-p no:fxverify": []}
        for _ in range(args.runs):
            for label, extra in (("with fxverify", []), ("-p no:fxverify", ["-p", "no:fxverify"])):
                before, start = children_cpu(), time.perf_counter()
                subprocess.run(base + extra, cwd=project, check=True, capture_output=True)
                wall[label].append(time.perf_counter() - start)
                cpu[label].append(children_cpu() - before)
    with_plugin, without = statistics.median(wall["with fxverify"]), statistics.median(wall["-p no:fxverify"])
    print(f"median collect-only over {args.runs} pairs: with fxverify {with_plugin * 1000:.0f} ms, "
          f"-p no:fxverify {without * 1000:.0f} ms")
    print(f"difference: {(with_plugin - without) * 1000:+.0f} ms (goal: at most 50 ms)")
    print(f"median of paired ratios: wall {_paired_ratio(wall):.3f}, CPU {_paired_ratio(cpu):.3f}")


def _paired_ratio(measured: dict[str, list[float]]) -> float:
    """The median over the pairs of (with fxverify / without): each pair ran back to back, under
    the same load."""
    return statistics.median(a / b for a, b in zip(measured["with fxverify"], measured["-p no:fxverify"]))


if __name__ == "__main__":
    main()
