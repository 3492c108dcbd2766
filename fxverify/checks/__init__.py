"""The checks, one module each, in the order they run and are reported.

Each check is ``check(v: Verification) -> dict | None``: it returns details on
success and raises :class:`~fxverify.result.Finding` to fail or
:class:`~fxverify.result.Skip` when it does not apply.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fxverify.checks import cuda, determinism, devices, golden, gradients, lint, numerics, purity, roundtrips

CHECKS: dict[str, Callable[[Any], dict[str, Any] | None]] = {
    "lint": lint.check,
    "determinism": determinism.check,
    "numerics": numerics.check,
    "gradients": gradients.check,
    "devices": devices.check,
    "cuda": cuda.check,
    "purity": purity.check,
    "recompile": roundtrips.check_recompile,
    "retrace": roundtrips.check_retrace,
    "to_folder": roundtrips.check_to_folder,
    "pickle": roundtrips.check_pickle,
    "interpreter": roundtrips.check_interpreter,
    "golden": golden.check,
}
