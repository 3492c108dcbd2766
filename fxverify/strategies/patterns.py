"""``graphs_with_pattern()``: random graphs embedding one or more instances of a
rewrite pattern (a Python function, as for ``torch.fx.replace_pattern``).

Random producers feed the pattern's inputs (shapes broadcast against each other
unless ``broadcast=False``; for a pattern that needs matmul-like shapes, every other
input has the last two dims swapped), random consumers use its outputs, and with
``expose_internals`` values computed inside the pattern get users outside it,
the case a matcher must not rewrite. Drawn shapes the pattern still rejects are
filtered out (``hypothesis.reject``).

>>> import torch
>>> from hypothesis import given
>>> @given(graphs_with_pattern(lambda x, y: torch.relu(x + y), max_nodes=6))
... def test_embeds(case):
...     assert case.instances >= 1 and any(n.target is torch.relu for n in case.module.graph.nodes)
>>> test_embeds()
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from hypothesis import reject
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from torch import fx

from fxverify.analysis.recording import RecordingInterpreter
from fxverify.core.results import exception_summary as exc_summary
from fxverify.strategies.builder import Builder, DrawnChoices, Limits, Value
from fxverify.strategies.graphs import (
    DEFAULT_DTYPES,
    GraphCase,
    Plan,
    _input_spec,
    _validate_bool,
    _validate_int,
    grow,
    seeded,
    select_ops,
    validate_dtypes,
)
from fxverify.strategies.meta import DTYPE_NAMES, Meta


class PatternCase(GraphCase):
    """A :class:`GraphCase` with ``instances`` copies of the pattern embedded."""

    def __init__(self, module: fx.GraphModule, inputs: tuple[Any, ...], predicted: Any, ops: tuple[str, ...],
                 instances: int) -> None:
        super().__init__(module, inputs, predicted, ops, name="pattern_graph")
        self.instances = instances


def _pattern_graph(pattern: Callable[..., Any]) -> fx.GraphModule:
    try:
        return fx.symbolic_trace(pattern)
    except Exception as exc:
        raise InvalidArgument(f"the pattern {pattern!r} does not trace with torch.fx.symbolic_trace: {exc}") from None


def graphs_with_pattern(
    pattern: Callable[..., Any],
    *,
    max_instances: int = 2,
    max_nodes: int = 10,
    dtypes: Sequence[torch.dtype | str] = DEFAULT_DTYPES,
    ranks: tuple[int, int] = (1, 3),
    broadcast: bool = True,
    expose_internals: bool = True,
    ops: Sequence[str] | None = None,
    max_side: int = 4,
) -> st.SearchStrategy[PatternCase]:
    """Graphs with 1 to ``max_instances`` copies of ``pattern`` inside random surroundings.

    ``max_nodes``: computation nodes of the surroundings, per instance; ``dtypes``: of the
    pattern's inputs (all the same dtype) and of the graph's inputs; ``ranks``: of the
    pattern's first input; ``broadcast``: other pattern inputs may have shapes that
    broadcast against the first (else equal shapes); ``expose_internals``: values inside
    the pattern may get users outside it; ``ops``: catalogue ops for the surroundings.
    A pattern that fails on equal shapes but runs with the last two dims of every other
    input swapped (``x @ y``, ``torch.bmm``) gets such inputs; drawn shapes it still
    rejects are filtered out, and one that fits no shape raises InvalidArgument::

        def pattern(x, y):
            return torch.relu(x + y)

        @given(graphs_with_pattern(pattern))
        def test_fusion(case): ...

    Shrinks towards one instance, few surrounding nodes, equal shapes, seed 0.
    """
    traced = _pattern_graph(pattern)
    limits = Limits(
        dtypes=validate_dtypes(dtypes),
        max_nodes=_validate_int("max_nodes", max_nodes, 0, 200),
        max_side=_validate_int("max_side", max_side, 1, 64),
        max_rank=4,
        allow_modules=True,
        allow_inplace=False,
    )
    _validate_int("max_instances", max_instances, 1, 16)
    if not (isinstance(ranks, tuple) and len(ranks) == 2 and 1 <= ranks[0] <= ranks[1] <= limits.max_rank):
        raise InvalidArgument(f"ranks must be (low, high) with 1 <= low <= high <= 4, but got ranks={ranks!r}")
    _validate_bool("broadcast", broadcast)
    _validate_bool("expose_internals", expose_internals)
    chosen = select_ops(ops, limits=limits)
    embedding = Embedding(pattern, traced, max_instances, ranks, broadcast, expose_internals)
    _check_fits_some_shape(embedding, limits)
    return _graphs_with_pattern(Plan(tuple(chosen), limits, 1), embedding)


@dataclasses.dataclass(frozen=True)
class Embedding:
    """How to embed the pattern (its repr is short: Hypothesis prints it)."""

    pattern: Callable[..., Any]
    traced: fx.GraphModule = dataclasses.field(repr=False)
    max_instances: int
    ranks: tuple[int, int]
    broadcast: bool
    expose_internals: bool


@st.composite
def _graphs_with_pattern(draw: Any, plan: Plan, embedding: Embedding) -> PatternCase:
    choices = DrawnChoices(draw)
    seed = choices.integer(0, 2**16 - 1)
    instances = choices.integer(1, embedding.max_instances)
    budget = plan.limits.max_nodes
    pattern_nodes = sum(1 for n in embedding.traced.graph.nodes if n.op not in ("placeholder", "output"))
    limits = dataclasses.replace(plan.limits, max_nodes=instances * (budget + pattern_nodes))
    with seeded(seed):
        builder = Builder(choices, limits)
        used: list[str] = []
        for _ in range(instances):
            used += grow(builder, plan.ops, builder.used, builder.used + budget // 2)
            embed(builder, embedding)
            used.append("<pattern>")
        used += grow(builder, plan.ops, builder.used, builder.used + budget - budget // 2)
        module, predicted = builder.finish()
    inputs = tuple(_input_spec(meta) for meta in builder.inputs)
    return PatternCase(module, inputs, predicted, tuple(used), instances)


def embed(b: Builder, embedding: Embedding) -> list[Value]:
    """Copy the pattern's nodes into the graph, fed by drawn values; returns its output values."""
    placeholders = [n for n in embedding.traced.graph.nodes if n.op == "placeholder"]
    if not placeholders:
        raise InvalidArgument(f"the pattern {embedding.pattern!r} takes no tensor inputs")
    first = _first_input(b, embedding)
    swapped = _needs_swapped(embedding, first.meta.rank, first.meta.dtype, len(placeholders))
    feeds = [first]
    for meta in _partners(first.meta, len(placeholders), swapped)[1:]:
        if embedding.broadcast and not swapped:
            other, _ = b.operand(first.meta, (first.meta.dtype,), scalar=False, same_dtype=True)
        else:
            def matches(v: Value, meta: Meta = meta) -> bool:
                return v.meta == meta
            found = b.candidates(matches)
            other = found[b.index(len(found))] if found and b.flag() else b.new_input(meta)
        feeds.append(other)
    metas = _run_on_meta(embedding, tuple(f.meta for f in feeds))
    if isinstance(metas, Exception):
        reject()  # shapes the pattern does not take (one that rarely fits fails the filter_too_much health check)
    env = {p: f.node for p, f in zip(placeholders, feeds)}
    outputs: list[Value] = []
    for node in embedding.traced.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "output":
            results = node.args[0] if isinstance(node.args[0], (tuple, list)) else [node.args[0]]
            # fresh=False: the pattern's values may be views of its inputs (in-place ops never write to them)
            outputs.extend(b.add(Value(env[out], metas[out.name], fresh=False)) for out in results)
            continue
        if node.op in ("get_attr", "call_module"):
            raise InvalidArgument(f"the pattern {embedding.pattern!r} uses {node.op} nodes; use plain tensor functions")
        env[node] = b.graph.node_copy(node, lambda n: env[n])
        b.used += 1
        if embedding.expose_internals and node.name in metas and b.flag():
            b.add(Value(env[node], metas[node.name], fresh=False))
    return outputs


def _first_input(b: Builder, embedding: Embedding) -> Value:
    """An existing value the pattern can take first (a producer), else a new input."""
    low, high = embedding.ranks
    found = b.candidates(lambda v: v.meta.dtype in b.limits.dtypes and low <= v.meta.rank <= high)
    pick = b.integer(0, len(found))
    if pick < len(found):
        return found[pick]
    meta = Meta(b.shape(b.integer(low, high)), b.dtype(b.limits.dtypes))
    return b.new_input(meta)


def _partners(first: Meta, count: int, swapped: bool) -> tuple[Meta, ...]:
    """``count`` input metas for the pattern: ``first``, and the same meta for every other
    input, or with ``swapped`` the last two dims swapped on every second one (``a @ b @ c``)."""
    other = Meta(first.shape[:-2] + first.shape[:-3:-1], first.dtype) if swapped else first
    return tuple(other if i % 2 else first for i in range(count))


@functools.lru_cache(maxsize=64)
def _needs_swapped(embedding: Embedding, rank: int, dtype: torch.dtype, count: int) -> bool:
    """Whether the pattern fails on equal shapes but runs with swapped ones (matmul-like),
    probed once per rank with sides 2, 3, 4, ..."""
    if rank < 2:
        return False
    probe = Meta(tuple(range(2, 2 + rank)), dtype)
    equal, swapped = (_run_on_meta(embedding, _partners(probe, count, s)) for s in (False, True))
    return isinstance(equal, Exception) and not isinstance(swapped, Exception)


@functools.lru_cache(maxsize=256)
def _run_on_meta(embedding: Embedding, metas: tuple[Meta, ...]) -> dict[str, Meta] | Exception:
    """The meta of every tensor node of the pattern for these input metas (run on the meta
    device), or the exception the pattern raised on them."""
    traced = embedding.traced
    args = [torch.empty(m.shape, dtype=m.dtype, device="meta") for m in metas]
    recorder = RecordingInterpreter(traced, {n.name for n in traced.graph.nodes})
    try:
        recorder.run(*args)
    except Exception as exc:
        return exc
    return {name: Meta(tuple(value.shape), value.dtype) for name, value in recorder.values.items()
            if isinstance(value, torch.Tensor)}


def _check_fits_some_shape(embedding: Embedding, limits: Limits) -> None:
    """InvalidArgument when the pattern raises on every probe shape: all-ones and 2, 3, 4, ...
    sides (capped at ``max_side``) at each allowed rank and dtype, equal or swapped."""
    count = sum(1 for n in embedding.traced.graph.nodes if n.op == "placeholder")
    low, high = embedding.ranks
    found: Any = None
    for dtype in limits.dtypes:
        for rank in range(low, high + 1):
            for shape in ((1,) * rank, tuple(min(limits.max_side, 2 + i) for i in range(rank))):
                for swapped in (False, True):
                    found = _run_on_meta(embedding, _partners(Meta(shape, dtype), count, swapped))
                    if not isinstance(found, Exception):
                        return
    raise InvalidArgument(
        f"the pattern {getattr(embedding.pattern, '__name__', embedding.pattern)}"
        f"{inspect.signature(embedding.pattern)} raised on every input shape "
        f"tried (ranks={embedding.ranks}, dtypes={tuple(DTYPE_NAMES[d] for d in limits.dtypes)}), last with "
        f"{exc_summary(found)}; narrow ranks= / dtypes= / max_side= to what the pattern accepts"
    )
