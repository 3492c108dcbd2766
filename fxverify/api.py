"""The public check functions: ``check_<name>`` returns a :class:`CheckResult`,
``assert_<name>`` raises :class:`CheckFailed` with a readable message.

Each takes the transform (a callable, a ``"module:function"`` spec or a
:class:`Transform`) and the model (a :class:`ModelCase` or a corpus name)::

    fxverify.check_numerics(my_pass, "resnet18").ok
    fxverify.assert_transform_ok(my_pass, fx_model)   # every check

To run several checks without redoing the shared work, use one
:class:`~fxverify.verification.Verification` and call ``run(check)`` on it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from fxverify.cases import ModelCase
from fxverify.checks import CHECKS
from fxverify.errors import CheckFailed
from fxverify.result import FAILED, CheckResult
from fxverify.transform import Transform
from fxverify.verification import DEFAULT_TIMEOUT, Verification

TransformLike = Transform | Callable[..., Any] | str
CaseLike = ModelCase | str


def verify(
    transform: TransformLike, case: CaseLike, *, checks: Sequence[str] | None = None, timeout: float | None = DEFAULT_TIMEOUT
) -> list[CheckResult]:
    """Run every check (or the named ones) of ``transform`` on ``case``.

    >>> import fxverify
    >>> [r.outcome for r in verify(fxverify.examples.identity, "resnet18", checks=["lint"])]
    ['passed']
    """
    from fxverify.crossprocess import CrossProcessDigests

    v = Verification(transform, case, timeout=timeout)
    digests = CrossProcessDigests(v.transform, [v.case], timeout=timeout or DEFAULT_TIMEOUT)
    v.cross_process = digests
    try:
        return v.run_all(list(checks) if checks else None)
    finally:
        digests.close()


def assert_transform_ok(
    transform: TransformLike, case: CaseLike, *, checks: Sequence[str] | None = None, timeout: float | None = DEFAULT_TIMEOUT
) -> list[CheckResult]:
    """Run the checks and raise :class:`CheckFailed` listing every failure.

    Example, in your own test over the corpus::

        def test_my_pass(fx_model):
            fxverify.assert_transform_ok(my_pass, fx_model)
    """
    __tracebackhide__ = True
    results = verify(transform, case, checks=checks, timeout=timeout)
    failed = [r for r in results if r.outcome == FAILED]
    if failed:
        raise CheckFailed("\n\n".join(r.message for r in failed))
    return results


def _pair(name: str) -> tuple[Callable[..., CheckResult], Callable[..., CheckResult]]:
    summary = (sys.modules[CHECKS[name].__module__].__doc__ or name).strip().splitlines()[0]

    def check_fn(transform: TransformLike, case: CaseLike, *, timeout: float | None = DEFAULT_TIMEOUT) -> CheckResult:
        return verify(transform, case, checks=[name], timeout=timeout)[0]

    def assert_fn(transform: TransformLike, case: CaseLike, *, timeout: float | None = DEFAULT_TIMEOUT) -> CheckResult:
        __tracebackhide__ = True
        return check_fn(transform, case, timeout=timeout).raise_for_failure()

    check_fn.__name__ = check_fn.__qualname__ = f"check_{name}"
    assert_fn.__name__ = assert_fn.__qualname__ = f"assert_{name}"
    check_fn.__doc__ = (
        f"Run the {name} check: {summary}\n\n"
        f"Returns a CheckResult; ``.ok`` is False when it failed, ``.message`` says why::\n\n"
        f"    fxverify.check_{name}(my_pass, 'resnet18').outcome   # 'passed', 'failed' or 'skipped'\n"
    )
    assert_fn.__doc__ = (
        f"Run the {name} check and raise CheckFailed with the finding when it fails.\n\n"
        f"    fxverify.assert_{name}(my_pass, 'resnet18')\n"
    )
    return check_fn, assert_fn


check_lint, assert_lint = _pair("lint")
check_determinism, assert_determinism = _pair("determinism")
check_numerics, assert_numerics = _pair("numerics")
check_gradients, assert_gradients = _pair("gradients")
check_devices, assert_devices = _pair("devices")
check_cuda, assert_cuda = _pair("cuda")
check_purity, assert_purity = _pair("purity")
check_recompile, assert_recompile = _pair("recompile")
check_retrace, assert_retrace = _pair("retrace")
check_to_folder, assert_to_folder = _pair("to_folder")
check_pickle, assert_pickle = _pair("pickle")
check_interpreter, assert_interpreter = _pair("interpreter")
check_golden, assert_golden = _pair("golden")

__all__ = [
    "verify", "assert_transform_ok", "CheckFailed",
    "check_lint", "assert_lint", "check_determinism", "assert_determinism",
    "check_numerics", "assert_numerics", "check_gradients", "assert_gradients",
    "check_devices", "assert_devices", "check_cuda", "assert_cuda", "check_purity", "assert_purity",
    "check_recompile", "assert_recompile", "check_retrace", "assert_retrace", "check_to_folder", "assert_to_folder",
    "check_pickle", "assert_pickle", "check_interpreter", "assert_interpreter", "check_golden", "assert_golden",
]
