"""Check outcomes: what a check returns (:class:`CheckResult`, its :class:`Outcome`) and what it
raises inside to fail (:class:`Finding`) or to skip (:class:`Skip`)."""

from __future__ import annotations

import dataclasses
import enum
import re
import textwrap
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

from fxverify.core.contracts import Mode
from fxverify.errors import CheckFailed

T = TypeVar("T")
Which = Literal["original", "result"]  # the two modules a check compares: the capture, and the transform's result
WRITTEN = "written"  # a check's details key: (status, path) of a file it wrote, which the run lists at its end
NOTE = "note"  # a check's details key: what a passed check says to people (its result's message), a warning too


class Outcome(str, enum.Enum):
    """What became of one check on one model. A string, so it compares equal to its value
    (``Outcome.PASSED == "passed"``) and writes as one in JSON; ``short`` is its summary cell.

    ``ERROR`` is no verdict on the transform: fxverify's own code raised, or the process
    running the check died.
    """

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"
    XFAILED = "xfailed"  # a corpus entry known not to trace or run failed, as its catalogue entry says

    def __str__(self) -> str:
        return self.value

    @property
    def short(self) -> str:
        """The summary table's cell: ``pass``, ``FAIL``, ``ERR``, ``skip``, ``xfail``."""
        return {"passed": "pass", "failed": "FAIL", "error": "ERR", "skipped": "skip", "xfailed": "xfail"}[self.value]


PASSED, FAILED, ERROR, SKIPPED, XFAILED = (Outcome.PASSED, Outcome.FAILED, Outcome.ERROR, Outcome.SKIPPED,
                                           Outcome.XFAILED)


class Finding(Exception):
    """Raised by a check that found a problem: ``what`` (the check's own words), the ``input``
    configuration it was seen with, ``where`` the first output path or value that differs,
    ``node`` the first divergent node as text and ``divergence`` as facts (see
    :class:`fxverify.analysis.localise.Divergence`), the error numbers, the ``mode`` it was seen
    in when not the contract's primary one, and ``details`` for anything else.
    """

    def __init__(self, what: str, *, input: str | None = None, where: str | None = None,
                 node: str | None = None, divergence: dict[str, Any] | None = None,
                 max_abs: float | None = None, max_rel: float | None = None, mode: Mode | None = None,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.input = input
        self.where = where
        self.node = node
        self.divergence = divergence
        self.max_abs = max_abs
        self.max_rel = max_rel
        self.mode = mode
        self.repro: str | None = None
        self.details = details or {}


class ModuleRaised(Finding):
    """The ``original`` or the ``result`` module raised when made or run: for the original the
    corpus entry is to blame (it cannot run this configuration), for the result the transform.
    ``cause`` is the exception in one line."""

    def __init__(self, which: Which, exc: BaseException, where: str) -> None:
        self.which, self.cause = which, exception_summary(exc)
        what = (ORIGINAL_RAISED if which == "original" else RESULT_RAISED).format(error=self.cause)
        super().__init__(what, input=where)

    @classmethod
    def guard(cls, which: Which, where: str, run: Callable[[], T]) -> T:
        """``run()``, what it raises made the finding that the ``original`` or ``result`` module raised at
        ``where`` (the inputs it ran on)."""
        try:
            return run()
        except Exception as exc:
            raise cls(which, exc, where) from None


class CaptureFailed(Finding):
    """Building the model or capturing its graph raised, before any transform: the model or
    how it is captured is to blame (a corpus entry, or your own case), never the transform."""

    def __init__(self, model: str, capture: str, exc: BaseException, mode: Mode) -> None:
        self.cause = exception_summary(exc)
        super().__init__(
            f"building or capturing model {model!r} ({capture}) in {mode} mode raised {self.cause}, before any "
            "transform. Not the transform's doing: fix the model or how it is captured (its tracer, concrete_args), "
            "or mark its corpus entry xfail",
            input=f"the model built in {mode} mode")


ORIGINAL_RAISED = (
    "the original model itself raised when run, before any transform: {error}. Not the transform's doing: "
    "the corpus entry cannot run this configuration; fix its inputs, batch_sizes or spatial_sizes"
)
RESULT_RAISED = "the transformed module raised when run: {error}"


REWRITES = ("graph", "state")  # the changes of a transform (Subject.changes) that rewrite what a model computes


def rewrites(changes: Sequence[str] | None) -> bool:
    """Whether ``changes`` (what a transform changed on a model: ``state``, ``graph``, ``code``, ...) rewrite
    what it computes, so that its rewrite is verified there.

    >>> rewrites(["code", "meta"]), rewrites(["graph"]), rewrites(None)
    (False, True, False)
    """
    return bool(set(REWRITES) & set(changes or ()))


MAX_SUMMARY = 300  # characters of an exception's message kept in a one-line summary
_DISPATCHER = re.compile(r"^(Could not run '[^']+' with arguments from the '[^']+' backend)\..*")


def exception_summary(exc: BaseException) -> str:
    r"""``Type: the line that explains``: the first line of the message (torch errors often append
    whole graphs), with the line after it when it ends in a colon (``Error(s) in loading state_dict
    for FxModule:`` says nothing alone), without the backend list torch's dispatcher appends.
    Never raises, even for an exception whose ``str()`` does.

    >>> exception_summary(RuntimeError("bad node\n%x = ..."))
    'RuntimeError: bad node'
    >>> exception_summary(RuntimeError("Error(s) in loading state_dict for M:\n\tsize mismatch for fc.weight"))
    'RuntimeError: Error(s) in loading state_dict for M: size mismatch for fc.weight'
    >>> exception_summary(NotImplementedError("Could not run 'aten::equal' with arguments from the 'MkldnnCPU' "
    ...                                       "backend. This could be because ... [CPU, CUDA, Meta, ...]."))
    "NotImplementedError: Could not run 'aten::equal' with arguments from the 'MkldnnCPU' backend"
    """
    lines = [line.strip() for line in exception_text(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    head = _DISPATCHER.sub(r"\1", lines[0])
    if head.endswith(":") and len(lines) > 1:
        head += " " + lines[1]
    if len(head) > MAX_SUMMARY:
        head = head[: MAX_SUMMARY - 3] + "..."
    return f"{type(exc).__name__}: {head}"


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters with ``...`` where longer (for a message naming a value).

    >>> short_repr(list(range(30)), 20)
    '[0, 1, 2, 3, 4, 5...'
    """
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def exception_text(exc: BaseException) -> str:
    """``str(exc)``, or a note saying it could not be had (never raises).

    >>> class Broken(Exception):
    ...     def __str__(self): raise ValueError
    >>> exception_text(Broken())
    '(its str() raised ValueError)'
    """
    try:
        return str(exc)
    except Exception as err:  # a user's exception class with a broken __str__
        return f"(its str() raised {type(err).__name__})"


class Skip(Exception):
    """Raised by a check that does not apply; the message is the reason, ``details`` what it found on the way
    (a warning's figures)."""

    def __init__(self, reason: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.details = details or {}


def failure_message(check: str, header: Sequence[tuple[str, str]], finding: Finding,
                    reproduce: str | None = None) -> str:
    """The message of a failed check, laid out alike for every kind of subject: the subject's ``header``
    lines (``(label, text)``: the model, the transform or backend ...), then the finding's input, first
    difference, first node and words, and a command that reproduces it.

    >>> print(failure_message("lint", [("model", "m"), ("transform", "my:pass")], Finding("bad", node="%x")))
    fxverify lint check failed
      model:      m
      transform:  my:pass
      first node: %x
      finding:    bad
    """
    lines = [f"fxverify {check} check failed", *_labelled(header)]
    lines += _labelled([("input", finding.input), ("first diff", finding.where), ("first node", finding.node),
                        ("finding", finding.what), ("reproduce", reproduce)])
    return "\n".join(lines)


def error_message(check: str, header: Sequence[tuple[str, str]], exc: BaseException, *, about: str,
                  doing: str = "") -> tuple[str, str]:
    """``(message, error)`` of a check fxverify itself could not complete (an ERROR, no verdict on ``about``:
    the transform, the backend ...): the subject's ``header`` lines, what raised, and the traceback."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    error = (f"{doing or f'running the {check} check'} raised {exception_summary(exc)} inside fxverify; this "
             f"says nothing about {about}. Please report it to fxverify's maintainers, with this message")
    lines = [f"fxverify error in the {check} check (not a finding about {about})", *_labelled(header),
             *_labelled([("error", error)]), tb.rstrip()]
    return "\n".join(lines), error


def _labelled(lines: Sequence[tuple[str, str | None]]) -> list[str]:
    """``  label:      text`` for each line with a text, continuation lines indented under the text."""
    return [f"  {label + ':':<12}" + textwrap.indent(text, " " * 14).lstrip() for label, text in lines if text]


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The outcome of one check on one model captured by ``capture``: its ``message`` for people, and
    for reports the finding's parts as fields (``finding``, ``input``, ``where``, ``node``,
    ``divergence``, the error numbers, the ``repro`` file) and the check's ``details``.

    >>> r = CheckResult("lint", "resnet18", "my.pass:fn", PASSED)
    >>> r.ok, r.outcome.short
    (True, 'pass')
    """

    check: str
    model: str
    transform: str
    outcome: Outcome
    message: str = ""
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    finding: str = ""
    input: str | None = None
    where: str | None = None
    node: str | None = None
    divergence: dict[str, Any] | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    repro: str | None = None
    capture: str | None = None  # None: the default capture (symbolic_trace)

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", Outcome(self.outcome))

    @property
    def ok(self) -> bool:
        """True unless the check failed or fxverify itself raised (a skip or an expected failure is ok)."""
        return self.outcome not in (FAILED, ERROR)

    def raise_for_failure(self) -> CheckResult:
        """Raise :class:`CheckFailed` with the message when the check failed (or could not run)."""
        __tracebackhide__ = True
        if not self.ok:
            raise CheckFailed(self.message)
        return self
