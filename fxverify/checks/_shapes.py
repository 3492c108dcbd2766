"""What the ``meta`` and ``dynamic`` checks both read of a subject: FakeTensors re-propagated through the
original and the result, whether the result still describes the graph as captured, and the guards the
transform adds. Kept in the subject's :class:`~fxverify.core.stash.Stash` under this module's keys, so each is
computed once per subject and the subject knows nothing of them."""

from __future__ import annotations

from torch import fx

from fxverify.analysis.repropagation import (
    AddedGuard,
    Repropagation,
    Violation,
    input_ranges,
    repropagate,
    same_descriptions,
    violation,
    violations,
)
from fxverify.core.results import Which
from fxverify.core.stash import StashKey
from fxverify.engine.subject import Subject

_REPROPAGATED = {which: StashKey[Repropagation | None](f"repropagated {which}") for which in ("original", "result")}
_DESCRIBED_AS_CAPTURED = StashKey[bool]("described as captured")
_GUARD_VIOLATION = StashKey[Violation | None]("guard violation")
_GUARD_ADDED = StashKey[Violation | None]("guard added while running")


def repropagated(subject: Subject, which: Which) -> Repropagation | None:
    """FakeTensors re-propagated through the primary-mode ``original`` or ``result`` on a copy of its ShapeEnv
    (:func:`~fxverify.analysis.repropagation.repropagate`); None for a module that is not a GraphModule or
    carries no ``meta['val']``."""

    def make() -> Repropagation | None:
        applied = subject.applied()
        module = applied.original if which == "original" else applied.result
        return repropagate(module, applied.shape_env) if isinstance(module, fx.GraphModule) else None

    return subject.stash.get(_REPROPAGATED[which], make)


def described_as_captured(subject: Subject) -> bool:
    """Whether the result is a GraphModule of the original's structure, tensors, modules and ``meta['val']``
    (a transform that did nothing to this model but regenerate code): re-propagating FakeTensors through it
    would find what re-propagating through the original finds, which is never the transform's doing."""

    def make() -> bool:
        applied = subject.applied()
        return isinstance(applied.result, fx.GraphModule) and not {"graph", "state", "modules"} & set(applied.changes) \
            and same_descriptions(applied.original.graph, applied.result.graph)

    return subject.stash.get(_DESCRIBED_AS_CAPTURED, make)


def guard_violation(subject: Subject) -> Violation | None:
    """The first guard that re-propagating through the result adds which is false somewhere inside the range
    the capture promises for its symbolic sizes (``Eq(s77, 2)`` for a batch in ``[2, 8]``), and which
    re-propagating through the original does not add; None (also where the result is described as captured)."""

    def make() -> Violation | None:
        if described_as_captured(subject):
            return None
        found = repropagated(subject, "result")
        if found is None or not violations(found):
            return None
        baseline = repropagated(subject, "original")
        exempt = {str(g.expr) for g in baseline.guards} if baseline is not None else set()
        return next(iter(violations(found, exempt)), None)

    return subject.stash.get(_GUARD_VIOLATION, make)


def guard_added_while_running(subject: Subject) -> Violation | None:
    """The first guard the transform added while it ran to the ShapeEnv that every copy of an export shares
    which is false somewhere inside the ranges of the input sizes as captured (``Eq(s77, 2)``, a
    specialisation; ``Eq(Mod(s77, 2), 0)``); None."""

    def make() -> Violation | None:
        applied = subject.applied()
        if applied.shape_env is None or not applied.guards_added:
            return None
        ranges = input_ranges(applied.original, applied.shape_env)
        found = ((guard, violation(guard, ranges)) for guard in applied.guards_added)
        return next((Violation(AddedGuard(None, g), point) for g, point in found if point is not None), None)

    return subject.stash.get(_GUARD_ADDED, make)
