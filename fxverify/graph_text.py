"""A canonical text of a graph: one line per node with its opcode, name,
target, args, kwargs and users, free of object addresses, so two graphs can be
compared (and later stored) as text.

>>> import torch
>>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
>>> print(canonical_text(gm.graph))
placeholder input_1 target=input users=[relu] args=() kwargs={}
call_function relu target=torch.nn.functional.relu users=[output] args=(%input_1,) kwargs={'inplace': False}
output output target=output users=[] args=(%relu,) kwargs={}
"""

from __future__ import annotations

import re
from typing import Any

from torch import fx

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def canonical_text(graph: fx.Graph) -> str:
    """The canonical text of ``graph``."""
    return "\n".join(node_line(node) for node in graph.nodes)


def node_line(node: fx.Node) -> str:
    """One node's canonical line."""
    users = ",".join(u.name for u in node.users)
    line = f"{node.op} {node.name} target={target_name(node)} users=[{users}] args={_arg(node.args)} kwargs={_arg(node.kwargs)}"
    return _ADDRESS.sub(" at 0x?", line)


def target_name(node: fx.Node) -> str:
    """A stable name for a node's target (qualified name for callables)."""
    if isinstance(node.target, str):
        return node.target
    return fx.node._get_qualified_name(node.target)  # type: ignore[arg-type]


def _arg(value: Any) -> str:
    return str(fx.node.map_arg(value, lambda n: _NodeRef(n.name)))


class _NodeRef:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"%{self.name}"
