"""The HTML report: one self-contained file (inline CSS and SVG, no scripts, no
external URLs). Per transform, the model x check matrix; per failure, the
message, the error numbers, the divergent node, the repro path, the graphs
before and after drawn around the divergent node, and a side-by-side diff of
the generated code. Every string that comes from a model or a transform is escaped.

>>> from fxverify.core.results import CheckResult
>>> from fxverify.reports.records import record
>>> page = render_html([record(CheckResult("lint", "<b>m</b>", "my:pass", "passed"))])
>>> "&lt;b&gt;m&lt;/b&gt;" in page and "<b>m</b>" not in page
True
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Mapping
from html import escape
from pathlib import Path
from typing import Any

from fxverify.analysis.op_variants import OP_COUNTS
from fxverify.core.results import Outcome
from fxverify.reports.records import FIGURES, header
from fxverify.reports.summary import changed_cell, rewrite_warning, variant_warning

Record = Mapping[str, Any]

SHOWN = ("failed", "error")  # outcomes with a section of their own

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #1d1d1f; }
h1 { font-size: 1.4em; } h2 { font-size: 1.2em; margin-top: 1.5em; } h3 { font-size: 1.05em; }
.meta { color: #555; font-size: .9em; }
table.matrix { border-collapse: collapse; margin: .5em 0 1em; }
table.matrix th, table.matrix td { border: 1px solid #ccc; padding: .25em .6em; text-align: center; }
table.matrix th.model { text-align: left; font-weight: normal; font-family: monospace; }
td.passed { background: #d9f2dc; } td.failed { background: #f8c9c9; font-weight: bold; }
td.skipped { background: #eee; color: #666; } td.xfailed { background: #fbe7c6; }
td.failed a { color: #8b0000; } td.error { background: #e4d4f4; font-weight: bold; }
td.changed { font-family: monospace; font-size: .85em; }
section.failure { border-top: 2px solid #d33; margin-top: 1.5em; padding-top: .5em; }
pre.message { background: #f6f6f6; padding: .6em; overflow-x: auto; font-size: .85em; }
table.numbers td { padding: .1em .8em .1em 0; font-family: monospace; }
.figures { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
figure { margin: 0; border: 1px solid #ddd; padding: .4em; max-width: 48%; overflow: auto; }
figure svg { max-width: 100%; height: auto; }
figcaption { font-size: .85em; color: #444; }
.note { background: #fff6d6; border-left: 4px solid #e0b400; padding: .4em .8em; }
.legend span { padding: 0 .5em; margin-right: .5em; }
table.diff { font-family: monospace; font-size: .8em; border-collapse: collapse; }
table.diff td { padding: 0 .4em; vertical-align: top; white-space: pre-wrap; }
.diff_header { color: #888; text-align: right; } td.diff_next { display: none; }
.diff_add { background: #c9f2cf; } .diff_chg { background: #fff0a8; } .diff_sub { background: #f8c9c9; }
"""

_LEGEND = (
    '<p class="legend"><span style="background:#ffc9c9;border:2px solid red">divergent node</span>'
    '<span style="background:#fff0a8">changed by the transform</span>'
    '<span style="border:1px dashed #333">neighbours cut off</span></p>'
)


def render_html(records: Iterable[Record], head: Mapping[str, Any] | None = None) -> str:
    """The report page for ``records`` (see :mod:`fxverify.reports.records`)."""
    records = list(records)
    head = head or header()
    versions = ", ".join(f"{name} {version}" for name, version in head["versions"].items() if version)
    counts = _counts(records)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>fxverify report</title>',
        f"<style>{_CSS}</style></head><body>",
        "<h1>fxverify report</h1>",
        f'<p class="meta">{escape(head["created"])} &middot; {escape(versions)} &middot; {escape(counts)}</p>',
    ]
    failures = [r for r in records if r["outcome"] in SHOWN]
    anchors = {id(r): f"failure-{i}" for i, r in enumerate(failures, 1)}
    for transform in dict.fromkeys(r["transform"] for r in records):
        parts.append(_matrix(transform, [r for r in records if r["transform"] == transform], anchors,
                             head.get("random_graphs", ())))
    if failures:
        parts.append("<h2>Failures</h2>")
        if any(r.get(FIGURES) for r in failures):
            parts.append(_LEGEND)
    diffs_shown: dict[tuple[str, str], str] = {}
    for r in failures:
        parts.append(_failure(r, anchors[id(r)], diffs_shown))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html(path: str | Path, records: Iterable[Record], head: Mapping[str, Any] | None = None) -> Path:
    """Write the report page to ``path`` (parent folders created) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(records, head), encoding="utf-8")
    return path


def _counts(records: list[Record]) -> str:
    found = {o.value: sum(r["outcome"] == o.value for r in records) for o in Outcome}
    return ", ".join(f"{n} {o}" for o, n in found.items() if n) or "no items"


def _matrix(transform: str, records: list[Record], anchors: Mapping[int, str], random_graphs: Collection[str]) -> str:
    """One transform's table: a row per model, a column per check, cells linking to failures, and
    what the transform changed on each model; above it, a warning when it rewrote (almost) nothing
    and how many of the random graphs it changed, and one naming the variants of the ops it rewrote that it
    left untouched, as in the terminal summary."""
    checks = list(dict.fromkeys(r["check"] for r in records))
    cells = {(r["model"], r["check"]): r for r in records}
    changes = {r["model"]: r.get("changed") for r in records if r.get("changed") is not None}
    rows = [f'<h2>transform <code>{escape(transform)}</code></h2>']
    warning = rewrite_warning(transform, changes, random_graphs)
    if warning:
        rows.append(f'<p class="note">{escape(warning)}</p>')
    variants = variant_warning(transform, {r["model"]: r[OP_COUNTS] for r in records if r.get(OP_COUNTS)})
    if variants:
        rows.append(f'<p class="note variants">{escape(variants)}</p>')
    rows.append(f'<table class="matrix" data-transform="{escape(transform)}"><tr><th>model</th>'
                + "".join(f"<th>{escape(c)}</th>" for c in checks) + "<th>changed</th></tr>")
    for model in dict.fromkeys(r["model"] for r in records):
        row = [f'<tr><th class="model">{escape(model)}</th>']
        for check in checks:
            r = cells.get((model, check))
            if r is None:
                row.append('<td class="missing">-</td>')
                continue
            outcome: str = r["outcome"]
            text = escape(Outcome(outcome).short)
            if id(r) in anchors:
                text = f'<a href="#{anchors[id(r)]}">{text}</a>'
            title = escape(r["message"].splitlines()[0] if r.get("message") else r["outcome"])
            row.append(f'<td class="{escape(r["outcome"])}" data-model="{escape(model)}" '
                       f'data-check="{escape(check)}" title="{title}">{text}</td>')
        row.append(f'<td class="changed">{escape(changed_cell(changes.get(model)))}</td>')
        rows.append("".join(row) + "</tr>")
    rows.append("</table>")
    return "\n".join(rows)


def _failure(r: Record, anchor: str, diffs_shown: dict[tuple[str, str], str]) -> str:
    """One failure: numbers, divergent node, repro, message, pictures, code diff."""
    parts = [f'<section class="failure" id="{anchor}">',
             f"<h3>{escape(r['model'])} &middot; {escape(r['check'])} &middot; "
             f"<code>{escape(r['transform'])}</code></h3>",
             _numbers(r),
             f'<pre class="message">{escape(r.get("message") or "")}</pre>']
    figures = r.get(FIGURES)
    if figures:
        parts.append(_pictures(figures))
        key = (r["transform"], r["model"])
        if key in diffs_shown:
            parts.append(f'<p>Code diff: as in <a href="#{diffs_shown[key]}">the first failure of this model</a>.</p>')
        elif figures.get("code_before") is not None:
            diffs_shown[key] = anchor
            parts.append(_code_diff(figures["code_before"], figures.get("code_after") or ""))
    parts.append("</section>")
    return "\n".join(parts)


def _numbers(r: Record) -> str:
    rows = []
    for label, key in (("max abs error", "max_abs"), ("max rel error", "max_rel")):
        if r.get(key) is not None:
            rows.append((label, f"{r[key]:.4g}"))
    for key, value in (r.get("divergence") or {}).items():
        if value not in (None, ""):
            rows.append((f"divergence: {key}", f"{value:.4g}" if isinstance(value, float) else str(value)))
    if r.get("repro"):
        rows.append(("repro", str(r["repro"])))
    if r.get("duration") is not None:
        rows.append(("duration", f"{r['duration']:.2f} s"))
    body = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="numbers">{body}</table>' if rows else ""


def _pictures(figures: Mapping[str, Any]) -> str:
    parts = []
    if figures.get("note"):
        parts.append(f'<p class="note">{escape(figures["note"])}</p>')
    shown = []
    for which in ("before", "after"):
        svg = figures.get(f"{which}_svg")
        if svg:  # made by Graphviz from escaped labels (see fxverify.reports.graph_picture)
            caption = escape(f"{which} the transform: {figures.get(f'{which}_caption') or ''}")
            shown.append(f'<figure class="graph {which}"><figcaption>{caption}</figcaption>{svg}</figure>')
    if shown:
        parts.append('<div class="figures">' + "".join(shown) + "</div>")
    return "\n".join(parts)


def _code_diff(before: str, after: str) -> str:
    """A side-by-side diff of the generated code (difflib escapes the text), changed lines in context."""
    table = difflib.HtmlDiff(wrapcolumn=90).make_table(
        before.strip("\n").splitlines(), after.strip("\n").splitlines(),
        "code before", "code after", context=True, numlines=3,
    )
    return '<div class="code-diff"><h4>Generated code</h4>' + table + "</div>"
