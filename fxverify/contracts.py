"""What a transform promises: the modes it supports, whether it may change
parameters, and the tolerances its numerics are judged with.

A transform without a declared contract gets the strictest one
(:data:`STRICT`): it must keep every parameter and match the original model in
both eval and train mode within the default tolerances of the dtype.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from fxverify.errors import FxVerifyError

MODES = ("eval", "train")
_ATTRIBUTE = "__fxverify_contract__"

F = TypeVar("F", bound=Callable[..., Any])


@dataclasses.dataclass(frozen=True)
class Contract:
    """The promises a transform makes, used to judge its results.

    ``modes``: the module modes the transform supports ("eval", "train").
    ``changes_parameters``: whether the transform may replace, remove or
    rewrite parameters (a conv/BN fusion does).
    ``rtol`` / ``atol``: tolerances that loosen the dtype defaults.
    """

    modes: tuple[str, ...] = MODES
    changes_parameters: bool = False
    rtol: float | None = None
    atol: float | None = None

    def __post_init__(self) -> None:
        modes = tuple(self.modes)
        if not modes or any(m not in MODES for m in modes):
            raise FxVerifyError(
                f"contract modes must be a non-empty subset of {MODES}, got modes={self.modes!r}"
            )
        object.__setattr__(self, "modes", modes)
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or value < 0):
                raise FxVerifyError(
                    f"contract {name} must be a non-negative number, got {name}={value!r}"
                )

    @property
    def primary_mode(self) -> str:
        """The mode most checks run in: eval when supported, else the first mode."""
        return "eval" if "eval" in self.modes else self.modes[0]

    def describe(self) -> str:
        """One line for summaries, e.g. ``modes=eval changes_parameters=yes``."""
        parts = [f"modes={'+'.join(self.modes)}"]
        parts.append(f"changes_parameters={'yes' if self.changes_parameters else 'no'}")
        if self.rtol is not None:
            parts.append(f"rtol={self.rtol:g}")
        if self.atol is not None:
            parts.append(f"atol={self.atol:g}")
        label = "strict (default)" if self == STRICT else "declared"
        return f"{label}: {' '.join(parts)}"


STRICT = Contract()


def contract(
    *,
    modes: tuple[str, ...] = MODES,
    changes_parameters: bool = False,
    rtol: float | None = None,
    atol: float | None = None,
) -> Callable[[F], F]:
    """Declare a transform's contract.

    The decorated callable is wrapped, never modified, so it is safe on
    functions you do not own::

        @fxverify.contract(modes=("eval",), changes_parameters=True)
        def fuse_conv_bn(gm):
            ...

        inference_only = fxverify.contract(modes=("eval",))(remove_dropout)
    """
    declared = Contract(modes=modes, changes_parameters=changes_parameters, rtol=rtol, atol=atol)

    def decorate(fn: F) -> F:
        if not callable(fn):
            raise FxVerifyError(f"@fxverify.contract decorates a callable, got {fn!r}")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        setattr(wrapper, _ATTRIBUTE, declared)
        return wrapper  # type: ignore[return-value]

    return decorate


def contract_of(fn: Callable[..., Any]) -> Contract:
    """The contract declared on ``fn``, or :data:`STRICT` when none was.

    >>> contract_of(lambda gm: gm) == STRICT
    True
    """
    found = getattr(fn, _ATTRIBUTE, None)
    return found if isinstance(found, Contract) else STRICT
