"""Random graphs as corpus entries, for ``pytest --fxverify MOD:FN --fxverify-random-graphs N``.

Each entry ``random_graph_<seed>`` is the graph :func:`graph_from_seed` builds for
its seed, rebuilt from the seed wherever it is needed (in another process too: the
factory is ``fxverify.strategies.corpus:random_graph``). Unless the options name
``ops``, the graphs are drawn from the ops the transforms rewrite, learned by
probing them on tiny graphs of each op (:mod:`fxverify.strategies.probe`; the
header says what was found, and the summary how many graphs each transform
changed); ``"ops": null`` draws from the whole catalogue. A run
checks ``N`` fresh seeds plus the seeds saved in the Hypothesis example database
(``.hypothesis/`` under the rootdir): a seed is saved when one of its items fails
and forgotten once all its items pass, so a failing graph replays until it passes
while every run still explores ``N`` new graphs. Under xdist the controller sends
its seed list to the workers, so all collect the same items.

>>> random_graph(7).graph is not random_graph(7).graph, random_graph(7).code == random_graph(7).code
(True, True)
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import InvalidArgument
from torch import fx

from fxverify.catalogue import CorpusEntry
from fxverify.checks.golden import RANDOM_GRAPH_TAG
from fxverify.strategies.graphs import GraphCase, graph_from_seed
from fxverify.strategies.probe import Probe, probe_ops

PREFIX = "random_graph_"
WORKER_SEEDS = "fxverify_random_graphs_seeds"
WORKER_OPTIONS = "fxverify_random_graphs_options"
DATABASE_DIR = Path(".hypothesis") / "fxverify"
# Part of the database key: raise it when what a seed builds changes, so that the seeds
# saved for the old graphs are not replayed as other graphs.
SEED_FORMAT = 3


def parse_graph_options(text: str) -> dict[str, Any]:
    """The options of ``--fxverify-random-graph-options``: a JSON object of ``graph_from_seed``
    keywords (``graph_modules``'s options), checked by building one graph with them.
    Raises ValueError saying what is wrong.

    >>> parse_graph_options('{"dtypes": ["float32", "int64"], "max_nodes": 6}')
    {'dtypes': ['float32', 'int64'], 'max_nodes': 6}
    """
    example = '\'{"dtypes": ["float32", "int64"], "max_nodes": 20, "allow_inplace": true}\''
    if not text.strip():
        return {}
    try:
        options = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{text!r} is not JSON ({exc}); give an object such as {example}") from None
    if not isinstance(options, dict):
        raise ValueError(f"{text!r} is not a JSON object; give one such as {example}")
    known = [name for name in inspect.signature(graph_from_seed).parameters if name != "seed"]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"{text!r} names {', '.join(unknown)}, which graph_modules() does not take; "
                         f"its options are {', '.join(known)}")
    try:
        graph_from_seed(0, **options)
    except InvalidArgument as exc:
        raise ValueError(f"{text!r}: {exc}") from None
    return options


@functools.lru_cache(maxsize=64)
def draw_graph(seed: int, options: str = "{}") -> GraphCase:
    """The graph for ``seed``: ``graph_from_seed(seed, **json.loads(options))``."""
    return graph_from_seed(seed, **json.loads(options))


def random_graph(seed: int, **options: Any) -> fx.GraphModule:
    """A fresh copy of the GraphModule for ``seed`` and ``graph_modules`` options (the factory of
    random-graph entries)."""
    return copy.deepcopy(draw_graph(seed, _canonical(options)).module)


def entry_for(seed: int, options: dict[str, Any] | None = None) -> CorpusEntry:
    """The corpus entry of the graph for ``seed`` (and ``graph_modules`` options)."""
    options = options or {}
    case = draw_graph(seed, _canonical(options))
    return CorpusEntry(
        name=f"{PREFIX}{seed}",
        source="user",
        factory="fxverify.strategies.corpus:random_graph",
        kwargs={"seed": seed, **options},
        inputs=case.inputs,
        batch_sizes=(case.inputs[0].shape[0],),
        tags=(RANDOM_GRAPH_TAG,),
        profiles=("random",),
    )


def _canonical(options: dict[str, Any]) -> str:
    return json.dumps(options, sort_keys=True)


class RandomGraphs:
    """A pytest plugin object: the random-graph entries of this run (the replayed seeds,
    then ``count`` fresh ones, built with ``options``), and the example database that
    remembers the seeds of failing ones (one key per set of transforms and options).
    xdist workers take the controller's seeds."""

    def __init__(self, config: pytest.Config, count: int, transforms: list[str],
                 options: dict[str, Any] | None = None) -> None:
        self.options = options or {}
        self.database = DirectoryBasedExampleDatabase(str(Path(config.rootpath) / DATABASE_DIR))
        workerinput = getattr(config, "workerinput", None)
        self.probes: list[Probe] = []
        if workerinput is not None and WORKER_OPTIONS in workerinput:
            self.options = dict(workerinput[WORKER_OPTIONS])
        elif "ops" not in self.options:  # guided: draw from the ops the transforms rewrite
            self.probes = [probe_ops(spec, **self.options) for spec in transforms]
            rewritten = sorted({name for probe in self.probes for name in probe.rewritten})
            if rewritten:
                self.options = {**self.options, "ops": rewritten}
        key = f"fxverify-random-graphs-v{SEED_FORMAT}:" + ",".join(sorted(transforms))
        self.key = (key + (f":{_canonical(self.options)}" if self.options else "")).encode()
        if workerinput is not None and WORKER_SEEDS in workerinput:
            self.replayed: list[int] = []  # the controller replays and forgets; workers only run
            self.seeds = [int(seed) for seed in workerinput[WORKER_SEEDS]]
        else:
            self.replayed = sorted(int(value.decode()) for value in self.database.fetch(self.key))
            fresh = [random.getrandbits(32) for _ in range(count)]
            self.seeds = list(dict.fromkeys(self.replayed + fresh))
        self.failed: set[int] = set()
        self.passed: set[int] = set()
        self.entries = [entry_for(seed, self.options) for seed in self.seeds]

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """xdist: every worker collects the controller's seeds and options (the ops its probe chose),
        whatever the database holds by then."""
        node.workerinput[WORKER_SEEDS] = list(self.seeds)
        node.workerinput[WORKER_OPTIONS] = dict(self.options)

    def pytest_report_header(self) -> list[str]:
        fresh = len(self.seeds) - len(self.replayed)
        lines = [f"fxverify: {len(self.seeds)} random graphs ({len(self.replayed)} replayed from the example "
                 f"database {DATABASE_DIR}/, {fresh} new); rebuild one with "
                 f"fxverify.strategies.graph_from_seed(<seed>{''.join(f', {k}={v!r}' for k, v in self.options.items())})"]
        lines += [f"fxverify: {probe.describe()}" for probe in self.probes]
        return lines

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Save the seed of a random graph as soon as one of its items fails."""
        if report.when != "call" and not report.failed:
            return
        for seed in self.seeds:
            if f"{PREFIX}{seed}-" in report.nodeid:
                if report.failed:
                    self.failed.add(seed)
                    self.database.save(self.key, str(seed).encode())
                elif report.passed:  # a skip proves nothing: the seed stays saved
                    self.passed.add(seed)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Forget replayed seeds whose items all passed this time (on the xdist controller, or alone)."""
        if getattr(session.config, "workerinput", None) is not None:
            return
        for seed in self.replayed:
            if seed in self.passed and seed not in self.failed:
                self.database.delete(self.key, str(seed).encode())
