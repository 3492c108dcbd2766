"""Report records: one JSON-ready dict per (transform, model, check), and the
JSON report for CI dashboards (a header with versions and time, then the records).

>>> from fxverify.engine.results import CheckResult
>>> r = record(CheckResult("numerics", "m", "my:pass", "failed", "...", max_abs=0.5, max_rel=2.0), duration=1.5)
>>> r["outcome"], r["max_abs"], r["duration"]
('failed', 0.5, 1.5)
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import platform
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fxverify.cases.catalogue import CAPTURES, model_label
from fxverify.engine.results import CheckResult

SCHEMA_VERSION = 1
FIGURES = "figures"  # the key of a record's pictures and code (HTML only, left out of the JSON)

def record(result: CheckResult, *, duration: float | None = None, nodeid: str | None = None,
           figures: Mapping[str, Any] | None = None, changed: list[str] | None = None) -> dict[str, Any]:
    """The record of one check result; ``changed`` says what the transform changed on the model
    (``[]``: nothing, a no-op; None: unknown); ``figures`` (see :mod:`fxverify.reports.figures`)
    feed the HTML only."""
    found: dict[str, Any] = {
        "transform": result.transform,
        "model": model_label(result.model, result.capture or CAPTURES[0]),
        "capture": result.capture or CAPTURES[0],
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
    if figures:
        found[FIGURES] = dict(figures)
    return found


def header(random_graphs: Iterable[str] = ()) -> dict[str, Any]:
    """Versions of fxverify, Python and the libraries that decide results, the time (UTC), and which
    models are random graphs (``--fxverify-random-graphs``)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for package in ("fxverify", "torch", "torchvision", "timm"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return {"schema": SCHEMA_VERSION, "created": created, "versions": versions, "random_graphs": sorted(random_graphs)}


def json_report(records: Iterable[Mapping[str, Any]], head: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{"header": ..., "records": [...]}`` without the HTML-only figures."""
    return {
        "header": dict(head or header()),
        "records": [{k: v for k, v in r.items() if k != FIGURES} for r in records],
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
