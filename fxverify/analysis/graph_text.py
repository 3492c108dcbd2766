"""A canonical text of a graph: one line per node with its opcode, name,
target, args, kwargs and users, free of object addresses, so two graphs can be
compared (and later stored) as text.

>>> import torch
>>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
>>> print(canonical_text(gm.graph))
placeholder input_1 target=input users=[relu] args=() kwargs={}
call_function relu target=torch.nn.functional.relu users=[output] args=(%input_1,) kwargs={'inplace': False}
output output target=output users=[] args=(%relu,) kwargs={}

``anonymous=True`` numbers the nodes instead of naming them, placeholders first and
get_attr nodes next by target (where these inputs sit means nothing), and leaves users
out (args give every edge): graphs that differ only in node names and input positions,
as a re-trace does, compare equal, and the first differing line is the first node that differs:

>>> print(canonical_text(gm.graph, anonymous=True).splitlines()[1])
call_function 1 target=torch.nn.functional.relu args=(%0,) kwargs={'inplace': False}
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from torch import fx

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_FLOAT = re.compile(r"(?<![\w.])-?\d+(?:\.\d+(?:e[-+]?\d+)?|e[-+]?\d+)(?![\w.])")


def canonical_text(graph: fx.Graph, *, anonymous: bool = False) -> str:
    """The canonical text of ``graph``; ``anonymous``: nodes numbered 0, 1, ..., inputs first."""
    if not anonymous:
        return "\n".join(node_line(node) for node in graph.nodes)
    rank = {"placeholder": 0, "get_attr": 1}
    nodes = sorted(graph.nodes, key=lambda n: (rank.get(n.op, 2), n.target if n.op == "get_attr" else ""))  # stable
    numbers = {node: str(i) for i, node in enumerate(nodes)}
    return "\n".join(node_line(node, numbers.__getitem__, users=False) for node in nodes)


def node_line(node: fx.Node, name: Callable[[fx.Node], str] = lambda n: n.name, *, users: bool = True) -> str:
    """One node's canonical line, nodes called by ``name`` (their own names by default);
    ``users=False`` leaves the users out."""
    listed = f" users=[{','.join(name(u) for u in node.users)}]" if users else ""
    line = (f"{node.op} {name(node)} target={target_name(node)}{listed} "
            f"args={_arg(node.args, name)} kwargs={_arg(node.kwargs, name)}")
    return without_addresses(line)


def without_addresses(text: str) -> str:
    """``text`` with every object address blanked: FX prints a builtin passed as an argument with its address
    (``<built-in method conv2d of type object at 0x7f...>``), which differs between processes and runs.

    >>> without_addresses("args=(<built-in method conv2d of type object at 0x7f3a2c1d0e80>,)")
    'args=(<built-in method conv2d of type object at 0x?>,)'
    """
    return _ADDRESS.sub(" at 0x?", text)


def without_floats(text: str) -> str:
    """``text`` with every floating-point literal blanked: a constant a transform computed in floating point (a scale
    calibrated on activations) differs in its last digits with the number of threads a process computes it on.

    >>> without_floats("quantize_per_tensor(conv2d_2, 0.02209177426993847, 45, -128, 127, torch.int8) * 1e-05")
    'quantize_per_tensor(conv2d_2, <float>, 45, -128, 127, torch.int8) * <float>'
    """
    return _FLOAT.sub("<float>", text)


def target_name(node: fx.Node) -> str:
    """A stable name for a node's target (qualified name for callables)."""
    if isinstance(node.target, str):
        return node.target
    return fx.node._get_qualified_name(node.target)


def _arg(value: Any, name: Callable[[fx.Node], str]) -> str:
    def verbatim(n: fx.Node) -> Any:  # map_arg puts whatever fn returns in the node's place, not only an Argument
        return _Verbatim("%" + name(n))
    return str(fx.node.map_aggregate(fx.node.map_arg(value, verbatim), _sorted_set))


def _sorted_set(value: Any) -> Any:
    """Sets print in hash order, which varies with ``PYTHONHASHSEED``: print them sorted."""
    if isinstance(value, (set, frozenset)) and value:
        text = "{" + ", ".join(sorted(map(repr, value))) + "}"
        return _Verbatim(text if type(value) is set else f"{type(value).__name__}({text})")
    return value


class _Verbatim:
    """Prints as the given text inside a container's repr."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text
