"""The float32 output comparison that ``numerics``, ``dynamic`` and ``stateful`` share: the result's outputs on
one input configuration against the original's, judged against a float64 reference when not allclose (see
:mod:`fxverify.checks.numerics`), whether a difference is the float32 rounding of the result's kernels (or NaN
and inf that appear in float32 only, which is never rounding), and the finding of outputs that differ."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fxverify.analysis.compare import Mismatch, Rerounded, compare_trees, leaves_with_paths, rmse_per_leaf
from fxverify.analysis.module_state import tensors_equal
from fxverify.cases.inputs import InputConfig
from fxverify.core.results import Finding, ModuleRaised
from fxverify.engine.subject import Subject


def compare_config(subject: Subject, config: InputConfig) -> Mismatch | None:
    """The result's float32 outputs on ``config`` against the original's, judged against a float64
    reference when not allclose (see the module's docstring); None when they agree. Where there is no float64
    run (a quantized graph) and running the two has moved their buffers apart (a counter, a running statistic),
    a fresh pair, run call for call alike, is compared instead (:func:`_fresh_outputs`)."""
    if subject.float64_problem is not None and subject.applied().state_advanced:
        return compare_trees(*_fresh_outputs(subject, config), tolerance=subject.tolerance)
    return compare_trees(
        subject.outputs("result", config),
        subject.outputs("original", config),
        tolerance=subject.tolerance,
        fp64_expected=None if subject.float64_problem else functools.partial(subject.outputs, "original", config, torch.float64),
        fp64_allowance=rounding_allowance(subject, config),
        other_expected=functools.partial(subject.outputs, "original", config, threads=other_threads()),
        other_actual=functools.partial(subject.outputs, "result", config, threads=other_threads()),
        rerounded_expected=functools.partial(rerounded_outputs, subject, config),
    )


def _fresh_outputs(subject: Subject, config: InputConfig) -> tuple[Any, Any]:
    """The result's and the original's outputs on ``config`` from the one fresh pair the subject makes from a fresh
    capture (:meth:`~fxverify.engine.subject.Subject.module` in float32), each run once a configuration."""
    inputs = config.make(subject.case.seed)
    where = f"{config.describe()}, {subject.dtype}, a fresh capture and result"
    with torch.no_grad():
        result = ModuleRaised.guard("result", where, lambda: subject.module("result", torch.float32)(*inputs))
        original = ModuleRaised.guard("original", where, lambda: subject.module("original", torch.float32)(*inputs))
    return result, original


def rerounded_outputs(subject: Subject, config: InputConfig, draw: int) -> Any:
    """The original's float32 outputs on ``config`` in run ``draw`` rounded otherwise
    (:class:`~fxverify.analysis.compare.Rerounded`); None where they cannot be had alike: in train mode (its
    runs draw random numbers and step its buffers; numerics' train stage makes its own), where running it has
    changed its buffers (a counter, a cache: the run would start elsewhere), or where it raises so."""
    applied = subject.applied()
    if applied.mode == "train" or applied.state_advanced:
        return None
    try:
        with torch.no_grad(), Rerounded(draw):
            outputs = subject.module("original")(*config.make(subject.case.seed))
    except Exception:  # e.g. a kernel for plain tensors only: no such run, the rule as without it
        return None
    return None if applied.state_advanced else outputs


def float32_rounding(subject: Subject, config: InputConfig, found: Mismatch) -> str | None:
    """Why the result's float32 outputs on ``config`` differ (``found``) where its float64 outputs agree with the
    original's there (at the float64 tolerance): the float32 rounding of the kernels the result runs, and the
    tolerance that would declare it, or, for NaN or inf where the original's are finite, an overflow or a dtype
    precondition in float32 (:func:`non_finite_note`); None where they do not agree, or there is no float64 run."""
    if subject.float64_skip is not None:
        return None
    try:
        agrees = agrees_in_float64(subject, subject.outputs("result", config, torch.float64),
                                    subject.outputs("original", config, torch.float64), subject.outputs("original", config))
    except ModuleRaised:
        return None
    if not agrees:
        return None
    return non_finite_note(found, subject.dtype) if found.non_finite else rounding_note(found.max_abs)


def agrees_in_float64(subject: Subject, result64: Any, original64: Any, original32: Any) -> bool:
    """Whether the float64 result computes what the float64 original does: within the float64 tolerance, or, leaf
    by leaf, by less than half of what float32 rounding alone moves the original (its float32 run against its
    float64 one; an ill-conditioned model, efficientvit in train mode, moves by 1e-4 in float64 between two
    memory layouts). A difference in what the result computes that small cannot put its float32 run twice as
    far from float64 as the original's (the triangle inequality): its own float32 rounding does. Leaves that
    are not floating (an integer buffer such as ``num_batches_tracked``) must be equal."""
    if compare_trees(result64, original64, tolerance=subject.float64_tolerance) is None:
        return True
    if pytree.tree_structure(result64) != pytree.tree_structure(original64):
        return False
    if not all(equal_unless_floating(ours, theirs) for ours, theirs in zip(pytree.tree_leaves(result64),
                                                                           pytree.tree_leaves(original64))):
        return False  # rounding moves no integer: a counter left at 0 is no rounding error
    return all(ours <= 0.5 * noise for ours, noise in zip(rmse_per_leaf(result64, original64),
                                                          rmse_per_leaf(original32, original64), strict=True))


def equal_unless_floating(ours: Any, theirs: Any) -> bool:
    """Whether two leaves are equal, or both floating tensors (which rounding may move)."""
    if all(isinstance(leaf, torch.Tensor) and leaf.is_floating_point() for leaf in (ours, theirs)):
        return True
    return type(ours) is type(theirs) and tensors_equal(ours, theirs)


def rounding_note(max_abs: float | None) -> str:
    """What a float32 difference whose float64 counterpart agrees is, and how to declare it."""
    here = f" (max abs err {max_abs:.3g} here; other inputs and modes may need more)" if max_abs else ""
    return ("in float64 the result agrees with the original at this input (within the float64 tolerance, or by less "
            "than half of what float32 rounding moves the original, which no difference in what it computes could "
            "double): the difference is the float32 rounding of the kernels the result runs (another algorithm, memory "
            "layout or accumulation order than the original's; a channels-last convolution, say), worse than the "
            "original's own against float64. If the "
            f"pass trades that accuracy by design, declare the error it may add: @fxverify.contract(atol=...){here}")


def non_finite_note(found: Mismatch, dtype: str) -> str:
    """What NaN or inf in the result's outputs (``found``, where the original's are finite) means where the
    result's float64 outputs agree with the original's, and what to do: never rounding, but a computation that
    overflows, or leaves its domain, in the low-precision dtype alone."""
    return (f"in float64 the result agrees with the original at this input: the {found.non_finite} non-finite "
            f"value{'s' if found.non_finite > 1 else ''} ({found.path}, first at index {found.index}) appear in "
            f"{dtype} only. That is no rounding error, and no tolerance accepts it: the result computes something "
            f"that overflows {dtype}'s range, or breaks a precondition of a kernel on its dtype, where the original "
            "does not (exp without subtracting the row max, a sum of squares or a product accumulated in the input's "
            "dtype, a kernel's fast path taken for this dtype only). Compute it as the original does (subtract the "
            "max before exp; accumulate low-precision inputs in float32), or leave inputs it cannot take to the "
            "original's op")


def finding_of(found: Mismatch, where: str) -> Finding:
    """The finding of outputs that differ."""
    return Finding(f"outputs differ: {found.describe()}", input=where, where=found.path, max_abs=found.max_abs,
                   max_rel=found.max_rel)


def other_threads() -> int:
    """Another number of torch threads than now (1, or 2 when it runs on 1, as under pytest-xdist):
    torch then picks other kernels (oneDNN another convolution algorithm), whose float32 error on
    the original is as legitimate and can be several times larger."""
    return 2 if torch.get_num_threads() == 1 else 1


def rounding_allowance(subject: Subject, config: InputConfig) -> Callable[[], list[float]] | None:
    """For a result with new parameters, computed in float64 and stored in float32 (a fusion): what
    rounding them alone costs, per output, in rmse: the float64 result against the float32 result
    converted to float64. None when the result keeps the original's parameters, or when the float64
    result is itself the float32 one converted (nothing to measure)."""
    if not subject.applied().rewrites_state or subject.float64_skip or not subject.float64_exact:
        return None

    def allowance() -> list[float]:
        try:
            rounded = subject.capture.convert(subject.applied().result, dtype=torch.float64)
            with torch.no_grad():
                outputs = rounded(*config.make(subject.case.seed, dtype=torch.float64))
        except Exception:  # a result that cannot be converted: no allowance, the rule as for any result
            return [0.0] * len(leaves_with_paths(subject.outputs("result", config))[0])
        return rmse_per_leaf(outputs, subject.outputs("result", config, torch.float64))

    return allowance
