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

from fxverify.checks import names as _check_names  # the registry imports neither torch nor any check

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "Contract": "fxverify.core.contracts",
    "STRICT": "fxverify.core.contracts",
    "contract": "fxverify.core.contracts",
    "contract_of": "fxverify.core.contracts",
    "Transform": "fxverify.core.transform",
    "CorpusEntry": "fxverify.cases.catalogue",
    "InputSpec": "fxverify.cases.catalogue",
    "register_model": "fxverify.cases.catalogue",
    "ModelCase": "fxverify.cases.case",
    "load_case": "fxverify.cases.case",
    "case_from_module": "fxverify.cases.case",
    "Verification": "fxverify.api",
    "ReferenceStore": "fxverify.engine.references",
    "check_rewrite": "fxverify.rewrite",
    "check_patterns": "fxverify.compile.patterns",
    "also_spelled": "fxverify.compile.pattern_sources",
    "check_backend": "fxverify.compile.backend",
    "check_graph_cache": "fxverify.compile.graph_cache",
    "RewriteFailed": "fxverify.errors",
    "Minimised": "fxverify.diagnose.minimise",
    "minimise_numerics": "fxverify.api",
    "minimise_module": "fxverify.diagnose.minimise",
    "write_repro": "fxverify.diagnose.repro",
    "CheckResult": "fxverify.core.results",
    "Outcome": "fxverify.core.results",
    "verify": "fxverify.api",
    "assert_transform_ok": "fxverify.api",
    "FxVerifyError": "fxverify.errors",
    "TransformLoadError": "fxverify.errors",
    "TransformFailed": "fxverify.errors",
    "CorpusError": "fxverify.errors",
    "CheckFailed": "fxverify.errors",
    **{f"{kind}_{name.replace('-', '_')}": "fxverify.api" for name in _check_names(None) for kind in ("check", "assert")},
}
# public submodule -> the module it is (the golden-file store lives in the analysis layer)
_SUBMODULES = {"examples": "fxverify.examples", "strategies": "fxverify.strategies", "reports": "fxverify.reports",
               "golden": "fxverify.analysis.golden"}

__all__ = sorted([*_EXPORTS, *_SUBMODULES])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    raise AttributeError(f"module 'fxverify' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
