"""The pytest items fxverify generates, and the run that owns them.

Imported by the plugin only when ``--fxverify`` is in use. One item per
(transform, model, capture, check), for the checks whose needs the capture's graphs meet (the
registry's ``requires``: no ``meta`` item under ``symbolic_trace``), named ``fxverify[<model>-<check>]``
(``fxverify[<model>@<capture>-<check>]`` under another capture than the
default); the items of a model under one capture share one
:class:`~fxverify.api.Verification` (capture, transform, reference outputs done
once per worker), and under pytest-xdist a model's items under every capture are scheduled
together on one worker (:mod:`fxverify.plugin.xdist`), where the reference capture's outputs are
handed to the agreement items of the others.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from fxverify.api import Verification
from fxverify.cases.case import ModelCase
from fxverify.checks import not_applicable, services_for
from fxverify.core.memory import release_memory
from fxverify.core.results import ERROR, FAILED, SKIPPED, WRITTEN, XFAILED, CheckResult
from fxverify.core.transform import Transform
from fxverify.engine.references import ReferenceStore
from fxverify.engine.subject import Settings
from fxverify.errors import CheckFailed
from fxverify.plugin.ledger import CHANGED, GOLDEN, OUTCOME, SUMMED
from fxverify.plugin.nodeids import item_name, model_label
from fxverify.plugin.options import RunOptions
from fxverify.plugin.order import History
from fxverify.plugin.reports import report_properties
from fxverify.plugin.torch_logs import torch_debug_kept_out


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
        o = self.options
        self.settings = Settings(references=self.references, captures=o.captures, options=o.check_options)
        # what the selected checks need from the run as a whole (the registry's CheckSpec.service)
        self.services = services_for(o.checks, self.transforms, self.cases, captures=o.captures, timeout=o.timeout,
                                     options=o.check_options)

    def verification(self, transform: Transform, case: ModelCase, capture: str) -> Verification:
        """The shared Verification of (transform, case, capture); only the latest is kept in memory."""
        key = (transform.spec, case.name, capture)
        if self._verification is None or self._verification[0] != key:
            if self._verification is not None:
                for service in self.services.values():
                    service.release(self._verification[1])
            self._verification = None  # release the previous model before building the next
            release_memory()
            captured = case.capture_named(capture)
            handed = {name: service.prepare(transform, case, captured) for name, service in self.services.items()}
            verification = Verification(transform, case, timeout=self.options.timeout, capture=captured,
                                        repro_dir=self.options.repro_dir,
                                        settings=dataclasses.replace(self.settings, services=handed))
            self._verification = (key, verification)
        return self._verification[1]

    # -- pytest hooks ------------------------------------------------------------
    @pytest.hookimpl(trylast=True)  # after -k, --deselect and --lf have had their say
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            if isinstance(item, CheckItem) and item.check in self.services:
                self.services[item.check].want(item.transform, item.case, item.capture)

    def pytest_unconfigure(self) -> None:
        for service in self.services.values():
            service.close()

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
                traits = case.capture_named(capture).traits  # a check its graphs cannot give what it needs is left out
                applicable = [check for check in checks if not_applicable(check, traits, capture) is None]
                ordered = history.ordered_checks(spec, label, applicable) if history is not None else applicable
                for check in ordered:
                    item = CheckItem.from_parent(self, name=item_name(label, check), case=case, check=check,
                                                 capture=capture)
                    item.add_marker(pytest.mark.fxverify)
                    item.extra_keyword_matches.update((*case.entry.tags, capture))
                    items.append(item)
        return items


class ResultItem(pytest.Item):
    """An item whose verdict is a :class:`~fxverify.core.results.CheckResult`: it skips, xfails or fails as the
    result says, and a failure shows the result's message alone."""

    def report(self, result: CheckResult) -> None:
        if result.outcome == SKIPPED:
            pytest.skip(result.message)
        if result.outcome == XFAILED:
            pytest.xfail(result.message)
        if result.outcome in (FAILED, ERROR):
            raise CheckFailed(result.message)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, CheckFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"{self.parent.name if self.parent else ''} {self.name}"


class CheckItem(ResultItem):
    """One check of one transform on one model."""

    def __init__(self, *, case: ModelCase, check: str, capture: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case, self.check, self.capture = case, check, capture

    @property
    def transform(self) -> Transform:
        assert isinstance(self.parent, TransformCollector)
        return self.parent.transform

    def runtest(self) -> None:
        with torch_debug_kept_out():  # torch's debug records stay out of the finding's report
            self._run_check()

    def _run_check(self) -> None:
        assert isinstance(self.parent, TransformCollector)
        run = self.parent.run
        verification = run.verification(self.transform, self.case, self.capture)
        result = verification.run(self.check)
        verification.subject.collect_garbage()  # what the check made and dropped, before the next check makes more
        try:
            changes = None if verification.subject.expected_failure else verification.subject.changes
            if run.options.reports:
                self.user_properties.extend(report_properties(result, verification.subject, reports=run.options.reports,
                                                              changed=changes))
            if not verification.subject.expected_failure:
                self.user_properties.append((CHANGED, changes))
                self.user_properties.extend((key, result.details[key]) for key in SUMMED if key in result.details)
            if WRITTEN in result.details:  # a file the check wrote (a golden file under --fxverify-update-golden)
                self.user_properties.append((GOLDEN, result.details[WRITTEN]))
        except Exception as exc:  # fxverify's bookkeeping must not turn the check's verdict into a failure
            result = verification.internal_error(self.check, exc, doing="recording the item's result for the summary and reports")
            if run.options.reports:
                self.user_properties.extend(report_properties(result, None, reports={}))
        if result.outcome == ERROR:
            self.user_properties.append((OUTCOME, ERROR.value))
        self.report(result)
