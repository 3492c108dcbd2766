"""determinism: the transform gives the same graph and code every time.

A pass that iterates a ``set`` of nodes orders its output by the nodes' hashes
(their object addresses) or, for a set of names, by string hash (which changes
with ``PYTHONHASHSEED``). The transform is applied to two more fresh traces in
this process while every node made (by a copy of the trace, the transform) hashes
in the order nodes are made, then in the reverse order (see :func:`hash_ordered`),
so a set of nodes iterates one way, then the other (the trace is made before, and copied under
the order: how a capture orders its own graph, ``torch.export``'s included, is not the transform's doing):
an order-dependent pass gives two graphs, every time, where address-dependent
reruns would agree by chance. Their canonical graph and code are compared; then
with a digest computed in another process under a different hash seed (one
long-lived server process per transform, see :mod:`fxverify.checks._digest_server`).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
from collections.abc import Iterator
from typing import Any

import torch.fx.graph as fx_graph
from torch import fx, nn

from fxverify.analysis.graph_text import canonical_text
from fxverify.analysis.module_state import first_line_difference
from fxverify.engine.results import Finding, Skip
from fxverify.engine.subject import Subject

ORDERS = ("ascending", "descending")  # how the nodes of the reruns' traces hash: in graph order, reversed

_patched_graph: Any = fx_graph  # torch.fx.graph, whose Node class hash_ordered swaps (mypy forbids assigning to a class)


class _HashOrderedNode(fx.Node):
    """A Node whose hash is set when it is made (under :func:`hash_ordered`), not its address."""

    _order_hash: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._order_hash = next(_next_hash)  # before Node.__init__, which puts the node in dicts
        super().__init__(*args, **kwargs)

    def __hash__(self) -> int:
        return self._order_hash


_next_hash: Iterator[int] = iter(())


@contextlib.contextmanager
def hash_ordered(order: str) -> Iterator[None]:
    """While active, every node made (a trace, a ``copy.deepcopy`` of a GraphModule, what a
    transform creates) hashes to a small integer in the order nodes are made (``"ascending"``) or
    the reverse (``"descending"``), instead of its address: a ``set`` of them iterates in that order
    (a set puts a small integer hash at that slot of its table), and a pass that iterates one
    orders its output one way, then the other.

    >>> import copy
    >>> gm = fx.symbolic_trace(nn.Sequential(nn.ReLU(), nn.Tanh(), nn.Sigmoid()))
    >>> with hash_ordered("descending"):
    ...     copied = copy.deepcopy(gm)
    >>> [n.name for n in set(copied.graph.nodes)]
    ['output', '_2', '_1', '_0', 'input_1']
    """
    global _next_hash
    step = 1 if order == "ascending" else -1
    _next_hash = itertools.count(1 if step == 1 else -2, step)  # -1 is no hash: CPython makes it -2
    plain = fx_graph.Node
    _patched_graph.Node = _HashOrderedNode  # Graph.create_node makes its nodes from this name
    try:
        yield
    finally:
        _patched_graph.Node = plain
        _next_hash = iter(())


def fingerprint(module: nn.Module) -> str:
    """Canonical graph text followed by the generated code."""
    if not isinstance(module, fx.GraphModule):
        raise Skip(f"the transform returned a {type(module).__name__}, not a GraphModule: no graph to compare")
    return canonical_text(module.graph) + "\n--- code ---\n" + module.code


def digest(module: nn.Module) -> str:
    """A short hash of :func:`fingerprint`, for comparing across processes."""
    return hashlib.sha256(fingerprint(module).encode()).hexdigest()[:16]


def check(v: Subject) -> dict[str, Any]:
    mode = v.contract.primary_mode
    first = fingerprint(v.applied().result)
    runs = {}
    for order in ORDERS:
        original = v.capture_fresh(mode)  # outside: the capture's own order is not the transform's doing
        with hash_ordered(order):
            result = v.transformed_copy(original, mode)
        runs[order] = fingerprint(result)
    for order, again in runs.items():
        if again != first:
            raise Finding(
                "fresh traces transformed in the same process gave different graphs: with the nodes hashing in "
                f"{order} graph order the transform made another graph than with the nodes hashing by address "
                "(its output depends on the order of a set or dict of nodes, or on id(): iterate the graph's "
                "node list, or sort)",
                where=first_line_difference(first, again),
            )
    in_process = {"in_process_runs": 1 + len(ORDERS)}
    if v.settings.cross_process is None:
        return {**in_process, "cross_process": "not run (no cross-process runner)"}
    other = v.settings.cross_process(v.case.name)
    if other.startswith("error:"):
        raise Finding(f"the cross-process run (different PYTHONHASHSEED) failed: {other[6:].strip()}")
    if other.startswith("skip:"):
        return {**in_process, "cross_process": other}
    here = digest(v.applied().result)
    if other != here:
        raise Finding(
            "the transform gave a different graph in another process with a different PYTHONHASHSEED "
            "(node order depends on string hashing: is a set of names or targets iterated?)",
            where=f"digest here {here}, in the other process {other}",
        )
    return {**in_process, "cross_process": "same digest"}
