"""golden: the generated code and graph, after tracing and after the transform, match the golden file.

The file is ``<golden dir>/<transform>/<model>.golden`` (``<model>.<capture>.golden`` under another
capture than symbolic tracing, with the exported graph's signature and range constraints; see
:mod:`fxverify.golden`); the golden dir is ``--fxverify-golden-dir`` (default ``fxverify_golden`` under pytest's rootdir), or the
``golden_dir`` given to :class:`fxverify.Verification` (default ``fxverify_golden``
in the current directory). With ``--fxverify-update-golden`` (``update_golden=True``) the file is
written or rewritten instead. The check skips while the transform has no golden folder at all,
saying how to create it; a missing file or a mismatch fails, with a unified diff and an
``.obtained`` file beside the golden one. It also skips random graphs (cases tagged
``random_graph``: ``--fxverify-random-graphs`` entries, ``fxverify.strategies`` draws), whose
seeds change every run, so no golden file could stay valid; none is written for them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fxverify.analysis import golden
from fxverify.capture.export import signature_text
from fxverify.cases.catalogue import RANDOM_GRAPH_TAG, file_label
from fxverify.checks import option
from fxverify.checks._common import graph_result
from fxverify.core.captures import DEFAULT_CAPTURE
from fxverify.core.results import WRITTEN, Finding, Skip
from fxverify.engine.subject import Subject


def check(subject: Subject) -> dict[str, Any]:
    if RANDOM_GRAPH_TAG in subject.case.entry.tags:
        raise Skip(f"{subject.case.name} is a random graph: its seed changes every run, so it has no stable golden "
                   "file; the other checks cover it")
    applied = subject.applied()
    result = graph_result(applied.result, "no code to compare")
    folder = option(subject.settings, "golden_dir")
    root = Path(folder) if folder is not None else Path.cwd() / golden.DEFAULT_DIR
    path = golden.golden_path(root, subject.transform.spec, file_label(subject.case.name, subject.capture.name))
    other_capture = subject.capture.name if subject.capture.name != DEFAULT_CAPTURE else None
    text = golden.golden_text(applied.original, result, model=subject.case.name, transform=subject.transform.spec,
                              capture=other_capture, signature=signature_text(result))
    if option(subject.settings, "update_golden"):
        status = golden.update_golden(path, text)
        return {"golden": status, "golden_file": str(path), WRITTEN: (status, str(path))}
    try:
        return {"golden": golden.check_golden(path, text), "golden_file": str(path)}
    except golden.GoldenDirMissing as missing:
        raise Skip(str(missing)) from None
    except golden.GoldenMismatch as mismatch:
        raise Finding(str(mismatch), where=mismatch.where) from None
