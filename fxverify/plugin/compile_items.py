"""The items of passes that run inside ``torch.compile``: ``--fxverify-patterns`` (pattern fuzzing of an
Inductor pattern-matcher pass), ``--fxverify-backend`` (a ``torch.compile`` backend over the selected
models) and ``--fxverify-graph-cache`` (the FX graph cache contract of a ``CustomGraphPass``).

Each spec is one collector, ``<kind>:<spec>``, with one item per result of the check it runs, named
``compile[<subject>-<check>]`` (the subject a pattern, a model or the pass set). A subject's results are
computed once, by its first item, and kept for the others. Imported by the plugin only when one of
these options is given; :func:`check_specs` makes a spec that names no usable object (and a graph-cache model
that does not load) a usage error before anything runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from fxverify.cases.case import ModelCase
from fxverify.compile import backend, graph_cache, patterns
from fxverify.core.results import CheckResult
from fxverify.core.transform import load_object
from fxverify.errors import FxVerifyError
from fxverify.plugin.items import ResultItem
from fxverify.plugin.options import usage


@dataclasses.dataclass(eq=False)  # pytest plugins must be hashable
class CompileRun:
    """The compile passes of this run (a pytest plugin object) and the results computed so far."""

    specs: dict[str, tuple[str, ...]]  # kind -> specs
    cases: list[ModelCase]
    timeout: float
    dtype: str = "float32"
    graph_cache_model: str | None = None  # what --fxverify-graph-cache compiles (None: its default model)

    def __post_init__(self) -> None:
        self.results: dict[tuple[str, str, str], dict[str, CheckResult]] = {}
        self.patterns: dict[str, dict[str, Any]] = {}  # spec -> its PatternExamples by name, registered once

    def result(self, kind: str, spec: str, subject: str, check: str) -> CheckResult:
        """The result of ``check`` on ``subject`` of ``spec``, computing the subject's results on first use."""
        key = (kind, spec, subject)
        if key not in self.results:
            self.results[key] = {r.check: r for r in self._compute(kind, spec, subject)}
        return self.results[key][check]

    def _compute(self, kind: str, spec: str, subject: str) -> list[CheckResult]:
        if kind == "patterns":
            complete = patterns.promises_every_spelling(load_object(spec, kind))
            return patterns.check_pattern(self.patterns[spec][subject], spec, complete=complete)
        if kind == "backend":
            import torch

            case = next(c for c in self.cases if c.name == subject)
            return backend.check_backend(spec, case, dtype=getattr(torch, self.dtype), timeout=self.timeout)
        return graph_cache.check_graph_cache(spec, model=self.graph_cache_model, timeout=self.timeout)

    def subjects(self, kind: str, spec: str) -> list[tuple[str, tuple[str, ...]]]:
        """``(subject, checks)`` of ``spec``: each pattern it registers, each selected model, or the pass set."""
        if kind == "patterns":
            from fxverify.compile.pattern_sources import pattern_examples

            self.patterns[spec] = {p.name: p for p in pattern_examples(load_object(spec, kind), spec)}
            return [(name, patterns.CHECKS) for name in self.patterns[spec]]
        if kind == "backend":
            return [(case.name, backend.ASPECTS) for case in self.cases]
        return [("passes", graph_cache.ASPECTS)]

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(self, collector: pytest.Collector) -> Any:
        """Add one collector per spec next to what the session collected from its arguments."""
        report = yield
        if isinstance(collector, pytest.Session) and report.passed:
            for kind, specs in self.specs.items():
                for spec in specs:
                    report.result.append(SpecCollector.from_parent(collector, name=f"{kind}:{spec}",
                                                                   nodeid=f"{kind}:{spec}", run=self, kind=kind,
                                                                   spec=spec))
        return report


LOADERS: dict[str, Callable[[str], Any]] = {  # what a spec of each kind must load as
    "patterns": lambda spec: load_object(spec, "patterns"),  # what it registers is read at collection
    "backend": backend.resolve_backend,  # a callable
    "graph-cache": graph_cache.load_passes,  # two or more CustomGraphPass instances
}


def check_specs(specs: dict[str, tuple[str, ...]], graph_cache_model: str | None = None) -> None:
    """Load every spec once, and the graph-cache model when graph-cache specs are given, so that a wrong one is a
    usage error, one line naming it and saying what to give, before anything runs."""
    for kind, given in specs.items():
        for spec in given:
            try:
                LOADERS[kind](spec)
            except FxVerifyError as exc:
                raise pytest.UsageError(f"fxverify: {exc}") from None
    if graph_cache_model is not None and "graph-cache" in specs:
        try:
            graph_cache.load_model(graph_cache_model)
        except FxVerifyError as exc:
            raise usage("fxverify_graph_cache_model", f"does not load: {exc}") from None


class SpecCollector(pytest.Collector):
    """The items of one spec: its subjects times the checks each gets."""

    def __init__(self, *, run: CompileRun, kind: str, spec: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run, self.kind, self.spec = run, kind, spec

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        items: list[pytest.Item | pytest.Collector] = []
        for subject, checks in self.run.subjects(self.kind, self.spec):
            for check in checks:
                compute = lambda subject=subject, check=check: self.run.result(self.kind, self.spec, subject, check)
                item = CompileItem.from_parent(self, name=f"compile[{subject}-{check}]", compute=compute)
                item.add_marker(pytest.mark.fxverify)
                item.extra_keyword_matches.add(self.kind)
                items.append(item)
        return items


class CompileItem(ResultItem):
    """One check of one subject; its verdict is the CheckResult ``compute`` gives."""

    def __init__(self, *, compute: Callable[[], CheckResult], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.compute = compute

    def runtest(self) -> None:
        self.report(self.compute())
