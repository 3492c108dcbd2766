"""Detection rate of fxverify over the mutation suite of `tests/mutations.py`.

    python benchmarks/detection.py [--corpus default] [--workers 2] [--only NAME,...] [--orders fast,catalogue]

Each buggy transform (`BUGGY`) runs as `pytest -x -n WORKERS --fxverify tests.mutations:NAME
--fxverify-corpus CORPUS`; it is detected when pytest fails a fxverify item (exit 1, or 2 when
pytest-xdist stops the run for -x). Printed: the first failure reported (check@model) and the
time to it, in seconds from starting pytest (interpreter start-up, collection and xdist workers
included) until that failure's report reaches the controller; `run s` is the whole run, which
-x ends once the workers finish their current items. Each correct transform (`CORRECT`) runs
the same way without -x; every failed item is a false positive, except on the models where
`KNOWN_DEFECTS` records a real, proven defect of that pass (torch's fuse on two layer variants).

The corpus is exactly the one given, run in each of the orders given (`--fxverify-order`): `fast`,
fxverify's default (edge-case and layer-variant modules first, then the other models by input
size, as on a machine without pytest's cache: the runs use `-p no:cacheprovider`, so no history
helps), and `catalogue`, the order before it (zoo models first). With both, each bug runs twice
and the totals compare the time to the first failure; correct transforms run once, in the first
order. The runs happen in a scratch directory with the repository on PYTHONPATH (so that
`tests.mutations` imports, while pytest does not also collect fxverify's own test suite), and
this module is loaded into them as a small pytest plugin (`-p benchmarks.detection`) that
timestamps failures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EVENTS_ENV = "FXVERIFY_DETECTION_EVENTS"

# -- the pytest plugin loaded into each run -----------------------------------------------------

_controller = True


def pytest_configure(config: Any) -> None:
    global _controller
    _controller = not hasattr(config, "workerinput")


def pytest_runtest_logreport(report: Any) -> None:
    """On the controller, append each failed report (node id and wall-clock time) to the events file."""
    path = os.environ.get(EVENTS_ENV)
    if path and _controller and report.failed:
        with open(path, "a") as events:
            events.write(json.dumps({"nodeid": report.nodeid, "time": time.time()}) + "\n")


# -- the benchmark --------------------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    """What one pytest run over the corpus showed for one transform."""

    name: str
    kind: str  # "bug" or "correct"
    order: str  # --fxverify-order
    expected: str  # the check that must catch the bug; "-" for correct transforms
    exit_code: int
    failed: list[tuple[str, str]]  # (check, model) of the failed fxverify items, in the order reported
    failed_items: int  # failed or erroring items of any kind, from the JUnit XML
    first_failure_s: float | None
    run_s: float
    last_line: str
    known: frozenset[str] = frozenset()  # models where the (correct) transform has a known real defect

    @property
    def false_positives(self) -> list[tuple[str, str]]:
        return [(check, model) for check, model in self.failed if model not in self.known]

    @property
    def first(self) -> str:
        return "-" if not self.failed else f"{self.failed[0][0]}@{self.failed[0][1]}"

    @property
    def verdict(self) -> str:
        # 1: tests failed; 2: interrupted, which is how pytest-xdist ends a run stopped by -x
        stopped_by_x = self.kind == "bug" and self.exit_code == 2 and bool(self.failed)
        if not stopped_by_x and (self.exit_code not in (0, 1) or (self.exit_code == 1 and not self.failed)):
            return f"ERROR (exit {self.exit_code}: {self.last_line})"
        if self.kind == "bug":
            return "detected" if self.failed else "MISSED"
        if self.false_positives:
            return f"FALSE POSITIVE ({len(self.false_positives)} items)"
        shown = sorted({model for _, model in self.failed})
        return f"ok (known defects on {', '.join(shown)})" if shown else "ok"


def run_pytest(name: str, kind: str, expected: str, corpus: str, workers: int, order: str,
               known: frozenset[str] = frozenset()) -> Outcome:
    """Verify ``tests.mutations:name`` over ``corpus`` in a pytest subprocess (``-x`` for bugs)."""
    args = ["--fxverify", f"tests.mutations:{name}", f"--fxverify-corpus={corpus}", f"--fxverify-order={order}"]
    return run_items(name, kind, expected, args, workers, order, known)


def fxverify_item(nodeid: str) -> tuple[str, str] | None:
    """``(check, model)`` of an fxverify item's node id, else None."""
    from fxverify.plugin.nodeids import parse_nodeid

    parsed = parse_nodeid(nodeid)
    return None if parsed is None else (parsed[2], parsed[1])


def run_items(name: str, kind: str, expected: str, args: list[str], workers: int, order: str = "-",
              known: frozenset[str] = frozenset(),
              item: Callable[[str], tuple[str, str] | None] = fxverify_item) -> Outcome:
    """Run pytest with ``args`` in a scratch directory (``-x`` for bugs), timestamping each failed item's report;
    ``item`` reads ``(check, subject)`` from a failed item's node id."""
    with tempfile.TemporaryDirectory(prefix="fxverify-detection-") as tmp:
        junit, events = Path(tmp) / "junit.xml", Path(tmp) / "events.jsonl"
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-p", "benchmarks.detection", *args,
                   f"--junitxml={junit}"]
        command += ["-x"] if kind == "bug" else []
        command += ["-n", str(workers)] if workers > 1 else []
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        env[EVENTS_ENV] = str(events)
        start = time.time()
        proc = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True)
        run_s = time.time() - start
        reported = [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []
        suite = ET.parse(junit).getroot().find("testsuite") if junit.exists() else None
    failed = [parsed for parsed in (item(e["nodeid"]) for e in reported) if parsed is not None]
    failed_items = len(reported) if suite is None else int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    lines = (proc.stdout.strip() or proc.stderr.strip()).splitlines()
    return Outcome(name, kind, order, expected, proc.returncode, failed, failed_items,
                   reported[0]["time"] - start if reported else None, run_s, lines[-1] if lines else "", known)


ROW = "{:40s} {:7s} {:11s} {:24s} {:45s} {:>12s} {:>6s}  {}"
GOAL_S = 120.0  # every bug caught within two minutes of starting pytest


def print_row(o: Outcome) -> None:
    first_s = "-" if o.first_failure_s is None else f"{o.first_failure_s:.1f}"
    print(ROW.format(o.name, o.kind, o.order, o.expected, o.first, first_s, f"{o.run_s:.0f}", o.verdict), flush=True)


def print_times(bugs: list[Outcome]) -> None:
    """Per order: the time to the first failure over the bugs caught (median, max, within the goal)."""
    for order in dict.fromkeys(o.order for o in bugs):
        times = sorted(o.first_failure_s for o in bugs if o.order == order and o.first_failure_s is not None)
        if times:
            within = sum(t <= GOAL_S for t in times)
            print(f"{order:15s}: first failure median {statistics.median(times):.1f} s, max {times[-1]:.1f} s; "
                  f"{within} of {len(times)} within {GOAL_S:.0f} s")


def print_totals(outcomes: list[Outcome]) -> None:
    bugs = [o for o in outcomes if o.kind == "bug"]
    correct = [o for o in outcomes if o.kind == "correct"]
    detected = [o for o in bugs if o.verdict == "detected"]
    missed = [o for o in bugs if o.verdict == "MISSED"]
    expected = [o for o in detected if o.failed[0][0] == o.expected]
    positives = [o for o in correct if o.false_positives]
    errors = [o for o in outcomes if o.verdict.startswith("ERROR")]
    print()
    if bugs:
        print(f"bugs:    {len(detected)} detected, {len(missed)} missed, of {len(bugs)} runs; "
              f"first caught by the expected check: {len(expected)} of {len(detected)}")
        print_times(bugs)
    if correct:
        print(f"correct: {len(correct) - len(positives)} clean, {len(positives)} with false positives "
              f"({sum(len(o.false_positives) for o in positives)} failed items), of {len(correct)}")
    if errors:
        print(f"errors:  {', '.join(o.name for o in errors)}")
    for o in missed + positives:
        shown = o.false_positives if o.kind == "correct" else o.failed
        print(f"  {o.name}: {o.verdict}; {', '.join(f'{c}@{m}' for c, m in shown[:8]) or o.last_line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="default", help="corpus selection (profiles, names, globs)")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (-n); 1 runs in-process")
    parser.add_argument("--only", default="", help="comma-separated transform names (buggy or correct)")
    parser.add_argument("--orders", default="fast", help="comma-separated --fxverify-order values to run each bug in")
    args = parser.parse_args()
    orders = [o.strip() for o in args.orders.split(",") if o.strip()]

    sys.path.insert(0, str(ROOT))
    from tests.mutations import BUGGY, CORRECT, KNOWN_DEFECTS

    planned: list[tuple[Callable[..., Any], str, str]] = [(f, "bug", check) for f, check in BUGGY.items()]
    planned += [(f, "correct", "-") for f in CORRECT]
    wanted = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(wanted) - {f.__name__ for f, _, _ in planned})
    if unknown:
        parser.error(f"unknown transforms {unknown}; known: {', '.join(f.__name__ for f, _, _ in planned)}")
    planned = [p for p in planned if not wanted or p[0].__name__ in wanted]

    print(f"corpus {args.corpus}, -n {args.workers}, orders {', '.join(orders)}, no pytest cache; "
          "first fail s: pytest start to the first failed item's report")
    print(ROW.format("transform", "kind", "order", "expected", "first failing check@model", "first fail s", "run s",
                     "verdict"))
    outcomes = []
    for transform, kind, expected in planned:
        for order in orders if kind == "bug" else orders[:1]:
            outcome = run_pytest(transform.__name__, kind, expected, args.corpus, args.workers, order,
                                 frozenset(KNOWN_DEFECTS.get(transform, ())))
            print_row(outcome)
            outcomes.append(outcome)
    print_totals(outcomes)


if __name__ == "__main__":
    main()
