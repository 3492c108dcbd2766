"""opset: a pass over an ATen-level graph leaves a graph of the same operator set.

Whatever reads an ATen graph after the pass assumes its operator set: lowerings match
``OpOverload`` targets, ``torch.export``'s Verifier allows only ATen operators (an
``OpOverload``, a higher-order operator, or a few builtins such as ``operator.getitem``),
functional graphs (``export_core``, functionalized ``make_fx``) promise no in-place or ``out=``
operator, and core ATen graphs (``export_core``) promise operators tagged ``torch.Tag.core``,
which is all an ExecuTorch or other backend implements. A pass that inserts ``torch.relu``, the
packet ``aten.relu`` instead of ``aten.relu.default``, a ``call_module`` node, ``aten.relu_`` in a
functional graph or ``aten.hardswish`` (decomposed by ``run_decompositions``) in a core graph
breaks them, and ``make_fx`` graphs are not verified by torch at all.

Each target the result uses that the capture's own graph does not is judged by the capture's
:attr:`~fxverify.core.captures.CaptureTraits.opset` (``aten``: ATen operators; ``functional``: also no
mutable schema; ``core``: also core ATen). Targets the capture's graph already has are not
blamed on the pass. Skipped for torch-level captures (``symbolic_trace``) and for a contract
declaring ``keeps_opset=False`` (a result that leaves the operator set by design).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from fxverify.checks._common import graph_result
from fxverify.core.results import Finding, Skip
from fxverify.engine.subject import Subject

_CORE_HINT = ("Emit the core ATen operators it decomposes to (its entry in torch.export.default_decompositions()), "
              "or run ep.run_decompositions() on the program after the pass")


def check(subject: Subject) -> dict[str, Any]:
    opset = subject.capture.traits.opset
    assert opset is not None, "the registry collects opset only under captures with the opset trait"
    if not subject.contract.keeps_opset:
        raise Skip("the contract declares that the result leaves the capture's operator set (keeps_opset=False)")
    applied = subject.applied()
    result = graph_result(applied.result, "no graph to check")
    known = {(node.op, node.target) for node in applied.original.graph.nodes}
    checked = 0
    for node in result.graph.nodes:
        if node.op in ("placeholder", "get_attr", "output") or (node.op, node.target) in known:
            continue
        checked += 1
        outside = _outside(node, opset)
        if outside is not None:
            what, fix = outside
            raise Finding(
                f"the result has %{node.name}, {what}, where {subject.capture.name} graphs hold {_PROMISES[opset]} and the "
                "capture's own graph has no such node: what reads the graph after this pass assumes that operator "
                f"set (the export Verifier, lowerings, backends). {fix}.",
                node=node.format_node() or node.name)
    return {"opset": opset, "new_targets_checked": checked}


_PROMISES = {
    "aten": "ATen operators only",
    "functional": "functional ATen operators only",
    "core": "functional core ATen operators only",
}


def _outside(node: fx.Node, opset: str) -> tuple[str, str] | None:
    """``(what it is, what to do instead)`` when ``node`` is outside ``opset``; None when it is inside."""
    from torch._export.verifier import Verifier

    target = node.target
    if node.op != "call_function":
        return f"a {node.op} node ({target})", "Call the ATen operators the module or method runs instead"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return (f"a call of the operator packet {target}, not of an overload",
                f"Call an overload such as {target}.default (the Verifier rejects packets, lowerings match overloads)")
    rules = Verifier()
    if not isinstance(target, rules.allowed_op_types()) and target not in rules.allowed_builtin_ops():
        name = getattr(target, "__qualname__", repr(target))
        return (f"a call of {getattr(target, '__module__', '')}.{name}, a torch-level function, not an ATen operator",
                "Call its torch.ops.aten overload instead (torch.ops.aten.gelu.default for F.gelu, for example)")
    if not isinstance(target, torch._ops.OpOverload) or opset == "aten":
        return None
    if target._schema.is_mutable:
        return (f"a call of {target}, which mutates its arguments (its schema is mutable)",
                "Call its functional variant (aten.relu.default for aten.relu_.default) and use the value it returns")
    if opset == "core" and torch.Tag.core not in target.tags:
        return f"a call of {target}, which is not a core ATen operator (it has no torch.Tag.core)", _CORE_HINT
    return None
