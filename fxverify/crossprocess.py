"""Digests of transform results computed in another process, under another
``PYTHONHASHSEED``, in batches: one subprocess serves many models.

The determinism check asks for one model's digest; the first request starts a
subprocess for that model and the next ones in collection order, so a run
over N models costs about N / batch_size subprocesses.

    python -m fxverify.crossprocess PAYLOAD OUT     # run by CrossProcessDigests
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from fxverify.cases import ModelCase
from fxverify.transform import Transform

BATCH_SIZE = 8


class CrossProcessDigests:
    """Callable: ``digests(model_name) -> digest | 'skip: why' | 'error: why'``."""

    def __init__(self, transform: Transform, cases: Sequence[ModelCase], *, timeout: float, batch_size: int = BATCH_SIZE) -> None:
        self.transform = transform
        self.cases = [c for c in cases if not c.entry.xfail]  # known failures get no check
        self.timeout = timeout
        self.batch_size = batch_size
        self._digests: dict[str, str] = {}

    def __call__(self, name: str) -> str:
        if name not in self._digests:
            if not self.transform.reloadable:
                return f"skip: transform {self.transform.spec} cannot be imported by name in another process"
            names = [c.name for c in self.cases]
            if name not in names:
                return f"error: {name} is not among the models this runner was given"
            batch = [c for c in self.cases[names.index(name):] if c.name not in self._digests][: self.batch_size]
            self._digests.update(self._run(batch))
        return self._digests.get(name, f"error: no digest came back for {name}")

    def _run(self, batch: list[ModelCase]) -> dict[str, str]:
        results: dict[str, str] = {}
        payload_entries = []
        for case in batch:
            try:
                pickle.dumps(case.entry)
            except Exception as exc:
                results[case.name] = f"skip: corpus entry cannot be sent to another process ({type(exc).__name__}: {exc})"
                continue
            payload_entries.append((case.entry, case.seed))
        if not payload_entries:
            return results
        with tempfile.TemporaryDirectory(prefix="fxverify-") as tmp:
            payload, out = Path(tmp) / "payload.pkl", Path(tmp) / "out.json"
            payload.write_bytes(pickle.dumps({"spec": self.transform.spec, "entries": payload_entries, "timeout": self.timeout}))
            env = dict(os.environ)
            env["PYTHONHASHSEED"] = "1" if os.environ.get("PYTHONHASHSEED") == "0" else "0"
            env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
            try:
                proc = subprocess.run(
                    [sys.executable, "-m", "fxverify.crossprocess", str(payload), str(out)],
                    env=env, capture_output=True, text=True, timeout=self.timeout * len(payload_entries) + 120,
                )
            except subprocess.TimeoutExpired:
                return results | {e.name: "error: the cross-process run timed out" for e, _ in payload_entries}
            if proc.returncode != 0 or not out.exists():
                tail = (proc.stderr or proc.stdout).strip()[-2000:]
                return results | {e.name: f"error: subprocess exited {proc.returncode}: {tail}" for e, _ in payload_entries}
            return results | json.loads(out.read_text())


def _main(payload_path: str, out_path: str) -> None:
    from fxverify.checks.determinism import digest
    from fxverify.errors import TransformFailed
    from fxverify.result import Skip, exception_summary
    from fxverify.verification import Verification

    payload = pickle.loads(Path(payload_path).read_bytes())
    transform = Transform.load(payload["spec"])
    digests = {}
    for entry, seed in payload["entries"]:
        verification = Verification(transform, ModelCase(entry, seed), timeout=payload["timeout"])
        try:
            digests[entry.name] = digest(verification.transformed_fresh(transform.contract.primary_mode))
        except TransformFailed as exc:
            digests[entry.name] = f"error: {exc}"
        except Skip as exc:
            digests[entry.name] = f"skip: {exc}"
        except Exception as exc:  # a model that fails to build or trace must not cost the others their digest
            digests[entry.name] = f"error: building or tracing the model failed: {exception_summary(exc)}"
    Path(out_path).write_text(json.dumps(digests))


if __name__ == "__main__":
    _main(*sys.argv[1:3])
