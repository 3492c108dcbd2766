"""Small helpers several checks share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import fx, nn

from fxverify.core.results import Finding, Skip


def graph_result(result: nn.Module, without: str = "") -> fx.GraphModule:
    """``result`` (what the transform returned) where it is a ``GraphModule``; else :class:`Skip`, saying what
    the check cannot do ``without`` one.

    >>> graph_result(nn.ReLU(), "no graph to lint")
    Traceback (most recent call last):
    ...
    fxverify.core.results.Skip: the transform returned a ReLU, not a GraphModule: no graph to lint
    """
    if not isinstance(result, fx.GraphModule):
        raise Skip(f"the transform returned a {type(result).__name__}, not a GraphModule" + (f": {without}" if without
                                                                                            else ""))
    return result


def node_text(module: nn.Module, name: str) -> str:
    """The node ``name`` of ``module``'s graph as FX prints it (``%name`` where it has no such node).

    >>> node_text(fx.symbolic_trace(nn.ReLU()), "relu").split(" = ")[0], node_text(nn.ReLU(), "relu")
    ('%relu : [num_users=1]', '%relu')
    """
    graph = module.graph if isinstance(module, fx.GraphModule) else None
    node = next((n for n in graph.nodes if n.name == name), None) if graph is not None else None
    return (node.format_node() or name) if node is not None else f"%{name}"


def problems_finding(made: Sequence[Any], what: str, advice: Mapping[str, str], *, quantizer: bool = False) -> Finding:
    """The finding of the problems ``made`` of ``what`` (each with ``kind``, ``node`` and ``describe()``, as
    :class:`fxverify.analysis.qdq.Problem`), a pass's and not the graph's it was given (with ``quantizer``: a
    quantizer under test's, all of them): the first in full with the ``advice`` for its kind, three more named, the
    rest counted.

    >>> from fxverify.analysis.qdq import Problem
    >>> made = [Problem("chained", "obs_1", "observes an observer")]
    >>> found = problems_finding(made, "the observers", {"chained": "read its input"})
    >>> found.node, str(found).split("; ")[1]
    ('obs_1', 'the first: %obs_1: observes an observer (chained). Advice: read its input')
    """
    first = made[0]
    also = "".join(f"\n  also: {problem.describe()}" for problem in made[1:4])
    more = f"\n  and {len(made) - 4} more" if len(made) > 4 else ""
    made_by, given = ("the quantizer", "") if quantizer else ("the pass", " that the graph it was given does not have")
    return Finding(f"{made_by} made {len(made)} problem(s) of {what}{given}; the first: {first.describe()}{also}{more}. "
                   f"Advice: {advice[first.kind]}", node=first.node,
                   details={"problems": [problem.describe() for problem in made]})
