"""Repros of failures on ``torch.export`` captures: a saved program and the pass call.

An exported graph cannot be rebuilt from its code as a symbolic trace can (its ``meta['val']``, its
signature and its ShapeEnv come from exporting), and torch's minifier does not keep a program's
signature valid. So the repro of a numerics failure on ``export`` / ``export_core`` is shrunk on the
program's module made flat, each candidate subgraph exported again as the capture exports (at its
inputs' shapes) and given to the pass as fxverify gives it a capture; the smallest failing one is
saved with ``torch.export.save`` (``<stem>.pt2``; the whole program where none is smaller), with the
inputs it fails on (``<stem>.pt``), and ``<stem>.py``, which loads both, calls the transform as
fxverify does on that capture (on ``program.module()``; on a copy of the program for a pass of form
``program``; through ``program._transform_do_not_use`` for form ``lifted``; each step in turn for a
list of passes) and compares the result's outputs with the program's own, exiting as the repros of
:mod:`fxverify.diagnose.repro` do. It is kept only when a fresh Python process running it fails as
the check did.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import fx

from fxverify.analysis.compare import Tolerance
from fxverify.capture.export import Export, program_of
from fxverify.core.contracts import Mode
from fxverify.core.results import exception_summary
from fxverify.diagnose.minimise import DEFAULT_BUDGET, cloned, minimise_module
from fxverify.diagnose.repro_script import DIFFERS, RAISES, absolute_spec, check_reproduces, script_source
from fxverify.engine.subject import Subject
from fxverify.errors import FxVerifyError, TransformFailed


@dataclasses.dataclass(frozen=True)
class _Failing:
    """A program on which the transform fails, with its inputs, as the repro will check it; ``module`` is the
    program's ``module()`` as the transform was given it, ``minimised`` how it was shrunk (empty: it was not)."""

    program: torch.export.ExportedProgram
    module: fx.GraphModule
    inputs: tuple[Any, ...]
    tolerance: tuple[float, float]
    kind: str  # RAISES or DIFFERS
    failure: str
    raised: str = ""
    where: str = ""
    minimised: str = ""


def write_program_repro(subject: Subject, directory: str | os.PathLike[str], stem: str, *, title: str = "",
                        budget_s: float = DEFAULT_BUDGET) -> tuple[Path, str]:
    """Write the repro of ``subject``'s failing numerics on an export capture into ``directory`` and return
    the ``.py`` path, once a fresh Python process running it fails as the check did, and how the
    program was minimised (``Minimised.describe()``; empty where the whole program is written).

    The program is the model exported as the capture exports it, in the contract's primary mode, in
    float64 first (with the float64 stage's tight tolerance) and then as built at each input
    configuration (with the float32 tolerance): the first on which the result's outputs differ from
    the program's, or the result raises; then shrunk within ``budget_s`` seconds to a subgraph on which
    the transform still fails, exported again as the capture exports (:func:`_minimised`). Raises
    :class:`FxVerifyError` when the transform cannot be imported by name, fails on none of them, or the
    program cannot be saved. For example::

        from fxverify.diagnose.program_repro import write_program_repro
        from fxverify.engine.subject import Subject

        subject = Subject("my_passes:fold_bn", "resnet18", capture=load_case("resnet18").capture_named("export"))
        path, how = write_program_repro(subject, "repros", "resnet18-fold_bn")  # repros/resnet18-fold_bn.py, .pt2, .pt
    """
    if not isinstance(subject.capture, Export):  # the program is Export's
        raise FxVerifyError(f"a saved-program repro is written for export captures, not {subject.capture.name}")
    if not subject.transform.reloadable:
        raise FxVerifyError(
            f"transform {subject.transform.spec} cannot be imported by name (a lambda, a local function or one defined "
            "in __main__), so a standalone repro cannot call it: define it in an importable module")
    found = _minimised(subject, subject.capture, _first_failing(subject, subject.capture), budget_s)
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / f"{stem}{suffix}" for suffix in (".py", ".pt2", ".pt")]
    try:
        torch.export.save(found.program, written[1])
    except Exception as exc:
        written[1].unlink(missing_ok=True)
        raise FxVerifyError(f"torch.export.save of the {subject.capture.name} program raised {exception_summary(exc)}") \
            from None
    torch.save({"inputs": list(found.inputs)}, written[2])
    written[0].write_text(script_source(
        _DOCSTRING, _BODY,
        title=title or f"transform {subject.transform.spec} fails on {subject.case.name}",
        where=found.where, capture=subject.capture.describe(), failure=found.failure,
        minimised=f", a subgraph of it ({found.minimised})" if found.minimised else "",
        run_path=os.path.relpath(written[0]), stem=stem, form=subject.transform.form,
        spec=absolute_spec(subject.transform.spec), rtol=found.tolerance[0], atol=found.tolerance[1],
    ))
    try:
        check_reproduces(written[0], found.kind, found.failure, found.raised)
    except FxVerifyError:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    return written[0], found.minimised


def _first_failing(subject: Subject, capture: Export) -> _Failing:
    """The first program and inputs (float64 first, see :func:`write_program_repro`) on which the
    transform's result fails."""
    mode = subject.contract.primary_mode
    attempts: list[tuple[Any, torch.dtype | None, Tolerance]] = []
    if subject.float64_skip is None:
        attempts.append((subject.primary, torch.float64, subject.float64_tolerance))
    attempts += [(config, None, subject.tolerance) for config in subject.configs]
    programs: dict[str, Any] = {}
    for config, dtype, tolerance in attempts:
        if str(dtype) not in programs:
            programs[str(dtype)] = _exported(subject, capture, mode, dtype)
        gm = programs[str(dtype)]
        inputs = tuple(config.make(subject.case.seed, dtype=dtype))
        rtol, atol = tolerance.for_dtype(dtype or torch.float32)
        where = f"{config.describe()}, {str(dtype or 'float32').removeprefix('torch.')}, {mode} mode"
        failing = _failure(subject, gm, inputs, (rtol, atol), where)
        if failing is not None:
            return failing
    raise FxVerifyError(f"transform {subject.transform.spec} fails on none of {subject.case.name}'s input configurations "
                        f"when its {subject.capture.name} program is given to it alone")


def _minimised(subject: Subject, capture: Export, found: _Failing, budget_s: float) -> _Failing:
    """``found`` shrunk by torch's minifier (:func:`~fxverify.diagnose.minimise.minimise_module`) to a subgraph on
    which the transform still fails, each candidate exported again as ``capture`` exports it but at its inputs'
    shapes (a static batch), so that the pass gets ``meta['val']`` and the program's form as it always does; the
    smallest such program, judged again as the repro judges it, or ``found`` where none is smaller."""
    static = dataclasses.replace(capture, dynamic_batch=False, keeps_program=True)
    training = subject.contract.primary_mode == "train"

    def exported(candidate: fx.GraphModule, inputs: Sequence[Any]) -> fx.GraphModule:
        return static.capture(candidate, training=training, inputs=tuple(inputs))

    try:
        small = minimise_module(subject.transform, flat_copy(found.module), found.inputs, tolerance=Tolerance(*found.tolerance),
                                capture=subject.capture, budget_s=budget_s, timeout=subject.timeout, prepare=exported)
    except FxVerifyError:
        return found
    if small.nodes_after >= small.nodes_before:
        return found
    failing = _failure(subject, exported(small.module, small.inputs), tuple(small.inputs), found.tolerance, found.where)
    return dataclasses.replace(failing, minimised=small.describe()) if failing is not None else found


def flat_copy(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` (an ``ep.module()``) taking and returning flat tensors, without its pytree code generator
    and its guards call, which torch's minifier cannot keep valid as it adds and removes placeholders."""
    flat = copy.deepcopy(gm)
    flat.graph.set_codegen(fx.graph.CodeGen())
    for node in list(flat.graph.nodes):
        if node.op == "call_module" and not node.users and node.target == "_guards_fn":
            flat.graph.erase_node(node)
    flat.recompile()
    return flat


def _exported(subject: Subject, capture: Export, mode: Mode, dtype: torch.dtype | None) -> Any:
    """The model exported as ``capture`` exports it, keeping its program (``meta[PROGRAM]``)."""
    module = subject.case.build(training=mode == "train")
    if dtype is not None:
        module = module.to(dtype)
    inputs = tuple(subject.case.configs[0].make(subject.case.seed, dtype=dtype))
    return dataclasses.replace(capture, keeps_program=True).capture(module, training=mode == "train", inputs=inputs)


def _failure(subject: Subject, gm: Any, inputs: tuple[Any, ...], tolerance: tuple[float, float], where: str) -> _Failing | None:
    """How the transform fails on the captured ``gm`` at ``inputs``, judged as the repro judges it."""
    program = program_of(gm)
    assert program is not None  # captured with keeps_program
    with torch.no_grad():
        expected = gm(*cloned(inputs))
    try:
        result, _ = subject.capture.apply(subject.transform, copy.deepcopy(gm), timeout=subject.timeout)
    except TransformFailed:
        return None  # another failure: numerics' is what the repro shows
    try:
        with torch.no_grad():
            actual = result(*cloned(inputs))
    except Exception as exc:
        return _Failing(program, gm, inputs, tolerance, RAISES,
                        f"the transformed module raised {exception_summary(exc)}", type(exc).__qualname__, where)
    try:
        torch.testing.assert_close(actual, expected, rtol=tolerance[0], atol=tolerance[1], equal_nan=True)
    except AssertionError as exc:
        return _Failing(program, gm, inputs, tolerance, DIFFERS, f"outputs differ: {str(exc).strip().splitlines()[0]}",
                        where=where)
    return None


_DOCSTRING = '''"""{title}.

Written by fxverify: the {capture} program of the model{minimised} ({where}), saved with
torch.export.save in {stem}.pt2, its inputs in {stem}.pt, and the pass call fxverify made (form {form}).
Failure: {failure}

Run it from the directory fxverify ran in (where the transform imports): python {run_path}
While the bug is there it prints the traceback and exits with {exit_differs} (torch.testing.assert_close
fails) or {exit_raises} (the transformed module raises); any other exit status is another problem.
"""
'''

_BODY = '''
FORM = {form!r}


def transformed(program, transform):
    """The pass called as fxverify calls it on an export capture; the module the result runs as."""
    steps = transform if isinstance(transform, (list, tuple)) else [transform]
    given = program.module() if FORM == "module" else program
    for step in steps:
        if FORM == "lifted":
            from torch.fx.passes.infra.pass_manager import pass_result_wrapper

            given = given._transform_do_not_use(pass_result_wrapper(step))
            continue
        returned = step(given)
        if returned is not None:
            given = returned if FORM == "program" else getattr(returned, "graph_module", returned)
    return given if FORM == "module" else given.module()


def main():
    saved = torch.load(HERE / "{stem}.pt", weights_only=True)
    with torch.no_grad():
        expected = torch.export.load(HERE / "{stem}.pt2").module()(*_clone(saved["inputs"]))
    result = transformed(torch.export.load(HERE / "{stem}.pt2"), _load_transform(TRANSFORM))
    return _judge(result, saved["inputs"], expected)
'''
