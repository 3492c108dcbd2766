"""The end-of-run table: models x checks, one block per transform.

Pure formatting over precomputed outcomes, so it is testable without pytest.

>>> print(format_table("my:pass", "strict (default)", {("m", "lint"): "pass"}, ["lint"], {"m": True}))
transform my:pass  [contract strict (default)]
model  lint  changed
m      pass  no-op
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def format_table(
    transform: str,
    contract: str,
    outcomes: Mapping[tuple[str, str], str],
    checks: Sequence[str],
    no_op: Mapping[str, bool | None],
) -> str:
    """One transform's block: a row per model, a column per check, and whether it changed anything."""
    models = list(dict.fromkeys(model for model, _ in outcomes))
    header = ["model", *checks, "changed"]
    rows = [header]
    for model in models:
        changed = {True: "no-op", False: "yes", None: "?"}[no_op.get(model)]
        rows.append([model, *(outcomes.get((model, c), "-") for c in checks), changed])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [f"transform {transform}  [contract {contract}]"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)
