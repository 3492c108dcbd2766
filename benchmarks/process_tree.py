"""The process tree of a running command, read from /proc (Linux): its processes, their memory
and their roles (the pytest controller, xdist workers, fxverify's digest servers), and the CPU time
of finished commands (:func:`timed`). Shared by the benchmarks."""

from __future__ import annotations

import os
import resource
import subprocess
import time


def children_cpu() -> float:
    """User + system seconds of this process's finished, waited-for children so far (a command's
    CPU time is the difference across it)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], cwd: str) -> tuple[float, float, str]:
    """Wall and CPU seconds of ``command``, and pytest's last line (failed checks are figures too;
    pytest's other errors stop the benchmark)."""
    cpu, start = children_cpu(), time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - start, children_cpu() - cpu
    lines = done.stdout.strip().splitlines() or ["(no output)"]
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n" + "\n".join(lines[-20:]) + done.stderr)
    return wall, cpu, lines[-1]


def children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.extend(int(k) for k in f.read().split())
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return kids


def tree(pid: int) -> list[int]:
    """``pid`` and every descendant alive now."""
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        todo.extend(children(p))
    return pids


def pss_kib(pid: int) -> int:
    """PSS of one process in KiB (RSS if smaps_rollup is unavailable), 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return status_kib(pid).get("VmRSS", 0)


def status_kib(pid: int) -> dict[str, int]:
    """``VmRSS`` (resident now) and ``VmHWM`` (the most it was ever resident) of one process, in
    KiB; empty if it is gone."""
    found = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    found[key] = int(value.split()[0])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return found


def role(pid: int, root: int) -> str:
    """``controller`` (the command itself), ``digest server`` (fxverify's cross-process determinism
    runner) or ``worker`` (any other descendant: pytest-xdist's workers)."""
    if pid == root:
        return "controller"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return "gone"
    return "digest server" if "_digest_server" in command else "worker"
