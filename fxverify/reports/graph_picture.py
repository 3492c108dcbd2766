"""Pictures of FX graphs for reports: Graphviz DOT with one node highlighted,
the nodes a transform changed tinted, and large graphs cropped to the
neighbourhood of the node of interest.

Every string from the model goes into DOT through the ``graphviz`` package's
quoting and comes out of ``dot -Tsvg`` XML-escaped, so a hostile name cannot
inject markup into the SVG.

>>> import torch
>>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh()))
>>> crop(gm.graph, focus="_1", hops=1, max_nodes=3).names  # a small graph is shown whole
['_0', '_1', 'output']
>>> dot = graph_dot(gm, crop(gm.graph, focus="_1"))
>>> print(next(line.strip() for line in dot.body if "focus" in line))
_1 [label="%_1\\lcall_module 1: Tanh\\l" class="fxnode focus" color=red fillcolor="#ffc9c9" penwidth=3 style=filled]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

import graphviz
from torch import fx

from fxverify.analysis.graph_text import target_name
from fxverify.errors import GraphvizMissing

DEFAULT_HOPS = 4
DEFAULT_MAX_NODES = 40

INSTALL_HINT = (
    "Graphviz's `dot` program is not on PATH, so graphs are not drawn: install Graphviz "
    "(Debian/Ubuntu: apt-get install graphviz; macOS: brew install graphviz; conda: conda install graphviz)"
)

_FOCUS = {"fillcolor": "#ffc9c9", "color": "red", "penwidth": "3", "style": "filled"}
_CHANGED = {"fillcolor": "#fff0a8", "style": "filled"}
_PLAIN = {"fillcolor": "#eef3fb", "style": "filled"}


@dataclasses.dataclass(frozen=True)
class Crop:
    """The nodes shown (in graph order), and how many the graph has."""

    names: list[str]
    total: int
    boundary: frozenset[str]  # shown nodes with a neighbour that is not shown
    focus: str | None = None

    def describe(self) -> str:
        """``all 9 nodes`` or ``12 of 160 nodes around %relu``."""
        shown = len(self.names)
        if shown == self.total:
            return f"all {shown} nodes"
        return f"{shown} of {self.total} nodes" + (f" around %{self.focus}" if self.focus else "")


def crop(graph: fx.Graph, focus: str | None = None, *, hops: int = DEFAULT_HOPS,
         max_nodes: int = DEFAULT_MAX_NODES) -> Crop:
    """The nodes within ``hops`` steps of ``focus`` (inputs and users alike), nearest first,
    at most ``max_nodes``; the whole graph when it is small enough, the first
    ``max_nodes`` nodes when there is no focus.
    """
    nodes = list(graph.nodes)
    by_name = {n.name: n for n in nodes}
    if len(nodes) <= max_nodes:
        chosen = set(by_name)
    elif focus is None or focus not in by_name:
        chosen = {n.name for n in nodes[:max_nodes]}
    else:
        chosen = {focus}
        layer = [by_name[focus]]
        for _ in range(hops):
            layer = [m for n in layer for m in (*n.all_input_nodes, *n.users) if m.name not in chosen]
            for m in layer:
                if len(chosen) < max_nodes:
                    chosen.add(m.name)
            layer = [m for m in layer if m.name in chosen]
    boundary = frozenset(
        n.name for n in nodes if n.name in chosen and any(m.name not in chosen for m in (*n.all_input_nodes, *n.users))
    )
    return Crop([n.name for n in nodes if n.name in chosen], len(nodes), boundary, focus if focus in by_name else None)


def node_label(gm: fx.GraphModule, node: fx.Node) -> str:
    """``%name``, the opcode and target (with the module's class for ``call_module``), and the shape when known."""
    lines = [f"%{node.name}"]
    if node.op == "call_module":
        try:
            kind = type(gm.get_submodule(str(node.target))).__name__
        except AttributeError:  # a broken result is drawn too
            kind = "missing module"
        lines.append(f"call_module {node.target}: {kind}")
    elif node.op not in ("placeholder", "output"):
        lines.append(f"{node.op} {target_name(node)}")
    meta = node.meta.get("tensor_meta")
    if meta is not None and hasattr(meta, "shape"):
        lines.append(f"{tuple(meta.shape)} {meta.dtype}")
    return "".join(graphviz.escape(line) + "\\l" for line in lines)


def graph_dot(gm: fx.GraphModule, shown: Crop | None = None, *, changed: Collection[str] = (),
              name: str = "g") -> graphviz.Digraph:
    """The DOT graph of the ``shown`` nodes of ``gm`` (default: all): the focus node red (SVG class
    ``focus``), ``changed`` nodes yellow (class ``changed``), nodes with neighbours cut off dashed
    (class ``cut``). ``name`` prefixes the SVG element ids, so several pictures can share an HTML page."""
    shown = shown or crop(gm.graph, max_nodes=len(gm.graph.nodes))
    focus = shown.focus
    dot = graphviz.Digraph(graph_attr={"id": name, "rankdir": "TB"},
                           node_attr={"shape": "box", "fontname": "monospace", "fontsize": "10"})
    keep = set(shown.names)
    for node in gm.graph.nodes:
        if node.name not in keep:
            continue
        style, classes = _PLAIN, ["fxnode"]
        if node.name == focus:
            style, classes = _FOCUS, [*classes, "focus"]
        elif node.name in changed:
            style, classes = _CHANGED, [*classes, "changed"]
        attrs = dict(style)
        if node.name in shown.boundary:
            attrs["style"] += ",dashed"
            classes.append("cut")
        dot.node(node.name, label=node_label(gm, node), **{"class": " ".join(classes)}, **attrs)
        for source in node.all_input_nodes:
            if source.name in keep:
                dot.edge(source.name, node.name)
    return dot


def render_svg(dot: graphviz.Digraph) -> str:
    """The SVG element (no XML prolog) for inline HTML; :class:`GraphvizMissing` without ``dot``."""
    try:
        svg = dot.pipe(format="svg", encoding="utf-8")
    except graphviz.ExecutableNotFound:
        raise GraphvizMissing(INSTALL_HINT) from None
    return svg[svg.index("<svg"):]
