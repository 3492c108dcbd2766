"""pytest glue of ``--fxverify-json`` / ``--fxverify-html``.

Each item attaches its record to its report (with the pictures and code of a failure when an
HTML report is wanted, made where the models are), which pytest-xdist carries from the workers;
the ledger (:mod:`fxverify.plugin.ledger`) gathers them and :class:`ReportWriter`, on the
controller (or the single process), writes the files once, at the end of the session.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from fxverify.cases import catalogue
from fxverify.core.results import CheckResult
from fxverify.engine.subject import Subject
from fxverify.plugin.ledger import RECORD, Ledger
from fxverify.plugin.nodeids import model_label
from fxverify.plugin.options import RunOptions
from fxverify.reports import FORMATS
from fxverify.reports.figures import figures_of
from fxverify.reports.records import header, record


def report_properties(result: CheckResult, subject: Subject | None, *, reports: Mapping[str, Path],
                      changed: list[str] | None = None) -> list[tuple[str, Any]]:
    """The ``user_properties`` entry of an item: its record (with what the transform changed on the
    model), and for a failure in a run writing a report that shows them (HTML), the pictures and code."""
    pictured = any(FORMATS[name].figures for name in reports)
    figures = figures_of(subject, result) if pictured and subject is not None else None
    return [(RECORD, record(result, figures=figures, changed=changed))]


def run_header(options: RunOptions, ledger: Ledger) -> dict[str, Any]:
    """The header's ``run``: the checks in their order, each transform's contract, the shard, and the
    models (labels, in catalogue order) of the whole selection and of this run, which
    :mod:`fxverify.reports.merge` needs to merge the shards' reports as one run."""
    whole = catalogue.select(options.corpus, exclude=options.exclude, tags=options.tags)
    passes = {spec.partition(":")[2]: spec.partition(":")[0] for spec in ledger.passes}  # a compile spec -> its option
    return {"checks": list(ledger.checks),
            "contracts": {**{t.spec: t.contract.describe() for t in ledger.transforms}, **passes},
            "shard": options.shard or None, "selection": [model_label(e.name, c) for e in whole for c in options.captures],
            "models": list(ledger.models)}


@dataclasses.dataclass(eq=False)  # pytest plugins must be hashable
class ReportWriter:
    """Writes the reports asked for (format name -> path, see :data:`fxverify.reports.FORMATS`) from the
    ledger's records at the end of the session."""

    ledger: Ledger
    reports: Mapping[str, Path]
    run: dict[str, Any]  # the header's run (:func:`run_header`)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self) -> None:
        records, head = self.ledger.sorted_records(), header(self.ledger.random_graphs, self.run)
        for name, path in self.reports.items():
            self.ledger.written.append(FORMATS[name].write(path, records, head))
