"""What pattern fuzzing (``fxverify.check_patterns``) costs: for each pass, the variants judged per second, the
time to its first unsound match and whether it kept its completeness promise, side by side in one run.

The passes are the re-created bug classes of ``tests/compile_patterns.py`` (each must report its first unsound
match within 60 s on 2 cores, the goal of issue 34), the passes of ``tests/compile_user_patterns.py`` written as
vLLM and serving libraries write them (issue 41), each beside its correct twin (no failure), Inductor's ``addmm``
handler (its search function derived from its pattern), and Inductor's own attention patterns as torch ships them
(``--inductor N``: the first N inference patterns of ``fuse_attention._get_sfdp_patterns()``, and ``--training N``
the first N training ones, judged on joint graphs, each fuzzed as registered into one pass with all of them).

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

PASSES = (*(f"tests.compile_patterns:{name}" for name in (
    "channel_dim_by_size", "channel_dim_fixed", "rms_norm_unguarded", "rms_norm_guarded", "leaky_relu_slope_dropped",
    "leaky_relu_slope_kept", "scaled_two_outputs", "scaled_one_output_each", "gelu_detached_backward", "gelu_fused",
    "double_to_scale", "INDUCTOR_ADDMM", "ADDMM")),
    *(f"tests.compile_user_patterns:{name}" for name in (
        "silu_and_mul_unguarded", "silu_and_mul_one_order", "silu_and_mul_fusion", "rms_norm_float32_traced",
        "rms_norm_fusion", "linear_gelu_tanh_kernel", "linear_gelu_fusion", "attention_key_by_size",
        "attention_fusion", "tokens_silu_mul_view", "tokens_silu_mul_reshape")))


def row(label: str, results: list[Any], seconds: float) -> str:
    from fxverify.compile.patterns import COMPLETE, SOUND

    sound = [r for r in results if r.check == SOUND]
    judged = sum(r.details.get("judged", 0) for r in sound)
    failing = [r for r in sound if not r.ok]
    incomplete = sum(not r.ok for r in results if r.check == COMPLETE)
    first = min((r.details["first_failure_s"] for r in failing if r.details.get("first_failure_s") is not None),
                default=None)
    return (f"{label:<52} {len(sound):>8} {judged:>8} {judged / seconds:>9.1f} {len(failing):>7} "
            f"{'-' if first is None else f'{first:.1f}':>12} {incomplete:>10} {seconds:>8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds of sweep for each pattern")
    parser.add_argument("--inductor", type=int, default=3, help="Inductor attention patterns to fuzz (0: none)")
    parser.add_argument("--training", type=int, default=2, help="Inductor training attention patterns (0: none)")
    args = parser.parse_args()
    import fxverify

    print(f"{'pass':<52} {'patterns':>8} {'variants':>8} {'variants/s':>9} {'unsound':>7} "
          f"{'first unsound s':>12} {'incomplete':>10} {'total s':>8}")
    for spec in PASSES:
        started = time.perf_counter()
        results = fxverify.check_patterns(spec, max_examples=50, budget_s=args.budget)
        print(row(spec.removeprefix("tests."), results, time.perf_counter() - started), flush=True)
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
