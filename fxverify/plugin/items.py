"""The pytest items fxverify generates, and the run that owns them.

Imported by the plugin only when ``--fxverify`` is in use. One item per
(transform, model, capture, check), named ``fxverify[<model>-<check>]``
(``fxverify[<model>@<capture>-<check>]`` under another capture than the
default); the items of a model under one capture share one
:class:`~fxverify.api.Verification` (capture, transform, reference outputs done
once per worker), and under pytest-xdist they are scheduled together on one
worker (:mod:`fxverify.plugin.xdist`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from fxverify.api import Verification
from fxverify.cases.case import ModelCase
from fxverify.checks._digest_server import CrossProcessDigests
from fxverify.engine.memory import release_memory
from fxverify.engine.references import ReferenceStore
from fxverify.engine.results import ERROR, FAILED, SKIPPED, XFAILED
from fxverify.engine.transform import Transform
from fxverify.errors import CheckFailed
from fxverify.plugin.ledger import CHANGED, GOLDEN, OUTCOME
from fxverify.plugin.nodeids import item_name, model_label
from fxverify.plugin.options import RunOptions
from fxverify.plugin.order import History
from fxverify.plugin.reports import report_properties


@dataclasses.dataclass(eq=False)  # pytest plugins must be hashable
class FxVerifyRun:
    """The transforms, models, checks and options of this pytest run (a pytest plugin object), and
    the one shared Verification of the model being checked."""

    transforms: list[Transform]
    cases: list[ModelCase]
    options: RunOptions
    history: History | None = None  # None: the catalogue's order (see fxverify.plugin.order)
    references: ReferenceStore | None = None  # None: the original's outputs are computed for each transform

    def __post_init__(self) -> None:
        self._verification: tuple[tuple[str, str, str], Verification] | None = None
        self._digests = {
            (t.spec, capture): CrossProcessDigests(t, self.cases, timeout=self.options.timeout, capture=capture)
            for t in self.transforms for capture in self.options.captures
        }
        # (transform, model, capture) with a selected determinism item
        self._digest_wanted: set[tuple[str, str, str]] = set()

    def verification(self, transform: Transform, case: ModelCase, capture: str) -> Verification:
        """The shared Verification of (transform, case, capture); only the latest is kept in memory."""
        key = (transform.spec, case.name, capture)
        if self._verification is None or self._verification[0] != key:
            self._verification = None  # release the previous model before building the next
            release_memory()
            digests = self._digests[transform.spec, capture]
            if key in self._digest_wanted:
                digests.request(case.name)  # the server works on it while the other checks run
            o = self.options
            v = Verification(transform, case, timeout=o.timeout, cross_process=digests, golden_dir=o.golden_dir,
                             update_golden=o.update_golden, repro_dir=o.repro_dir, references=self.references,
                             capture=case.capture_named(capture))
            self._verification = (key, v)
        return self._verification[1]

    # -- pytest hooks ------------------------------------------------------------
    @pytest.hookimpl(trylast=True)  # after -k, --deselect and --lf have had their say
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self._digest_wanted = {
            (item.transform.spec, item.case.name, item.capture)
            for item in items if isinstance(item, CheckItem) and item.check == "determinism"
        }

    def pytest_unconfigure(self) -> None:
        for digests in self._digests.values():
            digests.close()

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(self, collector: pytest.Collector) -> Any:
        """Add one collector per transform next to what the session collected from its arguments."""
        report = yield
        if isinstance(collector, pytest.Session) and report.passed:
            for transform in self.transforms:
                report.result.append(TransformCollector.from_parent(collector, name=transform.spec,
                                                                    nodeid=transform.spec, run=self,
                                                                    transform=transform))
        return report


class TransformCollector(pytest.Collector):
    """The items of one transform: a model x check grid."""

    def __init__(self, *, run: FxVerifyRun, transform: Transform, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run, self.transform = run, transform

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        items: list[pytest.Item | pytest.Collector] = []
        spec, history, checks = self.transform.spec, self.run.history, self.run.options.checks
        cases = {case.name: case for case in self.run.cases}
        if history is not None:
            cases = {e.name: cases[e.name] for e in history.ordered(spec, [case.entry for case in cases.values()])}
        for case in cases.values():
            for capture in self.run.options.captures:
                label = model_label(case.name, capture)
                for check in history.ordered_checks(spec, label, checks) if history is not None else checks:
                    item = CheckItem.from_parent(self, name=item_name(label, check), case=case, check=check,
                                                 capture=capture)
                    item.add_marker(pytest.mark.fxverify)
                    item.extra_keyword_matches.update((*case.entry.tags, capture))
                    items.append(item)
        return items


class CheckItem(pytest.Item):
    """One check of one transform on one model."""

    def __init__(self, *, case: ModelCase, check: str, capture: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case, self.check, self.capture = case, check, capture

    @property
    def transform(self) -> Transform:
        assert isinstance(self.parent, TransformCollector)
        return self.parent.transform

    def runtest(self) -> None:
        assert isinstance(self.parent, TransformCollector)
        run = self.parent.run
        v = run.verification(self.transform, self.case, self.capture)
        result = v.run(self.check)
        v.subject.collect_garbage()  # what the check made and dropped, before the next check makes more
        try:
            changes = None if v.subject.expected_failure else v.subject.changes
            if run.options.json or run.options.html:
                self.user_properties.extend(report_properties(result, v.subject, html=bool(run.options.html),
                                                              changed=changes))
            if not v.subject.expected_failure:
                self.user_properties.append((CHANGED, changes))
            if run.options.update_golden and "golden_file" in result.details:
                self.user_properties.append((GOLDEN, (result.details["golden"], result.details["golden_file"])))
        except Exception as exc:  # fxverify's bookkeeping must not turn the check's verdict into a failure
            result = v.internal_error(self.check, exc, doing="recording the item's result for the summary and reports")
            if run.options.json or run.options.html:
                self.user_properties.extend(report_properties(result, None, html=False))
        if result.outcome == SKIPPED:
            pytest.skip(result.message)
        if result.outcome == XFAILED:
            pytest.xfail(result.message)
        if result.outcome == ERROR:
            self.user_properties.append((OUTCOME, ERROR.value))
            raise CheckFailed(result.message)
        if result.outcome == FAILED:
            raise CheckFailed(result.message)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, CheckFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"{self.parent.name if self.parent else ''} {self.name}"
