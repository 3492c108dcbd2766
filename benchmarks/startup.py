"""Start-up cost of the installed plugin: `pytest --collect-only` in a small
unrelated project, with fxverify loaded against `-p no:fxverify`, measured
side by side (alternating runs) in one go. Prints the median difference.

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
        timings: dict[str, list[float]] = {"with fxverify": [], "-p no:fxverify": []}
        for _ in range(args.runs):
            for label, extra in (("with fxverify", []), ("-p no:fxverify", ["-p", "no:fxverify"])):
                start = time.perf_counter()
                subprocess.run(base + extra, cwd=project, check=True, capture_output=True)
                timings[label].append(time.perf_counter() - start)
    with_plugin = statistics.median(timings["with fxverify"])
    without = statistics.median(timings["-p no:fxverify"])
    print(f"median collect-only: with fxverify {with_plugin * 1000:.0f} ms, -p no:fxverify {without * 1000:.0f} ms")
    print(f"difference: {(with_plugin - without) * 1000:+.0f} ms (goal: at most 50 ms); ratio {with_plugin / without:.3f}")


if __name__ == "__main__":
    main()
