"""Report records: one JSON-ready dict per (transform, model, check), and the
JSON report for CI dashboards (a header with versions and time, then the records).

>>> from fxverify.result import CheckResult
>>> r = record(CheckResult("numerics", "m", "my:pass", "failed", "...", {"max_abs": 0.5, "max_rel": 2.0}), duration=1.5)
>>> r["outcome"], r["max_abs"], r["duration"]
('failed', 0.5, 1.5)
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import platform
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fxverify.result import CheckResult

SCHEMA_VERSION = 1
FIGURES = "figures"  # the key of a record's pictures and code (HTML only, left out of the JSON)

_FIRST_NODE = re.compile(r"^\s*first node: %(?P<result_node>\w+) \((?P<op>\w+) (?P<target>[^)]*)\): (?P<text>.*)$", re.M)


def record(result: CheckResult, *, duration: float | None = None, nodeid: str | None = None,
           figures: Mapping[str, Any] | None = None, changed: list[str] | None = None) -> dict[str, Any]:
    """The record of one check result; ``changed`` says what the transform changed on the model
    (``[]``: nothing, a no-op; None: unknown); ``figures`` (see :mod:`fxverify.reports.figures`)
    feed the HTML only."""
    details = result.details
    found: dict[str, Any] = {
        "transform": result.transform,
        "model": result.model,
        "check": result.check,
        "outcome": result.outcome,
        "message": result.message,
        "max_abs": details.get("max_abs"),
        "max_rel": details.get("max_rel"),
        "divergence": divergence_of(result),
        "repro": str(details["repro"]) if details.get("repro") else None,
        "changed": changed,
        "duration": duration,
        "nodeid": nodeid,
    }
    if figures:
        found[FIGURES] = dict(figures)
    return found


def divergence_of(result: CheckResult) -> dict[str, Any] | None:
    """The first divergent node: ``details["divergence"]`` when the check gave one, else what
    the message's ``first node:`` line says (``result_node``, ``op``, ``target``, ``text``).

    >>> divergence_of(CheckResult("numerics", "m", "t", "failed", "  first node: %relu (call_function relu): big"))
    {'result_node': 'relu', 'op': 'call_function', 'target': 'relu', 'text': 'big'}
    """
    given = result.details.get("divergence")
    if isinstance(given, Mapping):  # kept JSON-ready: xdist carries records between processes
        return json.loads(json.dumps(dict(given), default=str))
    match = _FIRST_NODE.search(result.message)
    return match.groupdict() if match else None


def header() -> dict[str, Any]:
    """Versions of fxverify, Python and the libraries that decide results, and the time (UTC)."""
    versions = {"python": platform.python_version()}
    for package in ("fxverify", "torch", "torchvision", "timm"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return {"schema": SCHEMA_VERSION, "created": created, "versions": versions}


def records_from_results(results: Iterable[CheckResult], verification: Any = None) -> list[dict[str, Any]]:
    """Records of check results run without pytest (no durations). Given the
    :class:`~fxverify.verification.Verification` that ran them, failures carry the
    pictures and code the HTML report shows (see :mod:`fxverify.reports.figures`)."""
    if verification is None:
        return [record(result) for result in results]
    from fxverify.reports.figures import failure_figures

    return [record(r, figures=None if r.ok else failure_figures(verification, r)) for r in results]


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
    >>> path = write_json(tempfile.mkdtemp() + "/report.json", records_from_results(results))
    >>> [r["outcome"] for r in json.loads(path.read_text())["records"]]
    ['passed']
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_report(records, head), indent=1, default=str) + "\n", encoding="utf-8")
    return path
