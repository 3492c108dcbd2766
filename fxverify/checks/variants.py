"""variants: the ops a transform rewrote, and the variants of them it left untouched.

A pass keyed on ``aten.relu.default`` rewrites nothing of the training IR's ``aten.relu_.default``;
one matching ``F.relu`` leaves ``nn.ReLU`` and ``x.relu()``. Outputs stay exact, so no other check
can fail it. This check counts the targets of the original capture and of the result (see
:mod:`fxverify.analysis.op_variants`): what the transform rewrote (a count that went down) and which
variants of those ops the model still holds untouched (the same op, other overloads, the in-place,
``out=`` and functional twins; the function, method and module spellings).

It passes with the counts in its details (``op_counts``, which the run's summary adds up over the
models into one warning per transform: a variant left in one model counts against an op rewritten in
another) unless the contract promises ``rewrites_every_occurrence``: then a model where the transform
rewrote an op and left a variant of it fails, naming the variant, its count and its first node. That promise
is about every occurrence of an op; what a pattern pass promises about its patterns' spellings is
``rewrites_spellings``, which pattern fuzzing checks (``fxverify.compile.patterns``).
"""

from __future__ import annotations

from typing import Any

from fxverify.analysis.op_variants import OP_COUNTS, coverage, first_node, op_counts
from fxverify.checks._common import graph_result
from fxverify.core.results import Finding
from fxverify.engine.subject import Subject


def check(subject: Subject) -> dict[str, Any]:
    applied = subject.applied()
    result = graph_result(applied.result, "no graph to count")
    counts = {"before": op_counts(applied.original), "after": op_counts(result)}
    found = coverage({subject.case.name: counts})
    details: dict[str, Any] = {OP_COUNTS: counts, "rewrote": {r.op: r.count for r in found.rewrote},
                               "left": [f"{left.op} x{left.count}: {left.kind} of {left.of}" for left in found.left]}
    if found.left and subject.contract.rewrites_every_occurrence:
        left = found.left[0]
        node = first_node(applied.result, left.op)
        rewrote = next(r for r in found.rewrote if r.op == left.of)
        others = "; ".join(f"{f.op} x{f.count} ({f.kind} of {f.of})" for f in found.left[1:])
        raise Finding(
            f"the transform rewrote {rewrote.op} x{rewrote.count} and left {left.op} x{left.count} untouched "
            f"({left.kind} of {left.of})" + (f"; also left: {others}" if others else "") + ", where its contract "
            "promises to rewrite every occurrence (rewrites_every_occurrence=True). Match every variant of the op "
            f"({left.op} too), or drop the promise if the pass rewrites only where a pattern holds (a pattern pass "
            "promises the spellings its patterns fire on with rewrites_spellings, which pattern fuzzing checks).",
            node=(node.format_node() or node.name) if node is not None else None, details=details)
    return details
