"""Hooks fxverify adds to pytest, for ``conftest.py`` files and plugins.

Implement ``pytest_fxverify_models`` to add your own models (production
architectures) to the corpus of every run::

    # conftest.py
    import fxverify

    def pytest_fxverify_models(config):
        return [fxverify.CorpusEntry(name="my_net", source="user", factory="my_pkg.models:MyNet",
                                     inputs=(fxverify.InputSpec((2, 3, 32, 32)),), tags=("production",))]
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.hookspec
def pytest_fxverify_models(config: pytest.Config) -> list[Any] | None:
    """Return ``fxverify.CorpusEntry`` objects to add to the corpus.

    They are selected like shipped entries: by profile (``default`` unless the
    entry's ``profiles`` say otherwise), name, glob or tag. A string factory
    ``"package.module:attr"`` also lets the cross-process determinism check
    rebuild the model in another process.
    """
