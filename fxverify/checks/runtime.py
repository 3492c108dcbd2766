"""runtime: on Edge programs, the result lowered to an ExecuTorch ``.pte`` runs and computes what its program does.

An Edge pass hands its program to a lowering that trusts more than ``program.module()`` reads: the XNNPACK
partitioner and its delegate (q/dq parameters it fuses into integer kernels, the dim order a node's
``meta['val']`` gives), memory planning (the sizes and dim orders of ``meta['val']``), the emitter (an out
variant for every op) and the runtime's kernels (a ``dim_order`` argument against the tensor it writes). A pass
that breaks one of those leaves a program whose ``module()`` computes the right numbers, and a ``.pte`` that the
runtime refuses at load, that raises in ``execute()``, or that computes other numbers (executorch#16032,
executorch#21829, executorch#20376).

Each program is lowered as ExecuTorch's XNNPACK flow lowers it, ``EdgeProgramManager({"forward": program})`` (the
captures' ``EdgeCompileConfig``) ``.to_backend(XnnpackPartitioner())`` ``.to_executorch()``, loaded from its
``.buffer`` by ``executorch.runtime`` and run on the model's primary example inputs (their memory format kept); its
outputs are compared, in the order ExecuTorch returns them (the program's user outputs, flattened), with
``program.module()``'s on the same inputs (its mutated buffers started at zero, as ExecuTorch starts them). The
verdict is differential: the captured program goes first, and where it does not lower, load or run, or its ``.pte``
already computes other numbers than it does, the check skips (the model, or ExecuTorch, not the pass). The result
fails when a stage raises on it (named: ``to_backend``, ``to_executorch``, ``load``, ``execute``) or when an output
differs by more than the tolerance and twice what the captured program's own ``.pte`` differed by at that output. A
program XNNPACK takes no part of runs on the portable kernels alike.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fxverify.analysis.compare import Mismatch, Tolerance, compare_values
from fxverify.capture.edge import compile_config
from fxverify.capture.export import program_of
from fxverify.core.results import Finding, ModuleRaised, Skip, exception_summary
from fxverify.core.stash import StashKey
from fxverify.engine.subject import Subject

STAGES = ("to_backend", "to_executorch", "load", "execute")
# what an output of a .pte may differ from its program's by: XNNPACK's float32 kernels sum in another order than
# ATen's (a few float32 ulps of the output's range); its quantized kernels round otherwise than the q/dq
# decomposition (a quantization step here and there: the capture's tolerance)
RUNTIME_TOLERANCE = Tolerance(rtol=1e-5, atol=1e-5, range_tol=1e-5)
ALLOWANCE = 2.0  # how many times the captured program's own difference at an output the result's may be
LOG_LINES = 6  # the last lines of ExecuTorch's log kept in a finding

ADVICE = {
    "to_backend": "XnnpackPartitioner raised while partitioning or preprocessing the result: its node visitors "
                  "read each delegated node's meta['val'] (shape, dtype, dim order) and the q/dq nodes around it "
                  "as the quantizer left them; a node the pass made without meta['val'], or a q/dq pattern the "
                  "partitioner half-recognises (a dequantize whose quantize was moved or merged), raises here. "
                  "Make new nodes through ExportPass.call_operator (which propagates meta), and keep q/dq pairs "
                  "whole. Where the raise is inside one of XNNPACK's own passes on a program the Edge verifier "
                  "accepted, XNNPACK may be at fault for a valid form the pass made (a transpose folded into a "
                  "constant makes ConvertToLinearPass build a wrong linear: executorch#10499, docs/bugs-found.md "
                  "row 42): reproduce with to_edge, the pass, to_backend(XnnpackPartitioner()) before blaming the "
                  "pass",
    "to_executorch": "to_executorch replaces each op by its out variant and plans memory from meta['val']: an "
                     "op with no out variant registered, or a meta['val'] (shape, dtype, dim order) that the "
                     "pass left stale or wrong, raises here. Keep meta['val'] true for every node the pass makes "
                     "or changes (ExportPass.call_operator recomputes it; an edit of node.args in call() does "
                     "not)",
    "load": "the runtime refused the program when loading its method: a delegate's init (XNNPACK builds its "
            "subgraph there and refuses q/dq parameters it cannot take: a scale that is not positive and finite, "
            "a zero point out of range, other parameters on the input and output of an op that only moves values, "
            "a slice or a view, executorch#21829), or an operator with no kernel in the runtime. ExecuTorch's log "
            "above names the node or the operator",
    "execute": "the method raised running the inputs: a kernel's check failed at runtime, most often a dim order "
               "or a size the program's meta['val'] promises and the tensor does not have (a _clone_dim_order / "
               "_to_dim_order_copy whose dim_order argument disagrees with its meta['val'], a channels-last input "
               "against a program planned contiguous, executorch#16032), or a planned buffer too small for what an "
               "op writes. Keep each node's dim_order argument and meta['val'] in step",
    "outputs": "the .pte computes other numbers than the program's module(): the lowering read something module() "
               "does not (meta['val'] memory planning trusts, a dim order, the q/dq parameters XNNPACK fuses into "
               "its integer kernels), or a buffer write-back the pass moved. Check each node's meta['val'] and "
               "q/dq parameters against what it computes; where they are right, XNNPACK's lowering may be at "
               "fault for a valid form the pass made (a transpose folded into a constant runs the weight "
               "transposed: executorch#10499, docs/bugs-found.md row 42)",
}

LOWERED: StashKey[Lowered] = StashKey("runtime.original")  # the captured program's run, made once a subject


@dataclasses.dataclass
class Lowered:
    """What lowering one program and running its ``.pte`` gave: the ``stage`` that raised (None: every stage
    ran) and ``error``, the last lines ExecuTorch logged meanwhile (``log``), the ``.pte``'s flat
    ``outputs`` and the program's own (``expected``, flattened as ExecuTorch returns them), how many delegate
    calls the lowered program makes (``delegated``: 0 where XNNPACK took no part) and the seconds each stage
    took."""

    stage: str | None = None
    error: str | None = None
    log: str = ""
    outputs: list[Any] = dataclasses.field(default_factory=list)
    expected: list[Any] = dataclasses.field(default_factory=list)
    delegated: int = 0
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)

    def describe_failure(self) -> str:
        """``to_backend raised RuntimeError: ...``, with ExecuTorch's log lines where it logged any."""
        log = f" (ExecuTorch logged: {self.log})" if self.log else ""
        return f"{self.stage} raised {self.error}{log}"


def check(subject: Subject) -> dict[str, Any]:
    if not subject.contract.keeps_opset:
        raise Skip("the contract declares that the result leaves the capture's operator set (keeps_opset=False): a "
                   "backend's own IR (made inside its preprocess), which to_backend does not lower again")
    applied = subject.applied()
    given, returned = program_of(applied.original), program_of(applied.result)
    if given is None or returned is None:
        raise Skip("no ExportedProgram comes with the original or the result: nothing to lower to a .pte")
    inputs = tuple(subject.primary.make(subject.case.seed))
    where = f"{subject.primary.describe()}, {subject.capture.name}"
    tolerance = subject.tolerance.loosest(RUNTIME_TOLERANCE)  # with edge_pt2e's quantization steps (its capture's)
    original = subject.stash.get(LOWERED, lambda: lowered_and_run(given, inputs))
    if original.stage is not None:
        raise Skip(f"the captured program itself does not run through ExecuTorch: {original.describe_failure()}; "
                   "the model (or ExecuTorch) is to blame, not the pass")
    own = differences(original.outputs, original.expected, tolerance)
    if own.mismatch is not None:
        raise Skip(f"the captured program's own .pte already computes other numbers than its module(): "
                   f"{own.mismatch.describe()}; nothing to judge the result's by (the model, or ExecuTorch, not "
                   "the pass)")
    result = lowered_and_run(returned, inputs, which="result", where=where)
    if result.stage is not None:
        raise Finding(f"the captured program lowers to a .pte that loads and runs, the result does not: "
                      f"{result.describe_failure()}. Advice: {ADVICE[result.stage]}", input=where,
                      details=_details(original, result) | {"stage": result.stage})
    allowed = [tolerance.loosest(Tolerance(atol=ALLOWANCE * diff)) for diff in own.max_abs] \
        if len(result.outputs) == len(original.outputs) else None
    found = differences(result.outputs, result.expected, tolerance, allowed)
    if found.mismatch is not None:
        index = found.index
        before = f"{own.max_abs[index]:.3g}" if index is not None and index < len(own.max_abs) else "nothing"
        raise Finding(f"the result's .pte computes other numbers than the result's program: "
                      f"{found.mismatch.describe()}, where the captured program's .pte differed from its own by "
                      f"{before} (stage: outputs). Advice: {ADVICE['outputs']}", input=where,
                      where=found.mismatch.path, max_abs=found.mismatch.max_abs, max_rel=found.mismatch.max_rel,
                      details=_details(original, result) | {"stage": "outputs"})
    return _details(original, result) | {"max_abs": {"original": own.max_abs, "result": found.max_abs}}


def _details(original: Lowered, result: Lowered) -> dict[str, Any]:
    return {"delegated": {"original": original.delegated, "result": result.delegated},
            "seconds": {"original": original.seconds, "result": result.seconds}}


def lowered_and_run(program: torch.export.ExportedProgram, inputs: Sequence[Any], *, which: str = "original",
                    where: str = "") -> Lowered:
    """``program`` (a copy: lowering leaves it alone) lowered to a ``.pte`` with XNNPACK, loaded and run on
    ``inputs`` by ``executorch.runtime``, and ``program.module()`` run on them; a stage that raises ends it (see
    :class:`Lowered`). Where the program's own ``module()`` raises, :class:`ModuleRaised` (``which`` of the two,
    on ``where``)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeProgramManager
    from executorch.runtime import Runtime

    found = Lowered()
    state: dict[str, Any] = {}

    def stage(name: str, run: Callable[[], Any]) -> bool:
        started = time.perf_counter()
        with _executorch_log() as log:
            try:
                state[name] = run()
            except Exception as exc:  # whatever the lowering or the runtime raises is the stage's verdict
                found.stage, found.error = name, exception_summary(exc)
        found.seconds[name] = round(time.perf_counter() - started, 3)
        if found.stage == name:
            found.log = log()
        return found.stage is None

    manager = lambda: EdgeProgramManager({"forward": copy.deepcopy(program)},
                                         compile_config=compile_config()).to_backend(XnnpackPartitioner())
    if not (stage("to_backend", manager) and stage("to_executorch", lambda: state["to_backend"].to_executorch())):
        return found
    executorch = state["to_executorch"]
    found.delegated = sum(node.target is torch.ops.higher_order.executorch_call_delegate
                          for node in executorch.exported_program().graph.nodes)
    buffer = executorch.buffer
    flat = [value for value in pytree.tree_leaves(tuple(inputs))]
    if not (stage("load", lambda: Runtime.get().load_program(buffer).load_method("forward"))
            and stage("execute", lambda: list(state["load"].execute(flat)))):
        return found
    found.outputs = state["execute"]
    reference = started_as_executorch_starts(program).module()
    with torch.no_grad():
        found.expected = pytree.tree_leaves(ModuleRaised.guard(which, where, lambda: reference(*inputs)))  # type: ignore[arg-type]
    return found


def started_as_executorch_starts(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """A copy of ``program`` whose buffers start where the ``.pte``'s do: ExecuTorch plans a buffer the program
    mutates in memory and serializes only its shape and dtype ("a meaningless initial state", its emitter warns, unless
    a pass such as ``InitializedMutableBufferPass`` sets ``meta["et_init_buffer"]``): executorch 1.5.1 starts it at
    zero, not at the program's value (a counter a calibration call advanced). A copy: the run leaves the program alone."""
    copied = copy.deepcopy(program)
    for name in copied.graph_signature.buffers_to_mutate.values():
        found = copied.state_dict.get(name, copied.constants.get(name))
        if isinstance(found, torch.Tensor):
            with torch.no_grad():
                found.zero_()
    return copied


@dataclasses.dataclass
class Differences:
    """A ``.pte``'s outputs against its program's: the max abs difference at each output (0 where not floating),
    and the first mismatch beyond the tolerance (``index``: its output's) or None."""

    max_abs: list[float]
    mismatch: Mismatch | None = None
    index: int | None = None


def differences(actual: list[Any], expected: list[Any], tolerance: Tolerance,
                allowed: list[Tolerance] | None = None) -> Differences:
    """The differences of ``actual`` (a ``.pte``'s flat outputs) from ``expected`` (its program's), each output at
    ``tolerance`` or at its own of ``allowed``."""
    found = Differences([_max_abs(a, e) for a, e in zip(actual, expected)])
    if len(actual) != len(expected):
        found.mismatch = Mismatch("output", f"ExecuTorch returned {len(actual)} outputs, the program's module() "
                                            f"{len(expected)} (flattened)")
        return found
    for index, (a, e) in enumerate(zip(actual, expected)):
        mismatch = compare_values(a, e, path=f"output[{index}]",
                                  tolerance=allowed[index] if allowed is not None else tolerance)
        if mismatch is not None:
            found.mismatch, found.index = mismatch, index
            return found
    return found


def _max_abs(actual: Any, expected: Any) -> float:
    """The largest absolute difference of two floating tensors of one shape (inf where one is not finite and the
    other is); 0 for anything else."""
    if not (isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor)) or \
            actual.shape != expected.shape or not expected.is_floating_point() or not actual.is_floating_point():
        return 0.0
    if actual.numel() == 0:
        return 0.0
    diff = (actual.double() - expected.double()).abs()
    diff = torch.where(torch.isnan(actual) & torch.isnan(expected), torch.zeros_like(diff), diff)
    return float(diff.max())


@contextlib.contextmanager
def _executorch_log() -> Iterator[Callable[[], str]]:
    """What ExecuTorch's C++ runtime and XNNPACK print to the process's stderr meanwhile (their log: ``[file:line]
    message``), as a function giving its last :data:`LOG_LINES` lines in one line; the XNNPACK partitioner's
    deprecation warning about ``to_backend`` is not logged."""
    partitioner = logging.getLogger("executorch.backends.xnnpack.partition.xnnpack_partitioner")
    level = partitioner.level
    partitioner.setLevel(logging.ERROR)
    text: list[str] = []
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to take: the messages say what the exceptions say
        saved = None
    with tempfile.TemporaryFile() as taken:
        if saved is not None:
            os.dup2(taken.fileno(), 2)
        try:
            yield lambda: " | ".join(text[-LOG_LINES:])
        finally:
            partitioner.setLevel(level)
            if saved is not None:
                os.dup2(saved, 2)
                os.close(saved)
                taken.seek(0)
                lines = taken.read().decode(errors="replace").splitlines()
                text.extend(line.strip() for line in lines if line.strip().startswith("[") and "cpuinfo" not in line)
