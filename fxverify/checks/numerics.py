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
from torch import nn
from torch.utils import _pytree as pytree

from fxverify.analysis.compare import Mismatch, compare_trees, compare_values, leaves_with_paths, rmse_per_leaf
from fxverify.analysis.localise import Localisation, localise
from fxverify.analysis.module_state import tensor_state, tensors_equal
from fxverify.cases.inputs import InputConfig
from fxverify.core.results import Finding, ModuleRaised, exception_summary
from fxverify.engine.subject import Subject
from fxverify.errors import TransformFailed


def check(v: Subject) -> dict[str, Any]:
    compared = []
    for config in v.configs:
        found = compare_config(v, config)
        if found is not None:
            finding = finding_of(found, f"{config.describe()}, float32, {v.contract.primary_mode} mode")
            rounding = float32_rounding(v, config, found)
            if rounding is not None:
                finding.what += f"\n{rounding}"
                finding.node = "not localised: in float64 no node computes something else"
                raise finding
            try:
                _localise_into(finding, _float64_localisation(v) if v.float64_skip is None else _float32_localisation(v),
                               " [float64]" if v.float64_skip is None else " [float32: no float64 run]")
            except Finding as unrunnable:
                finding.node = f"not localised: {unrunnable.what}"
            except Exception as exc:  # the float32 finding stands; say why it has no node
                finding.node = f"not localised: {exception_summary(exc)}"
            raise finding
        compared.append(config.name)
    located = None if v.float64_skip else _float64_localisation(v)
    if located is not None and (located.outputs is not None or located.divergence is not None):
        found = located.outputs
        what = (
            f"outputs differ: {found.describe()}" if found
            else "outputs agree, but a value the transform kept differs (a later op hides it)"
        )
        copy_problem = _copy_problem(v) if found else None
        if copy_problem:
            what += f"\n{copy_problem}"
        finding = Finding(what, input=_float64_input(v), where=found.path if found else None,
                          max_abs=found.max_abs if found else None, max_rel=found.max_rel if found else None)
        _localise_into(finding, located)
        raise finding
    for which in ("original", "result"):  # the train stage makes its own copies; gradients makes these again
        v.release_copy(which, torch.float64)
    modes = [m for m in v.contract.modes if m != v.contract.primary_mode]
    unchecked = None
    if modes and not v.capture.switches_mode and not v.settings.train_capture:
        modes, unchecked = [], (f"not compared: {v.capture.name} fixes the mode when it captures, and "
                                "--fxverify-train-capture off leaves out capturing the model in train mode too")
    try:
        switched: list[str] = []
        for mode in modes:
            if v.capture.switches_mode:
                switched.append(_compare_other_mode(v, mode))
                v.collect_garbage()  # that mode's trace and result
                switched += _compare_primary_switched(v, mode)
            else:
                _compare_captured_in(v, mode)
    except Finding as finding:
        finding.mode = modes[0]
        raise
    return {
        "configs": compared,
        "float64": "compared" if located else f"skipped: {v.float64_skip}",
        "kept_nodes_compared": located.compared if located else 0,
        "other_modes": unchecked or modes,
        "switched_modes": switched if v.capture.switches_mode else f"not compared: {v.capture.name} fixes the mode "
                                                                    "when it captures",
    }


def compare_config(v: Subject, config: InputConfig) -> Mismatch | None:
    """The result's float32 outputs on ``config`` against the original's, judged against a float64
    reference when not allclose (see the module's docstring); None when they agree."""
    return compare_trees(
        v.outputs("result", config),
        v.outputs("original", config),
        tolerance=v.tolerance,
        fp64_expected=None if v.float64_problem else functools.partial(v.outputs, "original", config, torch.float64),
        fp64_allowance=_rounding_allowance(v, config),
        other_expected=functools.partial(v.outputs, "original", config, threads=_other_threads()),
        other_actual=functools.partial(v.outputs, "result", config, threads=_other_threads()),
    )


def float32_rounding(v: Subject, config: InputConfig, found: Mismatch) -> str | None:
    """Why the result's float32 outputs on ``config`` differ (``found``) where its float64 outputs agree with the
    original's there (at the float64 tolerance): the float32 rounding of the kernels the result runs, and the
    tolerance that would declare it; None where they do not agree, or there is no float64 run."""
    if v.float64_skip is not None:
        return None
    try:
        agrees = _agrees_in_float64(v, v.outputs("result", config, torch.float64),
                                    v.outputs("original", config, torch.float64), v.outputs("original", config))
    except ModuleRaised:
        return None
    return _rounding(found.max_abs) if agrees else None


def _agrees_in_float64(v: Subject, result64: Any, original64: Any, original32: Any) -> bool:
    """Whether the float64 result computes what the float64 original does: within the float64 tolerance, or, leaf
    by leaf, by less than half of what float32 rounding alone moves the original (its float32 run against its
    float64 one; an ill-conditioned model, efficientvit in train mode, moves by 1e-4 in float64 between two
    memory layouts). A difference in what the result computes that small cannot put its float32 run twice as
    far from float64 as the original's (the triangle inequality): its own float32 rounding does. Leaves that
    are not floating (an integer buffer such as ``num_batches_tracked``) must be equal."""
    if compare_trees(result64, original64, tolerance=v.float64_tolerance) is None:
        return True
    if pytree.tree_structure(result64) != pytree.tree_structure(original64):
        return False
    if not all(_equal_unless_floating(ours, theirs) for ours, theirs in zip(pytree.tree_leaves(result64),
                                                                           pytree.tree_leaves(original64))):
        return False  # rounding moves no integer: a counter left at 0 is no rounding error
    return all(ours <= 0.5 * noise for ours, noise in zip(rmse_per_leaf(result64, original64),
                                                          rmse_per_leaf(original32, original64), strict=True))


def _equal_unless_floating(ours: Any, theirs: Any) -> bool:
    """Whether two leaves are equal, or both floating tensors (which rounding may move)."""
    if all(isinstance(leaf, torch.Tensor) and leaf.is_floating_point() for leaf in (ours, theirs)):
        return True
    return type(ours) is type(theirs) and tensors_equal(ours, theirs)


def _rounding(max_abs: float | None) -> str:
    """What a float32 difference whose float64 counterpart agrees is, and how to declare it."""
    here = f" (max abs err {max_abs:.3g} here; other inputs and modes may need more)" if max_abs else ""
    return ("in float64 the result agrees with the original at this input (within the float64 tolerance, or by less "
            "than half of what float32 rounding moves the original, which no difference in what it computes could "
            "double): the difference is the float32 rounding of the kernels the result runs (another algorithm, memory "
            "layout or accumulation order than the original's; a channels-last convolution, say), worse than the "
            "original's own against float64. If the "
            f"pass trades that accuracy by design, declare the error it may add: @fxverify.contract(atol=...){here}")


def finding_of(found: Mismatch, where: str) -> Finding:
    """The finding of outputs that differ."""
    return Finding(f"outputs differ: {found.describe()}", input=where, where=found.path, max_abs=found.max_abs,
                   max_rel=found.max_rel)


NO_KEPT_NODE_DIVERGED = "no kept node diverged: the difference arises in nodes the transform changed"


def _float64_input(v: Subject) -> str:
    return f"{v.primary.describe()}, float64, {v.contract.primary_mode} mode"


def _float64_localisation(v: Subject) -> Localisation:
    """Both modules run in float64 on the primary inputs, every kept node recorded."""
    original, result = v.module("original", torch.float64), v.module("result", torch.float64)
    inputs = v.primary.make(v.case.seed, dtype=torch.float64)
    return localise(original, result, inputs, v.float64_tolerance,
                    guard=functools.partial(ModuleRaised.guard, "result", _float64_input(v)))


def _float32_localisation(v: Subject) -> Localisation:
    """Both modules run as built on the primary inputs, every kept node recorded: where the float64
    run is not to be had (a float32-only result), with float32 tolerances."""
    inputs = v.primary.make(v.case.seed)
    where = f"{v.primary.describe()}, float32, {v.contract.primary_mode} mode"
    return localise(v.module("original"), v.module("result"), inputs, v.tolerance,
                    guard=functools.partial(ModuleRaised.guard, "result", where))


def _other_threads() -> int:
    """Another number of torch threads than now (1, or 2 when it runs on 1, as under pytest-xdist):
    torch then picks other kernels (oneDNN another convolution algorithm), whose float32 error on
    the original is as legitimate and can be several times larger."""
    return 2 if torch.get_num_threads() == 1 else 1


def _rounding_allowance(v: Subject, config: InputConfig) -> Callable[[], list[float]] | None:
    """For a result with new parameters, computed in float64 and stored in float32 (a fusion): what
    rounding them alone costs, per output, in rmse: the float64 result against the float32 result
    converted to float64. None when the result keeps the original's parameters, or when the float64
    result is itself the float32 one converted (nothing to measure)."""
    if not v.applied().rewrites_state or v.float64_skip or not v.float64_exact:
        return None

    def allowance() -> list[float]:
        try:
            rounded = v.capture.convert(v.applied().result, dtype=torch.float64)
            with torch.no_grad():
                outputs = rounded(*config.make(v.case.seed, dtype=torch.float64))
        except Exception:  # a result that cannot be converted: no allowance, the rule as for any result
            return [0.0] * len(leaves_with_paths(v.outputs("result", config))[0])
        return rmse_per_leaf(outputs, v.outputs("result", config, torch.float64))

    return allowance


def _copy_problem(v: Subject) -> str | None:
    """When the float64 result is a converted copy of the result: whether ``copy.deepcopy`` of the
    result already computes something else in float32 (say, a copy that loses its eval mode)."""
    if not v.converts_result or v.fresh_copies is not None or v.dtype_copies_fresh:
        return None  # the float64 result is the transform applied again, not a copy
    result = v.applied().result
    try:
        copied = copy.deepcopy(result)
        with torch.no_grad():
            outputs = copied(*v.primary.make(v.case.seed))
    except Exception as exc:
        return ("fxverify runs the float64 stage on copy.deepcopy(result).to(torch.float64); the copy raises: "
                f"{exception_summary(exc)}")
    found = compare_trees(outputs, v.outputs("result"), tolerance=v.tolerance)
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


def _captured_in(v: Subject, mode: str, *, static: bool = False) -> tuple[nn.Module, nn.Module]:
    """A fresh capture in ``mode`` and the transform's result of another one (``static``: at the example
    shapes, see :meth:`~fxverify.engine.subject.Subject.capture_fresh`)."""
    original = v.capture_fresh(mode, static=static)
    try:
        return original, v.transformed_fresh(mode, static=static)
    except TransformFailed as exc:
        raise Finding(f"the transform raised on the model captured in {mode} mode; {_primary_mode_matched(v)}:\n{exc}",
                      input=f"the model captured in {mode} mode") from None


def _compare_captured_in(v: Subject, mode: str) -> None:
    """For a capture that fixes the mode (``torch.export``: ``ep.module().train()`` raises): the model
    captured in ``mode`` (train) at the example shapes (only they are run: the dynamic check judges the
    others) and transformed, against that capture, outputs and buffers after one step, judged against
    the model captured in float64 in ``mode``."""
    original, result = _captured_in(v, mode, static=True)

    def float64_result() -> nn.Module:
        given = v.capture_fresh(mode, torch.float64, static=True)
        return v.capture.set_mode(v.capture.apply(v.transform, given, timeout=v.timeout)[0], mode == "train")

    _compare_runs(v, original, result, f"{mode} mode, captured in it at the example shapes (RNG reseeded per run)",
                  float64=lambda: v.capture_fresh(mode, torch.float64, static=True), float64_result=float64_result)


def _compare_other_mode(v: Subject, mode: str) -> str:
    """Trace and transform in ``mode`` (train); switch both to the primary mode and compare (see
    :func:`_compare_switched`); switch them back and compare outputs and buffers after one step in
    ``mode``. Returns the switch made, e.g. ``train->eval``."""
    original, result = _captured_in(v, mode)
    # switched first, as the transform left them: after a step in train mode their running statistics
    # differ by float32 rounding, which a fresh float64 copy of the stepped original cannot judge
    switched = _compare_switched(v, original, result, mode, v.contract.primary_mode)
    v.collect_garbage()  # the float64 reference of that run
    original.train(mode == "train")
    result.train(mode == "train")
    _compare_runs(v, original, result, f"{mode} mode (RNG reseeded per run)")
    return switched


def _compare_primary_switched(v: Subject, other: str) -> list[str]:
    """The subject's trace and result, transformed in the primary mode, switched to ``other``: on
    copies, since the subject's modules must not run in another mode (:meth:`~Subject.copy_of`: a fresh
    result where ``copy.deepcopy`` gives none that works, which the pickle check reports); on a fresh trace
    and result when running them has changed their buffers (the other checks need not have run them
    equally often)."""
    applied = v.applied()
    original: nn.Module
    try:
        if applied.state_advanced:
            original, result = v.capture_fresh(applied.mode), v.transformed_fresh(applied.mode)
        else:
            original, result = v.copy_of("original"), v.copy_of("result")
    except TransformFailed:
        raise
    except Exception:  # the original cannot be copied
        return []
    try:
        return [_compare_switched(v, original, result, applied.mode, other)]
    except Finding:
        if applied.state_advanced or not v.renew_result_copies():
            raise
    return [_compare_switched(v, v.copy_of("original"), v.copy_of("result"), applied.mode, other)]  # a fresh result


def _compare_switched(v: Subject, original: nn.Module, result: nn.Module, source: str, target: str) -> str:
    """The result transformed in ``source`` mode and switched to ``target`` mode must behave like the
    original trace switched the same way: a transform that reads ``module.training`` when it runs and
    writes it into the graph (``F.dropout(x, p, training=False)``) breaks the ``.train()`` / ``.eval()``
    switch every training loop makes. Comparing with the switched trace leaves out what tracing
    itself bakes in (``if self.training:`` in a module traced through)."""
    original.train(target == "train")
    result.train(target == "train")
    _compare_runs(v, original, result, f"transformed in {source} mode, then switched to {target} mode with "
                                       f".{target}() (RNG reseeded per run)", switched_from=source)
    return f"{source}->{target}"


def _compare_runs(v: Subject, original: nn.Module, result: nn.Module, how: str, *, switched_from: str | None = None,
                  float64: Callable[[], nn.Module] | None = None,
                  float64_result: Callable[[], nn.Module] | None = None) -> None:
    """Run ``original`` and ``result`` once on the primary inputs with the RNG reseeded; compare
    outputs and buffers after the run (BatchNorm running statistics), both judged against the
    original run in float64 with the same seed: ``original`` converted before it runs, or what ``float64``
    makes from a fresh capture, only when a float32 value is not allclose (a train-mode export made
    again in float64 costs as much as the first). On a failure, what ``float64_result`` makes (the transform
    applied to that capture) is run too: where it agrees with the float64 original, the finding says the
    difference is the float32 rounding of the result's kernels."""
    config = v.primary
    where = f"{config.describe()}, float32, {how}"
    if v.float64_problem is not None:
        float64 = None
    elif float64 is None:
        try:  # now, before ``original`` runs and steps its buffers
            converted = v.capture.convert(original, dtype=torch.float64)
            float64 = lambda: converted
        except Exception:  # no float64 reference: plain float32 tolerances
            pass
    expected = _run_reseeded(v, original, config.make(v.case.seed), where, original=True)
    try:
        actual = _run_reseeded(v, result, config.make(v.case.seed), where)
    except ModuleRaised as raised:
        raised.what += f"\n{_primary_mode_matched(v)}"
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
            inputs = config.make(v.case.seed, dtype=torch.float64)
            reference_run.append(pytree.tree_map(lambda _: None, expected, is_leaf=lambda x: x is None)
                                 if module is None else _run_reseeded(v, module, inputs, where, original=True))
        return reference_run[0]

    def rounding_only() -> bool:
        """Whether the transform applied in float64 gives the float64 original's outputs and buffers."""
        module = reference() if float64 is not None and float64_result is not None else None
        if module is None or float64_result is None:
            return False
        fp64()  # the float64 original has run: its buffers are stepped
        try:
            result64 = float64_result()
            outputs64 = _run_reseeded(v, result64, config.make(v.case.seed, dtype=torch.float64), where)
        except (TransformFailed, ModuleRaised):
            return False
        if not _agrees_in_float64(v, outputs64, reference_run[0], expected):
            return False
        reference_state, result_state, stepped = tensor_state(module), tensor_state(result64), tensor_state(original)
        names = sorted(reference_state.keys() & result_state.keys() & stepped.keys())
        return _agrees_in_float64(v, [result_state[n] for n in names], [reference_state[n] for n in names],
                                  [stepped[n] for n in names])

    found = compare_trees(actual, expected, tolerance=v.tolerance, fp64_expected=fp64 if float64 is not None else None)
    if found is not None:
        finding = finding_of(found, where)
        if rounding_only():
            finding.what += f"\n{_rounding(found.max_abs)}"
            raise finding
        if switched_from:
            finding.what += (f"\nthe result does not follow the switch as the original trace does: the transform "
                             f"baked {switched_from} mode into the graph (it read module.training when it ran, or "
                             "removed a module that behaves differently in the two modes); keep what depends on "
                             "the mode in modules, read at run time")
        finding.what += f"\n{_primary_mode_matched(v)}"
        raise finding
    before, after = tensor_state(original), tensor_state(result)
    parameters = {name for name, _ in original.named_parameters()}

    def fp64_buffer(name: str) -> Any:
        fp64()  # the reference's buffers are updated by its run
        module = reference()
        return None if module is None else tensor_state(module).get(name)

    for name in sorted((before.keys() & after.keys()) - parameters):
        found_buffer = compare_values(after[name], before[name], path=f"buffer {name!r} after the forward pass",
                                      tolerance=v.tolerance,
                                      fp64=functools.partial(fp64_buffer, name) if float64 is not None else None)
        if found_buffer is not None:
            why = _rounding(found_buffer.max_abs) if rounding_only() else _primary_mode_matched(v)
            raise Finding(f"buffers updated differently: {found_buffer.describe()}\n{why}", input=where,
                          where=found_buffer.path)


def _primary_mode_matched(v: Subject) -> str:
    """What a difference seen only in another mode than the contract's primary one says (:func:`_compare_runs`
    runs after every primary-mode stage passed): the result was right there, and how to declare a pass meant for
    that mode only (an inference-only pass run under the strict contract)."""
    primary = v.contract.primary_mode
    other = "+".join(m for m in v.contract.modes if m != primary)
    ran = "float32" if v.float64_skip else "float32 and float64"
    return (f"in {primary} mode, which the contract checks first, the result matched the original at every input "
            f"({ran}): only the {other}-mode promise of the contract (modes={'+'.join(v.contract.modes)}) is broken. "
            f"If the pass is meant for {primary} mode only (an inference-only pass: a conv/BN fold, dropout removal), "
            f"declare @fxverify.contract(modes=({primary!r},))")


def _run_reseeded(v: Subject, module: nn.Module, inputs: tuple[Any, ...], where: str, *, original: bool = False) -> Any:
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(v.case.seed + 1)
        return ModuleRaised.guard("original" if original else "result", where, lambda: module(*inputs))
