"""Which catalogue ops a transform rewrites, learned by running it on tiny graphs.

Random graphs drawn from the whole catalogue rarely hold what a pass rewrites:
a dropout remover or a division folder changes none of twenty default graphs,
and everything then passes without having verified anything. :func:`probe_ops`
gives the transform, for each catalogue op, a few graphs made of that op alone
(``graph_from_seed(seed, ops=[op], max_nodes=3)``); an op is *rewritten* when the
transform changes the graph or the parameters of one of them, or raises on it
(a crash is what random graphs are for). ``pytest --fxverify-random-graphs N``
then draws its graphs from the rewritten ops.

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
import time
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis.errors import InvalidArgument

from fxverify.analysis.module_state import Snapshot
from fxverify.capture import for_entry
from fxverify.core.transform import Transform, as_transform
from fxverify.errors import TransformFailed
from fxverify.strategies import ops as catalogue
from fxverify.strategies.graphs import graph_from_seed

PROBE_SEEDS = (0, 1, 2)  # graphs per op: one op alone in a chain, on an input, or shared by two users
PROBE_NODES = 3
BUDGET_SECONDS = 60.0  # the whole probe; what is left unprobed is said
PROBE_CAPTURE = for_entry("plain")  # how the probe graphs were made: what a transform taking a tracer gets


@dataclasses.dataclass(frozen=True)
class Probe:
    """What probing ``transform`` (its spec) found: the ops it ``rewritten`` (changed or raised on),
    those of them it ``raised`` on, how many ops were ``probed`` of how many ``usable`` under the
    options, and the ``seconds`` it took of its ``budget``."""

    transform: str
    rewritten: tuple[str, ...]
    raised: tuple[str, ...]
    probed: int
    usable: int
    seconds: float
    budget: float

    def describe(self) -> str:
        """One line for the run header.

        >>> Probe("my.pass", ("F.relu",), (), 256, 256, 5.2, 60.0).describe()
        'probed my.pass on graphs of each of 256 ops in 5.2 s; it rewrote 1 (F.relu)'
        """
        if not self.rewritten:
            found = "changed none of them"
        else:
            shown = ", ".join(self.rewritten[:12]) + (f" and {len(self.rewritten) - 12} more"
                                                      if len(self.rewritten) > 12 else "")
            found = f"rewrote {len(self.rewritten)} ({shown})"
        partial = "" if self.probed == self.usable else f" (of {self.usable}: the probe's {self.budget:g} s ran out)"
        return f"probed {self.transform} on graphs of each of {self.probed} ops{partial} in {self.seconds:.1f} s; it {found}"


def probe_ops(transform: Transform | Callable[..., Any] | str, *, ops: Sequence[str] | None = None,
              timeout: float = 10.0, budget: float = BUDGET_SECONDS, **options: Any) -> Probe:
    """Run ``transform`` on tiny graphs of each catalogue op (``ops``, default all) built with the
    other ``graph_modules`` ``options``; see the module docstring."""
    transform = as_transform(transform)
    names = list(ops) if ops is not None else [op.name for op in catalogue.CATALOGUE]
    start = time.monotonic()
    rewritten: list[str] = []
    raised: list[str] = []
    probed = usable = 0
    for name in names:
        graphs = _graphs_of(name, options)
        if not graphs:
            continue
        usable += 1
        if time.monotonic() - start > budget:
            continue
        probed += 1
        for gm in graphs:
            outcome = _outcome(transform, gm, timeout)
            if outcome is not None:
                rewritten.append(name)
                if outcome == "raised":
                    raised.append(name)
                break
    return Probe(transform.spec, tuple(rewritten), tuple(raised), probed, usable, time.monotonic() - start, budget)


def _graphs_of(name: str, options: dict[str, Any]) -> list[Any]:
    """The probe graphs of op ``name`` under ``options``; none when the options rule the op out."""
    chosen = {**options, "ops": [name], "max_nodes": PROBE_NODES, "min_nodes": 1}
    try:
        return [graph_from_seed(seed, **chosen).module for seed in PROBE_SEEDS]
    except InvalidArgument:  # no dtype, rank or module setting of the options lets this op in
        return []


def _outcome(transform: Transform, gm: Any, timeout: float) -> str | None:
    """``"changed"`` or ``"raised"`` when the transform rewrote ``gm`` or raised on it, else None."""
    before = Snapshot.take(gm)
    try:
        result, _ = PROBE_CAPTURE.apply(transform, copy.deepcopy(gm), timeout=timeout)
    except TransformFailed:
        return "raised"
    return "changed" if {"graph", "state"} & set(before.differences(result)) else None
