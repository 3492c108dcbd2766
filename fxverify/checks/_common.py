"""Small helpers several checks share."""

from __future__ import annotations

from torch import fx, nn

from fxverify.core.results import Skip


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
