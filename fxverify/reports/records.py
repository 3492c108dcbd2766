"""Report records: one JSON-ready dict per (transform, model, check), and the
JSON report for CI dashboards (a header with versions and time, then the records).

>>> from fxverify.core.results import CheckResult
>>> r = record(CheckResult("numerics", "m", "my:pass", "failed", "...", max_abs=0.5, max_rel=2.0), duration=1.5)
>>> r["outcome"], r["max_abs"], r["duration"]
('failed', 0.5, 1.5)
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import platform
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from fxverify.analysis.op_variants import OP_COUNTS, coverage
from fxverify.cases.catalogue import model_label
from fxverify.core.captures import DEFAULT_CAPTURE
from fxverify.core.results import CheckResult
from fxverify.errors import FxVerifyError

SCHEMA_VERSION = 1
FIGURES = "figures"  # the key of a record's pictures and code (HTML only, left out of the JSON)
R = TypeVar("R", bound=Mapping[str, Any])


class ReportError(FxVerifyError):
    """A JSON report that cannot be read, or reports that cannot be merged; the message says why
    and what to give instead."""


def record(result: CheckResult, *, duration: float | None = None, nodeid: str | None = None,
           figures: Mapping[str, Any] | None = None, changed: list[str] | None = None) -> dict[str, Any]:
    """The record of one check result; ``changed`` says what the transform changed on the model
    (``[]``: nothing, a no-op; None: unknown); ``figures`` (see :mod:`fxverify.reports.figures`)
    feed the HTML only."""
    found: dict[str, Any] = {
        "transform": result.transform,
        "model": model_label(result.model, result.capture or DEFAULT_CAPTURE),
        "capture": result.capture or DEFAULT_CAPTURE,
        "check": result.check,
        "outcome": result.outcome.value,
        "message": result.message,
        "finding": result.finding,
        "input": result.input,
        "where": result.where,
        "node": result.node,
        "max_abs": result.max_abs,
        "max_rel": result.max_rel,
        "divergence": json.loads(json.dumps(result.divergence, default=str)) if result.divergence else None,
        "repro": result.repro,
        "changed": changed,
        "duration": duration,
        "nodeid": nodeid,
    }
    if OP_COUNTS in result.details:  # the op counts of the original and the result (the variants check)
        found[OP_COUNTS] = result.details[OP_COUNTS]
    if figures:
        found[FIGURES] = dict(figures)
    return found


def op_coverage(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per transform, the ops it rewrote over the models of ``records`` and the variants of them it left
    untouched (:meth:`fxverify.analysis.op_variants.Coverage.as_dict`), from the records carrying op counts.

    >>> counts = {"before": {"aten.relu.default": 2, "aten.relu_.default": 1}, "after": {"aten.relu_.default": 1}}
    >>> op_coverage([{"transform": "t", "model": "m", OP_COUNTS: counts}])["t"]["left"][0]["kind"]
    'in-place twin'
    """
    by_transform: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.get(OP_COUNTS):
            by_transform.setdefault(r["transform"], {})[r["model"]] = r[OP_COUNTS]
    return {transform: coverage(counts).as_dict() for transform, counts in by_transform.items()}


def header(random_graphs: Iterable[str] = (), run: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Versions of fxverify, Python and the libraries that decide results, the time (UTC), which
    models are random graphs (``--fxverify-random-graphs``) and, from pytest, what the ``run``
    selected (its checks, the transforms' contracts, its shard and models: see docs/reports.md)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for package in ("fxverify", "torch", "torchvision", "timm"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return {"schema": SCHEMA_VERSION, "created": created, "versions": versions, "random_graphs": sorted(random_graphs),
            "run": dict(run) if run is not None else None}


def sorted_records(records: Iterable[R], checks: Sequence[str]) -> list[R]:
    """``records`` by transform, model and the order of ``checks`` (the reports' order).

    >>> [r["check"] for r in sorted_records([{"transform": "t", "model": "m", "check": c} for c in "ab"], "ba")]
    ['b', 'a']
    """
    order = {name: i for i, name in enumerate(checks)}
    return sorted(records, key=lambda r: (r["transform"], r["model"], order.get(r["check"], len(order))))


def json_report(records: Iterable[Mapping[str, Any]], head: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{"header": ..., "records": [...], "op_coverage": {transform: ...}}`` without the HTML-only figures
    (``op_coverage``: see :func:`op_coverage`)."""
    records = list(records)
    return {
        "header": dict(head or header()),
        "records": [{k: v for k, v in r.items() if k != FIGURES} for r in records],
        "op_coverage": op_coverage(records),
    }


def write_json(path: str | Path, records: Iterable[Mapping[str, Any]], head: Mapping[str, Any] | None = None) -> Path:
    """Write the JSON report to ``path`` (parent folders created) and return the path.

    >>> import fxverify, tempfile, json
    >>> results = fxverify.verify(fxverify.examples.identity, "edge_conv_bn_head", checks=["lint"])
    >>> path = write_json(tempfile.mkdtemp() + "/report.json", [record(r) for r in results])
    >>> [r["outcome"] for r in json.loads(path.read_text())["records"]]
    ['passed']
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_report(records, head), indent=1, default=str) + "\n", encoding="utf-8")
    return path


def read_json(path: str | Path) -> dict[str, Any]:
    """The JSON report at ``path`` (written by :func:`write_json`); :class:`ReportError` saying what
    is wrong with it otherwise.

    >>> import tempfile
    >>> read_json(write_json(tempfile.mkdtemp() + "/r.json", []))["records"]
    []
    """
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReportError(f"cannot read {path}: {exc.strerror or exc}; give a report --fxverify-json wrote") from None
    except ValueError as exc:
        raise ReportError(f"{path} is not JSON ({exc}); give a report --fxverify-json wrote") from None
    if not isinstance(report, dict) or not isinstance(report.get("header"), dict) or not isinstance(
            report.get("records"), list):
        raise ReportError(f"{path} is not an fxverify report (no header and records); give one --fxverify-json wrote")
    if report["header"].get("schema") != SCHEMA_VERSION:
        raise ReportError(f"{path} has schema {report['header'].get('schema')!r}, this fxverify reads "
                          f"{SCHEMA_VERSION}: write it again with this version")
    return report
