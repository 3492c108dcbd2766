"""Model cases: the corpus catalogue (``catalogue``: entries as plain data and selection over them,
torch-free), input configurations (``inputs``), state randomisation (``state``) and
:class:`~fxverify.cases.case.ModelCase` (an entry made concrete: fresh seeded instances, their
graphs, their inputs), exported here lazily so that reading the catalogue imports no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = ("ModelCase", "load_case", "case_from_module", "factory_of")
__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module("fxverify.cases.case"), name)
    raise AttributeError(f"module 'fxverify.cases' has no attribute {name!r}")
