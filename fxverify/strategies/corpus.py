"""Random graphs as corpus entries, for ``pytest --fxverify MOD:FN --fxverify-random-graphs N``.

Each entry ``random_graph_<seed>`` is a graph drawn from :func:`graph_modules` with
a seeded random source, rebuilt from its seed wherever it is needed (in another
process too: the factory is ``fxverify.strategies.corpus:random_graph``). A run
draws fresh seeds; seeds whose items failed are saved in the Hypothesis example
database (``.hypothesis/`` under the rootdir) and come first in the next run, so
a failing graph replays until it passes.

>>> random_graph(7).graph is not random_graph(7).graph, random_graph(7).code == random_graph(7).code
(True, True)
"""

from __future__ import annotations

import copy
import functools
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis.database import DirectoryBasedExampleDatabase
from torch import fx

from fxverify.catalogue import CorpusEntry
from fxverify.strategies.graphs import GraphCase, graph_modules

PREFIX = "random_graph_"
WORKER_SEED = "fxverify_random_graphs_seed"
DATABASE_DIR = Path(".hypothesis") / "fxverify"


@functools.lru_cache(maxsize=64)
def draw_graph(seed: int) -> GraphCase:
    """The graph for ``seed``: ``graph_modules()`` drawn from ``random.Random(seed)``.

    This uses Hypothesis's ``ConjectureData`` (internal API) to draw one example outside
    ``@given``, so the same seed gives the same graph in every process.
    """
    from hypothesis.internal.conjecture.data import ConjectureData

    data = ConjectureData(random=random.Random(seed))
    return data.draw(graph_modules())


def random_graph(seed: int) -> fx.GraphModule:
    """A fresh copy of the GraphModule for ``seed`` (the factory of random-graph entries)."""
    return copy.deepcopy(draw_graph(seed).module)


def entry_for(seed: int) -> CorpusEntry:
    """The corpus entry of the graph for ``seed``."""
    case = draw_graph(seed)
    return CorpusEntry(
        name=f"{PREFIX}{seed}",
        source="user",
        factory="fxverify.strategies.corpus:random_graph",
        kwargs={"seed": seed},
        inputs=case.inputs,
        batch_sizes=(case.inputs[0].shape[0],),
        tags=("random_graph",),
        profiles=("random",),
    )


class RandomGraphs:
    """A pytest plugin object: the random-graph entries of this run, and the example
    database that remembers the seeds of failing ones (one key per set of transforms)."""

    def __init__(self, config: pytest.Config, count: int, transforms: list[str]) -> None:
        self.database = DirectoryBasedExampleDatabase(str(Path(config.rootpath) / DATABASE_DIR))
        self.key = ("fxverify-random-graphs:" + ",".join(sorted(transforms))).encode()
        workerinput = getattr(config, "workerinput", None)
        self.base_seed = int(workerinput[WORKER_SEED]) if workerinput else random.getrandbits(32)
        replayed = sorted(int(value.decode()) for value in self.database.fetch(self.key))
        fresh = [random.Random(self.base_seed + i).getrandbits(32) for i in range(count)]
        self.seeds = list(dict.fromkeys(replayed + fresh))[: max(count, len(replayed))]
        self.replayed = replayed
        self.failed: set[int] = set()
        self.passed: set[int] = set()
        self.entries = [entry_for(seed) for seed in self.seeds]

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """xdist: every worker draws the same fresh seeds as the controller."""
        node.workerinput[WORKER_SEED] = self.base_seed

    def pytest_report_header(self) -> str:
        return (f"fxverify: {len(self.seeds)} random graphs ({len(self.replayed)} replayed from the example "
                f"database {DATABASE_DIR}/); rebuild one with fxverify.strategies.corpus.random_graph(<seed>)")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Save the seed of a random graph as soon as one of its items fails."""
        if report.when != "call" and not report.failed:
            return
        for seed in self.seeds:
            if f"{PREFIX}{seed}-" in report.nodeid:
                if report.failed:
                    self.failed.add(seed)
                    self.database.save(self.key, str(seed).encode())
                else:
                    self.passed.add(seed)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Forget replayed seeds whose items all passed this time (on the xdist controller, or alone)."""
        if getattr(session.config, "workerinput", None) is not None:
            return
        for seed in self.replayed:
            if seed in self.passed and seed not in self.failed:
                self.database.delete(self.key, str(seed).encode())
