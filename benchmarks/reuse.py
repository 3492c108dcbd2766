"""What keeping the original's reference outputs saves: pytest runs of fxverify over a corpus with
the reference store off and on, in one process each (no xdist, so that the figures are the work
and not the scheduling), measured side by side in pairs (A B A B ...), with wall and CPU time and
the median of the paired ratios.

    python benchmarks/reuse.py [--corpus smoke] [--pairs 2]

Two comparisons, each against ``--fxverify-reference-cache off``:

- *two transforms, cold store*: the identity and ``fuse_conv_bn`` in one run, the store emptied
  first (``--cache-clear``): the second transform reads what the first computed;
- *one transform, warm store*: the identity again, the store filled by an earlier run (the next
  run of a transform author's edit-run loop).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile

from process_tree import timed

TRANSFORMS = ("fxverify.examples:identity", "fxverify.examples:fuse_conv_bn")


def compare(name: str, off: list[str], on: list[str], cwd: str, pairs: int) -> None:
    """Runs ``off`` and ``on`` in pairs and prints the medians and the ratios."""
    figures: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    last = ""
    for _ in range(pairs):
        figures["off"].append(timed(off, cwd)[:2])
        wall, cpu, last = timed(on, cwd)
        figures["on"].append((wall, cpu))
        off_wall, off_cpu = figures["off"][-1]
        print(f"  {name}, pair {len(figures['on'])}: off {off_wall:.1f} s / {off_cpu:.1f} s CPU, "
              f"on {wall:.1f} s / {cpu:.1f} s CPU", flush=True)
    off_wall, off_cpu = (statistics.median(f[i] for f in figures["off"]) for i in (0, 1))
    on_wall, on_cpu = (statistics.median(f[i] for f in figures["on"]) for i in (0, 1))
    wall_ratio = statistics.median(a[0] / b[0] for a, b in zip(figures["on"], figures["off"]))
    cpu_ratio = statistics.median(a[1] / b[1] for a, b in zip(figures["on"], figures["off"]))
    print(f"{name}: store off {off_wall:.1f} s wall / {off_cpu:.1f} s CPU, on {on_wall:.1f} s / {on_cpu:.1f} s; "
          f"paired ratios (on / off) wall {wall_ratio:.3f}, CPU {cpu_ratio:.3f} ({pairs} pairs; {last})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="smoke")
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    base = [sys.executable, "-m", "pytest", "-q", f"--fxverify-corpus={args.corpus}"]
    off = ["--fxverify-reference-cache", "off"]
    both = [arg for t in TRANSFORMS for arg in ("--fxverify", t)]
    with tempfile.TemporaryDirectory() as cwd:
        compare("two transforms, cold store", base + both + off, base + both + ["--cache-clear"], cwd, args.pairs)
        identity = base + ["--fxverify", TRANSFORMS[0]]
        timed(identity, cwd)  # fills the store (the cold runs above leave the identity's references too)
        compare("one transform, warm store", identity + off, identity, cwd, args.pairs)


if __name__ == "__main__":
    main()
