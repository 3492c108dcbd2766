"""Verifying passes that run inside ``torch.compile``: Inductor pattern-matcher passes
(:mod:`~fxverify.compile.patterns`), the FX graph cache contract of a ``CustomGraphPass``
(:mod:`~fxverify.compile.graph_cache`) and compile backends (:mod:`~fxverify.compile.backend`).

Each module works without pytest and returns :class:`fxverify.CheckResult` objects; the API row
(:mod:`fxverify.api`) re-exports their entry points and the plugin makes items of them.
"""
