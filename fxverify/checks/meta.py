"""meta: every node of an ATen-level result still says truly what it computes (``node.meta['val']``).

``torch.export`` records on each node a FakeTensor (or SymInt) describing its value, and passes
downstream read it instead of running the graph: quantizers choose by dtype and shape, the export
Verifier rejects a program where a node lacks it, lowerings size buffers from it. A pass that adds
nodes without it, or changes what a node computes and leaves the old description, breaks them
silently, and nothing in torch compares the description with the value.

Two things are checked, on the graphs the transform produced, against the capture's own graph so
that what torch itself leaves out is not blamed on the pass:

- every ``call_function`` node (and placeholder) has ``meta['val']``, unless the capture's own nodes
  of that target have none either (``aten._assert_tensor_metadata`` in core ATen graphs); a
  ``get_attr`` or ``call_module`` node without one is reported in the details only;
- a real run on the primary inputs gives each node the shape, dtype and device its ``meta['val']``
  says, with the symbolic sizes (a dynamic batch ``s77``) bound from the inputs. Strides are not
  compared: real kernels and their fake implementations legitimately disagree on them.

Skipped for captures whose graphs carry no ``meta['val']`` (``symbolic_trace``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import sympy
import torch
from torch import fx
from torch.utils import _pytree as pytree

from fxverify.engine.results import Finding, ModuleRaised, Skip
from fxverify.engine.subject import Subject

NEEDED = ("call_function", "placeholder")  # where a missing meta['val'] breaks what reads it


def check(v: Subject) -> dict[str, Any]:
    applied = v.applied()
    original, result = applied.original, applied.result
    if not any("val" in node.meta for node in original.graph.nodes):
        raise Skip(f"{v.capture.name} graphs carry no meta['val']: nothing to check")
    if not isinstance(result, fx.GraphModule):
        raise Skip(f"the transform returned a {type(result).__name__}, not a GraphModule: no graph to check")
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
    where = f"{v.primary.describe()}, float32, {applied.mode} mode"
    inputs = v.primary.make(v.case.seed)
    wrong = _disagreements(result, inputs, "result", where)
    if wrong:  # the original is run only then: an interpreted run of a large graph is not cheap
        already = {(d.name, d.target) for d in _disagreements(original, inputs, "original", where)}
        wrong = [d for d in wrong if (d.name, d.target) not in already]
    if wrong:
        first = wrong[0]
        raise Finding(
            f"{len(wrong)} node(s) of the result compute something other than their meta['val'] says; the first, "
            f"%{first.name}: {first.what}. A pass changed what the node computes and kept the old description "
            "(or copied another node's): passes after it would read a wrong shape, dtype or device. Update "
            "meta['val'] with the node, e.g. by re-running torch.fx.passes.fake_tensor_prop.FakeTensorProp",
            input=where, node=first.node)
    checked = sum(1 for n in result.graph.nodes if "val" in n.meta)
    return {"nodes_checked": checked, "without_meta_not_needed": [f"%{n.name}" for n in missing if n.op not in NEEDED]}


@dataclasses.dataclass(frozen=True)
class Disagreement:
    """A node whose real value differs from its ``meta['val']`` (``what`` says how)."""

    name: str
    target: Any
    node: str
    what: str


def _disagreements(gm: fx.GraphModule, inputs: tuple[Any, ...], which: str, where: str) -> list[Disagreement]:
    """The nodes of ``gm`` whose values, in a real run on ``inputs``, differ from their ``meta['val']``."""
    recorder = _Recorder(gm)
    with torch.no_grad():
        ModuleRaised.guard(which, where, lambda: recorder.run(*inputs))
    bindings: dict[sympy.Symbol, int] = {}
    for node in gm.graph.find_nodes(op="placeholder"):
        _bind(node.meta.get("val"), recorder.values.get(node.name), bindings)
    found = []
    for node in gm.graph.nodes:
        if node.meta.get("val") is None or node.name not in recorder.values:  # None: no description (torch's
            continue  # Verifier accepts it; move_to_device_pass writes it on nodes that had none)
        what = _differs(node.meta["val"], recorder.values[node.name], bindings)
        if what is not None:
            found.append(Disagreement(node.name, node.target, node.format_node() or node.name, what))
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


def _differs(meta: Any, real: Any, bindings: dict[sympy.Symbol, int]) -> str | None:
    """How the real value ``real`` (as :func:`_described` gives it) differs from ``meta``, or None."""
    if isinstance(meta, (int, torch.SymInt)) and not isinstance(meta, bool) and isinstance(real, int):
        size = _concrete(meta, bindings)
        return None if size is None or size == real else f"meta['val'] says {size}, the node gives {real}"
    metas = pytree.tree_leaves(meta)
    reals = pytree.tree_leaves(real, is_leaf=lambda x: isinstance(x, tuple) and bool(x) and x[0] == "tensor")
    tensors = [m for m in metas if isinstance(m, torch.Tensor)]
    real_tensors = [r for r in reals if isinstance(r, tuple) and r and r[0] == "tensor"]
    if len(tensors) != len(real_tensors):
        return f"meta['val'] describes {len(tensors)} tensor(s), the node gives {len(real_tensors)}"
    for i, (m, (_, shape, dtype, device)) in enumerate(zip(tensors, real_tensors, strict=True)):
        label = f"output {i}: " if len(tensors) > 1 else ""
        if m.dtype != dtype:
            return f"{label}meta['val'] says dtype {m.dtype}, the node gives {dtype}"
        if m.device.type != device:
            return f"{label}meta['val'] says device {m.device.type}, the node gives {device}"
        sizes = [_concrete(s, bindings) for s in m.shape]
        if len(sizes) != len(shape) or any(s is not None and s != a for s, a in zip(sizes, shape, strict=False)):
            said = "x".join("?" if s is None else str(s) for s in sizes)
            return f"{label}meta['val'] says shape {said or 'scalar'}, the node gives {'x'.join(map(str, shape)) or 'scalar'}"
    return None
