"""Why a graph has no topological order, which torch's ``stable_topological_sort`` only asserts (``topological sort
did not consume all nodes``) after a hook: what a pass left that torch refuses.

>>> import torch
>>> from torch import fx
>>> gm = fx.symbolic_trace(lambda x: torch.relu(x) + 1)
>>> relu, add = list(gm.graph.nodes)[1:3]
>>> relu.args = (add,)
>>> ordering_problem(gm.graph)
'a cycle: %relu -> %add -> %relu (each reads the next)'
"""

from __future__ import annotations

from collections.abc import Iterator

from torch import fx


def ordering_problem(graph: fx.Graph) -> str | None:
    """Why ``graph`` is not in topological order (a node reading one no longer in the graph, a cycle, a node read
    before it is defined), or None where it is.

    >>> import torch
    >>> ordering_problem(fx.symbolic_trace(lambda x: torch.relu(x) + 1).graph) is None
    True
    """
    present = set(graph.nodes)
    for node in graph.nodes:
        gone = [arg for arg in node.all_input_nodes if arg not in present]
        if gone:
            return f"%{node.name} reads %{gone[0].name}, which is no longer in the graph (erased)"
    cycle = _cycle(graph)
    if cycle:
        return f"a cycle: {' -> '.join('%' + node.name for node in (*cycle, cycle[0]))} (each reads the next)"
    seen: set[fx.Node] = set()
    for node in graph.nodes:
        late = [arg for arg in node.all_input_nodes if arg not in seen]
        if late:
            return f"%{node.name} reads %{late[0].name} before it is defined (acyclic: nodes out of order)"
        seen.add(node)
    return None


def _cycle(graph: fx.Graph) -> list[fx.Node]:
    """The nodes of one cycle of ``graph`` (each reading the next, the last reading the first), or []."""
    state: dict[fx.Node, int] = {}  # 1: on the current path, 2: done
    for root in graph.nodes:
        if root in state:
            continue
        path: list[fx.Node] = []
        stack: list[tuple[fx.Node, Iterator[fx.Node]]] = [(root, iter(root.all_input_nodes))]
        state[root] = 1
        path.append(root)
        while stack:
            node, inputs = stack[-1]
            following = next(inputs, None)
            if following is None:
                stack.pop()
                path.pop()
                state[node] = 2
            elif state.get(following) == 1:
                return path[path.index(following):]
            elif following not in state:
                state[following] = 1
                path.append(following)
                stack.append((following, iter(following.all_input_nodes)))
    return []
