"""dynamic: a result captured with a dynamic batch still takes every batch size the capture takes.

``torch.export`` with a dynamic ``Dim`` gives a program valid for a range of sizes; a pass that
reads a size from ``meta['val']`` and writes it into the graph (a ``view`` to ``[2, -1]``, a
``sym_size`` node replaced by its example value) keeps the program right at the example size only,
and every check torch makes still passes. Three things are checked:

- the transform specialised no symbolic size while it ran (an ``int()`` of a size from
  ``meta['val']`` adds ``Eq(s77, 2)`` to the ShapeEnv every copy of the program shares, making the
  caller's own program static);
- no node's arguments hold a symbolic size (``s77``) itself: it is bound while exporting only, and
  the generated code cannot compute it (read sizes at run time, ``aten.sym_size.int(x, dim)``);
- the result runs and computes what the original computes at the smallest and largest batch of
  the range and at two sizes between (judged as numerics judges outputs; the sizes numerics already
  compared are not run again). A result that is already wrong at the example batch skips: that is
  numerics' finding, not a dynamic-shape one.

Skipped for captures without a dynamic dimension (``symbolic_trace``, a static export).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from fxverify.capture.export import BATCH_RANGE
from fxverify.cases.inputs import with_batch
from fxverify.checks.numerics import compare_config, finding_of
from fxverify.engine.results import Finding, ModuleRaised, Skip
from fxverify.engine.subject import Subject

SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def check(v: Subject) -> dict[str, Any]:
    applied = v.applied()
    low, high = _batch_range(applied.original)
    if applied.specialised:
        name, (lower, upper) = next(iter(applied.specialised.items()))
        raise Finding(
            f"the transform specialised the symbolic size {name} (in [{lower}, {upper}] as captured) while it ran: it "
            "is a constant now in the ShapeEnv that the program and every copy of it share, so the caller's own "
            "program is static there too (its placeholders' meta['val'] say the example size; its "
            "run_decompositions() rejects other sizes). An int(), bool() or == of a size read from meta['val'] adds "
            "that guard: test sizes with torch.fx.experimental.symbolic_shapes.statically_known_true, or read the "
            "example value with size.node.hint, neither of which adds a guard",
            where="the ShapeEnv of the capture")
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
    try:
        wrong_already = compare_config(v, v.primary) is not None
    except ModuleRaised:
        wrong_already = True
    if wrong_already:
        raise Skip(f"the result already differs from the original at the example batch "
                   f"({v.primary.describe()}): the numerics check reports that; other batch sizes would say nothing "
                   "more")
    sizes = sorted({low, high, low + (high - low) // 3, low + 2 * (high - low) // 3})
    compared = {config.specs[0].shape[0] for config in v.configs if config.scale == 1.0}
    for batch in sizes:
        config = with_batch(v.primary, batch)
        finding: Finding
        try:
            found = compare_config(v, config)
        except ModuleRaised as raised:
            if raised.which == "original":
                raise Skip(f"the capture itself does not run at batch {batch}, inside the range [{low}, {high}] it "
                           f"was exported for: {raised.cause}") from None
            finding = raised
        else:
            if found is None:
                continue
            finding = finding_of(found, f"{config.describe()}, float32, {applied.mode} mode")
        finding.what += (f"\nthe capture's batch is dynamic in [{low}, {high}], and the result was made from a "
                         f"capture at batch {v.primary.specs[0].shape[0]}: a size of the example inputs was written "
                         "into the graph (a view or reshape to a fixed shape, a sym_size node replaced by its "
                         "value); read sizes at run time (aten.sym_size.int) or keep the symbolic expression")
        raise finding
    return {"batch_range": [low, high], "batch_sizes": [b for b in sizes if b not in compared]}


def _batch_range(original: fx.GraphModule) -> tuple[int, int]:
    """The range of the dynamic batch as the capture recorded it, before any pass ran."""
    found = original.meta.get(BATCH_RANGE)
    if found is None:
        raise Skip("the capture has no dynamic batch dimension")
    return found
