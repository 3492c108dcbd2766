"""What the observers of a PT2E prepared graph promise, read from the graph ``prepare_pt2e`` made and the quantizer's
annotations, and the problems a pass over such a graph (one that runs before calibration) can make of them
(:func:`observer_problems`, the prepared graph before the pass against the one after):

- ``unobserved``: an input that ``prepare_pt2e`` observed (an edge the quantizer annotated: the consumer's
  ``input_qspec_map``, or the producer's ``output_qspec``) is read unobserved: no q/dq pair will stand there after
  ``convert_pt2e``, and the consumer is not lowered as a quantized op;
- ``split``: edges of several values one observer module observed (a sharing group: a ``SharedQuantizationSpec``,
  as XNNPACK's ``cat`` and ``max_pool2d``) are observed by several modules: calibrated apart, they get different
  scales (one value read by several consumers, observed apart, gives the same scale each time: not a problem);
- ``merged``: edges of different sharing groups are observed by one module;
- ``unannotated``: an observer on a value ``prepare_pt2e`` observed nowhere, on an edge nobody annotated (the
  consumer's ``input_qspec_map`` does not name the input, the producer has no ``output_qspec``; a pass that
  replaces a consumer of an observed value may leave the new one reading its observer);
- ``chained``: an observer observing an observer.

An edge is a consumer and the position of the input among the nodes its arguments read (``map_arg`` order), so
what a pass leaves of the consumer it is given is compared by name; a consumer the pass removed has nothing to
compare. Nothing here re-derives what ``prepare_pt2e`` would do: the graph before the pass is the expectation.
:func:`fxverify.capture.pt2e.calibrated_and_converted` finishes the flow after the pass.

>>> import torch
>>> from torch import fx, nn
>>> from torchao.quantization.pt2e.observer import MinMaxObserver
>>> root, g = nn.Module(), fx.Graph()
>>> root.obs = MinMaxObserver()
>>> x = g.placeholder("x")
>>> _ = g.output(g.call_function(torch.relu, (g.call_module("obs", (x,)),)))
>>> before = fx.GraphModule(root, g)
>>> after = fx.GraphModule(root, fx.Graph())
>>> y = after.graph.placeholder("x")
>>> _ = after.graph.output(after.graph.call_function(torch.relu, (y,)))
>>> [p.describe() for p in observer_problems(before, after)]  # doctest: +NORMALIZE_WHITESPACE
['%relu: reads %x unobserved (input 0), where prepare_pt2e observed it with MinMaxObserver obs (not annotated)
  (unobserved)']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping

from torch import fx

from fxverify.analysis.module_state import resolve
from fxverify.analysis.node_map import correspondence
from fxverify.analysis.qdq import OBSERVER_WORDS, Problem

ANNOTATION = "quantization_annotation"  # node.meta key of a PT2E quantizer's annotation


@dataclasses.dataclass(frozen=True)
class Edge:
    """An observed edge: ``consumer`` reads, at ``position`` among its input nodes, the ``observer`` node (calling
    the module at ``target``, a module ``group`` names by identity) that observes ``source``."""

    consumer: str
    position: int
    observer: str
    target: str
    group: int
    source: str

    @property
    def key(self) -> tuple[str, int]:
        return self.consumer, self.position


def is_observer(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether ``node`` calls an observer or fake-quantize module of ``gm`` (what ``prepare_pt2e`` inserts; not the
    export's ``_guards_fn``)."""
    if node.op != "call_module":
        return False
    try:
        module = resolve(gm, str(node.target))
    except AttributeError:
        return False
    return any(word in type(module).__name__ for word in OBSERVER_WORDS)


def inputs_of(node: fx.Node) -> list[fx.Node]:
    """The nodes ``node`` reads, in the order of its arguments (a node read twice counted twice).

    >>> import torch
    >>> g = fx.Graph()
    >>> x, y = g.placeholder("x"), g.placeholder("y")
    >>> [n.name for n in inputs_of(g.call_function(torch.cat, ([x, y, x],), {"dim": 0}))]
    ['x', 'y', 'x']
    """
    found: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), found.append)
    return found


def observed_source(gm: fx.GraphModule, observer: fx.Node) -> str:
    """The name of the node ``observer`` observes: its input, through any observer observing an observer (the
    input's text where a pass left it observing a constant)."""
    source = observer.args[0] if observer.args else None
    while isinstance(source, fx.Node) and is_observer(gm, source):
        source = source.args[0] if source.args else None
    return source.name if isinstance(source, fx.Node) else repr(source)


def observed_edges(gm: fx.GraphModule, alias: Mapping[str, str] | None = None) -> dict[tuple[str, int], Edge]:
    """Every edge of ``gm`` read through an observer, by (consumer, position), the consumer named as ``alias`` names
    it (a result's nodes by the original's names: :func:`aliases`); an observer reading an observer is not an edge
    (see ``chained``).

    >>> import torch
    >>> from torch import nn
    >>> from torchao.quantization.pt2e.observer import MinMaxObserver
    >>> root, g = nn.Module(), fx.Graph()
    >>> root.obs = MinMaxObserver()
    >>> x = g.placeholder("x")
    >>> _ = g.output(g.call_function(torch.relu, (g.call_module("obs", (x,)),)))
    >>> gm = fx.GraphModule(root, g)
    >>> [(key, edge.observer, edge.source) for key, edge in observed_edges(gm).items()], observer_count(gm)
    ([(('relu', 0), 'obs', 'x')], (1, 1))
    """
    alias = alias or {}
    edges = {}
    for node in gm.graph.nodes:
        if is_observer(gm, node):
            continue
        for position, read in enumerate(inputs_of(node)):
            if is_observer(gm, read):
                edge = Edge(node.name, position, read.name, str(read.target), id(resolve(gm, str(read.target))),
                            observed_source(gm, read))
                edges[alias.get(node.name, node.name), position] = edge
    return edges


def aliases(original: fx.GraphModule, result: fx.GraphModule) -> dict[str, str]:
    """The original's name of each node of ``result`` that corresponds to one
    (:func:`fxverify.analysis.node_map.correspondence`: by name, provenance, then position)."""
    return {new.name: match.original.name for new, match in correspondence(original, result).items()}


def annotation(gm: fx.GraphModule, consumer: str, source: str, *, also: str | None = None) -> str | None:
    """Where the quantizer asked for the edge from ``source`` to ``consumer`` (nodes of ``gm``) to be observed
    (``"input_qspec_map of %consumer"``, ``"output_qspec of %source"``), or None: nobody annotated it. Annotations
    name nodes by name (a copy of a graph shares its nodes' annotations, which then hold the first graph's nodes):
    ``also`` is another name of ``source`` (the original's)."""
    nodes = {node.name: node for node in gm.graph.nodes}
    reader = nodes.get(consumer)
    found = reader.meta.get(ANNOTATION) if reader is not None else None
    if found is not None and any(key.name in (source, also) and spec is not None
                                 for key, spec in found.input_qspec_map.items()):
        return f"input_qspec_map of %{consumer}"
    producer = nodes.get(source)
    found = producer.meta.get(ANNOTATION) if producer is not None else None
    if found is not None and found.output_qspec is not None:
        return f"output_qspec of %{source}"
    return None


def observer_problems(before: fx.GraphModule, after: fx.GraphModule) -> list[Problem]:
    """The problems of ``after`` (a pass's result) that ``before`` (the prepared graph it was given) does not have,
    in the order of :mod:`this module <fxverify.analysis.observers>`'s list."""
    alias = aliases(before, after)
    was, now = observed_edges(before), observed_edges(after, alias)
    counterpart = {alias[node.name]: node for node in after.graph.nodes if node.name in alias}
    unobserved = list(_unobserved(before, was, now, counterpart))
    bypassed = [p for p in _bypassed(before, after, alias, counterpart) if p.node not in {u.node for u in unobserved}]
    return [*unobserved, *bypassed, *_split(was, now), *_merged(was, now),
            *_unannotated(after, was, now, alias), *_chained(before, after, alias)]


def _describe(gm: fx.GraphModule, edge: Edge) -> str:
    return f"{type(resolve(gm, edge.target)).__name__} {edge.target}"


def _unobserved(before: fx.GraphModule, was: dict[tuple[str, int], Edge], now: dict[tuple[str, int], Edge],
                counterpart: dict[str, fx.Node]) -> Iterator[Problem]:
    for key, edge in was.items():
        consumer = counterpart.get(edge.consumer)
        if key in now or consumer is None or edge.position >= len(inputs_of(consumer)):
            continue  # still observed, or the pass replaced the consumer: nothing to compare
        read = inputs_of(consumer)[edge.position]
        asked = annotation(before, edge.consumer, edge.source) or "not annotated"
        yield Problem("unobserved", consumer.name, f"reads %{read.name} unobserved (input {edge.position}), where "
                                                   f"prepare_pt2e observed it with {_describe(before, edge)} ({asked})")


def _bypassed(before: fx.GraphModule, after: fx.GraphModule, alias: Mapping[str, str],
              counterpart: dict[str, fx.Node]) -> Iterator[Problem]:
    """Where the pass replaced the consumers of an observer: the observer read by nobody now, and a new node reading
    the value it observed directly."""
    for observer in before.graph.nodes:
        if not is_observer(before, observer) or not observer.users:
            continue
        now = counterpart.get(observer.name)
        source = counterpart.get(observed_source(before, observer))
        if (now is not None and now.users) or source is None:
            continue
        before_source = next(n for n in before.graph.nodes if n.name == alias.get(source.name, source.name))
        direct = {user.name for user in before_source.users if not is_observer(before, user)}
        new = [user for user in source.users if not is_observer(after, user) and alias.get(user.name) not in direct]
        if new:
            readers = ", ".join(f"%{user.name}" for user in observer.users)
            yield Problem("unobserved", new[0].name, f"reads %{source.name} unobserved, where prepare_pt2e observed it "
                                                     f"with {type(resolve(before, str(observer.target))).__name__} "
                                                     f"{observer.target} for {readers}, which the pass replaced; that "
                                                     "observer is read by nobody now")


def _groups(edges: dict[tuple[str, int], Edge]) -> dict[int, list[tuple[tuple[str, int], Edge]]]:
    grouped: dict[int, list[tuple[tuple[str, int], Edge]]] = {}
    for key, edge in edges.items():
        grouped.setdefault(edge.group, []).append((key, edge))
    return grouped


def _split(was: dict[tuple[str, int], Edge], now: dict[tuple[str, int], Edge]) -> Iterator[Problem]:
    for group in _groups(was).values():
        if len({edge.source for _, edge in group}) < 2:
            continue  # one value read by several consumers: observers apart see the same values, give the same scale
        kept = [now[key] for key, _ in group if key in now]
        first = kept[0] if kept else None
        apart = next((edge for edge in kept if first is not None and edge.group != first.group), None)
        if first is not None and apart is not None:
            yield Problem("split", apart.observer, f"%{apart.consumer} reads observer {apart.target}, another module "
                                                   f"than {first.target} that %{first.consumer} reads: prepare_pt2e "
                                                   f"made them one sharing group (one observer module, "
                                                   f"{group[0][1].target}), so convert_pt2e would give them different "
                                                   "scales")


def _merged(was: dict[tuple[str, int], Edge], now: dict[tuple[str, int], Edge]) -> Iterator[Problem]:
    owner = {key: edge.group for key, edge in was.items()}
    for group in _groups(now).values():
        before = {owner[key] for key, _ in group if key in owner}
        if len(before) > 1:
            first, edge = group[0][1], group[-1][1]
            yield Problem("merged", edge.observer, f"observer {edge.target} observes edges of {len(before)} sharing "
                                                   f"groups that prepare_pt2e observed apart (%{first.consumer} "
                                                   f"and %{edge.consumer} among them): they would share one scale")


def _unannotated(after: fx.GraphModule, was: dict[tuple[str, int], Edge], now: dict[tuple[str, int], Edge],
                 alias: Mapping[str, str]) -> Iterator[Problem]:
    watched = {edge.source for edge in was.values()}  # a new reader of a value prepare_pt2e observed is no new edge
    for key, edge in now.items():
        if key in was or alias.get(edge.source, edge.source) in watched:
            continue
        if annotation(after, edge.consumer, edge.source, also=alias.get(edge.source)) is None:
            yield Problem("unannotated", edge.observer, f"observer {edge.target} on the edge from %{edge.source} to "
                                                        f"%{edge.consumer}, which the quantizer did not annotate "
                                                        "(no input_qspec_map entry, no output_qspec)")


def _chained(before: fx.GraphModule, after: fx.GraphModule, alias: Mapping[str, str]) -> Iterator[Problem]:
    had = {node.name for node in before.graph.nodes if is_observer(before, node) and node.args
           and isinstance(node.args[0], fx.Node) and is_observer(before, node.args[0])}
    for node in after.graph.nodes:
        inner = node.args[0] if is_observer(after, node) and node.args else None
        if alias.get(node.name, node.name) not in had and isinstance(inner, fx.Node) and is_observer(after, inner):
            yield Problem("chained", node.name, f"observer {node.target} observes observer %{inner.name} "
                                                f"({inner.target}): convert_pt2e would quantize twice")


def observer_count(gm: fx.GraphModule) -> tuple[int, int]:
    """How many observer nodes ``gm`` has, and how many observer modules (sharing groups) they call."""
    called = [node for node in gm.graph.nodes if is_observer(gm, node)]
    return len(called), len({id(resolve(gm, str(node.target))) for node in called})
