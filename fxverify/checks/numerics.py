"""numerics: the result computes what the original computes.

Outputs are compared at every input configuration (batch sizes, spatial
sizes, a large-magnitude set) in float32, judged against a float64 reference
when not allclose (a result with new parameters is allowed what rounding them
to float32 alone costs; the original's and the result's errors are also taken with the
kernels torch picks on another number of threads, and the result passes when either of its runs
is within the rule); then in float64, tightly, together with the values of
every node the transform kept; then in train mode unless the contract is
eval-only, with the RNG reseeded so dropout masks match, judged by the same
float64-reference rule, including updated buffers such as BatchNorm running
statistics. For a contract covering both modes, the result transformed in one
mode and switched to the other (``.train()`` / ``.eval()``, as a training loop
does between epochs and validation) must behave as the original trace switched
the same way: a training flag baked in at transform time shows there. A capture that fixes the
mode (``torch.export``, ``make_fx``) is not switched: the train stage captures the model in train mode
(a capture per model more; ``--fxverify-train-capture off`` leaves it out) and compares that capture with
its transformed copy.

A failure names the first node whose float64 value diverges (see
:mod:`fxverify.analysis.localise`; the result's ``divergence``). With a repro directory
(``--fxverify-repro-dir``), the runner's post-failure hook minimises a failure in
the contract's primary mode and writes it as a standalone file
(:class:`fxverify.diagnose.repro.ReproOnFailure`).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from fxverify.analysis.compare import Mismatch, Rerounded, compare_trees, compare_values
from fxverify.analysis.cpu_kernels import int8_saturation_note
from fxverify.analysis.localise import Localisation, localise
from fxverify.analysis.module_state import tensor_state
from fxverify.cases.inputs import InputConfig
from fxverify.checks import option
from fxverify.checks._outputs import (
    agrees_in_float64,
    compare_config,
    finding_of,
    float32_rounding,
    non_finite_note,
    rounding_note,
)
from fxverify.checks._quantizer import check as quantizer_numerics
from fxverify.core.contracts import Mode
from fxverify.core.results import Finding, ModuleRaised, exception_summary
from fxverify.engine.subject import Subject
from fxverify.errors import TransformFailed


def check(subject: Subject) -> dict[str, Any]:
    if not subject.compares_values:  # a quantizer under test
        return quantizer_numerics(subject, float_check=check)
    compared = []
    for config in subject.configs:
        found = compare_config(subject, config)
        if found is not None:
            finding = finding_of(found, f"{config.describe()}, {subject.dtype}, {subject.contract.primary_mode} mode")
            cpu_note = int8_saturation_note(*_graphs(subject))
            if cpu_note is not None:
                finding.what += f"\n{cpu_note}"
            float32_only = float32_rounding(subject, config, found)
            if float32_only is not None:
                finding.what += f"\n{float32_only}"
                if not found.non_finite:
                    finding.node = "not localised: in float64 no node computes something else"
                    raise finding
            in_float64 = subject.float64_skip is None and float32_only is None  # else: no float64 run, or NaN
            try:  # that float64 does not show: where the result's float32 run first has them
                diverged = _float64_localisation(subject) if in_float64 else _float32_localisation(subject, config)
                _localise_into(finding, diverged, " [float64]" if in_float64 else
                               f" [{subject.dtype}]" if float32_only else " [float32: no float64 run]")
            except Finding as unrunnable:
                finding.node = f"not localised: {unrunnable.what}"
            except Exception as exc:  # the float32 finding stands; say why it has no node
                finding.node = f"not localised: {exception_summary(exc)}"
            raise finding
        compared.append(config.name)
    located = None if subject.float64_skip else _float64_localisation(subject)
    if located is not None and (located.outputs is not None or located.divergence is not None):
        found = located.outputs
        what = (
            f"outputs differ: {found.describe()}" if found
            else "outputs agree, but a value the transform kept differs (a later op hides it)"
        )
        copy_problem = _copy_problem(subject) if found else None
        if copy_problem:
            what += f"\n{copy_problem}"
        finding = Finding(what, input=_float64_input(subject), where=found.path if found else None,
                          max_abs=found.max_abs if found else None, max_rel=found.max_rel if found else None)
        _localise_into(finding, located)
        raise finding
    for which in ("original", "result"):  # the train stage makes its own copies; gradients makes these again
        subject.release_copy(which, torch.float64)
    modes = [m for m in subject.contract.modes if m != subject.contract.primary_mode]
    unchecked = None
    if modes and subject.capture.inference_only:
        modes, unchecked = [], f"not compared: {subject.capture.name} captures the model in eval mode only (for inference)"
    elif modes and not subject.capture.switches_mode and not option(subject.settings, "train_capture"):
        modes, unchecked = [], (f"not compared: {subject.capture.name} fixes the mode when it captures, and "
                                "--fxverify-train-capture off leaves out capturing the model in train mode too")
    try:
        switched: list[str] = []
        for mode in modes:
            if subject.capture.switches_mode:
                switched.append(_compare_other_mode(subject, mode))
                subject.collect_garbage()  # that mode's trace and result
                switched += _compare_primary_switched(subject, mode)
            else:
                _compare_captured_in(subject, mode)
    except Finding as finding:
        finding.mode = modes[0]
        raise
    return {
        "configs": compared,
        "float64": "compared" if located else f"skipped: {subject.float64_skip}",
        "kept_nodes_compared": located.compared if located else 0,
        "other_modes": unchecked or modes,
        "switched_modes": switched if subject.capture.switches_mode else f"not compared: {subject.capture.name} fixes the mode "
                                                                    "when it captures",
    }


def _graphs(subject: Subject) -> list[fx.Graph]:
    """The graphs of the original and the result (a result may be any module)."""
    modules = (subject.module("original"), subject.applied().result)
    return [module.graph for module in modules if isinstance(module, fx.GraphModule)]


NO_KEPT_NODE_DIVERGED = "no kept node diverged: the difference arises in nodes the transform changed"


def _float64_input(subject: Subject) -> str:
    return f"{subject.primary.describe()}, float64, {subject.contract.primary_mode} mode"


def _float64_localisation(subject: Subject) -> Localisation:
    """Both modules run in float64 on the primary inputs, every kept node recorded: from one state, where the runs
    before stepped a model's buffers apart (the float64 original is run once per input configuration, the result
    once)."""
    if subject.applied().state_advanced:
        for which in ("original", "result"):
            subject.release_copy(which, torch.float64)
    original, result = subject.module("original", torch.float64), subject.module("result", torch.float64)
    inputs = subject.primary.make(subject.case.seed, dtype=torch.float64)
    return localise(original, result, inputs, subject.float64_tolerance,
                    guard=functools.partial(ModuleRaised.guard, "result", _float64_input(subject)))


def _float32_localisation(subject: Subject, config: InputConfig | None = None) -> Localisation:
    """Both modules run as built on ``config``'s inputs (the primary ones by default), every kept node recorded:
    where the float64 run is not to be had (a float32-only result), or shows nothing (NaN appearing in float32
    only), with float32 tolerances."""
    config = config or subject.primary
    inputs = config.make(subject.case.seed)
    where = f"{config.describe()}, {subject.dtype}, {subject.contract.primary_mode} mode"
    return localise(subject.module("original"), subject.module("result"), inputs, subject.tolerance,
                    guard=functools.partial(ModuleRaised.guard, "result", where))


def _copy_problem(subject: Subject) -> str | None:
    """When the float64 result is a converted copy of the result: whether ``copy.deepcopy`` of the
    result already computes something else in float32 (say, a copy that loses its eval mode)."""
    if not subject.converts_result or subject.fresh_copies is not None or subject.dtype_copies_fresh:
        return None  # the float64 result is the transform applied again, not a copy
    result = subject.applied().result
    try:
        copied = copy.deepcopy(result)
        with torch.no_grad():
            outputs = copied(*subject.primary.make(subject.case.seed))
    except Exception as exc:
        return ("fxverify runs the float64 stage on copy.deepcopy(result).to(torch.float64); the copy raises: "
                f"{exception_summary(exc)}")
    found = compare_trees(outputs, subject.outputs("result"), tolerance=subject.tolerance)
    if found is None:
        return None
    mode = ""
    if copied.training != result.training:
        mode = (f" (the copy is in {'train' if copied.training else 'eval'} mode, the result in "
                f"{'train' if result.training else 'eval'} mode)")
    return ("fxverify runs the float64 stage on copy.deepcopy(result).to(torch.float64), and copy.deepcopy(result) "
            f"already computes something else in float32{mode}: {found.describe()}. The result does not survive "
            "copy.deepcopy (as torch.save, checkpoints and many passes copy it): make its copy behave like it")


def _localise_into(finding: Finding, located: Localisation, note: str = " [float64]") -> None:
    """Name the first divergent kept node (or the changed nodes feeding the outputs) in ``finding``."""
    if located.divergence is not None:
        finding.node = located.divergence.describe(note)
        finding.divergence = located.divergence.details()
    elif located.unmapped:
        finding.node = f"not localised: {located.unmapped}"
    elif located.changed_before_output:
        finding.node = f"{NO_KEPT_NODE_DIVERGED}: {located.changed_before_output}"
    else:
        finding.node = NO_KEPT_NODE_DIVERGED


def _captured_in(subject: Subject, mode: Mode, *, static: bool = False) -> tuple[nn.Module, nn.Module]:
    """A fresh capture in ``mode`` and the transform's result of another one (``static``: at the example
    shapes, see :meth:`~fxverify.engine.subject.Subject.capture_fresh`)."""
    original = subject.capture_fresh(mode, static=static)
    try:
        return original, subject.transformed_fresh(mode, static=static)
    except TransformFailed as exc:
        raise Finding(f"the transform raised on the model captured in {mode} mode; {_primary_mode_matched(subject)}:\n{exc}",
                      input=f"the model captured in {mode} mode") from None


def _compare_captured_in(subject: Subject, mode: Mode) -> None:
    """For a capture that fixes the mode (``torch.export``: ``ep.module().train()`` raises): the model
    captured in ``mode`` (train) at the example shapes (only they are run: the dynamic check judges the
    others) and transformed, against that capture, outputs and buffers after one step, judged against
    the model captured in float64 in ``mode``."""
    original, result = _captured_in(subject, mode, static=True)

    def float64_result() -> nn.Module:
        given = subject.capture_fresh(mode, torch.float64, static=True)
        result, _ = subject.capture.apply(subject.transform, given, timeout=subject.timeout)
        return subject.capture.set_mode(result, mode == "train")

    _compare_runs(subject, original, result, f"{mode} mode, captured in it at the example shapes (RNG reseeded per run)",
                  float64=lambda: subject.capture_fresh(mode, torch.float64, static=True), float64_result=float64_result)


def _compare_other_mode(subject: Subject, mode: Mode) -> str:
    """Trace and transform in ``mode`` (train); switch both to the primary mode and compare (see
    :func:`_compare_switched`); switch them back and compare outputs and buffers after one step in
    ``mode``. Returns the switch made, e.g. ``train->eval``."""
    original, result = _captured_in(subject, mode)
    # switched first, as the transform left them: after a step in train mode their running statistics
    # differ by float32 rounding, which a fresh float64 copy of the stepped original cannot judge
    switched = _compare_switched(subject, original, result, mode, subject.contract.primary_mode)
    subject.collect_garbage()  # the float64 reference of that run
    original.train(mode == "train")
    result.train(mode == "train")
    _compare_runs(subject, original, result, f"{mode} mode (RNG reseeded per run)")
    return switched


def _compare_primary_switched(subject: Subject, other: str) -> list[str]:
    """The subject's trace and result, transformed in the primary mode, switched to ``other``: on
    copies, since the subject's modules must not run in another mode (:meth:`~Subject.copy_of`: a fresh
    result where ``copy.deepcopy`` gives none that works, which the pickle check reports); on a fresh trace
    and result when running them has changed their buffers (the other checks need not have run them
    equally often)."""
    applied = subject.applied()
    original: nn.Module
    try:
        if applied.state_advanced:
            original, result = subject.capture_fresh(applied.mode), subject.transformed_fresh(applied.mode)
        else:
            original, result = subject.copy_of("original"), subject.copy_of("result")
    except TransformFailed:
        raise
    except Exception:  # the original cannot be copied
        return []
    try:
        return [_compare_switched(subject, original, result, applied.mode, other)]
    except Finding:
        if applied.state_advanced or not subject.renew_result_copies():
            raise
    fresh = subject.copy_of("result")  # a fresh result
    return [_compare_switched(subject, subject.copy_of("original"), fresh, applied.mode, other)]


def _compare_switched(subject: Subject, original: nn.Module, result: nn.Module, source: str, target: str) -> str:
    """The result transformed in ``source`` mode and switched to ``target`` mode must behave like the
    original trace switched the same way: a transform that reads ``module.training`` when it runs and
    writes it into the graph (``F.dropout(x, p, training=False)``) breaks the ``.train()`` / ``.eval()``
    switch every training loop makes. Comparing with the switched trace leaves out what tracing
    itself bakes in (``if self.training:`` in a module traced through)."""
    original.train(target == "train")
    result.train(target == "train")
    _compare_runs(subject, original, result, f"transformed in {source} mode, then switched to {target} mode with "
                                       f".{target}() (RNG reseeded per run)", switched_from=source)
    return f"{source}->{target}"


def _compare_runs(subject: Subject, original: nn.Module, result: nn.Module, how: str, *, switched_from: str | None = None,
                  float64: Callable[[], nn.Module] | None = None,
                  float64_result: Callable[[], nn.Module] | None = None) -> None:
    """Run ``original`` and ``result`` once on the primary inputs with the RNG reseeded; compare
    outputs and buffers after the run (BatchNorm running statistics), both judged against the
    original run in float64 with the same seed: ``original`` converted before it runs, or what ``float64``
    makes from a fresh capture, only when a float32 value is not allclose (a train-mode export made
    again in float64 costs as much as the first). On a failure, what ``float64_result`` makes (the transform
    applied to that capture) is run too: where it agrees with the float64 original, the finding says the
    difference is the float32 rounding of the result's kernels (or, for NaN and inf, an overflow in float32).
    The original's error against float64 is the largest of its run and its runs rounded otherwise, each from
    the buffers it had before its run (:func:`_rerounded_runs`)."""
    config = subject.primary
    where = f"{config.describe()}, {subject.dtype}, {how}"
    rerounded = _rerounded_runs(subject, original, where)
    if subject.float64_problem is not None:
        float64 = None
    elif float64 is None:
        try:  # now, before ``original`` runs and steps its buffers
            converted = subject.capture.convert(original, dtype=torch.float64)
            float64 = lambda: converted
        except Exception:  # no float64 reference: plain float32 tolerances
            pass
    expected = _run_reseeded(subject, original, config.make(subject.case.seed), where, original=True)
    try:
        actual = _run_reseeded(subject, result, config.make(subject.case.seed), where)
    except ModuleRaised as raised:
        raised.what += f"\n{_primary_mode_matched(subject)}"
        raise
    reference_run: list[Any] = []

    @functools.cache
    def reference() -> nn.Module | None:
        assert float64 is not None  # fp64 is passed on only when there is a reference to make
        try:
            return float64()
        except Exception:  # no float64 reference: plain float32 tolerances
            return None

    def fp64() -> Any:
        if not reference_run:
            module = reference()
            inputs = config.make(subject.case.seed, dtype=torch.float64)
            reference_run.append(pytree.tree_map(lambda _: None, expected, is_leaf=lambda x: x is None)
                                 if module is None else _run_reseeded(subject, module, inputs, where, original=True))
        return reference_run[0]

    def rounding_only() -> bool:
        """Whether the transform applied in float64 gives the float64 original's outputs and buffers."""
        module = reference() if float64 is not None and float64_result is not None else None
        if module is None or float64_result is None:
            return False
        fp64()  # the float64 original has run: its buffers are stepped
        try:
            result64 = float64_result()
            outputs64 = _run_reseeded(subject, result64, config.make(subject.case.seed, dtype=torch.float64), where)
        except (TransformFailed, ModuleRaised):
            return False
        if not agrees_in_float64(subject, outputs64, reference_run[0], expected):
            return False
        reference_state, result_state, stepped = tensor_state(module), tensor_state(result64), tensor_state(original)
        names = sorted(reference_state.keys() & result_state.keys() & stepped.keys())
        return agrees_in_float64(subject, [result_state[n] for n in names], [reference_state[n] for n in names],
                                  [stepped[n] for n in names])

    found = compare_trees(actual, expected, tolerance=subject.tolerance, fp64_expected=fp64 if float64 is not None else None,
                          rerounded_expected=lambda draw: rerounded(draw)[0])
    if found is not None:
        finding = finding_of(found, where)
        if rounding_only():
            finding.what += f"\n{_float32_only(subject, found)}"
            raise finding
        if switched_from:
            finding.what += (f"\nthe result does not follow the switch as the original trace does: the transform "
                             f"baked {switched_from} mode into the graph (it read module.training when it ran, or "
                             "removed a module that behaves differently in the two modes); keep what depends on "
                             "the mode in modules, read at run time")
        finding.what += f"\n{_primary_mode_matched(subject)}"
        raise finding
    before, after = tensor_state(original), tensor_state(result)
    parameters = {name for name, _ in original.named_parameters()}

    def fp64_buffer(name: str) -> Any:
        fp64()  # the reference's buffers are updated by its run
        module = reference()
        return None if module is None else tensor_state(module).get(name)

    def rerounded_buffer(name: str, draw: int) -> Any:
        return rerounded(draw)[1].get(name)

    for name in sorted((before.keys() & after.keys()) - parameters):
        found_buffer = compare_values(after[name], before[name], path=f"buffer {name!r} after the forward pass",
                                      tolerance=subject.tolerance,
                                      fp64=functools.partial(fp64_buffer, name) if float64 is not None else None,
                                      rerounded=functools.partial(rerounded_buffer, name))
        if found_buffer is not None:
            why = _float32_only(subject, found_buffer) if rounding_only() else _primary_mode_matched(subject)
            raise Finding(f"buffers updated differently: {found_buffer.describe()}\n{why}", input=where,
                          where=found_buffer.path)


def _rerounded_runs(subject: Subject, original: nn.Module, where: str) -> Callable[[int], tuple[Any, dict[str, Any]]]:
    """Run ``draw`` of ``original`` rounded otherwise (:class:`~fxverify.analysis.compare.Rerounded`), on the
    primary inputs with the RNG reseeded as its own run: its outputs and its tensors other than parameters after
    the run, each run on a copy given the buffers ``original`` has now, before its own run; ``(None, {})`` where
    no copy runs."""
    before = {name: buffer.detach().clone() for name, buffer in original.named_buffers()}

    @functools.cache
    def run(draw: int) -> tuple[Any, dict[str, Any]]:
        try:
            module = subject.capture.convert(original)
            with torch.no_grad():
                for name, buffer in module.named_buffers():
                    buffer.copy_(before[name])
            with Rerounded(draw):
                outputs = _run_reseeded(subject, module, subject.primary.make(subject.case.seed), where, original=True)
        except Exception:  # no copy to run: the rule as without it
            return None, {}
        parameters = {name for name, _ in module.named_parameters()}
        return outputs, {name: t for name, t in tensor_state(module).items() if name not in parameters}

    return run


def _float32_only(subject: Subject, found: Mismatch) -> str:
    """What a difference ``found`` in float32 alone is (the float64 result agrees): NaN or inf that appear in
    float32 only, or the rounding of the result's kernels."""
    return non_finite_note(found, subject.dtype) if found.non_finite else rounding_note(found.max_abs)


def _primary_mode_matched(subject: Subject) -> str:
    """What a difference seen only in another mode than the contract's primary one says (:func:`_compare_runs`
    runs after every primary-mode stage passed): the result was right there, and how to declare a pass meant for
    that mode only (an inference-only pass run under the strict contract)."""
    primary = subject.contract.primary_mode
    other = "+".join(m for m in subject.contract.modes if m != primary)
    ran = subject.dtype if subject.float64_skip else f"{subject.dtype} and float64"
    return (f"in {primary} mode, which the contract checks first, the result matched the original at every input "
            f"({ran}): only the {other}-mode promise of the contract (modes={'+'.join(subject.contract.modes)}) is broken. "
            f"If the pass is meant for {primary} mode only (an inference-only pass: a conv/BN fold, dropout removal), "
            f"declare @fxverify.contract(modes=({primary!r},))")


def _run_reseeded(subject: Subject, module: nn.Module, inputs: tuple[Any, ...], where: str, *, original: bool = False) -> Any:
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(subject.case.seed + 1)
        return ModuleRaised.guard("original" if original else "result", where, lambda: module(*inputs))
