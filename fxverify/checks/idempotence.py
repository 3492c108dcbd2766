"""idempotence: on ExecuTorch Edge programs, running the pass again on its own result changes nothing more.

ExecuTorch runs passes through a pass manager that may run them again until none changes the program
(``ExportedProgramPassManager(steps=...)``), and backends chain passes that each expect the others' output to be
stable; its pass tests check that a second run adds nothing (``test_insert_pad_qdq.py``). A pass that inserts its
rewrite again each time it runs (a pad or q/dq pair around what it already wrapped), or undoes half of what it did,
fails here: the first line where the program after two runs differs from the program after one is shown. Skipped
under a contract declaring ``idempotent=False``.
"""

from __future__ import annotations

from typing import Any

from fxverify.analysis.graph_text import canonical_text
from fxverify.analysis.module_state import first_line_difference
from fxverify.capture.export import program_of
from fxverify.checks._common import graph_result
from fxverify.core.results import Finding, Skip
from fxverify.engine.subject import Subject


def check(subject: Subject) -> dict[str, Any]:
    if not subject.contract.idempotent:
        raise Skip("the contract declares that the transform changes its own result again (idempotent=False)")
    once = subject.applied().result
    if program_of(once) is None:
        raise Skip("the transform's result carries no program to run it on again")
    twice = subject.transformed_copy(graph_result(once, "no graph to run it on"), subject.applied().mode)
    first, second = program_of(once), program_of(twice)
    if first is None or second is None:
        raise Skip("the transform's second run returned no program")
    before, after = (canonical_text(program.graph, anonymous=True) for program in (first, second))
    if before != after:
        raise Finding(
            "running the pass again on its own result changes it again: "
            f"{first_line_difference(before, after)} (nodes numbered, inputs first). ExecuTorch's pass managers run "
            "passes again until none changes the program, and later passes expect a stable one: make the pass "
            "recognise what it already rewrote (match only the unrewritten form); if changing its result again "
            "each run is what it is for, declare @fxverify.contract(idempotent=False)",
            where="the result after a second run of the transform")
    return {"nodes": len(first.graph.nodes)}
