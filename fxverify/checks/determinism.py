"""determinism: the transform gives the same graph and code every time.

A pass that iterates a ``set`` of nodes orders its output by object address
(which changes with the allocator) or by string hash (which changes with
``PYTHONHASHSEED``). The transform is applied to independent fresh traces in
this process, with the allocator perturbed between runs, and the canonical
graph and code are compared; then with a digest computed in another process
under a different hash seed (one long-lived server process for the whole run,
see :mod:`fxverify.crossprocess`).
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from torch import fx, nn

from fxverify.graph_text import canonical_text
from fxverify.module_state import first_line_difference
from fxverify.result import Finding, Skip

IN_PROCESS_RUNS = 2


def fingerprint(module: nn.Module) -> str:
    """Canonical graph text followed by the generated code."""
    if not isinstance(module, fx.GraphModule):
        raise Skip(f"the transform returned a {type(module).__name__}, not a GraphModule: no graph to compare")
    return canonical_text(module.graph) + "\n--- code ---\n" + module.code


def digest(module: nn.Module) -> str:
    """A short hash of :func:`fingerprint`, for comparing across processes."""
    return hashlib.sha256(fingerprint(module).encode()).hexdigest()[:16]


def check(v: Any) -> dict[str, Any]:
    first = fingerprint(v.applied().result)
    for run in range(IN_PROCESS_RUNS):
        ballast = _perturb_allocator(run)
        again = fingerprint(v.transformed_fresh(v.contract.primary_mode))
        del ballast
        if again != first:
            raise Finding(
                "two fresh traces transformed in the same process gave different graphs "
                "(node order, names or users depend on object addresses: is a set or id() iterated?)",
                where=first_line_difference(first, again),
            )
    if v.cross_process is None:
        return {"in_process_runs": IN_PROCESS_RUNS + 1, "cross_process": "not run (no cross-process runner)"}
    other = v.cross_process(v.case.name)
    if other.startswith("error:"):
        raise Finding(f"the cross-process run (different PYTHONHASHSEED) failed: {other[6:].strip()}")
    if other.startswith("skip:"):
        return {"in_process_runs": IN_PROCESS_RUNS + 1, "cross_process": other}
    here = digest(v.applied().result)
    if other != here:
        raise Finding(
            "the transform gave a different graph in another process with a different PYTHONHASHSEED "
            "(node order depends on string hashing: is a set of names or targets iterated?)",
            where=f"digest here {here}, in the other process {other}",
        )
    return {"in_process_runs": IN_PROCESS_RUNS + 1, "cross_process": "same digest"}


def _perturb_allocator(run: int) -> list[object]:
    """Allocate a random number of objects of assorted sizes so new objects get other addresses."""
    rng = random.Random(run)
    return [object() if i % 3 else [0] * rng.randint(1, 64) for i in range(rng.randint(500, 5000))]
