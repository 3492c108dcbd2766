"""fxverify: a test-and-verification harness for torch.fx transforms.

    import fxverify
    fxverify.assert_transform_ok(my_pass, "resnet18")       # every check on one model
    fxverify.check_numerics(my_pass, fxverify.load_case("mobilenet_v2")).ok

The public names below are imported lazily, so that loading the pytest plugin
(``fxverify.plugin``) never imports torch in a run that does not use it.
"""

from __future__ import annotations

import importlib
from typing import Any

# The checks in run order: fxverify.checks.CHECKS's keys (a test keeps them in step), here so
# that the plugin's --help and the lazy exports need no torch import.
_CHECK_NAMES = ("lint", "determinism", "numerics", "gradients", "devices", "cuda", "purity",
                "recompile", "retrace", "to_folder", "pickle", "interpreter", "golden")

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "Contract": "fxverify.contracts",
    "STRICT": "fxverify.contracts",
    "contract": "fxverify.contracts",
    "contract_of": "fxverify.contracts",
    "Transform": "fxverify.transform",
    "CorpusEntry": "fxverify.catalogue",
    "InputSpec": "fxverify.catalogue",
    "register_model": "fxverify.catalogue",
    "ModelCase": "fxverify.cases",
    "load_case": "fxverify.cases",
    "case_from_module": "fxverify.cases",
    "Verification": "fxverify.verification",
    "check_rewrite": "fxverify.rewrite",
    "RewriteFailed": "fxverify.rewrite",
    "Minimised": "fxverify.minimise",
    "minimise_numerics": "fxverify.minimise",
    "minimise_module": "fxverify.minimise",
    "write_repro": "fxverify.repro",
    "CheckResult": "fxverify.result",
    "verify": "fxverify.api",
    "assert_transform_ok": "fxverify.api",
    "FxVerifyError": "fxverify.errors",
    "TransformLoadError": "fxverify.errors",
    "TransformFailed": "fxverify.errors",
    "CorpusError": "fxverify.errors",
    "CheckFailed": "fxverify.errors",
    **{f"{kind}_{name}": "fxverify.api" for name in _CHECK_NAMES for kind in ("check", "assert")},
}
_SUBMODULES = ("examples", "strategies", "reports", "golden")

__all__ = sorted([*_EXPORTS, *_SUBMODULES])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"fxverify.{name}")
    raise AttributeError(f"module 'fxverify' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
