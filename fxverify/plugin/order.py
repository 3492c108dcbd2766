"""The order fxverify runs a transform's items in: what is likely to fail soonest first, so that
``-x`` and an author watching the run get the verdict early.

Models, for each transform:

1. those that failed for this transform in the last run (pytest's cache, as ``--ff`` does);
2. the edge-case and layer-variant modules and random graphs: milliseconds each, and written to
   break passes;
3. the other models, cheapest first: by the seconds their items took in the last run where the
   cache knows them, then the ones it does not know by the size of their inputs.

A model's items stay together (one worker, one shared capture and transform) and keep the
registry's check order, except that the checks that failed last time come first. The order
depends only on the selection and the cache, which the run does not change until it ends, so
every pytest-xdist worker computes the same one; sharding chose the entries before (see the end),
so the shards still partition the selection exactly. ``--fxverify-order catalogue`` keeps
the catalogue's order; without the cache (``-p no:cacheprovider``) the order uses no history.

>>> history = History({"my:pass": TransformHistory(failed=[("b", "numerics")], seconds={"c": 9.0, "d": 2.0})})
>>> edge = CorpusEntry("e", source="edge", factory="torch.nn:Identity", inputs=(InputSpec((2, 4)),))
>>> zoo = [CorpusEntry(name, source="timm", inputs=(InputSpec((2, 3, 64, 64)),)) for name in "abcd"]
>>> [e.name for e in history.ordered("my:pass", [*zoo, edge])]
['b', 'e', 'd', 'c', 'a']
>>> history.ordered_checks("my:pass", "b", ("lint", "numerics", "golden"))
['numerics', 'lint', 'golden']

With ``--fxverify-durations`` (a JSON report of an earlier run), ``--fxverify-shard`` balances the
shards by the seconds that run recorded (:func:`balanced_shards`), not by taking every N-th entry in
catalogue order: the longest model first onto the least loaded shard, ties to the model first in
the catalogue and the lowest shard. It depends only on the selection and the file, so every
machine given the same file computes the same partition; each shard keeps catalogue order before
the ordering above.

>>> [[e.name for e in part] for part in balanced_shards(zoo, 2, {"a": 9.0, "b": 5.0, "c": 4.0, "d": 1.0})]
[['a', 'd'], ['b', 'c']]
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytest

from fxverify.cases.catalogue import RANDOM_GRAPH_TAG, CorpusEntry, InputSpec, split_label
from fxverify.core.results import ERROR, FAILED
from fxverify.plugin.ledger import Ledger

CACHE_KEY = "fxverify/history"  # in pytest's cache (.pytest_cache/v/fxverify/history); --cache-clear drops it


@dataclasses.dataclass
class TransformHistory:
    """What the last runs of one transform left: the (model, check) items that failed in the
    latest run that ran them, and the seconds each model's items took."""

    failed: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class History:
    """Every transform's :class:`TransformHistory`, as kept in pytest's cache."""

    transforms: dict[str, TransformHistory] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_cache(cls, data: Any) -> History:
        """The history stored under :data:`CACHE_KEY` (``None``, or anything malformed: an empty one)."""
        history = cls()
        if not isinstance(data, dict):
            return history
        for spec, kept in data.items():
            try:
                failed = [(str(model), str(check)) for model, check in kept.get("failed", [])]
                seconds = {str(model): float(s) for model, s in kept.get("seconds", {}).items()}
            except (AttributeError, TypeError, ValueError):
                continue  # written by another version: start that transform afresh
            history.transforms[str(spec)] = TransformHistory(failed, seconds)
        return history

    def to_cache(self) -> dict[str, Any]:
        """JSON-ready, for ``config.cache.set(CACHE_KEY, ...)``."""
        return {spec: {"failed": [list(item) for item in kept.failed], "seconds": kept.seconds}
                for spec, kept in sorted(self.transforms.items())}

    def ordered(self, spec: str, entries: Sequence[CorpusEntry]) -> list[CorpusEntry]:
        """``entries`` in the order to run them for transform ``spec`` (see the module's docstring)."""
        kept = self.transforms.get(spec, TransformHistory())
        failed = {model for model, _ in kept.failed}
        position = {entry.name: i for i, entry in enumerate(entries)}

        def key(entry: CorpusEntry) -> tuple[Any, ...]:
            known = kept.seconds.get(entry.name)
            cheap_by_design = entry.source == "edge" or RANDOM_GRAPH_TAG in entry.tags
            return (entry.name not in failed, not cheap_by_design, known is None, known or 0.0,
                    _input_size(entry.inputs), position[entry.name])

        return sorted(entries, key=key)

    def ordered_checks(self, spec: str, model: str, checks: Sequence[str]) -> list[str]:
        """``checks`` with those that failed on ``model`` last time first, each group in the given order."""
        kept = self.transforms.get(spec, TransformHistory())
        failed = {check for failed_model, check in kept.failed if failed_model == model}
        return sorted(checks, key=lambda check: check not in failed)

    def record(self, spec: str, outcomes: Iterable[tuple[str, str, bool]], seconds: dict[str, float]) -> None:
        """Fold one run of transform ``spec`` in: ``outcomes`` are its (model, check, failed) items,
        ``seconds`` what each model's items took. Items this run did not reach keep their record."""
        kept = self.transforms.setdefault(spec, TransformHistory())
        ran = {(model, check): failed for model, check, failed in outcomes}
        kept.failed = [item for item in kept.failed if item not in ran] + [item for item, failed in ran.items() if failed]
        kept.seconds.update(seconds)


def _input_size(inputs: Iterable[InputSpec]) -> int:
    return sum(math.prod(spec.shape) for spec in inputs)


def recorded_seconds(report: Mapping[str, Any]) -> dict[str, float]:
    """The seconds each model's items took in a JSON report (:func:`fxverify.reports.records.read_json`),
    every transform and capture of the model together.

    >>> recorded_seconds({"records": [{"model": "m", "duration": 2.0}, {"model": "m@export", "duration": 1.5}]})
    {'m': 3.5}
    """
    seconds: dict[str, float] = defaultdict(float)
    for found in report["records"]:
        if isinstance(found.get("duration"), (int, float)):
            seconds[split_label(found["model"])[0]] += found["duration"]
    return dict(seconds)


def estimated_seconds(entries: Sequence[CorpusEntry], seconds: Mapping[str, float]) -> dict[str, float]:
    """Each entry's seconds in ``seconds``; for an entry without them (new in the catalogue, or left out
    of the run that recorded them), the median of the recorded entries of its source (``edge``,
    ``timm``, ...), else of all of them, else 1.

    >>> zoo = [CorpusEntry(name, source="timm", inputs=(InputSpec((2, 4)),)) for name in "abc"]
    >>> estimated_seconds(zoo, {"a": 2.0, "b": 6.0})
    {'a': 2.0, 'b': 6.0, 'c': 4.0}
    """
    known = [entry for entry in entries if entry.name in seconds]
    by_source: dict[str, list[float]] = defaultdict(list)
    for entry in known:
        by_source[entry.source].append(seconds[entry.name])
    fallback = statistics.median(seconds[entry.name] for entry in known) if known else 1.0
    return {entry.name: seconds[entry.name] if entry.name in seconds
            else statistics.median(by_source[entry.source]) if by_source[entry.source] else fallback
            for entry in entries}


def balanced_shards(entries: Sequence[CorpusEntry], count: int, seconds: Mapping[str, float]) -> list[list[CorpusEntry]]:
    """``entries`` in ``count`` shards of about equal seconds (:func:`estimated_seconds`): the longest
    first onto the least loaded shard (ties: the entry first in ``entries``, the lowest shard), each
    shard in the order of ``entries``. An exact partition, the same wherever it is computed."""
    estimate = estimated_seconds(entries, seconds)
    loads = [(0.0, shard) for shard in range(count)]  # a heap: the least loaded, then the lowest, first
    parts: list[list[int]] = [[] for _ in range(count)]
    for position in sorted(range(len(entries)), key=lambda i: (-estimate[entries[i].name], i)):
        load, shard = heapq.heappop(loads)
        parts[shard].append(position)
        heapq.heappush(loads, (load + estimate[entries[position].name], shard))
    return [[entries[i] for i in sorted(part)] for part in parts]


@dataclasses.dataclass(eq=False)  # pytest plugins must be hashable
class HistoryKeeper:
    """Folds the run's outcomes and durations, as the ledger gathered them, into the history in
    pytest's cache when the session ends (on the controller: workers only read it)."""

    ledger: Ledger
    cache: pytest.Cache
    history: History

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput"):
            return
        for spec, outcomes in self.ledger.outcomes.items():
            kept = [(model, check, outcome in (FAILED, ERROR)) for (model, check), outcome in outcomes.items()
                    if model not in self.ledger.random_graphs]  # drawn anew each run
            seconds = {model: s for model, s in self.ledger.seconds[spec].items() if model not in self.ledger.random_graphs}
            self.history.record(spec, kept, seconds)
        self.cache.set(CACHE_KEY, self.history.to_cache())
