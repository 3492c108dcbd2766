"""Overhead and memory of fxverify against a bare loop doing the same work.

    python benchmarks/overhead.py [--corpus default] [--workers 2] [--no-xdist] [--threads 1] [--repeat 1]

Measures, side by side in one run, each in a subprocess of its own:

  bare        this file with ``--bare-loop CORPUS``: the work the checks need, in plain torch;
  fxverify    ``python -m pytest -p no:cacheprovider -q --fxverify fxverify.examples:identity
              --fxverify-corpus CORPUS``, single-process, from an empty temporary directory;
  fxverify -n the same with ``-n WORKERS`` (not with ``--no-xdist``);

and prints for each the wall time, CPU time, and peak memory, then the ratios to
the bare loop. Goal: fxverify single-process at most 1.3x the bare loop's wall time.
With ``--repeat N`` the three runs alternate N times and medians are reported
(the machine is noisy; CPU time is printed as a check less sensitive to load).

Threads: every run gets ``OMP_NUM_THREADS=MKL_NUM_THREADS=--threads`` (default 1),
which sets torch's intra-op thread count in the bare loop and in single-process
pytest alike. Under ``-n`` fxverify's plugin sets each worker to
``cpu_count // workers`` threads itself (1 each on a 2-core machine).

What the bare loop does, per model of the corpus (the identity transform,
``fxverify.examples.identity``, a ``torch.fx.Transformer``; building, randomised state, tracing and
inputs through ``fxverify.cases.ModelCase`` / ``InputConfig.make``, which are model
construction, not harness; nothing of ``Verification`` or the checks):

  * eval trace, ``copy.deepcopy``, transform (the transform gets a copy; ``eval()``);
  * purity: the copy handed to the transform still equals the trace (state and code);
    output aliasing and strides compared on the primary float32 outputs below;
  * lint: ``graph.lint()``, regenerated code equal to ``gm.code``, one
    ``torch.fx.Interpreter`` run of the result on the primary inputs (output structure
    compared), ``copy.deepcopy`` of the result with the same code;
  * numerics: for every input configuration a float32 ``no_grad`` forward of the trace
    and of the result, compared; float64 copies (``deepcopy().to(float64)``) of both and
    a forward of each on the primary inputs, compared; a train-mode trace, deepcopy and
    transform, and a forward of both with the RNG reseeded, outputs and buffers compared;
  * gradients: float64 forward + backward of both copies, loss = sum(outputs * fixed
    random weights), input and parameter gradients compared;
  * determinism: three more fresh trace + transform runs (the two in-process reruns and
    the cross-process run's one, done here in-process), generated code compared;
  * devices: the result moved to the meta device (in place, it is not needed after) and
    run there on meta inputs; the original too only if that fails;
  * cuda: nothing (skipped without a GPU, as the check skips);
  * round trips, on the result: a recompiled deepcopy (code compared, one forward); a
    re-trace of the result with the model's tracer keeping called modules as leaves (node
    opcodes and targets compared); ``to_folder`` export, import and one forward (on the
    original too when the result's export fails, as the check does to tell whose fault it
    is); a deepcopy (code, one forward) and a pickle round trip (one forward); one more
    ``torch.fx.Interpreter`` run (the codegen vs interpreter differential); golden: nothing
    (skipped without golden files);
  * models marked ``xfail``: one trace and forward, expected to fail.

Not in the bare loop, as harness overhead: the float64 runs through a recording
Interpreter (numerics localises the first diverging node) and the meta runs through one
(devices), the state snapshots and their comparisons (purity's clone-and-compare, the
summary's no-op column), the extra deepcopies (train mode, meta), purity's second pair of
float32 forwards, the cross-process subprocesses (interpreter and torch start-up), and
pytest itself.

Peak memory: each measured command runs under this file's ``--measure`` wrapper, a
fresh stdlib-only process whose only child is the command. After ``wait()`` the
wrapper's ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` is the largest RSS of any single
process of the command's tree that was waited for (the kernel keeps a max, not a sum,
over waited descendants), so it is exact for one process but not a total for ``-n``
(controller + workers) or for pytest plus its cross-process subprocess. So the wrapper
also samples the whole process tree every 0.2 s and records the peak of the summed PSS
(proportional set size: shared library pages split between processes, not counted once
per process as RSS sums would). Both figures are printed, each with its ratio to the bare loop's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from process_tree import pss_kib, tree

TRANSFORM = "fxverify.examples:identity"
GOAL = 1.3
SAMPLE_INTERVAL = 0.2


# -- measuring one command ----------------------------------------------------------


def measure_main(out: str, command: list[str]) -> int:
    """Run ``command`` as this (fresh) process's only child; write its figures to ``out``."""
    start = time.perf_counter()
    proc = subprocess.Popen(command)
    peak_tree = 0
    while proc.poll() is None:
        peak_tree = max(peak_tree, sum(pss_kib(p) for p in tree(proc.pid)))
        time.sleep(SAMPLE_INTERVAL)
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # only child: the command (and what it waited for)
    Path(out).write_text(json.dumps({
        "wall": wall,
        "cpu": usage.ru_utime + usage.ru_stime,
        "max_rss_mib": usage.ru_maxrss / 1024,  # KiB on Linux
        "peak_tree_pss_mib": peak_tree / 1024,
        "returncode": proc.returncode,
    }))
    return 0


def measured(command: list[str], cwd: str, env: dict[str, str]) -> tuple[dict[str, float], str]:
    """Run ``command`` under the ``--measure`` wrapper; its figures and its output's tail."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "measure.json"
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--measure", str(out), "--", *command],
            cwd=cwd, env=env, capture_output=True, text=True,
        )
        figures = json.loads(out.read_text())
    lines = (proc.stdout.strip() or proc.stderr.strip()).splitlines()
    return figures, (lines[-1] if lines else "")


# -- the bare loop ----------------------------------------------------------------


def bare_loop(corpus: str) -> int:
    """The checks' work on every model of ``corpus``, in plain torch (see the module docstring)."""
    import copy
    import importlib.util
    import pickle

    import torch
    from torch import fx
    from torch.utils import _pytree as pytree

    from fxverify.cases import catalogue
    from fxverify.cases.case import ModelCase
    from fxverify.examples import identity  # the transform under test, the same in both runs

    defaults = {torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7)}

    def assert_same(actual, expected, entry) -> None:
        a_leaves, a_spec = pytree.tree_flatten(actual)
        e_leaves, e_spec = pytree.tree_flatten(expected)
        assert a_spec == e_spec, f"output structure {a_spec} != {e_spec}"
        for a, e in zip(a_leaves, e_leaves):
            if isinstance(e, torch.Tensor) and e.is_floating_point():
                rtol, atol = defaults.get(e.dtype, (0.0, 0.0))
                rtol, atol = max(rtol, entry.rtol or 0.0), max(atol, entry.atol or 0.0)
                torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True)
            elif isinstance(e, torch.Tensor):
                torch.testing.assert_close(a, e, rtol=0, atol=0)
            else:
                assert a == e, f"{a!r} != {e!r}"

    def assert_state_equal(a, b) -> None:
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys()
        for k in sa:
            assert torch.equal(sa[k], sb[k]), k

    def layout(outputs, inputs):
        ptrs = {t.untyped_storage().data_ptr() for t in inputs}
        return [(t.untyped_storage().data_ptr() in ptrs, t.stride(), t.is_contiguous())
                for t in pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor)]

    def gradients(module, inputs, seed):
        inputs = tuple(t.requires_grad_(True) if t.is_floating_point() else t for t in inputs)
        outputs = [o for o in pytree.tree_leaves(module(*inputs)) if isinstance(o, torch.Tensor) and o.requires_grad]
        if not outputs:
            return None
        gen = torch.Generator().manual_seed(seed)
        sum((o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum() for o in outputs).backward()
        grads = [t.grad for t in inputs if t.is_floating_point()]
        return grads + [p.grad for _, p in sorted(module.named_parameters())]

    def both_fail(run, result, original):
        """``run(result)``; when it raises, the original must raise too (as the checks judge: not the
        transform's doing, no finding), and None is returned."""
        try:
            return run(result)
        except Exception as exc:
            try:
                run(original)
            except Exception:
                return None
            raise AssertionError("only the result fails") from exc

    def round_trips(case: ModelCase, gm: fx.GraphModule, result: fx.GraphModule, inputs: tuple) -> None:
        called = {str(n.target) for n in result.graph.nodes if n.op == "call_module"}

        class KeepCalled(case.capture.tracer_class):
            def is_leaf_module(self, m, qualname):
                return qualname in called or super().is_leaf_module(m, qualname)

        def nodes(graph):
            return [(n.op, str(n.target)) for n in graph.nodes if n.op != "call_function" or n.target is not getattr]

        def recompile(module, expected):
            recompiled = copy.deepcopy(module)
            recompiled.recompile()
            assert recompiled.code == module.code
            assert_same(recompiled(*inputs), expected, case.entry)

        def retrace(module, expected):
            assert nodes(KeepCalled().trace(module)) == nodes(module.graph)

        def to_folder(module, expected):
            with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
                warnings.simplefilter("ignore")  # children saved as pickles: expected
                module.to_folder(Path(tmp) / "exported", "FxModule")
                spec = importlib.util.spec_from_file_location(f"exported_{Path(tmp).name}",
                                                              Path(tmp) / "exported" / "__init__.py")
                package = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = package
                try:
                    spec.loader.exec_module(package)
                    assert_same(package.FxModule()(*inputs), expected, case.entry)
                finally:
                    sys.modules.pop(spec.name)

        def pickle_and_deepcopy(module, expected):
            copied = copy.deepcopy(module)
            assert copied.code == module.code
            assert_same(copied(*inputs), expected, case.entry)
            assert_same(pickle.loads(pickle.dumps(copied))(*inputs), expected, case.entry)

        def interpreter(module, expected):
            assert_same(pytree.tree_leaves(fx.Interpreter(module).run(*inputs)), pytree.tree_leaves(expected),
                        case.entry)

        with torch.no_grad():
            expected = result(*inputs)
            for trip in (recompile, retrace, to_folder, pickle_and_deepcopy, interpreter):
                both_fail(lambda m, trip=trip: trip(m, expected), result, gm)  # one the original fails too is skipped

    def one_model(case: ModelCase) -> None:
        entry, seed = case.entry, case.seed
        primary = case.configs[0]
        if entry.xfail:
            try:
                with torch.no_grad():
                    case.captured()(*primary.make(seed))
            except Exception:
                return
            raise AssertionError("xfail entry traces and runs")
        gm = case.captured()
        given = copy.deepcopy(gm)
        result = identity(given).eval()
        # purity: the transform left its argument alone
        assert given.code == gm.code
        assert_state_equal(given, gm)
        # lint
        result.graph.lint()
        assert result.graph.python_code(root_module="self").src == result.code
        inputs = primary.make(seed)
        with torch.no_grad():
            interpreted = both_fail(lambda m: fx.Interpreter(m).run(*inputs), result, gm)
        assert copy.deepcopy(result).code == result.code
        round_trips(case, gm, result, inputs)
        # numerics, float32, every configuration
        for config in case.configs:
            x = inputs if config is primary else config.make(seed)
            with torch.no_grad():
                expected, actual = gm(*x), result(*x)
            assert_same(actual, expected, entry)
            if config is primary:
                # the Interpreter returns FX's immutable containers: compare the leaves
                if interpreted is not None:
                    assert_same(pytree.tree_leaves(interpreted), pytree.tree_leaves(expected), entry)
                assert layout(actual, x) == layout(expected, x)  # purity: aliasing and strides
        # numerics, float64
        gm64, result64 = copy.deepcopy(gm).to(torch.float64), copy.deepcopy(result).to(torch.float64)
        x64 = primary.make(seed, dtype=torch.float64)
        with torch.no_grad():
            assert_same(result64(*x64), gm64(*x64), entry)
        # gradients, float64
        expected = gradients(gm64, primary.make(seed, dtype=torch.float64), seed)
        if expected is not None:
            actual = gradients(result64, primary.make(seed, dtype=torch.float64), seed)
            assert_same(actual, expected, entry)
        del gm64, result64
        # numerics, train mode
        train = case.captured(training=True)
        train_result = identity(copy.deepcopy(train)).train(True)
        runs = []
        for module in (train, train_result):
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                torch.manual_seed(seed + 1)
                runs.append(module(*primary.make(seed)))
        assert_same(runs[1], runs[0], entry)
        assert_same(dict(train_result.named_buffers()), dict(train.named_buffers()), entry)
        del train, train_result, runs
        # determinism: two in-process reruns and the cross-process one
        for _ in range(3):
            assert identity(case.captured()).code == result.code
        # devices: a meta run
        meta_inputs = primary.make(seed, device="meta")
        with torch.no_grad():
            both_fail(lambda m: m.to("meta")(*meta_inputs), result, gm)

    entries = catalogue.select(corpus)
    errors = []
    start = time.perf_counter()
    for entry in entries:
        try:
            one_model(ModelCase(entry))
        except Exception as exc:  # reported, and the loop goes on, as pytest would
            errors.append(f"{entry.name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    for error in errors:
        print(f"  bare loop error: {error}")
    print(f"bare loop: {len(entries) - len(errors)} of {len(entries)} models ok, torch threads "
          f"{torch.get_num_threads()}, {time.perf_counter() - start:.1f} s in the loop")
    return 1 if errors else 0


# -- the comparison ------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="default", help="corpus selection (profile, names, globs)")
    parser.add_argument("--workers", type=int, default=2, help="xdist workers for the -n run")
    parser.add_argument("--no-xdist", action="store_true", help="skip the -n run")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS / MKL_NUM_THREADS of every run")
    parser.add_argument("--repeat", type=int, default=1, help="alternate the runs this many times; report medians")
    parser.add_argument("--bare-loop", metavar="CORPUS", help=argparse.SUPPRESS)
    parser.add_argument("--measure", metavar="OUT", help=argparse.SUPPRESS)
    parser.add_argument("command", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.command and not args.measure:
        parser.error(f"unrecognized arguments: {' '.join(args.command)}")
    if args.measure:
        sys.exit(measure_main(args.measure, args.command))
    if args.bare_loop:
        sys.exit(bare_loop(args.bare_loop))

    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--fxverify", TRANSFORM,
              f"--fxverify-corpus={args.corpus}"]
    runs = {
        "bare loop": [sys.executable, str(Path(__file__).resolve()), "--bare-loop", args.corpus],
        "fxverify": pytest,
    }
    if not args.no_xdist:
        runs[f"fxverify -n {args.workers}"] = pytest + ["-n", str(args.workers)]
    results: dict[str, list[dict[str, float]]] = {label: [] for label in runs}
    lasts: dict[str, str] = {}
    for _ in range(args.repeat):
        for label, command in runs.items():
            with tempfile.TemporaryDirectory() as empty:  # a project of its own, as a user would run it
                figures, lasts[label] = measured(command, empty, env)
            results[label].append(figures)
            print(f"  {label:14s} {figures['wall']:7.1f} s wall  exit {figures['returncode']}: {lasts[label]}",
                  flush=True)

    def median(label: str, key: str) -> float:
        return statistics.median(r[key] for r in results[label])

    print(f"\ncorpus {args.corpus!r}, transform {TRANSFORM}, OMP_NUM_THREADS={args.threads}, "
          f"{args.repeat} run(s) each (medians)")
    print(f"{'':16s}{'wall s':>9s}{'CPU s':>9s}{'tree PSS MiB':>14s}{'max RSS MiB':>13s}")
    for label in runs:
        print(f"{label:16s}{median(label, 'wall'):9.1f}{median(label, 'cpu'):9.1f}"
              f"{median(label, 'peak_tree_pss_mib'):14.0f}{median(label, 'max_rss_mib'):13.0f}")
    bare = "bare loop"
    for label in list(runs)[1:]:
        wall = median(label, "wall") / median(bare, "wall")
        cpu = median(label, "cpu") / median(bare, "cpu")
        pss = median(label, "peak_tree_pss_mib") / median(bare, "peak_tree_pss_mib")
        rss = median(label, "max_rss_mib") / median(bare, "max_rss_mib")
        verdict = ""
        if label == "fxverify":
            verdict = f"  (goal <= {GOAL}x: {'met' if wall <= GOAL else 'NOT met'})"
        print(f"{label} / bare: wall {wall:.2f}x, CPU {cpu:.2f}x, peak tree PSS {pss:.2f}x, "
              f"max RSS {rss:.2f}x{verdict}")


if __name__ == "__main__":
    main()
