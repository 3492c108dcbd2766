"""Random graphs as corpus entries, built from seeds wherever they are needed (in another process
too: the factory of their entries is ``fxverify.strategies.corpus:random_graph``); the pytest side
of ``--fxverify-random-graphs`` is :mod:`fxverify.plugin.random_graphs`.

>>> random_graph(7).graph is not random_graph(7).graph, random_graph(7).code == random_graph(7).code
(True, True)
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
from typing import Any

from hypothesis.errors import InvalidArgument
from torch import fx

from fxverify.cases.catalogue import RANDOM_GRAPH_TAG, CorpusEntry
from fxverify.strategies.graphs import GraphCase, graph_from_seed

PREFIX = "random_graph_"
# Part of the database key: raise it when what a seed builds changes, so that the seeds
# saved for the old graphs are not replayed as other graphs.
SEED_FORMAT = 4


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
    return copy.deepcopy(draw_graph(seed, canonical(options)).module)


def entry_for(seed: int, options: dict[str, Any] | None = None) -> CorpusEntry:
    """The corpus entry of the graph for ``seed`` (and ``graph_modules`` options)."""
    options = options or {}
    case = draw_graph(seed, canonical(options))
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


def canonical(options: dict[str, Any]) -> str:
    """``options`` as one JSON string, keys sorted (a cache and database key)."""
    return json.dumps(options, sort_keys=True)
