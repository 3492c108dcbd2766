"""Random-graph generation (issue 4): fxverify's random graphs side by side with NNSmith 0.1.0.

    python benchmarks/strategies.py [--graphs 1000] [--given-graphs 300] [--nodes 13] [--nnsmith-graphs 200]
                                    [--nnsmith-hash-seeds 0,1,2,3,4] [--seed 0] [--threads 1]

(``--nnsmith-graphs 0``: fxverify's side only.)

For each side, in this one process: graphs drawn + compiled (a ``GraphModule`` with
its generated code) + executed once per second (wall clock and process CPU time,
failures included), distinct operators covered, and the validity rate (the graph
lints, runs, and gives the output shapes and dtypes its builder predicted). Then
the ratios, against the goals: at least 10x NNSmith's throughput at equal graph
size (wall clock, and CPU time, which a busy machine disturbs less), at least twice
its operator count, 100% validity.

Operators are compared like with like: NNSmith counts its operator classes (about 54
distinct torch operations), so fxverify counts distinct torch operations among the
call_function / call_method nodes it drew, not catalogue entries: ``F.relu``,
``torch.relu``, ``Tensor.relu`` and ``Tensor.relu_`` are one operation (names
lowercased, in-place ``_`` and ``__dunder__`` stripped, aliases such as ``Tensor.float``
= ``Tensor.to`` or ``truediv`` = ``div`` merged, ``getitem`` and ``size`` not counted),
and ``nn`` layers (call_module) add none, as each repeats a functional op (``nn.ReLU``).
Catalogue entries and raw FX targets seen are printed too.

fxverify's graphs are ``graph_from_seed(seed + i)`` (the graphs of
``--fxverify-random-graphs``; like NNSmith's, seeded and not shrinkable), over every
dtype, with ``min_nodes = max_nodes = --nodes + --attrs`` computation nodes, so that
the operators per graph (printed) match NNSmith's ``--nodes``. The goals are judged
on these. A second row shows the same strategy under ``@given`` (``--given-graphs``
examples), where Hypothesis records every choice so that a failure shrinks. Both sides run with
one torch thread (``--threads``). NNSmith's side is
``benchmarks/strategies_nnsmith.py``'s ``measure()``, run in one fresh process per
``--nnsmith-hash-seeds``: NNSmith iterates sets while it generates, so its graphs, and
its rate (here 23-44 graphs/s), change with ``PYTHONHASHSEED``; the ratios take its
fastest run. When NNSmith is not installed that side is skipped, saying why and how
to install it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def measure(n_graphs: int = 1000, nodes: int = 13, seed: int = 0, *, under_given: bool = False) -> dict[str, Any]:
    """fxverify's figures for ``n_graphs`` graphs of ``nodes`` computation nodes, over every dtype.

    Graph ``i`` is ``graph_from_seed(seed + i, ...)`` (what ``--fxverify-random-graphs``
    draws), or with ``under_given`` the examples a ``@given(graph_modules(...))`` test
    receives (Hypothesis records every choice, for shrinking).

    Returns ``graphs_per_second``, ``graphs_per_cpu_second``, ``validity``,
    ``distinct_ops`` (distinct torch operations seen, see :func:`operation`),
    ``catalogue_entries`` (catalogue entries seen), ``distinct_targets`` (distinct FX
    call targets seen), ``mean_operators`` (call_* nodes per graph) and ``catalogue_size``.
    """
    from fxverify.strategies import OPS, graph_from_seed, graph_modules
    from fxverify.strategies.meta import ANY

    tally = Tally()
    options = {"min_nodes": nodes, "max_nodes": nodes, "dtypes": ANY}
    wall, cpu = time.perf_counter(), time.process_time()
    if under_given:
        from hypothesis import HealthCheck, Phase, given, settings
        from hypothesis import seed as hypothesis_seed

        @settings(max_examples=n_graphs, database=None, phases=[Phase.generate], deadline=None,
                  suppress_health_check=list(HealthCheck))
        @hypothesis_seed(seed)  # the same examples every run
        @given(graph_modules(**options))
        def run(case: Any) -> None:
            tally.add(case, "a @given example")

        run()
    else:
        for i in range(n_graphs):
            tally.add(graph_from_seed(seed + i, **options), f"seed {seed + i}")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "graphs_per_second": tally.n / wall,
        "graphs_per_cpu_second": tally.n / cpu,
        "validity": tally.valid / tally.n,
        "distinct_ops": len(tally.operations),
        "catalogue_entries": len(tally.entries),
        "distinct_targets": len(tally.targets),
        "mean_operators": tally.operators / max(tally.valid, 1),
        "catalogue_size": len(OPS),
        "n": tally.n,
    }


class Tally:
    """Validity and operator coverage of the graphs seen so far (a graph is valid when it
    lints, runs, and gives the output shapes and dtypes its builder predicted)."""

    def __init__(self) -> None:
        self.n = self.valid = self.operators = 0
        self.entries: set[str] = set()
        self.targets: set[str] = set()
        self.operations: set[str] = set()

    def add(self, case: Any, label: str) -> None:
        import torch

        self.n += 1
        try:
            case.module.graph.lint()
            with torch.no_grad():
                case.check_predictions()
        except Exception as exc:  # counted as invalid, and shown: there should be none
            print(f"  invalid graph ({label}): {type(exc).__name__}: {str(exc).splitlines()[0]}")
            return
        self.valid += 1
        self.entries.update(case.ops)
        calls = [n for n in case.module.graph.nodes if n.op.startswith("call_")]
        self.operators += len(calls)
        names = [(n.op, type(case.module.get_submodule(n.target)).__name__ if n.op == "call_module"
                  else getattr(n.target, "__name__", n.target)) for n in calls]
        self.targets.update(f"{op}:{name}" for op, name in names)
        self.operations.update(o for o in (operation(name) for op, name in names if op != "call_module") if o)


ALIASES = {"float": "to", "double": "to", "bfloat16": "to", "int": "to", "long": "to", "bool": "to",
           "type_as": "to", "truediv": "div", "true_divide": "div", "concat": "cat", "clamp_min": "clamp"}
NOT_OPERATIONS = frozenset({"getitem", "size"})  # tuple unpacking and shape queries


def operation(name: str) -> str | None:
    """The torch operation a call_function / call_method target name stands for (None: not one).

    >>> sorted({operation(n) for n in ("relu", "relu_", "__add__", "add", "float", "to", "getitem")} - {None})
    ['add', 'relu', 'to']
    """
    name = name.strip("_").lower()
    return None if name in NOT_OPERATIONS else ALIASES.get(name, name)


def nnsmith_runs(n_graphs: int, nodes: int, seed: int, threads: int, hash_seeds: list[int]) -> list[dict[str, Any]]:
    """NNSmith's figures (``strategies_nnsmith.measure``), one fresh process per ``PYTHONHASHSEED``
    in ``hash_seeds``: NNSmith iterates sets while it generates, so the same seeds give other
    graphs, and other rates, under another hash seed. Each result gains ``hash_seed``; a run
    NNSmith cannot make returns only ``{"unavailable": why}``."""
    script = Path(__file__).with_name("strategies_nnsmith.py")
    if not script.is_file():
        return [{"unavailable": f"{script} is absent"}]
    runs = []
    for hash_seed in hash_seeds:
        command = [sys.executable, str(script), "--graphs", str(n_graphs), "--nodes", str(nodes), "--seed", str(seed),
                   "--threads", str(threads), "--json"]
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": str(hash_seed)})
        if done.returncode != 0:
            return [{"unavailable": f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()[-2000:]}"}]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        if "unavailable" in result:
            return [result]
        runs.append({**result, "hash_seed": hash_seed})
    return runs


def _row(name: str, figures: dict[str, Any]) -> str:
    nodes = figures.get("mean_operators", figures.get("mean_nodes", float("nan")))
    return (f"{name:10} {figures['graphs_per_second']:9.1f} {figures['graphs_per_cpu_second']:9.1f} "
            f"{nodes:8.1f} {figures['distinct_ops']:8d} {figures['validity']:9.1%}  (n={figures['n']})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=1000, help="fxverify graphs to draw (default 1000)")
    parser.add_argument("--given-graphs", type=int, default=300,
                        help="examples drawn under @given for the second row (default 300; 0: no such row)")
    parser.add_argument("--nodes", type=int, default=13, help="operators (call nodes) per graph (default 13)")
    parser.add_argument("--attrs", type=int, default=3,
                        help="fxverify's node budget is --nodes + this: its budget also counts get_attr nodes "
                        "(weights, constants; about 3 a graph), NNSmith's counts operators only (default 3)")
    parser.add_argument("--nnsmith-graphs", type=int, default=200,
                        help="NNSmith graphs (default 200: it is slower; 0: fxverify's side only)")
    parser.add_argument("--nnsmith-hash-seeds", type=lambda text: [int(h) for h in text.split(",")], default=[0, 1, 2, 3, 4],
                        help="PYTHONHASHSEED of each NNSmith process, comma-separated (default 0,1,2,3,4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads for both sides (default 1: tiny tensors, threads only contend)")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    ours = measure(args.graphs, args.nodes + args.attrs, args.seed)
    print(f"{'':10} {'graphs/s':>9} {'graphs/cpu-s':>9} {'ops/graph':>8} {'distinct':>8} {'validity':>9}")
    print(_row("fxverify", ours))
    print(f"{'':10} (distinct = torch operations; catalogue entries seen: {ours['catalogue_entries']} of "
          f"{ours['catalogue_size']}; distinct FX targets seen: {ours['distinct_targets']})")
    if args.given_graphs:
        print(_row("  @given", measure(args.given_graphs, args.nodes + args.attrs, args.seed, under_given=True)))
        print(f"{'':10} (the same graphs' strategy under @given: every choice recorded, so failures shrink)")
    if args.nnsmith_graphs == 0:
        print("NNSmith: skipped (--nnsmith-graphs 0)")
        return 0
    runs = nnsmith_runs(args.nnsmith_graphs, args.nodes, args.seed, args.threads, args.nnsmith_hash_seeds)
    if "unavailable" in runs[0]:
        print(f"NNSmith: skipped, {runs[0]['unavailable']}")
        return 0
    for run in runs:
        print(_row(f"NNSmith h{run['hash_seed']}", run))
    theirs = max(runs, key=lambda run: run["graphs_per_second"])  # the ratio against NNSmith at its fastest
    print(f"{'':10} (one process per PYTHONHASHSEED: NNSmith draws other graphs under each; the ratios take its "
          f"fastest, h{theirs['hash_seed']})")
    speed = ours["graphs_per_second"] / theirs["graphs_per_second"]
    cpu_speed = ours["graphs_per_cpu_second"] / theirs["graphs_per_cpu_second"]
    coverage = ours["distinct_ops"] / max(theirs["distinct_ops"], 1)
    print(f"ratios: throughput {speed:.1f}x wall, {cpu_speed:.1f}x CPU (goal >= 10x); distinct operations "
          f"{ours['distinct_ops']} vs {theirs['distinct_ops']} NNSmith operator classes = {coverage:.1f}x "
          f"(goal >= 2x); validity {ours['validity']:.1%} vs {theirs['validity']:.1%} (goal 100%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
