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
WORKER_GRAPHS = "fxverify_random_graphs"  # xdist workerinput: [[seed, options], ...] from the controller
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
    """A pytest plugin object: the random-graph entries of this run (the replayed graphs, then
    ``count`` fresh ones), and the example database that remembers failing ones (one key per set
    of transforms and options). Fresh graphs are drawn with ``options``, from the ops the
    transforms rewrite unless ``options`` names ``ops``; a saved graph keeps the options it was
    drawn with, so it is the same graph when replayed whatever a later probe finds. xdist workers
    take the controller's graphs."""

    def __init__(self, config: pytest.Config, count: int, transforms: list[str],
                 options: dict[str, Any] | None = None) -> None:
        self.options = options or {}
        self.database = DirectoryBasedExampleDatabase(str(Path(config.rootpath) / DATABASE_DIR))
        key = f"fxverify-random-graphs-v{SEED_FORMAT}:" + ",".join(sorted(transforms))
        self.key = (key + (f":{_canonical(self.options)}" if self.options else "")).encode()
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

    @property
    def seeds(self) -> list[int]:
        return list(self.graphs)

    def _guided(self, transforms: list[str]) -> dict[str, Any]:
        """The options of fresh graphs: the user's, with ``ops`` set to the ops the transforms rewrite
        (when the user named none and a probe finds some, but not all)."""
        if "ops" in self.options:
            return self.options
        self.probes = [probe_ops(spec, **self.options) for spec in transforms]
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
        return lines

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Save a random graph (its seed and options) as soon as one of its items fails."""
        if report.when != "call" and not report.failed:
            return
        for seed, options in self.graphs.items():
            if f"{PREFIX}{seed}-" in report.nodeid:
                if report.failed:
                    self.failed.add(seed)
                    self.database.save(self.key, self.saved.get(seed) or _encode(seed, options))
                elif report.passed:  # a skip proves nothing: the seed stays saved
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
