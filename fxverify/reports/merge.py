"""One report from the shards of a run: the JSON reports (``--fxverify-json``) that the machines of a
CI matrix wrote, each running one ``--fxverify-shard I/N`` of the same selection, merged into the
JSON and HTML reports and the summary one run of the whole selection gives::

    python -m fxverify.reports.merge shard-*.json --json all.json --html all.html

It refuses, saying why, reports written with other versions (fxverify, torch, torchvision, timm,
Python), of other transforms, checks or selections, a shard given twice or missing, and shards that
overlap (computed from different ``--fxverify-durations`` files). The exit status is pytest's: 0
when no item failed, 1 when some did, 2 for a refusal. The merged HTML has no graph pictures (the
JSON does not carry them); each shard's own ``--fxverify-html`` has those of its failures.

>>> head = {"schema": 1, "versions": {"torch": "2.4"}, "random_graphs": []}
>>> def shard(i, model):
...     run = {"checks": ["lint"], "contracts": {"my:pass": "strict"}, "shard": f"{i}/2", "selection": ["a", "b"],
...            "models": [model]}
...     found = {"transform": "my:pass", "model": model, "check": "lint", "outcome": "passed", "changed": []}
...     return {"header": {**head, "run": run}, "records": [found]}
>>> merged = merge_reports({"2.json": shard(2, "b"), "1.json": shard(1, "a")})
>>> [r["model"] for r in merged["records"]], merged["header"]["run"]["shard"]
(['a', 'b'], None)
>>> merge_reports({"1.json": shard(1, "a"), "2.json": shard(2, "a")})
Traceback (most recent call last):
...
fxverify.reports.records.ReportError: the shards overlap: 1 models in two shards (a in 1.json and 2.json), 1 in none (b): ...
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fxverify import checks
from fxverify.cases.catalogue import parse_shard
from fxverify.core.results import ERROR, FAILED, Outcome
from fxverify.errors import CorpusError
from fxverify.reports.html import write_html
from fxverify.reports.records import ReportError, header, read_json, sorted_records, write_json
from fxverify.reports.summary import format_table, merged_changes, rewrite_warning

Report = Mapping[str, Any]
SHOWN = 5  # models named in an error
PASS_OPTIONS = tuple(k.option for k in checks.KINDS if k.name != checks.MODEL)  # a compile spec's "contract"


def merge_reports(reports: Mapping[str, Report]) -> dict[str, Any]:
    """One report (``{"header": ..., "records": [...]}``) of the shards' ``reports``, keyed by where
    they came from (for the errors); :class:`ReportError` when they are not the shards of one run."""
    if not reports:
        raise ReportError("no reports to merge: give the --fxverify-json report of every shard")
    runs = {path: _run(path, report) for path, report in reports.items()}
    versions = _agreeing({path: report["header"]["versions"] for path, report in reports.items()}, "versions",
                         "run every shard with the same fxverify, torch, torchvision, timm and Python")
    for what, key in (("transforms", "contracts"), ("checks", "checks"), ("selection", "selection")):
        _agreeing({path: run[key] for path, run in runs.items()}, what,
                  "merge the shards of one run, each given the same options but --fxverify-shard")
    _complete(runs)
    _partition(runs)
    first = next(iter(runs.values()))
    records = [found for report in reports.values() for found in report["records"]]
    _distinct(records, reports)
    run = {**first, "shard": None, "models": first["selection"]}
    random_graphs = {model for report in reports.values() for model in report["header"].get("random_graphs", ())}
    return {"header": {**header(random_graphs, run), "versions": versions},
            "records": sorted_records(records, first["checks"])}


def summary(report: Report) -> str:
    """The terminal summary of a report with a ``run`` header (a merged one): per transform, the table of
    models (in catalogue order) x checks with what it changed, and the warning when it rewrote (almost)
    nothing, as the run itself prints them."""
    run, random_graphs = report["header"]["run"], report["header"].get("random_graphs", ())
    row = {model: i for i, model in enumerate(run["selection"])}
    blocks = []
    for spec, contract in run["contracts"].items():
        records = sorted((r for r in report["records"] if r["transform"] == spec),
                         key=lambda r: row.get(r["model"], len(row)))
        cells = {(r["model"], r["check"]): Outcome(r["outcome"]).short for r in records}
        changes: dict[str, list[str] | None] = {}
        for r in records:
            changes[r["model"]] = merged_changes(changes.get(r["model"]), r.get("changed"))
        if contract in PASS_OPTIONS:  # passes inside torch.compile: their kind's checks, nothing "changed"
            taken = [check for check in run["checks"] if checks.spec(check).subject == checks.kind(contract).name]
            blocks.append(format_table(spec, "", cells, taken, None, kind=contract))
            continue
        warning = rewrite_warning(spec, changes, random_graphs)
        blocks.append(format_table(spec, contract, cells, run["checks"], changes) + (f"\n{warning}" if warning else ""))
    return "\n\n".join(blocks)


def _run(path: str, report: Report) -> Mapping[str, Any]:
    run = report["header"].get("run")
    if not run or not run.get("shard"):
        raise ReportError(f"{path} is not the report of a shard: give the --fxverify-json reports of the runs "
                          "with --fxverify-shard I/N, one per shard (this fxverify writes which shard in the header)")
    return run


def _agreeing(values: Mapping[str, Any], what: str, advice: str) -> Any:
    """The value every report (path -> its value) has, else :class:`ReportError` naming two that differ."""
    (first_path, first), *others = values.items()
    for path, value in others:
        if value != first:
            raise ReportError(f"{first_path} and {path} are of different {what} ({_difference(first, value)}): {advice}")
    return first


def _difference(one: Any, other: Any) -> str:
    if isinstance(one, Mapping) and isinstance(other, Mapping):
        keys = [k for k in dict.fromkeys([*one, *other]) if one.get(k) != other.get(k)]
        return "; ".join(f"{k}: {one.get(k)!r} against {other.get(k)!r}" for k in keys[:SHOWN])
    if isinstance(one, list) and isinstance(other, list) and len(one) > SHOWN:
        only = [m for m in one if m not in other][:SHOWN] or [m for m in other if m not in one][:SHOWN]
        return f"{len(one)} against {len(other)} models, e.g. {', '.join(map(str, only)) or 'in another order'}"
    return f"{one!r} against {other!r}"


def _complete(runs: Mapping[str, Mapping[str, Any]]) -> None:
    """Every shard of one count, each once."""
    given: dict[int, str] = {}
    counts = set()
    for path, run in runs.items():
        try:
            index, count = parse_shard(run["shard"])
        except CorpusError as exc:
            raise ReportError(f"{path}: {exc}") from None
        if index in given:
            raise ReportError(f"shard {run['shard']} is given twice ({given[index]} and {path}): give each shard once")
        given[index] = path
        counts.add(count)
    if len(counts) > 1:
        raise ReportError(f"the reports are shards of different counts ({', '.join(map(str, sorted(counts)))}): "
                          "merge the shards of one run")
    count = counts.pop()
    missing = [f"{i}/{count}" for i in range(1, count + 1) if i not in given]
    if missing:
        raise ReportError(f"shard {', '.join(missing)} is missing: give the reports of all {count} shards")


def _partition(runs: Mapping[str, Mapping[str, Any]]) -> None:
    """The shards' models partition the selection."""
    where: dict[str, list[str]] = {}
    for path, run in runs.items():
        for model in run["models"]:
            where.setdefault(model, []).append(path)
    twice = [f"{model} in {' and '.join(paths)}" for model, paths in where.items() if len(paths) > 1]
    missing = [model for model in next(iter(runs.values()))["selection"] if model not in where]
    if twice or missing:
        raise ReportError(f"the shards overlap: {len(twice)} models in two shards ({'; '.join(twice[:SHOWN])}), "
                          f"{len(missing)} in none ({', '.join(missing[:SHOWN])}): they were sharded differently. Give "
                          "every shard the same --fxverify-durations file (or none) and the same catalogue")


def _distinct(records: Sequence[Report], reports: Mapping[str, Report]) -> None:
    """No item in two reports (random graphs replayed by two shards, a report merged twice)."""
    seen: set[tuple[str, str, str]] = set()
    for found in records:
        key = (found["transform"], found["model"], found["check"])
        if key in seen:
            raise ReportError(f"the item {key[1]}-{key[2]} of {key[0]} is in two of {', '.join(reports)}: give "
                              "each shard once, and draw --fxverify-random-graphs in one shard only")
        seen.add(key)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fxverify.reports.merge SHARD.json... [--json FILE] [--html FILE]``: prints the summary,
    writes the merged reports and returns the exit status (see the module's docstring)."""
    parser = argparse.ArgumentParser(prog="python -m fxverify.reports.merge", description=(
        "Merge the --fxverify-json reports of the shards of one run (--fxverify-shard I/N) into one report."))
    parser.add_argument("reports", nargs="+", metavar="SHARD.json", help="the JSON report of every shard")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the merged JSON report to FILE")
    parser.add_argument("--html", type=Path, metavar="FILE", help="write the merged HTML report to FILE")
    args = parser.parse_args(argv)
    try:
        merged = merge_reports({path: read_json(path) for path in args.reports})
    except ReportError as exc:
        parser.error(str(exc))
    print(summary(merged))
    for path, write in ((args.json, write_json), (args.html, write_html)):
        if path is not None:
            print(f"fxverify: wrote {write(path, merged['records'], merged['header'])}")
    return 1 if any(r["outcome"] in (FAILED, ERROR) for r in merged["records"]) else 0


if __name__ == "__main__":
    sys.exit(main())
