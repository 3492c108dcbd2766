"""The one mapping from what a check does to its :class:`~fxverify.core.results.CheckResult`, for every kind
of subject: the check returns details (PASSED), raises :class:`~fxverify.core.results.Skip` (SKIPPED) or
:class:`~fxverify.core.results.Finding` (FAILED), and anything else it raises is fxverify's own error (ERROR,
no verdict). :func:`attempt` is that mapping; :func:`judge` renders it for a subject that describes itself
(:class:`Judged`: a pattern, a backend on a model, a set of graph passes); the model runner
(:class:`fxverify.runner.Runner`) renders it with what a transform adds (pipelines, expected failures, repros).

>>> from fxverify.core.results import Finding
>>> class Toy:
...     model, under_test, capture, about = "m", "my:backend", None, "the backend"
...     def header(self): return [("model", "m"), ("backend", "my:backend")]
...     def not_applicable(self, check): return None
...     def reproduce(self, check): return None
>>> def broken(subject): raise Finding("outputs differ")
>>> result = judge("backend-outputs", broken, Toy())
>>> result.outcome.value, result.finding
('failed', 'outputs differ')
>>> judge("backend-outputs", lambda subject: 1 / 0, Toy()).outcome.value
'error'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from fxverify.core.results import (
    ERROR,
    FAILED,
    NOTE,
    PASSED,
    SKIPPED,
    CheckResult,
    Finding,
    Outcome,
    Skip,
    error_message,
    failure_message,
)

Check = Callable[[Any], "dict[str, Any] | None"]  # a check: details on success, Finding / Skip raised


class Judged(Protocol):
    """A subject that is no model under a capture, as its results and messages name it."""

    @property
    def model(self) -> str:
        """The result's ``model``: the pattern, the model compiled, the model the passes compile."""

    @property
    def under_test(self) -> str:
        """The result's ``transform``: what is under test (the patterns', backend's or passes' spec)."""

    @property
    def capture(self) -> str | None:
        """The result's ``capture``: how the graphs were made (None: the default)."""

    @property
    def about(self) -> str:
        """What a verdict is about, in an error's words (``the backend``)."""

    def header(self) -> Sequence[tuple[str, str]]:
        """The lines naming the subject at the top of a failure's message, ``(label, text)``."""

    def not_applicable(self, check: str) -> str | None:
        """Why ``check`` is outside what the subject promises (its contract), or None."""

    def reproduce(self, check: str) -> str | None:
        """A command that reruns ``check`` on this subject alone, or None."""


def attempt(check: Check, subject: Any) -> tuple[Outcome, Any]:
    """``check(subject)`` as an outcome and what goes with it: ``(PASSED, details)``, ``(SKIPPED, Skip)``,
    ``(FAILED, Finding)`` or ``(ERROR, the exception fxverify's own code raised)``."""
    try:
        return PASSED, check(subject) or {}
    except Skip as skip:
        return SKIPPED, skip
    except Finding as finding:
        return FAILED, finding
    except Exception as exc:  # fxverify's own code raised: no verdict on the subject
        return ERROR, exc


def judge(name: str, check: Check, subject: Judged) -> CheckResult:
    """The result of check ``name`` (the function ``check``) on ``subject``."""
    def result(outcome: Outcome, **fields: Any) -> CheckResult:
        return CheckResult(name, subject.model, subject.under_test, outcome, capture=subject.capture, **fields)

    outside = subject.not_applicable(name)
    if outside:
        return result(SKIPPED, message=outside)
    outcome, got = attempt(check, subject)
    if outcome is PASSED:
        return result(PASSED, message=got.get(NOTE, ""), details=got)
    if outcome is SKIPPED:
        return result(SKIPPED, message=str(got), details=got.details)
    if outcome is FAILED:
        return result(FAILED, message=failure_message(name, subject.header(), got, subject.reproduce(name)),
                      details=got.details, finding=got.what, input=got.input, where=got.where, node=got.node,
                      divergence=got.divergence, max_abs=got.max_abs, max_rel=got.max_rel, repro=got.repro)
    message, error = error_message(name, subject.header(), got, about=subject.about)
    return result(ERROR, message=message, finding=error)
