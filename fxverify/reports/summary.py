"""The end-of-run table: models x checks, one block per transform, with what the
transform changed on each model, and a warning when it rewrote (almost) nothing.

Pure formatting over precomputed outcomes, so it is testable without pytest.

>>> print(format_table("my:pass", "strict (default)", {("m", "lint"): "pass"}, ["lint"], {"m": []}))
transform my:pass  [contract strict (default)]
model  lint  changed
m      pass  no-op
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from fxverify.analysis.op_variants import coverage
from fxverify.cases.catalogue import split_label
from fxverify.core.results import rewrites

FEW = 0.1  # a transform that rewrote at most this share of the models "changed almost nothing"
SHOWN = 5  # models named in a warning


def changed_cell(changes: Sequence[str] | None) -> str:
    """The ``changed`` column: ``no-op`` (nothing at all changed), what changed
    (``graph+state``, ``code``, ``meta``), or ``?`` when it is not known (the transform failed,
    or the model is an expected failure and no check ran).

    >>> changed_cell([]), changed_cell(["graph", "state"]), changed_cell(None)
    ('no-op', 'graph+state', '?')
    """
    if changes is None:
        return "?"
    return "+".join(changes) if changes else "no-op"


def merged_changes(seen: Sequence[str] | None, more: Sequence[str] | None) -> list[str] | None:
    """What a transform changed on a model as its items report it, each what it has seen so far (a check
    that runs the transform in another mode sees more): the union, None while none knows.

    >>> merged_changes(None, []), merged_changes(["code"], ["code", "graph"]), merged_changes(None, None)
    ([], ['code', 'graph'], None)
    """
    if seen is None or more is None:
        return None if seen is None and more is None else list(seen or more or ())
    return list(dict.fromkeys([*seen, *more]))


def format_table(
    transform: str,
    contract: str,
    outcomes: Mapping[tuple[str, str], str],
    checks: Sequence[str],
    changes: Mapping[str, Sequence[str] | None] | None,
    *,
    kind: str = "transform",
) -> str:
    """One transform's block: a row per model, a column per check, and what it changed. A block of passes inside
    torch.compile (``kind`` the option naming them: ``backend``) has a row per subject, no contract where
    ``contract`` is empty and no ``changed`` column where ``changes`` is None.

    >>> print(format_table("my:backend", "", {("m", "backend-outputs"): "FAIL"}, ["backend-outputs"], None,
    ...                    kind="backend"))
    backend my:backend
    subject  backend-outputs
    m        FAIL
    """
    models = list(dict.fromkeys(model for model, _ in outcomes))
    header = ["model" if kind == "transform" else "subject", *checks, *(["changed"] if changes is not None else [])]
    rows = [header]
    for model in models:
        changed = [] if changes is None else [changed_cell(changes.get(model))]
        rows.append([model, *(outcomes.get((model, c), "-") for c in checks), *changed])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [f"{kind} {transform}" + (f"  [contract {contract}]" if contract else "")]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def rewrite_warning(transform: str, changes: Mapping[str, Sequence[str] | None],
                    random_graphs: Collection[str] = ()) -> str | None:
    """A loud line when ``transform`` changed the graph or parameters of no model it ran on
    ("nothing was verified"), or of only a few; with random graphs among the models, how many
    of them it changed. None when it rewrote enough to say nothing.

    >>> print(rewrite_warning("my:pass", {"a": ["code"], "b": []}))  # doctest: +ELLIPSIS
    WARNING: my:pass changed the graph or parameters of none of the 2 models it ran on: nothing it rewrites ...
    >>> print(rewrite_warning("my:pass", {"a": ["graph"], "random_graph_7": []}, {"random_graph_7"}))
    my:pass changed 0 of 1 random graphs (graph or parameters)
    """
    ran = [model for model, changed in changes.items() if changed is not None]
    rewrote = [model for model in ran if rewrites(changes[model])]
    lines = []
    if ran and not rewrote:
        lines.append(f"WARNING: {transform} changed the graph or parameters of none of the {len(ran)} models it "
                     "ran on: nothing it rewrites was verified")
    elif ran and len(rewrote) <= FEW * len(ran):
        names = ", ".join(rewrote[:SHOWN]) + (f" and {len(rewrote) - SHOWN} more" if len(rewrote) > SHOWN else "")
        lines.append(f"WARNING: {transform} changed the graph or parameters of only {len(rewrote)} of the {len(ran)} "
                     f"models it ran on ({names}): little of what it rewrites was verified")
    if lines:
        lines[-1] += (". Select models that have what it rewrites (--fxverify-corpus, --fxverify-tags), or add "
                      "random graphs of the ops it rewrites (--fxverify-random-graphs N)")
    differing = capture_disagreement(transform, changes)
    if differing:
        lines.append(differing)
    graphs = [model for model in ran if model in random_graphs]
    if graphs:
        changed = sum(model in rewrote for model in graphs)
        lines.append(f"{transform} changed {changed} of {len(graphs)} random graphs (graph or parameters)")
    return "\n".join(lines) or None


def variant_warning(transform: str, op_counts: Mapping[str, Mapping[str, Any]]) -> str | None:
    """A line naming the ops ``transform`` rewrote in some model and the variants of them (the same op,
    its in-place, ``out=`` and functional twins, other overloads, other spellings) it left untouched in
    the models it ran on, with their counts; None when it left none. ``op_counts`` holds each model's
    ``{"before": counts, "after": counts}`` (see :mod:`fxverify.analysis.op_variants`).

    >>> print(variant_warning("my:pass", {"a": {"before": {"aten.relu.default": 2}, "after": {}},
    ...                                   "b": {"before": {"aten.relu_.default": 3}, "after": {"aten.relu_.default": 3}}}))
    ... # doctest: +ELLIPSIS
    WARNING: my:pass rewrote aten.relu.default x2 in 1 model; left aten.relu_.default x3 in 1 model: in-place twin (b). ...
    >>> variant_warning("my:pass", {"a": {"before": {"aten.relu.default": 2}, "after": {}}}) is None
    True
    """
    text = coverage(op_counts).describe()
    if not text:
        return None
    return (f"WARNING: {transform} {text}. A pass that rewrites only where its pattern holds may leave them by design; "
            "one meant to rewrite every occurrence misses them, and nothing verified it on them (a contract declaring "
            "rewrites_every_occurrence=True fails the variants item of each model where it rewrote an op and left a "
            "variant of it)")


def capture_disagreement(transform: str, changes: Mapping[str, Sequence[str] | None]) -> str | None:
    """A line naming the models ``transform`` rewrote (graph or parameters) under some captures and
    not under others (``changes`` keyed by ``model@capture`` labels), or None.

    >>> print(capture_disagreement("my:pass", {"m@export": ["code"], "m@export_core": ["graph"]}))
    ... # doctest: +ELLIPSIS
    WARNING: my:pass rewrote 1 model(s) under some captures and not under others (m: export_core, not export): ...
    """
    rewrote: dict[str, dict[str, bool]] = {}
    for label, changed in changes.items():
        if changed is not None:
            model, capture = split_label(label)
            rewrote.setdefault(model, {})[capture] = rewrites(changed)
    differing = {model: by_capture for model, by_capture in rewrote.items() if len(set(by_capture.values())) > 1}
    if not differing:
        return None
    shown = "; ".join(f"{model}: {', '.join(c for c, yes in by.items() if yes)}, not "
                      f"{', '.join(c for c, yes in by.items() if not yes)}" for model, by in list(differing.items())[:SHOWN])
    more = f"; and {len(differing) - SHOWN} more" if len(differing) > SHOWN else ""
    return (f"WARNING: {transform} rewrote {len(differing)} model(s) under some captures and not under others "
            f"({shown}{more}): its items under the others verify none of that change. Either what it matches is "
            "spelled otherwise there (the training IR keeps aten.relu_ where core ATen has aten.relu), or what it "
            "changed exists under one capture only (the unread outputs of a call, which export writes as getitem "
            "nodes and a dead-code elimination drops)")
