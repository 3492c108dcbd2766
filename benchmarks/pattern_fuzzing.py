"""What pattern fuzzing (``fxverify.check_patterns``) costs: for each pass, the variants judged per second and
the time to its first unsound match, side by side in one run.

The passes are the re-created bug classes of ``tests/compile_patterns.py`` (each must report its first unsound
match within 60 s on 2 cores, the goal of issue 34), their correct twins (no failure), and Inductor's own
attention patterns as torch ships them (``--inductor N``: the first N inference patterns of
``fuse_attention._get_sfdp_patterns()``, and ``--training N`` the first N training ones, judged on joint graphs,
each fuzzed as registered into one pass with all of them).

    python benchmarks/pattern_fuzzing.py [--budget 60] [--inductor 3] [--training 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests package holds the re-created passes

PASSES = ("channel_dim_by_size", "channel_dim_fixed", "rms_norm_unguarded", "rms_norm_guarded",
          "leaky_relu_slope_dropped", "leaky_relu_slope_kept", "scaled_two_outputs", "scaled_one_output_each",
          "gelu_detached_backward", "gelu_fused", "double_to_scale", "INDUCTOR_ADDMM")


def row(label: str, results: list[Any], seconds: float) -> str:
    from fxverify.compile.patterns import SOUND

    sound = [r for r in results if r.check == SOUND]
    judged = sum(r.details.get("judged", 0) for r in sound)
    failing = [r for r in sound if not r.ok]
    first = min((r.details["first_failure_s"] for r in failing if r.details.get("first_failure_s") is not None),
                default=None)
    return (f"{label:<44} {len(sound):>8} {judged:>8} {judged / seconds:>9.1f} {len(failing):>7} "
            f"{'-' if first is None else f'{first:.1f}':>12} {seconds:>8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds of sweep for each pattern")
    parser.add_argument("--inductor", type=int, default=3, help="Inductor attention patterns to fuzz (0: none)")
    parser.add_argument("--training", type=int, default=2, help="Inductor training attention patterns (0: none)")
    args = parser.parse_args()
    import fxverify

    print(f"{'pass':<44} {'patterns':>8} {'variants':>8} {'variants/s':>9} {'unsound':>7} "
          f"{'first unsound s':>12} {'total s':>8}")
    for name in PASSES:
        started = time.perf_counter()
        results = fxverify.check_patterns(f"tests.compile_patterns:{name}", max_examples=50, budget_s=args.budget)
        print(row(name, results, time.perf_counter() - started), flush=True)
    from torch._inductor.fx_passes import fuse_attention

    for kind, count in (("_inference", args.inductor), ("_training", args.training)):
        rows = [r for r in fuse_attention._get_sfdp_patterns() if r[0].endswith(kind)
                and "_half" not in r[0] and "_bs1" not in r[0]]
        for name, _ in rows[:count]:
            started = time.perf_counter()
            results = fxverify.check_patterns(rows, names=[name], max_examples=50, budget_s=args.budget)
            print(row(f"inductor {name}", results, time.perf_counter() - started), flush=True)


if __name__ == "__main__":
    main()
