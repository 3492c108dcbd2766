"""The pytest items fxverify generates, and the run that owns them.

Imported by the plugin only when fxverify is in use. One item per subject and check of the registry
(:mod:`fxverify.checks`), all of one class (:class:`CheckItem`) and one node id scheme
(:mod:`fxverify.plugin.nodeids`), under one collector per thing under test:

- a transform (``--fxverify``): an item per (model, capture, check), for the checks whose needs the
  capture's graphs meet (the registry's ``requires``: no ``meta`` item under ``symbolic_trace``), named
  ``fxverify[<model>-<check>]`` (``fxverify[<model>@<capture>-<check>]`` under another capture than the
  default); the items of a model under one capture share one :class:`~fxverify.api.Verification` (capture,
  transform, reference outputs done once per worker);
- a spec of the passes that run inside torch.compile (``--fxverify-patterns``, ``--fxverify-backend``,
  ``--fxverify-graph-cache``), collected as ``<option>:<spec>``: an item per subject of the spec (a pattern
  it registers, a model the backend compiles, the pass set) and check of that kind, the subject made once
  and shared by its checks.

Under pytest-xdist a subject's items (a model's under every capture) are scheduled together on one worker
(:mod:`fxverify.plugin.xdist`), where the reference capture's outputs are handed to the agreement items of
the others.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from fxverify import checks
from fxverify.api import Verification
from fxverify.cases.case import ModelCase
from fxverify.checks import not_applicable, services_for
from fxverify.core.memory import release_memory
from fxverify.core.results import ERROR, FAILED, SKIPPED, WRITTEN, XFAILED, CheckResult, error_message
from fxverify.core.transform import Transform
from fxverify.engine import judging
from fxverify.engine.references import ReferenceStore
from fxverify.engine.subject import Settings
from fxverify.errors import CheckFailed, FxVerifyError
from fxverify.plugin.ledger import CHANGED, GOLDEN, OUTCOME, SUMMED
from fxverify.plugin.nodeids import item_name, model_label
from fxverify.plugin.options import RunOptions
from fxverify.plugin.order import History
from fxverify.plugin.reports import report_properties
from fxverify.plugin.torch_logs import torch_debug_kept_out


@dataclasses.dataclass(eq=False)  # pytest plugins must be hashable
class FxVerifyRun:
    """The transforms, passes, models, checks and options of this pytest run (a pytest plugin object), and
    the one shared subject being checked (a model's Verification, or a pattern, backend or pass set)."""

    transforms: list[Transform]
    cases: list[ModelCase]
    options: RunOptions
    history: History | None = None  # None: the catalogue's order (see fxverify.plugin.order)
    references: ReferenceStore | None = None  # None: the original's outputs are computed for each transform
    # the subjects of each spec of passes inside torch.compile, by (option, spec): see pass_subjects
    passes: dict[tuple[str, str], list[tuple[str, Callable[[], Any]]]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self._verification: tuple[tuple[str, str, str], Verification] | None = None
        self._subject: tuple[tuple[str, str], Any] | None = None  # the latest subject of a spec, by (spec, name)
        o = self.options
        self.settings = Settings(references=self.references, captures=o.captures, options=o.check_options)
        # what the selected checks need from the run as a whole (the registry's CheckSpec.service)
        self.services = services_for(o.checks_of(checks.MODEL), self.transforms, self.cases, captures=o.captures,
                                     timeout=o.timeout, options=o.check_options)

    def verification(self, transform: Transform, case: ModelCase, capture: str) -> Verification:
        """The shared Verification of (transform, case, capture); only the latest is kept in memory."""
        key = (transform.spec, case.name, capture)
        if self._verification is None or self._verification[0] != key:
            if self._verification is not None:
                for service in self.services.values():
                    service.release(self._verification[1])
            self._verification = None  # release the previous model before building the next
            release_memory()
            captured = case.capture_named(capture).configured(self.options.capture_settings)
            handed = {name: service.prepare(transform, case, captured) for name, service in self.services.items()}
            verification = Verification(transform, case, timeout=self.options.timeout, capture=captured,
                                        repro_dir=self.options.repro_dir,
                                        settings=dataclasses.replace(self.settings, services=handed))
            self._verification = (key, verification)
        return self._verification[1]

    def subject(self, spec: str, name: str, make: Callable[[], Any]) -> Any:
        """The subject ``name`` of ``spec`` (``<option>:<spec>``), made by ``make`` on first use; only the latest
        is kept in memory (a subject's items run one after the other)."""
        if self._subject is None or self._subject[0] != (spec, name):
            self._subject = None
            release_memory()
            self._subject = ((spec, name), make())
        return self._subject[1]

    # -- pytest hooks ------------------------------------------------------------
    @pytest.hookimpl(trylast=True)  # after -k, --deselect and --lf have had their say
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            if isinstance(item, CheckItem) and item.check in self.services and item.case and item.capture:
                self.services[item.check].want(item.transform, item.case, item.capture)  # a model's item

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
            for (option, spec), subjects in self.passes.items():
                report.result.append(SpecCollector.from_parent(collector, name=f"{option}:{spec}",
                                                               nodeid=f"{option}:{spec}", run=self, option=option,
                                                               spec=spec, subjects=dict(subjects)))
        return report


def pass_subjects(specs: dict[str, tuple[str, ...]], given: checks.Given) -> dict[tuple[str, str], list[tuple[str, Any]]]:
    """The subjects of each spec of passes inside torch.compile (option -> specs, see
    :func:`fxverify.plugin.options.compile_specs`), by ``(option, spec)``: ``(name, make)`` pairs. A spec that
    names no usable object is a usage error, one line naming it and saying what to give, before anything runs."""
    found = {}
    for option, given_specs in specs.items():
        subjects_of = checks.subjects_of(option)
        for spec in given_specs:
            try:
                found[(option, spec)] = subjects_of(spec, given)
            except FxVerifyError as exc:
                raise pytest.UsageError(f"fxverify: {exc}") from None
    return found


class TransformCollector(pytest.Collector):
    """The items of one transform: a model x check grid."""

    def __init__(self, *, run: FxVerifyRun, transform: Transform, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run, self.transform = run, transform

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        items: list[pytest.Item | pytest.Collector] = []
        spec, history, names = self.transform.spec, self.run.history, self.run.options.checks_of(checks.MODEL)
        cases = {case.name: case for case in self.run.cases}
        if history is not None:
            cases = {e.name: cases[e.name] for e in history.ordered(spec, [case.entry for case in cases.values()])}
        for case in cases.values():
            for capture in self.run.options.captures:
                label = model_label(case.name, capture)
                traits = case.capture_named(capture).traits  # a check its graphs cannot give what it needs is left out
                applicable = [check for check in names if not_applicable(check, traits, capture) is None]
                ordered = history.ordered_checks(spec, label, applicable) if history is not None else applicable
                for check in ordered:
                    item = CheckItem.from_parent(self, name=item_name(label, check), check=check, subject=label,
                                                 case=case, capture=capture)
                    item.add_marker(pytest.mark.fxverify)
                    item.extra_keyword_matches.update((*case.entry.tags, capture))
                    items.append(item)
        return items

    def judge(self, item: CheckItem) -> CheckResult:
        """The result of ``item`` on the run's shared Verification of its model, with what the summary and
        reports read attached to the item."""
        assert item.case is not None and item.capture is not None
        run = self.run
        verification = run.verification(self.transform, item.case, item.capture)
        result = verification.run(item.check)
        verification.subject.collect_garbage()  # what the check made and dropped, before the next check makes more
        try:
            changes = None if verification.subject.expected_failure else verification.subject.changes
            if run.options.reports:
                item.user_properties.extend(report_properties(result, verification.subject, reports=run.options.reports,
                                                              changed=changes))
            if not verification.subject.expected_failure:
                item.user_properties.append((CHANGED, changes))
                item.user_properties.extend((key, result.details[key]) for key in SUMMED if key in result.details)
            if WRITTEN in result.details:  # a file the check wrote (a golden file under --fxverify-update-golden)
                item.user_properties.append((GOLDEN, result.details[WRITTEN]))
        except Exception as exc:  # fxverify's bookkeeping must not turn the check's verdict into a failure
            result = verification.internal_error(item.check, exc,
                                                 doing="recording the item's result for the summary and reports")
            if run.options.reports:
                item.user_properties.extend(report_properties(result, None, reports={}))
        return result


class SpecCollector(pytest.Collector):
    """The items of one spec of passes that run inside torch.compile (``<option>:<spec>``): its subjects times
    the checks of their kind the run selects."""

    def __init__(self, *, run: FxVerifyRun, option: str, spec: str, subjects: dict[str, Callable[[], Any]],
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run, self.option, self.spec, self.makers = run, option, spec, subjects

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        selected = self.run.options.checks_of(checks.kind(self.option).name)
        items: list[pytest.Item | pytest.Collector] = []
        for name in self.makers:
            for check in selected:
                item = CheckItem.from_parent(self, name=item_name(name, check), check=check, subject=name)
                item.add_marker(pytest.mark.fxverify)
                item.extra_keyword_matches.add(self.option)
                items.append(item)
        return items

    def judge(self, item: CheckItem) -> CheckResult:
        """The result of ``item`` on its subject (made by its first item), with its report record attached."""
        try:
            subject = self.run.subject(self.nodeid, item.subject, self.makers[item.subject])
        except Exception as exc:  # the spec's subject cannot be made: the user's input, or fxverify's own error
            result = self._unmade(item, exc)
        else:
            result = judging.judge(item.check, checks.get(item.check), subject)
        if self.run.options.reports:
            item.user_properties.extend(report_properties(result, None, reports=self.run.options.reports))
        return result

    def _unmade(self, item: CheckItem, exc: Exception) -> CheckResult:
        """The result of an item whose subject raised when made: a failure naming what to fix for an input
        fxverify refuses (:class:`~fxverify.errors.FxVerifyError`), else fxverify's own error."""
        header = [(self.option, self.spec), ("subject", item.subject)]
        if isinstance(exc, FxVerifyError):
            return CheckResult(item.check, item.subject, self.spec, FAILED, message=str(exc), finding=str(exc))
        message, error = error_message(item.check, header, exc, about=self.spec,
                                       doing=f"making the subject {item.subject} of {self.option}:{self.spec}")
        return CheckResult(item.check, item.subject, self.spec, ERROR, message=message, finding=error)


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
    """One check of one subject: a transform's on a model under a capture (``case`` and ``capture`` set), or a
    pattern's, a backend's on a model, a pass set's. Its collector judges it."""

    def __init__(self, *, check: str, subject: str, case: ModelCase | None = None, capture: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check, self.subject, self.case, self.capture = check, subject, case, capture

    @property
    def transform(self) -> Transform:
        assert isinstance(self.parent, TransformCollector)
        return self.parent.transform

    def runtest(self) -> None:
        assert isinstance(self.parent, (TransformCollector, SpecCollector))
        with torch_debug_kept_out():  # torch's debug records stay out of the finding's report
            result = self.parent.judge(self)
        if result.outcome == ERROR:
            self.user_properties.append((OUTCOME, ERROR.value))
        self.report(result)
