"""``--fxverify-random-graphs N``: random graphs as models of the run.

Each model ``random_graph_<seed>`` is the graph :func:`fxverify.strategies.graph_from_seed`
builds for its seed (its entry: :func:`fxverify.strategies.corpus.entry_for`). Unless the options
name ``ops``, the graphs are drawn from the ops the transforms rewrite, learned by probing them
on tiny graphs of each op (:mod:`fxverify.strategies.probe`), captured as the run captures its
models (under ``--fxverify-capture export`` an ATen pass is probed on ATen graphs); the header says
what was found, and the summary how many graphs each transform changed under each capture (the
graphs' labels, ``random_graph_<seed>@export``, are in :attr:`RandomGraphs.models`); ``"ops": null``
draws from the whole catalogue. A run checks ``N`` fresh seeds plus the graphs saved in the Hypothesis example
database (``.hypothesis/`` under the rootdir): a graph is saved, with the options it was drawn
with, when one of its items fails and forgotten once all its items pass, so a failing graph
replays until it passes while every run still explores ``N`` new graphs. Under xdist the
controller sends its graphs to the workers, so all collect the same items.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis.database import DirectoryBasedExampleDatabase

from fxverify.cases.catalogue import model_label, split_label
from fxverify.core.results import ERROR, FAILED, PASSED, Outcome
from fxverify.strategies.corpus import SEED_FORMAT, canonical, entry_for
from fxverify.strategies.probe import Probe, probe_ops

WORKER_GRAPHS = "fxverify_random_graphs"  # xdist workerinput: [[seed, options], ...] from the controller
DATABASE_DIR = Path(".hypothesis") / "fxverify"


class RandomGraphs:
    """A pytest plugin object: the random-graph entries of this run (the replayed graphs, then
    ``count`` fresh ones), and the example database that remembers failing ones (one key per set
    of transforms and options). Fresh graphs are drawn with ``options``, from the ops the
    transforms rewrite unless ``options`` names ``ops``; a saved graph keeps the options it was
    drawn with, so it is the same graph when replayed whatever a later probe finds. xdist workers
    take the controller's graphs. ``captures``: the run's (capture names; none: the default), which
    the transforms are probed under."""

    def __init__(self, config: pytest.Config, count: int, transforms: list[str],
                 options: dict[str, Any] | None = None, captures: Sequence[str] = ()) -> None:
        self.options = options or {}
        self.captures = tuple(captures)
        self.database = DirectoryBasedExampleDatabase(str(Path(config.rootpath) / DATABASE_DIR))
        key = f"fxverify-random-graphs-v{SEED_FORMAT}:" + ",".join(sorted(transforms))
        self.key = (key + (f":{canonical(self.options)}" if self.options else "")).encode()
        self.probes: list[Probe] = []
        self.saved: dict[int, bytes] = {}  # replayed seed -> its value in the database
        workerinput = getattr(config, "workerinput", None)
        if workerinput is not None and WORKER_GRAPHS in workerinput:
            self.graphs = {int(seed): dict(options) for seed, options in workerinput[WORKER_GRAPHS]}
            self.drawn = self.options  # the controller replays and forgets; workers only run
        else:
            self.drawn = self._guided(transforms) if count else self.options
            replayed = {}
            for value in self.database.fetch(self.key):
                seed, replayed[seed] = self._decode(value)
                self.saved[seed] = value
            self.graphs = dict(sorted(replayed.items()))
            for _ in range(count):
                self.graphs.setdefault(random.getrandbits(32), self.drawn)
        self.failed: set[int] = set()
        self.passed: set[int] = set()
        self.entries = [entry_for(seed, options) for seed, options in self.graphs.items()]
        self.seed_of = {entry.name: seed for entry, seed in zip(self.entries, self.graphs)}

    @property
    def seeds(self) -> list[int]:
        return list(self.graphs)

    @property
    def models(self) -> frozenset[str]:
        """The random graphs as the summary and the reports name them: their names, and their labels under the
        run's captures (``random_graph_7@export``, the ledger's and the records' key under a capture other than
        the default)."""
        return frozenset(self.seed_of) | {model_label(name, capture) for name in self.seed_of for capture in self.captures}

    def _guided(self, transforms: list[str]) -> dict[str, Any]:
        """The options of fresh graphs: the user's, with ``ops`` set to the ops the transforms rewrite
        (when the user named none and a probe finds some, but not all)."""
        if "ops" in self.options:
            return self.options
        kept: dict[Any, Any] = {}  # the probe graphs' exports, made once for every transform
        self.probes = [probe_ops(spec, captures=self.captures, kept=kept, **self.options) for spec in transforms]
        rewritten = sorted({name for probe in self.probes for name in probe.rewritten})
        if not rewritten or all(len(probe.rewritten) == probe.usable for probe in self.probes):
            return self.options
        return {**self.options, "ops": rewritten}

    def _decode(self, value: bytes) -> tuple[int, dict[str, Any]]:
        """A saved graph: ``{"seed": ..., "options": ...}``, or a bare seed (saved before options were kept)."""
        found = json.loads(value.decode())
        if isinstance(found, int):
            return found, self.options
        return int(found["seed"]), dict(found["options"])

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """xdist: every worker collects the controller's graphs, whatever the database holds by then."""
        node.workerinput[WORKER_GRAPHS] = [[seed, options] for seed, options in self.graphs.items()]

    def pytest_report_header(self) -> list[str]:
        replayed = len(self.saved)
        lines = [f"fxverify: {len(self.graphs)} random graphs ({replayed} replayed from the example "
                 f"database {DATABASE_DIR}/, {len(self.graphs) - replayed} new); rebuild a new one with "
                 f"fxverify.strategies.graph_from_seed(<seed>{''.join(f', {k}={v!r}' for k, v in self.drawn.items())})"]
        lines += [f"fxverify: {probe.describe()}" for probe in self.probes]
        if self.probes:  # the ops were left to the probe: say what the new graphs are drawn from
            ops = self.drawn.get("ops")
            lines.append(f"fxverify: new random graphs are drawn from the ops the probe found rewritten ({len(ops)})"
                         if ops else "fxverify: new random graphs are drawn from every op (the probe narrowed nothing)")
        return lines

    def reported(self, spec: str, model: str, check: str, outcome: Outcome) -> None:
        """Save a random graph (its seed and options) as soon as one of its items fails or errors (its
        transform killed the worker, say): a ledger observer."""
        seed = self.seed_of.get(split_label(model)[0])  # a label under a capture: random_graph_7@export
        if seed is None:
            return
        if outcome in (FAILED, ERROR):
            self.failed.add(seed)
            self.database.save(self.key, self.saved.get(seed) or _encode(seed, self.graphs[seed]))
        elif outcome is PASSED:  # a skip proves nothing: the seed stays saved
            self.passed.add(seed)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Forget replayed graphs whose items all passed this time (on the xdist controller, or alone)."""
        if getattr(session.config, "workerinput", None) is not None:
            return
        for seed, value in self.saved.items():
            if seed in self.passed and seed not in self.failed:
                self.database.delete(self.key, value)


def _encode(seed: int, options: dict[str, Any]) -> bytes:
    return json.dumps({"seed": seed, "options": options}, sort_keys=True).encode()
