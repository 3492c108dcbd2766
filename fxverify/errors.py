"""Exception types raised by fxverify.

Every error says what was wrong and what to do next. ``FxVerifyError`` is the
common base so callers can catch everything fxverify raises on bad input.
"""

from __future__ import annotations

from typing import Any


class FxVerifyError(Exception):
    """Base class of every error fxverify raises about its inputs."""


class TransformLoadError(FxVerifyError):
    """A transform spec cannot be turned into a callable transform.

    Raised at start-up for an unimportable module, a missing or non-callable
    attribute, or a signature fxverify cannot call.
    """


class TransformFailed(FxVerifyError):
    """The transform raised, hung, or returned something fxverify cannot use. ``cause`` says
    what happened in one line (``AssertionError: this pass is only for torch.float modules``)."""

    def __init__(self, message: str, cause: str = "") -> None:
        super().__init__(message)
        self.cause = cause or message.splitlines()[0]


class CopyFailed(FxVerifyError):
    """``copy.deepcopy`` of a module raised, so fxverify cannot make the converted copy it needs
    (its float64, meta or CUDA copy): no verdict on the module's dtypes or devices follows."""


class CorpusError(FxVerifyError):
    """A corpus selection or catalogue entry is invalid."""


class CheckFailed(AssertionError):
    """Raised by the ``fxverify.assert_*`` helpers; the message is the finding."""


class RewriteFailed(CheckFailed):
    """A rewrite rule failed a check on a (shrunk) random graph (:func:`fxverify.check_rewrite`); ``case`` is that
    graph, a :class:`fxverify.strategies.patterns.PatternCase`."""

    def __init__(self, message: str, case: Any) -> None:
        super().__init__(message)
        self.case = case


class GoldenMismatch(AssertionError):
    """The obtained text differs from the golden file, or the file is missing; ``where`` is the first difference."""

    def __init__(self, message: str, where: str | None = None) -> None:
        super().__init__(message)
        self.where = where


class GoldenDirMissing(GoldenMismatch):
    """The transform's golden folder does not exist: no golden file was ever written for it."""


class GraphvizMissing(FxVerifyError):
    """Graphviz's ``dot`` program cannot be run; the message says how to install it."""
