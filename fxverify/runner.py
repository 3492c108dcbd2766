"""The runner above the checks: it looks a check up in the registry, runs it on the subject,
turns what it raises into a :class:`~fxverify.core.results.CheckResult` (a finding, a skip,
the transform's failure, or an ERROR when fxverify's own code raised), renders the message,
handles the catalogue's expected failures, and calls the post-failure hooks (minimising a
numerics failure into a repro file is one: :class:`fxverify.diagnose.repro.ReproOnFailure`).

>>> import fxverify
>>> runner = Runner(fxverify.examples.identity, fxverify.load_case("edge_conv_bn_head"))
>>> runner.run("lint").outcome.value
'passed'
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from fxverify import checks
from fxverify.capture import Capture
from fxverify.cases import catalogue
from fxverify.cases.case import ModelCase
from fxverify.core.results import (
    ERROR,
    FAILED,
    PASSED,
    SKIPPED,
    XFAILED,
    CheckResult,
    Finding,
    Outcome,
    error_message,
    exception_summary,
    failure_message,
)
from fxverify.core.transform import Transform
from fxverify.engine.judging import Check, attempt
from fxverify.engine.subject import DEFAULT_TIMEOUT, Settings, Subject
from fxverify.errors import FxVerifyError, TransformFailed


class AfterFailure(Protocol):
    """A post-failure hook: called with the subject, the check's name and its finding before the
    message is rendered; it may add to the finding (``finding.repro``, a line in ``finding.what``)."""

    def __call__(self, subject: Subject, check: str, finding: Finding) -> None: ...


def _transform_failures_found(check: Check) -> Check:
    """``check``, a failure of the transform inside it (:class:`TransformFailed`) made its finding."""
    def run(subject: Subject) -> dict[str, Any] | None:
        try:
            return check(subject)
        except TransformFailed as exc:
            raise Finding(f"the transform failed on this model:\n{exc}") from None
    return run


def library_versions(source: str) -> str:
    """The versions that decide whether a model of ``source`` traces, e.g. ``torch 2.14.1, timm 1.0.31``."""
    versions = [f"torch {torch.__version__}"]
    if source in ("torchvision", "timm"):
        module = __import__(source)
        versions.append(f"{source} {module.__version__}")
    return ", ".join(versions)


class Runner:
    """Runs checks of ``transform`` on ``case``, on one shared :class:`Subject` (``subject``).

    ``settings`` are what single checks need (the cross-process digests, the golden folder);
    ``after_failure`` hooks run on each finding before its message is made; ``capture``
    overrides the case's own (see :mod:`fxverify.capture`).
    """

    def __init__(
        self,
        transform: Transform | Callable[..., Any] | str,
        case: ModelCase | str,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        settings: Settings = Settings(),
        capture: Capture | None = None,
        after_failure: Sequence[AfterFailure] = (),
    ) -> None:
        self.subject = Subject(transform, case, timeout=timeout, settings=settings, capture=capture)
        self.after_failure = list(after_failure)

    @property
    def transform(self) -> Transform:
        return self.subject.transform

    @property
    def case(self) -> ModelCase:
        return self.subject.case

    def run(self, check: str) -> CheckResult:
        """Run the named check and return its result (never raises for a finding)."""
        if check not in checks.names():
            if check in checks.names(None):
                taken = checks.kind(checks.spec(check).subject)
                raise FxVerifyError(f"check {check!r} takes a {taken.name}, not a transform on a model: run it with "
                                    f"--fxverify-{taken.option}; the model checks: {', '.join(checks.names())}")
            raise FxVerifyError(f"unknown check {check!r}; known checks: {', '.join(checks.names())}")
        capture = self.subject.capture.name
        not_run = self.subject.not_run
        if not_run:
            return self._result(check, SKIPPED, message=not_run)
        if self.subject.expected_failure:
            return self._expected_failure(check)
        skipped = checks.not_applicable(check, self.subject.capture.traits, capture)
        if skipped:
            return self._result(check, SKIPPED, message=skipped)
        outcome, got = attempt(_transform_failures_found(checks.get(check)), self.subject)
        if outcome is SKIPPED:
            return self._result(check, SKIPPED, message=str(got))
        if outcome is FAILED:
            return self._failed(check, got)
        if outcome is ERROR:
            return self.internal_error(check, got)
        details = got
        if self.transform.contract.verify_each and checks.spec(check).verify_each and len(self.transform.steps) > 1:
            broken = self._first_failing_prefix(check)
            if broken is not None:
                count, result = broken
                repaired = Finding(f"verify-each (the contract declares verify_each=True): step {count} of "
                                   f"{len(self.transform.steps)} leaves a graph that fails the {check} check, which "
                                   f"the whole pipeline passes (a later step repairs it):\n{result.finding}",
                                   input=result.input, where=result.where, node=result.node)
                return self._failed(check, repaired, step=self._step_line(check, count))
        if self.subject.fresh_copies is not None:
            details = {**details, "result_copies": self.subject.fresh_copies_note}
        return self._result(check, PASSED, details=details)

    def _failed(self, check: str, finding: Finding, *, step: str | None = None) -> CheckResult:
        if len(self.transform.steps) > 1:
            finding.what += f"\n{step or self.first_failing_step(check)}"
        if self.subject.fresh_copies is not None:
            finding.what += f"\n{self.subject.fresh_copies_note}"
        for hook in self.after_failure:
            try:
                hook(self.subject, check, finding)
            except Exception as exc:  # a hook's failure must not hide the finding
                finding.what += f"\n{type(hook).__name__} raised {exception_summary(exc)}; please report this to fxverify"
        return self._result(check, FAILED, message=self._failure_message(check, finding), details=finding.details,
                            finding=finding.what, input=finding.input, where=finding.where, node=finding.node,
                            divergence=finding.divergence, max_abs=finding.max_abs, max_rel=finding.max_rel,
                            repro=finding.repro)

    def first_failing_step(self, check: str) -> str:
        """Which step of a pipeline ``check`` first fails after (see :meth:`_first_failing_prefix`)."""
        broken = self._first_failing_prefix(check)
        return self._step_line(check, len(self.transform.steps) if broken is None else broken[0])

    def _first_failing_prefix(self, check: str) -> tuple[int, CheckResult] | None:
        """The shortest proper prefix of a pipeline on which ``check`` fails, and its result: the check run
        again on the prefixes, shortest first, each on a fresh capture (no post-failure hooks, no
        cross-process digests, no other capture's outputs of the whole pipeline); None when every proper prefix
        passes it."""
        settings = dataclasses.replace(self.subject.settings, services={})
        contract = dataclasses.replace(self.transform.contract, verify_each=False)  # each prefix is judged alone
        for count in range(1, len(self.transform.steps)):
            prefix = Runner(dataclasses.replace(self.transform.prefix(count), contract=contract), self.case,
                            timeout=self.subject.timeout, settings=settings, capture=self.subject.capture)
            result = prefix.run(check)
            if result.outcome is FAILED:
                return count, result
        return None

    def _step_line(self, check: str, count: int) -> str:
        steps = self.transform.steps
        before = {1: "", 2: "; step 1 passes it"}.get(count, f"; steps 1 to {count - 1} pass it")
        return f"first failing step: the {check} check fails after step {count} of {len(steps)}, {steps[count - 1].spec}" \
               f"{before}"

    def internal_error(self, check: str, exc: BaseException, doing: str = "") -> CheckResult:
        """The result of a check that fxverify itself could not complete: an ERROR naming the
        model and transform, saying it is no verdict on the transform, with the traceback."""
        header = [("model", self.case.name), ("transform", self.transform.spec)]
        message, error = error_message(check, header, exc, about="the transform", doing=doing)
        return self._result(check, ERROR, message=message, finding=error)

    @functools.cached_property
    def model_error(self) -> str | None:
        """Why the untransformed model fails to trace or run on its primary inputs (None if it works)."""
        try:
            traced = self.case.captured(capture=self.subject.capture)
            with torch.no_grad():
                traced(*self.subject.primary.make(self.case.seed))
        except Exception as exc:  # any failure to trace or run is what an xfail entry records
            return exception_summary(exc)
        return None

    def _expected_failure(self, check: str) -> CheckResult:
        """A catalogue entry marked ``xfail``: no check runs; the model must still fail to trace or run."""
        entry, expected, capture = self.case.entry, self.subject.expected_failure, self.subject.capture.name
        if self.model_error is not None:
            return self._result(check, XFAILED, message=f"expected failure: {expected} (now: {self.model_error})")
        field = "xfail" if expected == entry.xfail else f"capture_xfail.{capture}"
        message = (
            f"corpus entry {entry.name!r} is listed as an expected failure under {capture} ({expected}), but it now "
            f"captures and runs with {library_versions(entry.source)}: remove `{field}` from its catalogue "
            "entry so the checks run on it"
        )
        return self._result(check, FAILED, message=message, finding=message)

    def run_all(self, names: list[str] | None = None) -> list[CheckResult]:
        """Every check (or the named ones), in the canonical order."""
        return [self.run(name) for name in (checks.names() if names is None else names)]

    def _result(self, check: str, outcome: Outcome, **fields: Any) -> CheckResult:
        return CheckResult(check, self.case.name, self.transform.spec, outcome, capture=self.subject.capture.name,
                           **fields)

    def _failure_message(self, check: str, finding: Finding) -> str:
        entry = self.case.entry
        header = [("model", f"{entry.name} ({entry.source}, {self.subject.capture.describe()})"),
                  ("transform", self.transform.spec), ("contract", self.transform.contract.describe())]
        return failure_message(check, header, finding, self.repro_command(check))

    def repro_command(self, check: str) -> str | None:
        """A command that reruns this check alone, when the transform and model can be named: a
        reloadable transform, a shipped corpus entry captured its own way, the check's options at their
        defaults (the command would not know a golden folder given to pytest)."""
        if any(checks.option(self.subject.settings, key) != default for key, default in checks.spec(check).options):
            return None
        if not self.transform.reloadable or self.subject.capture != self.case.capture:
            return None
        shipped = any(e == self.case.entry for e in catalogue.catalogue())
        if not shipped:
            return None
        return (
            f'python -c "import fxverify; fxverify.assert_{check}(\'{self.transform.spec}\', \'{self.case.name}\')"'
        )
