"""Which catalogue ops a transform rewrites, learned by running it on tiny graphs.

Random graphs drawn from the whole catalogue rarely hold what a pass rewrites:
a dropout remover or a division folder changes none of twenty default graphs,
and everything then passes without having verified anything. :func:`probe_ops`
gives the transform, for each catalogue op, a few graphs made of that op alone
(``graph_from_seed(seed, ops=[op], max_nodes=3)``, or as many nodes as a composition
such as ``hand.softmax`` emits), side by side in one module (:func:`side_by_side`: one capture
per op, as an export costs ten symbolic traces) captured the way corpus models are under each
capture of the run (``captures``: a symbolic trace by default; under ``export`` the transform
gets ``ep.module()``, ATen ops, as an ATen pass does), and applies the transform through that
capture; an op is *rewritten* when the transform changes the graph or the parameters, or raises
(a crash is what random graphs are for). The compositions (``hand.swish``...) go first: the budget
may run out before the last ops under export. ``pytest --fxverify-random-graphs N`` then draws its
graphs from the rewritten ops.

>>> import torch
>>> def relu_to_clamp(gm):
...     for node in gm.graph.find_nodes(op="call_function", target=torch.nn.functional.relu):
...         node.target, node.kwargs = torch.clamp, {"min": 0.0}
...     gm.recompile()
>>> found = probe_ops(relu_to_clamp, ops=["F.relu", "add", "tanh"])
>>> found.rewritten, found.probed
(('F.relu',), 3)
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis.errors import InvalidArgument
from torch import fx, nn

from fxverify.analysis.module_state import Snapshot
from fxverify.core.captures import DEFAULT_CAPTURE
from fxverify.core.transform import Transform, as_transform
from fxverify.errors import TransformFailed
from fxverify.strategies.graphs import GraphCase, graph_from_seed
from fxverify.strategies.ops import BY_NAME, CATALOGUE, FAMILIES

PROBE_SEEDS = (0, 1, 2)  # graphs per op: one op alone in a chain, on an input, or shared by two users
PROBE_NODES = 3  # the most nodes of a probe graph, or the fewest a composition emits where that is more
BUDGET_SECONDS = 60.0  # the whole probe; what is left unprobed is said
COMPOSITIONS = frozenset(FAMILIES.get("composition", ()))  # probed first: few, and what pattern passes target
_MISSING = object()


@dataclasses.dataclass(frozen=True)
class Probe:
    """What probing ``transform`` (its spec) found: the ops it ``rewritten`` (changed or raised on),
    those of them it ``raised`` on, how many ops were ``probed`` of how many ``usable`` under the
    options, and the ``seconds`` it took of its ``budget``; ``captures``: the captures its graphs were
    made with (empty: the default, a symbolic trace); ``uncaptured``: probed ops none of whose graphs
    the captures took."""

    transform: str
    rewritten: tuple[str, ...]
    raised: tuple[str, ...]
    probed: int
    usable: int
    seconds: float
    budget: float
    captures: tuple[str, ...] = ()
    uncaptured: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for the run header.

        >>> Probe("my.pass", ("F.relu",), (), 256, 256, 5.2, 60.0).describe()
        'probed my.pass on graphs of each of 256 ops in 5.2 s; it rewrote 1 (F.relu)'
        >>> Probe("my.pass", ("hand.swish",), (), 272, 272, 41.0, 60.0, ("export",)).describe()
        'probed my.pass on export graphs of each of 272 ops in 41.0 s; it rewrote 1 (hand.swish)'
        """
        if not self.rewritten:
            found = "changed none of them"
        else:
            shown = ", ".join(self.rewritten[:12]) + (f" and {len(self.rewritten) - 12} more"
                                                      if len(self.rewritten) > 12 else "")
            found = f"rewrote {len(self.rewritten)} ({shown})"
        partial = "" if self.probed == self.usable else f" (of {self.usable}: the probe's {self.budget:g} s ran out)"
        where = "" if all(c == DEFAULT_CAPTURE for c in self.captures) else " and ".join(self.captures) + " "
        missed = ""
        if self.uncaptured:
            names = ", ".join(self.uncaptured[:6]) + (" and more" if len(self.uncaptured) > 6 else "")
            missed = f"; {len(self.uncaptured)} did not capture ({names})"
        return (f"probed {self.transform} on {where}graphs of each of {self.probed} ops{partial} in "
                f"{self.seconds:.1f} s; it {found}{missed}")


def probe_captures(transform: Transform, captures: Sequence[str]) -> tuple[str, ...]:
    """The captures to probe ``transform`` under: those of ``captures`` (the run's) its contract is written
    for, or where it names none of them, the ones it names (its items are skipped anyway); empty: the
    default capture.

    >>> import fxverify
    >>> aten = as_transform(fxverify.contract(captures=("export", "export_core"))(lambda gm: gm))
    >>> probe_captures(aten, ["symbolic_trace", "export"]), probe_captures(aten, ["make_fx"])
    (('export',), ('export', 'export_core'))
    """
    contract = transform.contract
    chosen = tuple(name for name in dict.fromkeys(captures) if contract.supports_capture(name))
    return chosen or tuple(contract.captures or ())


def probe_ops(transform: Transform | Callable[..., Any] | str, *, ops: Sequence[str] | None = None,
              captures: Sequence[str] = (), timeout: float = 10.0, budget: float = BUDGET_SECONDS,
              kept: dict[Any, Any] | None = None, **options: Any) -> Probe:
    """Run ``transform`` on tiny graphs of each catalogue op (``ops``, default all) built with the
    other ``graph_modules`` ``options``, captured by each of ``captures`` (capture names, as
    ``--fxverify-capture`` takes them; none: the default capture) that the transform's contract is
    written for (:func:`probe_captures`); see the module docstring. ``kept``: a dict keeping the captures
    that cost more than copying (exports) between calls, so that probing several transforms exports each
    op's graphs once."""
    transform = as_transform(transform)
    names = list(ops) if ops is not None else [op.name for op in CATALOGUE]
    order = sorted(names, key=lambda name: name not in COMPOSITIONS)  # what pattern passes target, before the budget ends
    chosen: tuple[str | None, ...] = probe_captures(transform, captures) or (None,)
    training = transform.contract.primary_mode == "train"
    kept = {} if kept is None else kept
    given = json.dumps(options, sort_keys=True, default=str)
    start = time.monotonic()
    rewritten: list[str] = []
    raised: list[str] = []
    uncaptured: list[str] = []
    probed = usable = 0
    for name in order:
        graphs = _graphs_of(name, options)
        if not graphs:
            continue
        usable += 1
        if time.monotonic() - start > budget:
            continue
        probed += 1
        outcomes = {_outcome(transform, graphs, capture, training, timeout, kept, (name, given, capture, training,
                                                                                  transform.form))
                    for capture in chosen}
        if outcomes & {"changed", "raised"}:
            rewritten.append(name)
            if "raised" in outcomes:
                raised.append(name)
        elif outcomes == {"uncaptured"}:
            uncaptured.append(name)
    def listed(found: list[str]) -> tuple[str, ...]:
        return tuple(sorted(found, key=names.index))

    return Probe(transform.spec, listed(rewritten), listed(raised), probed, usable, time.monotonic() - start, budget,
                 tuple(c for c in chosen if c is not None), listed(uncaptured))


def _graphs_of(name: str, options: dict[str, Any]) -> list[GraphCase]:
    """The probe graphs of op ``name`` under ``options``; none when the options rule the op out."""
    op = BY_NAME.get(name)
    nodes = max(PROBE_NODES, op.cost) if op is not None else PROBE_NODES
    chosen = {**options, "ops": [name], "max_nodes": nodes, "min_nodes": 1}
    try:
        return [graph_from_seed(seed, **chosen) for seed in PROBE_SEEDS]
    except InvalidArgument:  # no dtype, rank or module setting of the options lets this op in
        return []


def side_by_side(graphs: Sequence[nn.Module], arity: Sequence[int]) -> fx.GraphModule:
    """Graphs side by side in one module (``graph0``, ``graph1``...): its inputs are theirs one after the
    other (``arity``: how many each takes), its output the tuple of their outputs. The probe captures an
    op's graphs together (an export costs ten symbolic traces)."""
    root, graph = nn.Module(), fx.Graph()
    inputs = [graph.placeholder(f"x{i}") for i in range(sum(arity))]
    outputs, used = [], 0
    for i, (module, count) in enumerate(zip(graphs, arity, strict=True)):
        root.add_module(f"graph{i}", module)
        outputs.append(graph.call_module(f"graph{i}", tuple(inputs[used:used + count])))
        used += count
    graph.output(tuple(outputs))
    return fx.GraphModule(root, graph, class_name="SideBySide")


def _captured(graphs: Sequence[GraphCase], capture: Any, training: bool) -> fx.GraphModule | None:
    """``graphs`` side by side, captured as corpus models are (a fresh copy in the mode, from example inputs);
    where the capture does not take them together, the first it takes alone; None where it takes none (the
    capture's limits, such as an op export cannot take, are not the transform's doing)."""
    for chosen in (graphs, *([case] for case in graphs)):
        module = side_by_side([case.build(training=training) for case in chosen], [len(case.inputs) for case in chosen])
        inputs = tuple(tensor for case in chosen for tensor in case.example_inputs())
        try:
            return capture.capture(module.train(training), training=training, inputs=inputs)
        except Exception:
            if len(graphs) == 1:
                break
    return None


def _outcome(transform: Transform, graphs: Sequence[GraphCase], capture_name: str | None, training: bool,
             timeout: float, kept: dict[Any, Any], key: Any) -> str | None:
    """``"changed"`` or ``"raised"`` when the transform rewrote ``graphs`` (side by side) captured by
    ``capture_name`` (None: the graphs' own capture) or raised on them, ``"uncaptured"`` when the capture
    takes none of them, else None. A capture that ``keeps_captures`` is kept in ``kept`` under ``key`` and
    copied for each use."""
    first = graphs[0]
    capture = (first.capture if capture_name is None else first.capture_named(capture_name)).for_transform(transform)
    captured = kept.get(key, _MISSING)
    if captured is _MISSING:
        captured = _captured(graphs, capture, training)
        if captured is None or capture.keeps_captures:
            kept[key] = captured
    if captured is None:
        return "uncaptured"
    gm = copy.deepcopy(captured) if capture.keeps_captures else captured
    before = Snapshot.take(gm)
    try:
        result, _ = capture.apply(transform, gm, timeout=timeout)
    except TransformFailed:
        return "raised"
    return "changed" if {"graph", "state"} & set(before.differences(result)) else None
