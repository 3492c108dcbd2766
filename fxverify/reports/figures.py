"""What the HTML report shows of a failure: the graphs before and after the
transform drawn around the divergent node, and the generated code of both.

Made where the subject of the checks (:class:`~fxverify.engine.subject.Subject`) lives (the
pytest worker) and carried as a JSON-ready dict, so the report is written without models.

>>> import fxverify, torch
>>> def relu_to_sigmoid(gm):
...     for node in gm.graph.find_nodes(op="call_function", target=torch.nn.functional.relu):
...         node.target, node.kwargs = torch.sigmoid, {}
...     gm.recompile()
>>> verification = fxverify.Verification(relu_to_sigmoid, "edge_conv_bn_head")
>>> result = verification.run("numerics")
>>> figures = failure_figures(verification.subject, result)
>>> figures["focus"] == result.divergence["result_node"], figures["after_caption"]
(True, 'all 12 nodes')
>>> "torch.sigmoid(bn1)" in figures["code_after"]
True
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

from torch import fx, nn

from fxverify.analysis.node_map import kept_nodes
from fxverify.core.results import FAILED, CheckResult, exception_summary
from fxverify.engine.subject import Subject
from fxverify.errors import TransformFailed
from fxverify.reports.graph_picture import DEFAULT_HOPS, DEFAULT_MAX_NODES, GraphvizMissing, crop, graph_dot, render_svg


def figures_of(subject: Subject, result: CheckResult) -> dict[str, Any] | None:
    """The pictures and code of a failed result (None for any other outcome); when drawing them
    raises, a note saying so instead: a picture must never hide the check's own result."""
    if result.outcome != FAILED:
        return None
    try:
        return failure_figures(subject, result)
    except Exception as exc:
        return {"note": f"no pictures: drawing them raised {exception_summary(exc)}"}


def failure_figures(subject: Subject, result: CheckResult, *, hops: int = DEFAULT_HOPS,
                    max_nodes: int = DEFAULT_MAX_NODES) -> dict[str, Any]:
    """``focus`` (the node the pictures centre on), ``before_svg`` / ``after_svg`` with their
    ``*_caption``, ``code_before`` / ``code_after``, and ``note`` saying what is missing and why."""
    figures: dict[str, Any] = dict.fromkeys(
        ("focus", "before_svg", "after_svg", "before_caption", "after_caption", "code_before", "code_after", "note")
    )
    try:
        applied = subject.applied()
    except TransformFailed:
        figures["note"] = "no graphs: the transform failed on this model"
        return figures
    original = applied.original
    transformed: nn.Module | None = applied.result
    figures["code_before"] = original.code
    if not isinstance(transformed, fx.GraphModule):
        figures["note"] = f"no graph after: the transform returned a {type(transformed).__name__}, not a GraphModule"
        transformed = None
    else:
        figures["code_after"] = transformed.code
    graphs = {"before": original, **({"after": transformed} if transformed is not None else {})}
    kept = kept_nodes(original, transformed) if transformed is not None else []
    kept_names = {"before": {old.name for old, _ in kept}, "after": {new.name for _, new in kept}}
    changed = {
        which: [n.name for n in gm.graph.nodes if n.name not in kept_names[which] and n.op not in ("placeholder", "output")]
        for which, gm in graphs.items()
    }
    focus = _focus(result.divergence, graphs, changed)
    figures["focus"] = focus.get("after") or focus["before"]
    key = zlib.crc32(f"{result.transform}|{result.model}|{result.check}".encode())
    drawing = True  # until Graphviz is found missing: the captions are made all the same
    for which, gm in graphs.items():
        shown = crop(gm.graph, focus[which], hops=hops, max_nodes=max_nodes)
        figures[f"{which}_caption"] = shown.describe()
        try:
            if drawing:
                figures[f"{which}_svg"] = render_svg(graph_dot(gm, shown, changed=changed[which],
                                                               name=f"{which}{key:08x}"))
        except GraphvizMissing as missing:
            figures["note"], drawing = str(missing), False
    return figures


def _focus(divergence: Mapping[str, Any] | None, graphs: Mapping[str, fx.GraphModule],
           changed: Mapping[str, list[str]]) -> dict[str, str | None]:
    """The node to centre each picture on: the divergent node when known (by its name in each
    graph), else the first node the transform changed, so every failure shows where the edit was."""
    if not divergence:
        return {which: next(iter(changed[which]), None) for which in graphs}
    name = {"after": divergence.get("result_node"),
            "before": divergence.get("original_node") or divergence.get("result_node")}
    return {which: name[which] if name[which] in {n.name for n in gm.graph.nodes} else None
            for which, gm in graphs.items()}
