"""The one listener of a run: every fxverify item's report is read here once (its node id parsed,
its outcome decided, what the item attached to it taken), for the summary table, the golden-file
updates, the JSON / HTML reports and whoever else subscribes (the random graphs remember the
seeds that failed). Under pytest-xdist the controller's ledger sees every worker's reports.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fxverify import checks
from fxverify.analysis.golden import format_updates
from fxverify.analysis.op_variants import OP_COUNTS
from fxverify.cases.catalogue import split_label
from fxverify.core.results import ERROR, FAILED, PASSED, SKIPPED, XFAILED, CheckResult, Outcome
from fxverify.core.transform import Transform
from fxverify.plugin.nodeids import parse_nodeid
from fxverify.reports.records import record, sorted_records
from fxverify.reports.summary import format_table, merged_changes, rewrite_warning, variant_warning

# the user_properties keys an item attaches to its report
RECORD = "fxverify_record"  # its report record (only when a JSON or HTML report is wanted)
CHANGED = "fxverify_changed"  # what the transform changed on its model
GOLDEN = "fxverify_golden_update"  # (status, path) of the golden file it wrote
OUTCOME = "fxverify_outcome"  # "error" when fxverify could not judge it
SUMMED = (OP_COUNTS,)  # the keys of a check's details an item attaches as they are, for the summary to add up
CRASHED = "???"  # the ``when`` of the report pytest-xdist makes for an item whose worker died

Observer = Callable[[str, str, str, Outcome], None]  # (transform spec, model, check, outcome)


def item_outcome(report: pytest.TestReport) -> Outcome:
    """What became of the item of ``report``: an error when fxverify's own code raised or the
    process running it died (pytest-xdist's crash report), else as pytest says."""
    if hasattr(report, "wasxfail"):
        return XFAILED
    if report.failed and (report.when == CRASHED or (OUTCOME, ERROR.value) in report.user_properties):
        return ERROR
    return {"passed": PASSED, "failed": FAILED, "skipped": SKIPPED}[report.outcome]


@dataclasses.dataclass(eq=False)  # pytest plugins must be hashable
class Ledger:
    """Outcomes, changes, golden updates and report records of the run's items (a pytest plugin)."""

    transforms: list[Transform]
    checks: tuple[str, ...]
    random_graphs: frozenset[str] = frozenset()  # the models that are random graphs
    keep_records: bool = False
    outcomes: dict[str, dict[tuple[str, str], Outcome]] = dataclasses.field(default_factory=lambda: defaultdict(dict))
    changes: dict[str, dict[str, list[str] | None]] = dataclasses.field(default_factory=lambda: defaultdict(dict))
    golden_updates: dict[str, list[str]] = dataclasses.field(default_factory=lambda: defaultdict(list))
    records: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    # transform -> model -> an item's details under a key of SUMMED (the op counts of the original and result)
    summed: dict[str, dict[str, dict[str, Any]]] = dataclasses.field(default_factory=lambda: defaultdict(dict))
    seconds: dict[str, dict[str, float]] = dataclasses.field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))
    models: tuple[str, ...] = ()  # the selected models in catalogue order: the summary's row order
    passes: tuple[str, ...] = ()  # the specs of passes inside torch.compile, as their items' node ids begin
    observers: list[Observer] = dataclasses.field(default_factory=list)
    written: list[Path] = dataclasses.field(default_factory=list)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        parsed = parse_nodeid(report.nodeid)
        if parsed is None:
            return
        spec, model, check = parsed
        self.seconds[spec][model] += report.duration  # setup, call and teardown: what the model costs
        if report.when != "call" and not (report.failed or report.skipped):
            return
        outcome = item_outcome(report)
        self.outcomes[spec][(model, check)] = outcome
        attached: dict[str, Any] = dict(report.user_properties)
        if CHANGED in attached:  # what each item saw it change: a later check may have run it in another mode
            self.changes[spec][model] = merged_changes(self.changes[spec].get(model), attached[CHANGED])
        for key in SUMMED:
            if key in attached:
                self.summed[spec].setdefault(model, {})[key] = attached[key]
        if GOLDEN in attached:
            status, path = attached[GOLDEN]
            self.golden_updates[status].append(path)
        if self.keep_records:
            self._record(report, spec, model, check, outcome, attached.get(RECORD))
        for observer in self.observers:
            observer(spec, model, check, outcome)

    def _record(self, report: pytest.TestReport, spec: str, model: str, check: str, outcome: Outcome,
                given: dict[str, Any] | None) -> None:
        if given is not None and report.when == "call":
            self.records[report.nodeid] = {**given, "nodeid": report.nodeid, "duration": report.duration,
                                           "outcome": outcome.value}
        elif report.failed or report.nodeid not in self.records:  # outside the check: setup, a dead worker
            name, capture = split_label(model)
            self.records[report.nodeid] = record(CheckResult(check, name, spec, outcome, report.longreprtext,
                                                             capture=capture),
                                                 duration=report.duration, nodeid=report.nodeid)

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report: pytest.TestReport) -> tuple[str, str, str] | None:
        """An item fxverify could not judge is an error, not a failure of the transform."""
        if parse_nodeid(report.nodeid) is not None and item_outcome(report) is ERROR:
            return "error", "E", "ERROR"
        return None

    def _checks_of(self, subject: str) -> list[str]:
        """The run's checks that take ``subject`` (a kind of :data:`fxverify.checks.KINDS`): a block's columns."""
        return [check for check in self.checks if checks.spec(check).subject == subject]

    def sorted_records(self) -> list[dict[str, Any]]:
        """The records by transform, model and the checks' order."""
        return sorted_records(self.records.values(), self.checks)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.outcomes:
            terminalreporter.write_sep("=", "fxverify summary")
        row = {model: i for i, model in enumerate(self.models)}  # catalogue order, whatever order they ran in
        for transform in self.transforms:
            outcomes = self.outcomes.get(transform.spec)
            if not outcomes:
                continue
            changes = self.changes[transform.spec]
            cells = {key: outcomes[key].short for key in sorted(outcomes, key=lambda key: row.get(key[0], len(row)))}
            terminalreporter.write_line(format_table(transform.spec, transform.contract.describe(), cells,
                                                     self._checks_of(checks.MODEL), changes))
            warning = rewrite_warning(transform.spec, changes, self.random_graphs)
            if warning:
                terminalreporter.write_line(warning, yellow=True, bold=True)
            counts = {model: found[OP_COUNTS] for model, found in self.summed[transform.spec].items() if OP_COUNTS in found}
            variants = variant_warning(transform.spec, counts)
            if variants:
                terminalreporter.write_line(variants, yellow=True, bold=True)
            terminalreporter.write_line("")
        for spec in self.passes:
            outcomes = self.outcomes.get(spec)
            if outcomes:
                option, _, given = spec.partition(":")
                cells = {key: outcome.short for key, outcome in outcomes.items()}
                terminalreporter.write_line(format_table(given, "", cells, self._checks_of(checks.kind(option).name),
                                                         None, kind=option) + "\n")
        if self.golden_updates:
            terminalreporter.write_line(format_updates(self.golden_updates, terminalreporter.config.rootpath))
        for path in self.written:
            terminalreporter.write_line(f"fxverify: wrote {path}")
