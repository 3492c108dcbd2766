"""Check outcomes: what a check returns (:class:`CheckResult`) and what it raises
inside to fail (:class:`Finding`) or to skip (:class:`Skip`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from fxverify.errors import CheckFailed

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
XFAILED = "xfailed"  # a corpus entry known not to trace or run failed, as its catalogue entry says


class Finding(Exception):
    """Raised by a check that found a problem.

    ``where`` is the first output path or node that differs; ``input`` the
    input configuration it was seen with.
    """

    def __init__(self, what: str, *, input: str | None = None, where: str | None = None,
                 node: str | None = None, details: dict[str, Any] | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.input = input
        self.where = where
        self.node = node
        self.details = details or {}


def exception_summary(exc: BaseException) -> str:
    r"""``Type: first line of the message`` (torch errors often append whole graphs).

    >>> exception_summary(RuntimeError("bad node\n%x = ..."))
    'RuntimeError: bad node'
    """
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


class Skip(Exception):
    """Raised by a check that does not apply; the message is the reason."""


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The outcome of one check on one model.

    >>> r = CheckResult("lint", "resnet18", "my.pass:fn", PASSED)
    >>> r.ok
    True
    """

    check: str
    model: str
    transform: str
    outcome: str
    message: str = ""
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True unless the check failed (a skip or an expected failure is ok)."""
        return self.outcome != FAILED

    def raise_for_failure(self) -> CheckResult:
        """Raise :class:`CheckFailed` with the message when the check failed."""
        __tracebackhide__ = True
        if self.outcome == FAILED:
            raise CheckFailed(self.message)
        return self
