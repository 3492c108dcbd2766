"""``graphs_with_pattern()``: random graphs embedding one or more instances of a
rewrite pattern (a Python function, as for ``torch.fx.replace_pattern``).

Random producers feed the pattern's inputs (shapes broadcast against each other
unless ``broadcast=False``), random consumers use its outputs, and with
``expose_internals`` values computed inside the pattern get users outside it,
the case a matcher must not rewrite.

>>> import torch
>>> from hypothesis import given
>>> @given(graphs_with_pattern(lambda x, y: torch.relu(x + y), max_nodes=6))
... def test_embeds(case):
...     assert case.instances >= 1 and any(n.target is torch.relu for n in case.module.graph.nodes)
>>> test_embeds()
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from torch import fx

from fxverify.recording import RecordingInterpreter
from fxverify.result import exception_summary as exc_summary
from fxverify.strategies.builder import Builder, Limits, Value
from fxverify.strategies.graphs import (
    DEFAULT_DTYPES, GraphCase, Plan, _input_spec, _validate_bool, _validate_int, grow, seeded, select_ops,
    validate_dtypes,
)
from fxverify.strategies.meta import Meta


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
    the pattern may get users outside it; ``ops``: catalogue ops for the surroundings::

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
    seed = draw(st.integers(0, 2**16 - 1))
    instances = draw(st.integers(1, embedding.max_instances))
    budget = plan.limits.max_nodes
    pattern_nodes = sum(1 for n in embedding.traced.graph.nodes if n.op not in ("placeholder", "output"))
    limits = dataclasses.replace(plan.limits, max_nodes=instances * (budget + pattern_nodes))
    with seeded(seed):
        builder = Builder(draw, limits)
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
    feeds = [first]
    for _ in placeholders[1:]:
        if embedding.broadcast:
            other, _ = b.operand(first.meta, (first.meta.dtype,), scalar=False, same_dtype=True)
        else:
            found = b.candidates(lambda v: v.meta == first.meta)
            other = found[b.index(len(found))] if found and b.flag() else b.new_input(first.meta)
        feeds.append(other)
    metas = _propagate(embedding, [f.meta for f in feeds])
    env = {p: f.node for p, f in zip(placeholders, feeds)}
    outputs: list[Value] = []
    for node in embedding.traced.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "output":
            results = node.args[0] if isinstance(node.args[0], (tuple, list)) else [node.args[0]]
            outputs.extend(b.add(Value(env[out], metas[out.name])) for out in results)
            continue
        if node.op in ("get_attr", "call_module"):
            raise InvalidArgument(f"the pattern {embedding.pattern!r} uses {node.op} nodes; use plain tensor functions")
        env[node] = b.graph.node_copy(node, lambda n: env[n])
        b.used += 1
        if embedding.expose_internals and node.name in metas and b.flag():
            b.add(Value(env[node], metas[node.name]))
    return outputs


def _first_input(b: Builder, embedding: Embedding) -> Value:
    """An existing value the pattern can take first (a producer), else a new input."""
    low, high = embedding.ranks
    found = b.candidates(lambda v: v.meta.dtype in b.limits.dtypes and low <= v.meta.rank <= high)
    pick = b.draw(st.integers(0, len(found)))
    if pick < len(found):
        return found[pick]
    meta = Meta(b.shape(b.draw(st.integers(low, high))), b.dtype(b.limits.dtypes))
    return b.new_input(meta)


def _propagate(embedding: Embedding, metas: list[Meta]) -> dict[str, Meta]:
    """The meta of every tensor node of the pattern for these input metas (run on the meta device)."""
    traced = embedding.traced
    args = [torch.empty(m.shape, dtype=m.dtype, device="meta") for m in metas]
    recorder = RecordingInterpreter(traced, {n.name for n in traced.graph.nodes})
    try:
        recorder.run(*args)
    except Exception as exc:
        shapes = ", ".join(str(m) for m in metas)
        hint = "pass broadcast=False for equal shapes, or narrow ranks= / dtypes=" if embedding.broadcast else \
            "narrow ranks= / dtypes= to what the pattern accepts"
        raise InvalidArgument(
            f"the pattern {embedding.pattern!r} ({inspect.signature(embedding.pattern)}) raised on inputs {shapes}: "
            f"{exc_summary(exc)}; {hint}"
        ) from None
    return {name: Meta(tuple(value.shape), value.dtype) for name, value in recorder.values.items()
            if isinstance(value, torch.Tensor)}
