"""Digests of transform results computed in another process, under another
``PYTHONHASHSEED``, by one long-lived server process per transform.

The server starts on the first request and then serves every model of the run:
torch and the corpus libraries are imported once, not once per model. A request
can be sent ahead (:meth:`CrossProcessDigests.request`, done when a model's items
start), so the server builds, traces and transforms the model on another core
while this process runs the other checks; the determinism check then only
collects the answer.

    python -m fxverify.checks._digest_server SPEC TIMEOUT    # the server, started by CrossProcessDigests

Protocol: one request per line on the server's stdin (a base64 pickle of
``(key, entry, seed, capture)``), one JSON answer ``[key, digest]`` per line on the file
descriptor that was its stdout (``key``: ``[name, mode, static, transformed]``; not ``transformed``: the digest of
the capture itself); the transform's own prints go to stderr.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import pickle
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from fxverify.capture import Capture
from fxverify.cases.case import ModelCase
from fxverify.checks import option
from fxverify.checks.determinism import cross_process_capture, digest
from fxverify.core.captures import DEFAULT_CAPTURE
from fxverify.core.contracts import Mode
from fxverify.core.memory import release_memory
from fxverify.core.results import CaptureFailed, Skip, exception_summary
from fxverify.core.transform import Transform
from fxverify.engine.subject import Subject
from fxverify.errors import TransformFailed

SERVER_START_SECONDS = 120.0  # imports, on a loaded machine
Key = tuple[str, str, bool, bool]  # what a digest is of: the model's name, the mode it is captured in, whether static,
# whether transformed (else the capture itself)


class CrossProcessDigests:
    """Callable: ``digests(model_name, mode=None, static=False) -> digest | 'skip: why' | 'error: why'``,
    the digest of the transform applied to the model captured in ``mode`` (default: the contract's primary
    mode; ``static``: at the example shapes, see :meth:`~fxverify.engine.subject.Subject.capture_fresh`);
    ``transformed=False``: of the capture itself, untransformed (a model whose graph depends on the process,
    its calibrated constants on the thread count, differs there whatever the transform does). The
    server captures each model with ``capture`` (default: the entry's own; a name: the model's capture of that
    name, :meth:`~fxverify.cases.case.ModelCase.capture_named`), as the :class:`Subject` it serves must.

    >>> from fxverify.core.transform import as_transform
    >>> digests = CrossProcessDigests(as_transform(lambda gm: gm), [], timeout=10)
    >>> digests("resnet18")[:5]
    'skip:'
    """

    def __init__(self, transform: Transform, cases: Sequence[ModelCase], *, timeout: float,
                 capture: Capture | str | None = None) -> None:
        self.transform = transform
        self.capture = capture
        name = capture if isinstance(capture, str) else capture.name if capture is not None else DEFAULT_CAPTURE
        self.cases = {c.name: c for c in cases if not c.entry.expected_failure(name)}  # known failures get no check
        self.timeout = timeout
        self._digests: dict[Key, str] = {}
        self._pending: list[Key] = []
        self._server: _Server | None = None

    def request(self, name: str, *, mode: Mode | None = None, static: bool = False, transformed: bool = True) -> None:
        """Have the server start on ``name`` captured in ``mode`` now, without waiting for the answer."""
        key = self._key(name, mode, static, transformed)
        if key in self._digests or key in self._pending:
            return
        problem = self._cannot_send(name)
        if problem is not None:
            self._digests[key] = problem
            return
        case = self.cases[name]
        if self._server is None:
            try:
                self._server = _Server(self.transform.spec, self.timeout)
            except OSError as exc:
                self._digests[key] = f"error: could not start the cross-process server: {exc}"
                return
        try:
            self._server.send((key, case.entry, case.seed, self.capture))
        except OSError:  # the server died; the answer says why
            pass
        self._pending.append(key)

    def __call__(self, name: str, *, mode: Mode | None = None, static: bool = False, transformed: bool = True) -> str:
        key = self._key(name, mode, static, transformed)
        self.request(name, mode=mode, static=static, transformed=transformed)
        if key in self._pending:
            self._collect(key)
        return self._digests[key]

    def close(self) -> None:
        """Stop the server (it also stops by itself when this process exits)."""
        if self._server is not None:
            self._server.close()
            self._server = None

    def _key(self, name: str, mode: Mode | None, static: bool, transformed: bool) -> Key:
        return name, mode or self.transform.contract.primary_mode, static, transformed

    def _cannot_send(self, name: str) -> str | None:
        if not self.transform.reloadable:
            return f"skip: transform {self.transform.spec} cannot be imported by name in another process"
        if name not in self.cases:
            return f"error: {name} is not among the models this runner was given"
        try:
            pickle.dumps((self.cases[name].entry, self.capture))
        except Exception as exc:
            return f"skip: corpus entry cannot be sent to another process ({type(exc).__name__}: {exc})"
        return None

    def _collect(self, key: Key) -> None:
        """Read answers until ``key``'s arrives; on a timeout or a dead server every pending
        request gets the error, and the next request starts a fresh server."""
        assert self._server is not None
        ahead = self._pending.index(key) + 1
        deadline = time.monotonic() + SERVER_START_SECONDS + self.timeout * ahead
        while key in self._pending:
            answer = self._server.receive(deadline - time.monotonic())
            if isinstance(answer, str):  # the server is gone or too slow
                for pending in self._pending:
                    self._digests[pending] = f"error: {answer}"
                self._pending.clear()
                self._server.close(grace=0.0)
                self._server = None
                return
            done, digest = answer
            self._digests[done] = digest
            if done in self._pending:
                self._pending.remove(done)


class _Server:
    """The subprocess and a thread that reads its answers into a queue."""

    def __init__(self, spec: str, timeout: float) -> None:
        env = dict(os.environ)
        env["PYTHONHASHSEED"] = "1" if os.environ.get("PYTHONHASHSEED") == "0" else "0"
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env["OMP_NUM_THREADS"] = "1"  # it builds, traces and transforms: no use for the cores the checks need
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115  (open as long as the server runs; closed in close())
        self.process = subprocess.Popen(
            [sys.executable, "-m", "fxverify.checks._digest_server", spec, str(timeout)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env, text=True,
        )
        self._answers: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()
        atexit.register(self.close)

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._answers.put(line)
        self._answers.put(None)

    def send(self, request: tuple[object, ...]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(base64.b64encode(pickle.dumps(request)).decode() + "\n")
        self.process.stdin.flush()

    def receive(self, seconds: float) -> tuple[Key, str] | str:
        """The next ``(key, digest)``, or why none will come."""
        try:
            line = self._answers.get(timeout=max(seconds, 0.0))
        except queue.Empty:
            return "the cross-process run timed out"
        if line is None:
            code = self.process.wait()
            self._stderr.seek(0)
            tail = self._stderr.read().decode(errors="replace").strip()[-2000:]
            return f"the cross-process server exited {code}: {tail}"
        (name, mode, static, transformed), digest = json.loads(line)
        return (name, mode, static, transformed), digest

    def close(self, grace: float = 5.0) -> None:
        """Close its stdin and give it ``grace`` seconds to finish, then kill it."""
        if self.process.poll() is None:
            try:
                self.process.stdin.close()  # type: ignore[union-attr]
                self.process.wait(timeout=grace)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self._stderr.close()
        atexit.unregister(self.close)


def _serve(spec: str, timeout: float) -> None:
    """Answer requests until stdin closes."""
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # the transform's prints must not mix in

    transform = Transform.load(spec)
    for line in sys.stdin:
        key, entry, seed, capture = pickle.loads(base64.b64decode(line))
        _, mode, static, transformed = key
        case = ModelCase(entry, seed)
        subject = Subject(transform, case, timeout=timeout,
                          capture=case.capture_named(capture) if isinstance(capture, str) else capture)
        try:  # the transform given a copy, as the subject's result was made
            source = subject.capture_source(mode, static=static)
            answer = digest(subject.transformed_copy(source, mode), calibrated=not subject.compares_values) \
                if transformed else digest(source)
        except TransformFailed as exc:
            answer = f"error: {exc}"
        except Skip as exc:
            answer = f"skip: {exc}"
        except Exception as exc:  # a model that fails to build or capture must not cost the others their digest
            answer = f"error: {exc if isinstance(exc, CaptureFailed) else exception_summary(exc)}"
        protocol.write(json.dumps([key, answer]) + "\n")
        protocol.flush()
        del subject
        release_memory()


if __name__ == "__main__":
    _serve(sys.argv[1], float(sys.argv[2]))


class CrossProcessService:
    """The determinism check's run-scoped service (``CheckSpec.service``): one digest server per transform
    and capture, asked to start on a model's cross-process digest as soon as its subject is made, where a
    determinism item of that model will run; each subject's settings get its :class:`CrossProcessDigests`."""

    def __init__(self, transforms: Sequence[Transform], cases: Sequence[ModelCase], *, captures: Sequence[str],
                 timeout: float, options: Mapping[str, Any]) -> None:
        self.train_capture = bool(option(options, "train_capture"))
        self.digests = {(t.spec, capture): CrossProcessDigests(t, cases, timeout=timeout, capture=capture)
                        for t in transforms for capture in captures}
        self.wanted: set[tuple[str, str, str]] = set()

    def want(self, transform: Transform, case: ModelCase, capture: str) -> None:
        self.wanted.add((transform.spec, case.name, capture))

    def prepare(self, transform: Transform, case: ModelCase, capture: Capture) -> CrossProcessDigests:
        digests = self.digests[transform.spec, capture.name]
        if capture.reads_settings:  # set up by the run's settings (a quantizer): the server is sent it whole
            digests.capture = capture
        if (transform.spec, case.name, capture.name) in self.wanted:  # the server works while the other checks run
            mode, static = cross_process_capture(transform.contract, capture, self.train_capture)
            digests.request(case.name, mode=mode, static=static)
        return digests

    def release(self, runner: Any) -> None:
        pass

    def close(self) -> None:
        for digests in self.digests.values():
            digests.close()
