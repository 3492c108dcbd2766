"""pytest glue of ``--fxverify-json`` / ``--fxverify-html``.

Each item puts its record in ``user_properties`` (with the pictures and code of
a failure when an HTML report is wanted), which pytest-xdist carries from the
workers in their TestReports; :class:`ReportWriter`, on the controller (or the
single process), gathers them and writes the files once, at the end of the session.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fxverify.plugin import option, path_option
from fxverify.reports.records import record
from fxverify.result import ERROR, FAILED, CheckResult, exception_summary

RECORD = "fxverify_record"


def report_properties(config: pytest.Config, v: Any, result: CheckResult,
                      changed: list[str] | None = None) -> list[tuple[str, Any]]:
    """The ``user_properties`` entry of an item: its record (with what the transform changed on the
    model), and for a failure in a run writing HTML, the pictures and code (made here, where the
    models are). Empty without a report option."""
    html, json_path = option(config, "fxverify_html"), option(config, "fxverify_json")
    if not (html or json_path):
        return []
    figures = None
    if html and result.outcome == FAILED:
        from fxverify.reports.figures import failure_figures

        try:
            figures = failure_figures(v, result)
        except Exception as exc:  # drawing must never hide the check's own result
            figures = {"note": f"no pictures: drawing them raised {exception_summary(exc)}"}
    return [(RECORD, record(result, figures=figures, changed=changed))]


class ReportWriter:
    """Gathers item records from TestReports and writes the JSON and HTML reports at the end."""

    def __init__(self, json_path: Path | None, html_path: Path | None) -> None:
        self.json_path, self.html_path = json_path, html_path
        self.records: dict[str, dict[str, Any]] = {}
        self.written: list[Path] = []

    @classmethod
    def register(cls, config: pytest.Config) -> None:
        """Register a writer when a report is asked for, except on xdist workers (the controller writes)."""
        json_path, html_path = path_option(config, "fxverify_json"), path_option(config, "fxverify_html")
        if hasattr(config, "workerinput") or not (json_path or html_path):
            return
        config.pluginmanager.register(cls(json_path, html_path), "fxverify-reports")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        from fxverify.pytest_items import parse_nodeid

        parsed = parse_nodeid(report.nodeid)
        if parsed is None:
            return
        given = next((value for key, value in report.user_properties if key == RECORD), None)
        if given is not None and report.when == "call":
            self.records[report.nodeid] = {**given, "nodeid": report.nodeid, "duration": report.duration,
                                           "outcome": _outcome(report)}
        elif report.failed or (report.skipped and report.nodeid not in self.records):
            spec, model, check = parsed  # failed outside the check (setup, teardown, a dead worker)
            self.records[report.nodeid] = record(
                CheckResult(check, model, spec, _outcome(report), report.longreprtext),
                duration=report.duration, nodeid=report.nodeid,
            )

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self) -> None:
        from fxverify.checks import CHECKS
        from fxverify.reports.html import write_html
        from fxverify.reports.records import header, write_json

        order = {name: i for i, name in enumerate(CHECKS)}
        records = sorted(self.records.values(),
                         key=lambda r: (r["transform"], r["model"], order.get(r["check"], len(order))))
        head = header()
        if self.json_path:
            self.written.append(write_json(self.json_path, records, head))
        if self.html_path:
            self.written.append(write_html(self.html_path, records, head))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for path in self.written:
            terminalreporter.write_line(f"fxverify: wrote {path}")


def _outcome(report: pytest.TestReport) -> str:
    from fxverify.pytest_items import is_error

    if hasattr(report, "wasxfail"):
        return "xfailed"
    if is_error(report):
        return ERROR
    return {"passed": "passed", "failed": "failed", "skipped": "skipped"}[report.outcome]
