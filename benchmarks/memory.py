"""Peak memory of a corpus run: the identity transform over a corpus with ``-n N``, its process
tree sampled every 0.2 s, printing the peak resident memory (RSS) of each xdist worker, of the
controller and of the digest servers (each process's own high-water mark, ``VmHWM``, exact), and
of the whole tree (the peak of the sampled sum of RSS, and of PSS, which splits shared pages
between processes), with wall and CPU time.

    python benchmarks/memory.py [--corpus default] [--workers 2] [--before REV] [--pairs 1]

``--before REV`` measures fxverify as of git revision REV side by side (a temporary worktree put
first on PYTHONPATH), in pairs (A B, A B...), and prints the ratios of each figure. The goal of
issue 16: at most 3 GB per worker over ``default``, so that ``-n 4`` fits in 24 GiB.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from process_tree import children_cpu, pss_kib, role, status_kib, tree

TRANSFORM = "fxverify.examples:identity"
SAMPLE_INTERVAL = 0.2
REPO = Path(__file__).resolve().parent.parent


def measure(corpus: str, workers: int, pythonpath: str | None) -> dict[str, object]:
    """One run: its peaks (MiB), wall and CPU seconds, and pytest's last line."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers),
               "--fxverify", TRANSFORM, f"--fxverify-corpus={corpus}"]
    peaks: dict[int, tuple[str, int]] = {}  # pid -> (role, VmHWM KiB)
    tree_rss = tree_pss = 0
    with tempfile.TemporaryDirectory() as cwd, tempfile.TemporaryFile("w+") as output:
        start, cpu = time.perf_counter(), children_cpu()
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            pids = tree(proc.pid)
            rss = 0
            for pid in pids:
                status = status_kib(pid)
                if status.get("VmHWM"):  # gone, or a zombie
                    rss += status["VmRSS"]
                    peaks[pid] = (peaks.get(pid, (role(pid, proc.pid), 0))[0], status["VmHWM"])
            tree_rss = max(tree_rss, rss)
            tree_pss = max(tree_pss, sum(pss_kib(p) for p in pids))
            time.sleep(SAMPLE_INTERVAL)
        wall, cpu = time.perf_counter() - start, children_cpu() - cpu  # poll() reaped it: its CPU is counted
        output.seek(0)
        lines = output.read().strip().splitlines()
    by_role = collections.defaultdict(list)
    for kind, hwm in peaks.values():
        by_role[kind].append(hwm / 1024)
    return {"wall": wall, "cpu": cpu, "workers": sorted(by_role["worker"], reverse=True),
            "controller": max(by_role["controller"], default=0.0), "servers": sorted(by_role["digest server"]),
            "tree_rss": tree_rss / 1024, "tree_pss": tree_pss / 1024, "last": lines[-1] if lines else ""}


def describe(run: dict[str, object]) -> str:
    workers = ", ".join(f"{w:.0f}" for w in run["workers"])  # type: ignore[attr-defined]
    servers = ", ".join(f"{s:.0f}" for s in run["servers"])  # type: ignore[attr-defined]
    return (f"peak RSS per worker [{workers}] MiB, controller {run['controller']:.0f}, digest servers [{servers}]; "
            f"tree peak RSS {run['tree_rss']:.0f} MiB, PSS {run['tree_pss']:.0f} MiB; wall {run['wall']:.0f} s, "
            f"CPU {run['cpu']:.0f} s; {run['last']}")


def worktree(revision: str, folder: str) -> str:
    """A checkout of ``revision`` in ``folder`` (the code measured as "before"), its ``corpus`` folder
    also at ``fxverify/corpus``: put first on PYTHONPATH, ``fxverify.corpus`` would otherwise still
    come from the editable install's mapping, the current revision's corpus."""
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", folder, revision], check=True,
                   capture_output=True)
    (Path(folder) / "fxverify" / "corpus").symlink_to(Path(folder) / "corpus", target_is_directory=True)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="default")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--before", metavar="REV", help="also measure fxverify as of this git revision, paired")
    parser.add_argument("--pairs", type=int, default=1, help="runs of each (A B A B ...) with --before")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        variants = {"now": None}
        if args.before:
            variants = {f"before ({args.before})": worktree(args.before, f"{tmp}/before"), "now": None}
        runs: dict[str, list[dict[str, object]]] = {label: [] for label in variants}
        try:
            for _ in range(args.pairs if args.before else 1):
                for label, path in variants.items():
                    run = measure(args.corpus, args.workers, path)
                    runs[label].append(run)
                    print(f"{label:>22s}: {describe(run)}", flush=True)
        finally:
            if args.before:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", f"{tmp}/before"],
                               capture_output=True)
    if not args.before:
        return
    before, now = runs.values()

    def ratio(key: str) -> str:
        def value(run: dict[str, object]) -> float:
            found = run[key]
            return max(found) if isinstance(found, list) else float(found)  # type: ignore[arg-type]

        return f"{statistics.median(value(r) for r in now) / statistics.median(value(r) for r in before):.2f}x"

    print(f"now / before (medians over {args.pairs} pair(s)): largest worker peak {ratio('workers')}, "
          f"tree peak RSS {ratio('tree_rss')}, PSS {ratio('tree_pss')}, wall {ratio('wall')}, CPU {ratio('cpu')}")


if __name__ == "__main__":
    main()
