"""A typed store of per-subject state that one check (or a few) keep, as pytest's ``Stash`` lets a plugin keep
state on a ``Config`` or an ``Item`` that the ``Config`` does not know of: the subject holds a :class:`Stash`,
each check declares its :class:`StashKey`\\ s next to its code, and the subject stays free of what a single
check needs.

>>> ANSWER: StashKey[int] = StashKey("answer")
>>> stash = Stash()
>>> stash.get(ANSWER, lambda: 42), stash.get(ANSWER, lambda: 0)
(42, 42)
>>> ANSWER in stash, StashKey[int]("answer") in stash  # keys are compared by identity, not by name
(True, False)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class StashKey(Generic[T]):
    """A key of a :class:`Stash` whose values are ``T``; ``name`` shows in errors and ``repr`` only."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"StashKey({self.name!r})"


class Stash:
    """Values by :class:`StashKey`, each made once on first use."""

    def __init__(self) -> None:
        self._values: dict[StashKey[Any], Any] = {}

    def get(self, key: StashKey[T], make: Callable[[], T]) -> T:
        """The value under ``key``, made by ``make()`` (and kept) when there is none yet."""
        if key not in self._values:
            self._values[key] = make()
        value: T = self._values[key]
        return value

    def __contains__(self, key: StashKey[Any]) -> bool:
        return key in self._values
