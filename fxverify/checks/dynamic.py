"""dynamic: a result captured with a dynamic batch still takes every batch size the capture takes.

``torch.export`` with a dynamic ``Dim`` gives a program valid for a range of sizes; a pass that
reads a size from ``meta['val']`` and writes it into the graph (a ``view`` to ``[2, -1]``, a
``sym_size`` node replaced by its example value) keeps the program right at the example size only,
and every check torch makes still passes. Four things are checked:

- the transform specialised no symbolic size, and added no guard false somewhere inside the range,
  while it ran (an ``int()`` of a size from ``meta['val']`` adds ``Eq(s77, 2)`` to the ShapeEnv every
  copy of the program shares, making the caller's own program static; ``FakeTensorProp`` without the
  Python dispatcher does that at ``aten.upsample_bilinear2d``, which is then named);
- no node's arguments hold a symbolic size (``s77``) itself: it is bound while exporting only, and
  the generated code cannot compute it (read sizes at run time, ``aten.sym_size.int(x, dim)``);
- the result runs and computes what the original computes at the smallest and largest batch of
  the range and at two sizes between (judged as numerics judges outputs; the sizes numerics already
  compared are not run again; none where the transform changed nothing: the result is the capture
  as made). A result that is already wrong at the example batch skips: that is
  numerics' finding, not a dynamic-shape one; so is a float32 difference where the float64 outputs
  agree (the rounding of other kernels: a channels-last convolution is less accurate in float32),
  which is noted in the details;
- FakeTensors re-propagated through the result on a copy of its ShapeEnv
  (:mod:`fxverify.analysis.repropagation`) add no guard that is false somewhere inside the range
  (``Eq(s77, 2)`` from an ``expand`` to the example batch, ``s77 < 4`` from a slice ending at 4),
  but those re-propagating through the original adds too; a guard that holds over the whole range
  (``s77 < 16``) is not a finding. The node that added it is named, with the sizes' failure when
  there is one.

Skipped for captures without a dynamic dimension (``symbolic_trace``, a static export).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from fxverify.analysis.repropagation import Violation, repropagate
from fxverify.capture.export import BATCH_RANGE
from fxverify.cases.inputs import with_batch
from fxverify.checks import _shapes
from fxverify.checks._common import node_text
from fxverify.checks._outputs import compare_config, finding_of, float32_rounding
from fxverify.core.results import Finding, ModuleRaised, Skip
from fxverify.engine.subject import Subject

SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def check(subject: Subject) -> dict[str, Any]:
    applied = subject.applied()
    low, high = _batch_range(applied.original)
    cut = _shapes.guard_violation(subject)
    _changed_while_running(subject, cut)
    result = applied.result
    if isinstance(result, fx.GraphModule):
        for node in result.graph.nodes:
            held = [a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, SYMBOLIC)]
            if held:
                raise Finding(
                    f"%{node.name} holds the symbolic size {held[0]} itself in its arguments: the symbol is bound only "
                    "while exporting, so the generated code cannot compute it. Read the size at run time instead "
                    "(a node aten.sym_size.int(x, dim), or the node that already computes it)",
                    node=node.format_node() or node.name)
    if not applied.changes:  # the guards above are the transform's even so: reading a size can add one
        return {"batch_range": [low, high], "batch_sizes": "not run: the transform changed nothing in the capture, so "
                                                            "the result would be compared with itself"}
    try:
        wrong_already = compare_config(subject, subject.primary) is not None
    except ModuleRaised:
        wrong_already = True
    if wrong_already:
        raise Skip(f"the result already differs from the original at the example batch "
                   f"({subject.primary.describe()}): the numerics check reports that; other batch sizes would say nothing "
                   "more")
    sizes = sorted({low, high, low + (high - low) // 3, low + 2 * (high - low) // 3, *_sizes_at(cut, low, high)})
    compared = {config.specs[0].shape[0] for config in subject.configs if config.scale == 1.0}
    rounding: list[int] = []
    for batch in sizes:
        config = with_batch(subject.primary, batch)
        finding: Finding
        try:
            found = compare_config(subject, config)
        except ModuleRaised as raised:
            if raised.which == "original":
                raise Skip(f"the capture itself does not run at batch {batch}, inside the range [{low}, {high}] it "
                           f"was exported for: {raised.cause}") from None
            finding = raised
        else:
            if found is None:
                continue
            if float32_rounding(subject, config, found) is not None:  # right in float64: no size written into the graph
                rounding.append(batch)  # the accuracy of float32 kernels is numerics' to judge
                continue
            finding = finding_of(found, f"{config.describe()}, {subject.dtype}, {applied.mode} mode")
        finding.what += (f"\nthe capture's batch is dynamic in [{low}, {high}], and the result was made from a "
                         f"capture at batch {subject.primary.specs[0].shape[0]}: a size of the example inputs was written "
                         "into the graph (a view or reshape to a fixed shape, a sym_size node replaced by its "
                         "value); read sizes at run time (aten.sym_size.int) or keep the symbolic expression")
        if cut is not None:
            finding.what += f"\nre-propagating FakeTensors through the result, {cut.describe()}"
            finding.node = _named(result, cut.guard.node)  # the cause, before where a run raised
        raise finding
    if cut is not None:
        raise Finding(
            f"re-propagating FakeTensors through the result, {cut.describe()}: traced with symbolic sizes, the result "
            "holds for part of the range the capture was exported for only. It computes the same at the sizes run here "
            "(that one included), but whatever traces it again with a symbolic batch (re-export, run_decompositions, "
            "ExecuTorch's to_edge, torch.compile) specialises it or rejects the range (export: 'Constraints violated'). "
            "Where the node's arguments hold a size the pass wrote, keep it symbolic (aten.sym_size.int); where its "
            "target's FakeTensor implementation branches on a size (a custom op's register_fake), make it decide "
            "without a guard (torch.fx.experimental.symbolic_shapes.statically_known_true) or not branch at all",
            input=f"FakeTensors made from the placeholders' meta['val'], batch in [{low}, {high}]",
            node=_named(result, cut.guard.node))
    details: dict[str, Any] = {"batch_range": [low, high], "batch_sizes": [b for b in sizes if b not in compared]}
    if rounding:
        details["float32_rounding_only"] = (f"at batch {', '.join(map(str, rounding))} the float32 outputs differ "
                                            "beyond the rule and the float64 ones agree: kernels' rounding, not a size "
                                            "written into the graph (numerics judges float32 accuracy)")
    return details


def _changed_while_running(subject: Subject, cut: Violation | None) -> None:
    """Raise a :class:`Finding` where the transform, while it ran, specialised a symbolic size or added a guard
    false somewhere inside the capture's range to the ShapeEnv every copy of the program shares (``cut``: a
    guard that re-propagating through the result adds)."""
    added = _shapes.guard_added_while_running(subject)
    if added is None:
        return
    applied = subject.applied()
    if applied.specialised:
        name, (lower, upper) = next(iter(applied.specialised.items()))
        what = (f"the transform specialised the symbolic size {name} (in [{lower}, {upper}] as captured) while it "
                "ran: it is a constant now in the ShapeEnv that the program and every copy of it share, so the "
                "caller's own program is static there too (its placeholders' meta['val'] say the example size; its "
                "run_decompositions() rejects other sizes)")
    else:
        what = (f"the transform added the guard {added.guard.expr} to the ShapeEnv while it ran, false at {added.at}, "
                "inside the range the capture was exported for: the program and every copy of it share that "
                "ShapeEnv, so the caller's own program no longer takes that size (its run_decompositions() fails "
                "with 'Guard failed')")
    node, why = _culprit(subject, cut, str(added.guard.expr))
    raise Finding(f"{what}. {why}", where="the ShapeEnv of the capture",
                  node=_named(applied.result, node))


def _culprit(subject: Subject, cut: Violation | None, guard: str) -> tuple[str | None, str]:
    """The node that needs ``guard``, which the transform added while it ran, and how to avoid it (each claim
    checked: the re-propagations that add the guard and those that do not)."""
    if cut is not None and str(cut.guard.expr) == guard:
        return cut.guard.node, (f"Re-propagating FakeTensors through the result adds it at %{cut.guard.node}: the graph "
                                "itself holds for part of the range only; keep the sizes the pass writes symbolic "
                                "(aten.sym_size.int)")
    aided = _shapes.repropagated(subject, "result")
    needing = next((g.node for g in (aided.guards if aided is not None else []) if str(g.expr) == guard), None)
    if needing is not None:  # the op's FakeTensor implementation asks it, though exporting the model did not
        return needing, (f"Running %{needing}'s op on FakeTensors adds it (its FakeTensor implementation branches on the "
                         "size), and a pass that computes meta['val'] that way records it in the program's ShapeEnv: "
                         "run the op inside shape_env.suppress_guards() (the ShapeEnv of the inputs' meta['val']), "
                         "which records none")
    result = subject.applied().result
    unaided = repropagate(result, subject.applied().shape_env, python_dispatcher=False) \
        if isinstance(result, fx.GraphModule) else None
    found = next((g for g in (unaided.guards if unaided is not None else []) if str(g.expr) == guard), None)
    if found is not None:
        return found.node, (f"Running the result's ops on FakeTensors without the Python dispatcher, as "
                            "torch.fx.passes.fake_tensor_prop.FakeTensorProp does, adds it at "
                            f"%{found.node} (its C++ kernel specialises sizes): recompute meta['val'] inside "
                            "torch._dispatch.python.enable_python_dispatcher(), as torch.export traces, which adds "
                            "no such guard")
    return None, ("An int(), bool() or == of a size read from meta['val'] adds such a guard: test sizes with "
                  "torch.fx.experimental.symbolic_shapes.statically_known_true, or read the example value with "
                  "size.node.hint, neither of which adds one")


def _sizes_at(cut: Violation | None, low: int, high: int) -> list[int]:
    """The batch size where the guard ``cut`` is false, to run the result at (the range's one symbol is the batch)."""
    if cut is None or len(cut.point) != 1:
        return []
    (size,) = cut.point.values()
    return [size] if low <= size <= high else []


def _batch_range(original: fx.GraphModule) -> tuple[int, int]:
    """The range of the dynamic batch as the capture recorded it, before any pass ran."""
    found = original.meta.get(BATCH_RANGE)
    if found is None:
        raise Skip("the capture has no dynamic batch dimension")
    return found


def _named(gm: nn.Module, name: str | None) -> str | None:
    """The node ``name`` of ``gm`` as FX prints it (:func:`~fxverify.checks._common.node_text`); None for no name."""
    return node_text(gm, name) if name is not None else None
