"""Reports of a verification run: JSON records for CI dashboards and a
self-contained HTML page with graph pictures and code diffs of each failure.

From pytest: ``--fxverify-json FILE`` and ``--fxverify-html FILE``. Without pytest::

    import fxverify
    from fxverify import reports

    verification = fxverify.Verification(my_pass, "resnet18")
    records = reports.records_from_results(verification.run_all(), verification.subject)   # failures get pictures
    reports.write_json("out/report.json", records)
    reports.write_html("out/report.html", records)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from fxverify.core.results import CheckResult
from fxverify.engine.subject import Subject
from fxverify.reports.figures import figures_of
from fxverify.reports.html import render_html, write_html
from fxverify.reports.records import header, json_report, record, write_json

__all__ = [
    "FORMATS",
    "ReportFormat",
    "header",
    "json_report",
    "record",
    "records_from_results",
    "render_html",
    "write_html",
    "write_json",
]


@dataclasses.dataclass(frozen=True)
class ReportFormat:
    """A report file: ``write(path, records, head) -> path``, and whether its records need the pictures and code
    of failures (:mod:`fxverify.reports.figures`, made where the models are)."""

    write: Callable[[Path, list[dict[str, Any]], Mapping[str, Any]], Path]
    figures: bool = False


# the report formats, by name: --fxverify-<name> FILE writes one (a third format is a row here and an option row)
FORMATS: dict[str, ReportFormat] = {
    "json": ReportFormat(write_json),
    "html": ReportFormat(write_html, figures=True),
}


def records_from_results(results: Iterable[CheckResult], subject: Subject | None = None) -> list[dict[str, Any]]:
    """Records of check results run without pytest (no durations). Given the
    :class:`~fxverify.engine.subject.Subject` they ran on (``Verification.subject``), failures
    carry the pictures and code the HTML report shows (see :mod:`fxverify.reports.figures`), and
    every record what the transform changed on the model."""
    if subject is None:
        return [record(result) for result in results]
    return [record(r, figures=figures_of(subject, r), changed=subject.changes) for r in results]
