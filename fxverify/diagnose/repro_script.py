"""What every repro file shares: its preamble (imports, the transform loaded by name, the tolerance),
its ending (the result run and judged against the expected outputs, the exit status), and the
fresh Python process fxverify runs it in before keeping it. :mod:`fxverify.diagnose.repro`
writes minimised symbolic traces with it, :mod:`fxverify.diagnose.program_repro` saved programs.

>>> EXIT_DIFFERS, EXIT_RAISES
(3, 4)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from fxverify.errors import FxVerifyError

EXIT_DIFFERS, EXIT_RAISES = 3, 4  # a repro's exit status while the bug is there
DIFFERS, RAISES = "differs", "raises"  # how a repro fails: its outputs differ, or the result raises
OUTCOME_ENV = "FXVERIFY_REPRO_OUTCOME"  # a file where a repro run by fxverify writes the exception type raised
CHECK_TIMEOUT_S = 300.0  # for the run of a freshly written repro


def absolute_spec(spec: str) -> str:
    """The transform spec with a file path made absolute, so the repro runs from anywhere."""
    module_part, _, qualname = spec.rpartition(":")
    if module_part.endswith(".py"):
        return f"{Path(module_part).expanduser().resolve()}:{qualname}"
    return spec




def check_reproduces(path: Path, kind: str, failure: str, raised: str = "") -> None:
    """Run the repro in a fresh process (this one's ``sys.path``, from the current directory)
    and raise :class:`FxVerifyError` unless it fails as ``failure`` did: outputs that differ
    (``kind`` DIFFERS), or the result raising the exception type ``raised`` (``kind`` RAISES)."""
    with tempfile.TemporaryDirectory(prefix="fxverify-repro-") as tmp:
        told = Path(tmp) / "raised"
        env = {**os.environ, OUTCOME_ENV: str(told),
               "PYTHONPATH": os.pathsep.join(p for p in [*sys.path, os.environ.get("PYTHONPATH")] if p)}
        try:
            run = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True,
                                 timeout=CHECK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise FxVerifyError(f"the repro written to {path} did not finish within {CHECK_TIMEOUT_S:g} s") from None
        told_raised = told.read_text() if told.exists() else None
    expected = EXIT_DIFFERS if kind == DIFFERS else EXIT_RAISES
    if run.returncode == expected and (kind == DIFFERS or told_raised == raised):
        return
    tail = "\n".join(run.stderr.strip().splitlines()[-3:]) or run.stdout.strip()
    wanted = "outputs that differ" if kind == DIFFERS else f"the transformed module raising {raised}"
    raise FxVerifyError(f"the repro written to {path} (now deleted) exited with {run.returncode} instead of failing "
                        f"with {wanted} ({failure}); it said:\n{tail}\nIt runs from the current directory, "
                        "as its user will: if the transform imports here, please report this to fxverify")


_PREAMBLE = '''
import importlib
import importlib.util
import os
import pathlib
import sys
import traceback

import torch

TRANSFORM = {spec!r}
RTOL, ATOL = {rtol!r}, {atol!r}
EXIT_DIFFERS, EXIT_RAISES = {exit_differs!r}, {exit_raises!r}
HERE = pathlib.Path(__file__).resolve().parent


def _resolve(module, qualname):
    value = importlib.import_module(module)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


def _load_transform(spec):
    module_part, _, qualname = spec.rpartition(":")
    if module_part.endswith(".py"):
        file_spec = importlib.util.spec_from_file_location("repro_transform", module_part)
        module = sys.modules["repro_transform"] = importlib.util.module_from_spec(file_spec)
        file_spec.loader.exec_module(module)
        module_part = "repro_transform"
    return _resolve(module_part, qualname)


def _clone(values):
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]
'''

_JUDGE = '''

def _judge(result, inputs, expected):
    """EXIT_DIFFERS or EXIT_RAISES (after printing the traceback) while the bug is there, else 0."""
    try:
        with torch.no_grad():
            actual = result(*_clone(inputs))
    except Exception as exc:
        traceback.print_exc()
        print(f"fxverify repro: the transformed module raised {{type(exc).__qualname__}}", file=sys.stderr)
        _tell(raised=type(exc).__qualname__)
        return EXIT_RAISES
    try:
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, equal_nan=True)
    except AssertionError:
        traceback.print_exc()
        print("fxverify repro: the transformed module's outputs differ", file=sys.stderr)
        _tell()
        return EXIT_DIFFERS
    print("no failure: the transform's result matches the module")
    return 0


def _tell(raised=""):
    """When fxverify runs this file to check it, it asks which exception the module raised."""
    if os.environ.get("{outcome_env}"):
        pathlib.Path(os.environ["{outcome_env}"]).write_text(raised)


if __name__ == "__main__":
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    sys.exit(main())
'''


def script_source(docstring: str, body: str, **fields: Any) -> str:
    """A repro file: ``docstring``, the shared preamble (imports, ``TRANSFORM``, ``RTOL`` / ``ATOL``,
    ``_load_transform``, ``_clone``), ``body`` (which defines ``main()``, returning ``_judge(result,
    inputs, expected)``) and the shared ending, all formatted with ``fields`` (``spec``, ``rtol``,
    ``atol`` and the body's own; the exit statuses are filled in)."""
    fields = {"exit_differs": EXIT_DIFFERS, "exit_raises": EXIT_RAISES, "outcome_env": OUTCOME_ENV, **fields}
    return (docstring + _PREAMBLE + body + _JUDGE).format(**fields)
