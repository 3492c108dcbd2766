"""meta: every node of an ATen-level result still says truly what it computes (``node.meta['val']``).

``torch.export`` records on each node a FakeTensor (or SymInt) describing its value, and passes
downstream read it instead of running the graph: quantizers choose by dtype and shape, the export
Verifier rejects a program where a node lacks it, lowerings size buffers from it. A pass that adds
nodes without it, or changes what a node computes and leaves the old description, breaks them
silently, and nothing in torch compares the description with the value.

Three things are checked, on the graphs the transform produced, against the capture's own graph so
that what torch itself leaves out or gets wrong is not blamed on the pass:

- every ``call_function`` node (and placeholder) has ``meta['val']``, unless the capture's own nodes
  of that target have none either (``aten._assert_tensor_metadata`` in core ATen graphs); a
  ``get_attr`` or ``call_module`` node without one is reported in the details only;
- FakeTensors re-propagated from the placeholders' ``meta['val']``, on a copy of their ShapeEnv
  (:mod:`fxverify.analysis.repropagation`), give each node the dtype, device, symbolic shape and
  strides its ``meta['val']`` says (``s77x6``, not ``2x6``; strides of dimensions of more than one
  element, compared fake against fake), and run through the whole result where they run through
  the original. Where the result specialises a symbolic size (the ``dynamic`` check's finding),
  the nodes from there on are not compared;
- a real run on the primary inputs gives each node the shape, dtype and device its ``meta['val']``
  says, with the symbolic sizes (a dynamic batch ``s77``) bound from the inputs (strides are not
  compared there: real kernels and their fake implementations legitimately disagree on them).

New nodes without provenance (none of ``nn_module_stack``, ``stack_trace``, ``from_node``, where the
capture's own nodes carry it) are listed in the details, not failed: they compute what they say, but
tools that map nodes back to the model's modules and source lines (a quantizer configured by module
name, ExecuTorch's inspector, export's error messages) cannot place them.

Skipped for captures whose graphs carry no ``meta['val']`` (``symbolic_trace``).
"""

from __future__ import annotations

from typing import Any

import sympy
import torch
from torch import fx
from torch.utils import _pytree as pytree

from fxverify.analysis.repropagation import DescriptionMismatch, Repropagation, difference, shape_text
from fxverify.checks import _shapes
from fxverify.checks._common import graph_result, node_text
from fxverify.core.results import Finding, ModuleRaised, Which
from fxverify.engine.subject import Subject

NEEDED = ("call_function", "placeholder")  # where a missing meta['val'] breaks what reads it


def check(subject: Subject) -> dict[str, Any]:
    applied = subject.applied()
    original, result = applied.original, applied.result
    result = graph_result(result, "no graph to check")
    exempt = {node.target for node in original.graph.nodes if "val" not in node.meta}
    missing = [n for n in result.graph.nodes if "val" not in n.meta and n.op != "output" and n.target not in exempt]
    needed = [n for n in missing if n.op in NEEDED]
    if needed:
        first = needed[0]
        rebuilt = len(needed) == sum(1 for n in result.graph.nodes if n.op in NEEDED)
        hint = (" None of the result's nodes has it: the graph was rebuilt without its meta (torch.fx.Transformer "
                "and Graph.create_node do not carry meta['val'] over); copy each node's meta over, or run "
                "FakeTensorProp on the result." if rebuilt else "")
        raise Finding(
            f"{len(needed)} node(s) of the result have no meta['val'] ({', '.join('%' + n.name for n in needed[:5])}"
            f"{', ...' if len(needed) > 5 else ''}), where the capture records one on every such node: passes and "
            "tools after this one read it (the export Verifier rejects the program, quantizers and lowerings "
            "read shapes and dtypes from it). Set new_node.meta['val'] when creating a node: copy the replaced "
            "node's meta when the value is the same, or compute it with FakeTensorProp / the op on "
            "meta['val'] of its inputs." + hint,
            node=first.format_node() or first.name)
    details: dict[str, Any] = {}
    fake, compared, fakes = _fake_mismatches(subject, result, original, details)
    where = f"{subject.primary.describe()}, {subject.dtype}, {applied.mode} mode"
    real = _real_mismatches(subject, result, original, where)
    wrong = [n for n in result.graph.nodes if n.name in fake or n.name in real]
    if wrong:
        raise _finding(wrong, fake, real, compared=compared, fakes=fakes, where=where)
    checked = sum(1 for n in result.graph.nodes if "val" in n.meta)
    return {"nodes_checked": checked, "without_meta_not_needed": [f"%{n.name}" for n in missing if n.op not in NEEDED],
            **_provenance(result, original), **details}


PROVENANCE = ("nn_module_stack", "stack_trace", "from_node")  # what maps a node back to the model's modules and code


def _provenance(result: fx.GraphModule, original: fx.GraphModule) -> dict[str, Any]:
    """The new ``call_function`` nodes of ``result`` that carry none of :data:`PROVENANCE`, where the
    original's ``call_function`` nodes all carry some: information, since they compute what they say."""
    def traced(node: fx.Node) -> bool:
        return any(node.meta.get(key) for key in PROVENANCE)

    calls = [n for n in original.graph.nodes if n.op == "call_function"]
    if not calls or not all(traced(n) for n in calls):
        return {}
    names = {n.name for n in original.graph.nodes}
    untraced = [f"%{n.name}" for n in result.graph.nodes
                if n.op == "call_function" and n.name not in names and not traced(n)]
    if not untraced:
        return {}
    return {"without_provenance": untraced,
            "without_provenance_note": (
                "new nodes carrying none of nn_module_stack, stack_trace, from_node: tools mapping nodes back to "
                "modules and source lines (a quantizer configured by module name, ExecuTorch's inspector) cannot "
                "place them; copy nn_module_stack and stack_trace from the node each replaces (an fx.Transformer run "
                "under torch.fx.traceback.preserve_node_meta() records from_node itself)")}


def _fake_mismatches(subject: Subject, result: fx.GraphModule, original: fx.GraphModule,
                     details: dict[str, Any]) -> tuple[dict[str, DescriptionMismatch], set[str], str]:
    """The nodes of ``result`` whose ``meta['val']`` is not what FakeTensors re-propagated through it give (but
    those the original's re-propagation gets wrong too), the nodes compared, and the inputs of the
    re-propagation; a :class:`Finding` where it raises in the result and not in the original. What was not
    compared is said in ``details``."""
    if _shapes.described_as_captured(subject):
        details["repropagated"] = ("not needed: the result has the capture's graph, tensors and meta['val'], so "
                                   "re-propagating finds what it finds in the capture")
        return {}, set(), ""
    added = _shapes.guard_added_while_running(subject)
    if added is not None:  # descriptions made since say the specialised sizes
        details["repropagated"] = (f"not compared: the transform added {added.guard.expr} to the "
                                   "ShapeEnv while it ran (the dynamic check's finding)")
        return {}, set(), ""
    found = _shapes.repropagated(subject, "result")
    if found is None:
        details["repropagated"] = "not compared: the placeholders' sizes belong to a ShapeEnv fxverify cannot copy"
        return {}, set(), ""
    fakes = "FakeTensors made from the placeholders' meta['val']" + (
        f", on a copy of their ShapeEnv ({', '.join(f'{s} in [{lo}, {hi}]' for s, (lo, hi) in found.ranges.items())})"
        if found.ranges else "")
    cut = _shapes.guard_violation(subject)  # from there on, sizes are the specialised ones: the dynamic check reports that
    if cut is not None:
        details["repropagated_until"] = f"%{cut.guard.node} ({cut.describe()}: the dynamic check's finding)"
    stop = found.stopped
    if stop is not None and stop.raised is not None and cut is None:
        baseline = _shapes.repropagated(subject, "original")
        node, raised = stop.node, stop.raised
        if baseline is not None and baseline.stopped is None:
            raise Finding(
                f"re-propagating FakeTensors through the result raises at %{node}: {raised}. The original's graph "
                "re-propagates: tools that trace a program with FakeTensors (run_decompositions, re-export, "
                "ExecuTorch's to_edge, torch.compile) fail on the result. Give the node's target a FakeTensor "
                "implementation (torch.library.register_fake for a custom op) or keep data-dependent code out of it",
                input=fakes, node=node_text(result, node))
        details["repropagated_until"] = f"%{node} (the capture's own graph does not re-propagate either: {raised})"
    elif stop is not None and stop.raised is None:
        details["repropagated_until"] = stop.describe()
    compared = _compared(result, found, until=cut.guard.node if cut is not None else None)
    wrong = _described_wrong(result, found, compared)
    if wrong:
        baseline = _shapes.repropagated(subject, "original")
        already = set(_keys(original, _described_wrong(original, baseline, _compared(original, baseline)))) \
            if baseline is not None else set()
        wrong = {name: m for name, m in wrong.items() if _key(result, name) not in already}
    if wrong and not subject.capture.traits.kept_strides_read:
        wrong = _without_stale_strides_left_alone(wrong, original, result, details)
    return wrong, compared, fakes


def _without_stale_strides_left_alone(wrong: dict[str, DescriptionMismatch], original: fx.GraphModule,
                                      result: fx.GraphModule, details: dict[str, Any]) -> dict[str, DescriptionMismatch]:
    """``wrong`` less the nodes the pass left alone whose ``meta['val']`` differs in strides only (their layout
    moved with an input the pass replaced), listed in ``details``: at a hook where torch itself leaves them so
    (its own replacements do) and nothing reads them, they are no defect of the pass."""
    left_alone = _left_alone(original, result)
    stale = [name for name, mismatch in wrong.items() if name in left_alone and mismatch.aspect == "strides"]
    if stale:
        details["stale_strides_left_alone"] = [f"%{name}: {wrong[name].describe('re-propagating FakeTensors')}"
                                              for name in stale]
        details["stale_strides_note"] = (
            "nodes the pass left alone, whose strides moved with an input it replaced: torch leaves them so at this "
            "hook (Inductor's own joint-graph patterns do) and recomputes none of them; not failed")
    return {name: mismatch for name, mismatch in wrong.items() if name not in stale}


def _left_alone(original: fx.GraphModule, result: fx.GraphModule) -> set[str]:
    """The nodes of ``result`` the pass left alone but for the nodes they read (rewired by a replacement): the
    original's name and target, and each argument that is no node the same."""
    def own(node: fx.Node) -> str:
        return f"{node.target} {fx.map_arg((node.args, node.kwargs), lambda _: None)}"

    before = {node.name: own(node) for node in original.graph.nodes}
    return {node.name for node in result.graph.nodes if before.get(node.name) == own(node)}


def _compared(gm: fx.GraphModule, found: Repropagation, until: str | None = None) -> set[str]:
    """The nodes of ``gm`` (before ``until``) that ``found`` describes and have a ``meta['val']``; a
    ``call_module`` node is taken at its description, so it is not among them."""
    names = set()
    for node in gm.graph.nodes:
        if node.name == until:
            break
        if node.op != "call_module" and node.meta.get("val") is not None and node.name in found.values:
            names.add(node.name)
    return names


def _described_wrong(gm: fx.GraphModule, found: Repropagation, names: set[str]) -> dict[str, DescriptionMismatch]:
    """The nodes ``names`` of ``gm`` whose ``meta['val']`` is not what ``found`` describes."""
    wrong = {}
    for node in gm.graph.nodes:
        mismatch = difference(node.meta["val"], found.values[node.name], found.ranges) if node.name in names else None
        if mismatch is not None:
            wrong[node.name] = mismatch
    return wrong


def _real_mismatches(subject: Subject, result: fx.GraphModule, original: fx.GraphModule,
                     where: str) -> dict[str, DescriptionMismatch]:
    """The nodes of ``result`` whose value in a real run on the primary inputs has another shape, dtype or
    device than its ``meta['val']`` says (but those of the original's run that do too)."""
    inputs = subject.primary.make(subject.case.seed)
    wrong = _run_wrong(result, inputs, "result", where)
    if wrong:  # the original is run only then: an interpreted run of a large graph is not cheap
        already = set(_keys(original, _run_wrong(original, inputs, "original", where)))
        wrong = {name: m for name, m in wrong.items() if _key(result, name) not in already}
    return wrong


def _finding(wrong: list[fx.Node], fake: dict[str, DescriptionMismatch], real: dict[str, DescriptionMismatch], *,
             compared: set[str], fakes: str, where: str) -> Finding:
    """The finding for the first node of ``wrong``, blaming whoever is to blame: the FakeTensor implementation
    of the node's target where a real run and re-propagated FakeTensors disagree and one of them agrees with
    ``meta['val']`` (a custom op's ``register_fake``, say), else a stale ``meta['val']`` (the pass). ``compared``:
    the nodes re-propagation compared."""
    node = wrong[0]
    said, ran = fake.get(node.name), real.get(node.name)
    if said is not None and ran is None and said.aspect in RUN_COMPARES:
        return _fake_implementation_wrong(
            node, said.describe("re-propagating FakeTensors") + ", where a real run gives what meta['val'] says",
            fakes)
    if said is None and ran is not None and node.name in compared:
        return _fake_implementation_wrong(
            node, ran.describe("a real run") + ", where re-propagating FakeTensors gives what meta['val'] says",
            where)
    if said is not None:
        what = said.describe("re-propagating FakeTensors") + (" (and so does a real run)" if ran else "")
        how, given = "have a meta['val'] that is not what they compute", fakes
    else:
        assert ran is not None
        what, how, given = ran.describe("a real run"), "compute something other than their meta['val'] says", where
    return Finding(
        f"{len(wrong)} node(s) of the result {how}; the first, %{node.name}: {what}. A pass changed what the node "
        "computes and kept the old description (or copied another node's): passes after it would read a wrong "
        "shape, dtype, device or layout. Update meta['val'] with the node, e.g. by re-running "
        "torch.fx.passes.fake_tensor_prop.FakeTensorProp, or by running its target on its inputs' meta['val']",
        input=given, node=node.format_node() or node.name)


def _fake_implementation_wrong(node: fx.Node, what: str, given: str) -> Finding:
    return Finding(
        f"%{node.name}: {what}. The FakeTensor implementation of its target ({node.target}) disagrees with its "
        "kernel: every tool that traces the program with FakeTensors (export, run_decompositions, torch.compile) "
        "reads a wrong description of the node. Make the op's FakeTensor implementation (register_fake, for a "
        "custom op) give what its kernel gives, or use an op whose implementations agree",
        input=given, node=node.format_node() or node.name)


RUN_COMPARES = ("dtype", "device")  # what a real run decides regardless of the batch it binds (sizes and strides: not)


def _key(gm: fx.GraphModule, name: str) -> tuple[str, Any]:
    node = next(n for n in gm.graph.nodes if n.name == name)
    return name, node.target


def _keys(gm: fx.GraphModule, wrong: dict[str, DescriptionMismatch]) -> list[tuple[str, Any]]:
    return [_key(gm, name) for name in wrong]


def _run_wrong(gm: fx.GraphModule, inputs: tuple[Any, ...], which: Which, where: str) -> dict[str, DescriptionMismatch]:
    """The nodes of ``gm`` whose values, in a real run on ``inputs``, differ from their ``meta['val']``."""
    recorder = _Recorder(gm)
    with torch.no_grad():
        ModuleRaised.guard(which, where, lambda: recorder.run(*inputs))
    bindings: dict[sympy.Symbol, int] = {}
    for node in gm.graph.find_nodes(op="placeholder"):
        _bind(node.meta.get("val"), recorder.values.get(node.name), bindings)
    found = {}
    for node in gm.graph.nodes:
        if node.meta.get("val") is None or node.name not in recorder.values:  # None: no description (torch's
            continue  # Verifier accepts it; move_to_device_pass writes it on nodes that had none)
        mismatch = _differs(node.meta["val"], recorder.values[node.name], bindings)
        if mismatch is not None:
            found[node.name] = mismatch
    return found


class _Recorder(fx.Interpreter):
    """Runs the graph keeping only a description of each node's value (no tensor is kept)."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[str, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        self.values[n.name] = pytree.tree_map(_described, value)
        return value


def _described(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device.type)
    return value if isinstance(value, (int, float, bool)) else None


def _bind(meta: Any, real: Any, bindings: dict[sympy.Symbol, int]) -> None:
    """Bind the symbols of a placeholder's meta sizes to the real input's sizes."""
    if isinstance(meta, torch.Tensor) and isinstance(real, tuple) and real and real[0] == "tensor":
        for size, actual in zip(meta.shape, real[1], strict=False):
            expr = size.node.expr if isinstance(size, torch.SymInt) else None
            if isinstance(expr, sympy.Symbol):
                bindings[expr] = actual


def _concrete(size: Any, bindings: dict[sympy.Symbol, int]) -> int | None:
    """``size`` (an int or a SymInt) with its symbols bound; None when some stay free."""
    if not isinstance(size, torch.SymInt):
        return int(size)
    expr = sympy.sympify(sympy.sympify(size.node.expr).xreplace(bindings))
    return int(expr) if expr.is_number else None


def _differs(meta: Any, real: Any, bindings: dict[sympy.Symbol, int]) -> DescriptionMismatch | None:
    """How the real value ``real`` (as :func:`_described` gives it) differs from ``meta``, or None."""
    if isinstance(meta, (int, torch.SymInt)) and not isinstance(meta, bool) and isinstance(real, int):
        size = _concrete(meta, bindings)
        return None if size is None or size == real else DescriptionMismatch("size", str(size), str(real))
    metas = pytree.tree_leaves(meta)
    reals = pytree.tree_leaves(real, is_leaf=lambda x: isinstance(x, tuple) and bool(x) and x[0] == "tensor")
    tensors = [m for m in metas if isinstance(m, torch.Tensor)]
    real_tensors = [r for r in reals if isinstance(r, tuple) and r and r[0] == "tensor"]
    if len(tensors) != len(real_tensors):
        return DescriptionMismatch("tensors", str(len(tensors)), str(len(real_tensors)))
    for i, (m, (_, shape, dtype, device)) in enumerate(zip(tensors, real_tensors, strict=True)):
        label = f"output {i}: " if len(tensors) > 1 else ""
        if m.dtype != dtype:
            return DescriptionMismatch("dtype", str(m.dtype), str(dtype), label)
        if m.device.type != device:
            return DescriptionMismatch("device", m.device.type, device, label)
        sizes = [_concrete(s, bindings) for s in m.shape]
        if len(sizes) != len(shape) or any(s is not None and s != a for s, a in zip(sizes, shape, strict=False)):
            said = shape_text(tuple("?" if s is None else s for s in sizes))
            return DescriptionMismatch("shape", said, shape_text(shape), label)
    return None
