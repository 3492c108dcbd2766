"""gradients: backward through the result matches backward through the original.

Gradients with respect to the inputs, and to every parameter the transform
kept unchanged, are compared in float64. Parameters are matched by identity,
then by name, then by value (:mod:`fxverify.analysis.parameters`): one the transform
moved to another path (``split_module``, a wrapper) is kept. Unless the
contract says ``changes_parameters=True``, every parameter must be kept. When
the contract covers train mode, a parameter of the original that survives in
the result as a tensor must still be a trainable ``nn.Parameter``. A contract declaring
``range_tol`` (the result computes another function by design: a quantizing pass) bounds the
outputs, not the gradients: then only that every gradient still flows is checked. A gradient
difference names the first kept node whose value differs, or else the kept node nearest the
outputs whose gradient differs (:mod:`fxverify.analysis.localise`; the result's ``divergence``).
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn

from fxverify.analysis.compare import Mismatch, compare_values
from fxverify.analysis.localise import differentiable, localise, localise_gradients
from fxverify.analysis.parameters import FROZEN, MOVED, Fate
from fxverify.core.results import Finding, Skip, exception_summary
from fxverify.engine.subject import Subject


def check(subject: Subject) -> dict[str, Any]:
    applied = subject.applied()
    compared = _surviving_parameters(subject, [f for f in applied.fates if f.is_parameter])
    if subject.float64_skip is not None:
        raise Skip(f"gradients are compared in float64, and {subject.float64_skip}")
    subject.release_copy("result", torch.float64)  # made to learn float64_skip when numerics has not run: the room is needed
    config = subject.primary
    where = f"{config.describe()}, float64, {applied.mode} mode, loss = sum(outputs * fixed random weights)"
    mode = functools.partial(subject.capture.set_mode, training=applied.mode == "train")
    try:
        expected = loss_gradients(subject.module("original", torch.float64), config.make(subject.case.seed, dtype=torch.float64),
                              subject.case.seed, {name: name for name in compared}, mode)
    except Exception as exc:  # e.g. an op without a derivative (floor_divide), or an in-place op on a saved value
        raise Skip(f"backward through the original raised {exception_summary(exc)}: there are no gradients to "
                   "compare the result's with") from None
    finally:
        subject.release_copy("original", torch.float64)  # its gradients are kept; the result's need the room
    if expected is None:
        raise Skip("the original's outputs do not depend differentiably on its inputs or parameters")
    result = subject.module("result", torch.float64)

    def compared_with_expected(label: str, grad: torch.Tensor | None) -> Mismatch | None:
        if label in expected:
            return compare_values(grad, expected[label], path=f"grad of {label}", tolerance=subject.float64_tolerance)
        # the original's parameter gets no gradient: the result's may only be zero (a `w * 0` for a `zeros_like(w)`)
        return compare_values(grad, torch.zeros_like(grad) if grad is not None else None,
                              path=f"grad of {label} (the original's gets no gradient)", tolerance=subject.float64_tolerance)

    approximates = subject.contract.range_tol is not None  # its result computes another function by design
    try:  # each parameter's gradient is compared as it is accumulated, then let go
        actual = loss_gradients(result, config.make(subject.case.seed, dtype=torch.float64), subject.case.seed, compared, mode,
                            keep=(lambda label, grad: None) if approximates else compared_with_expected)
    except _ComparingRaised as raised:  # fxverify's own comparison: an error of fxverify's, not a finding
        raise raised.error from None
    except Exception as exc:
        raise Finding(f"backward through the result raised {exception_summary(exc)}", input=where) from None
    if actual is None:
        raise Finding("the result's outputs no longer require grad: gradients do not flow", input=where)
    for name in [*expected, *(label for label in actual if label not in expected)]:
        if name not in actual and subject.contract.changes_parameters and name.startswith("parameter"):
            continue  # a kept parameter the rewritten graph no longer reads (a folded BN)
        if name in actual and name.startswith("parameter"):
            found = actual[name]  # what keep made of it as it was accumulated
        elif name in actual and approximates:
            found = None  # it flows; its values are another function's
        else:
            found = compared_with_expected(name, actual.get(name))
        if found is not None:
            finding = Finding(f"gradients differ: {found.describe()}", input=where, where=found.path)
            _localise_into(subject, finding, subject.module("original", torch.float64), result,
                           config.make(subject.case.seed, dtype=torch.float64))
            raise finding
    del result
    subject.release_copy("result", torch.float64)  # no check after this one runs it
    moved = [f.describe() for f in applied.fates if f.kind == MOVED]
    values = "not compared: the contract's range_tol lets the result compute another function, whose gradients " \
        "it does not bound (an input of a ReLU that changes sign switches a whole term); only that they flow" \
        if approximates else "compared"
    return {"inputs_and_parameters_compared": len(expected), "values": values, "moved": moved}


def _localise_into(subject: Subject, finding: Finding, original: nn.Module, result: nn.Module, inputs: tuple[Any, ...]) -> None:
    """Name the first kept node whose value differs, else the kept node nearest the outputs
    whose gradient differs (see :mod:`fxverify.analysis.localise`)."""
    if not isinstance(original, fx.GraphModule) or not isinstance(result, fx.GraphModule):
        return
    try:
        divergence = localise(original, result, inputs, subject.float64_tolerance).divergence
        note = " [float64 values]"
        if divergence is None:
            divergence = localise_gradients(original, result, inputs, subject.float64_tolerance,
                                            lambda out: _loss(out, subject.case.seed))
            note = " [float64 gradients, the kept node nearest the outputs]"
    except Exception as exc:  # the check's own finding stands; say why it has no node
        finding.node = f"not localised: {exception_summary(exc)}"
        return
    if divergence is not None:
        finding.node = divergence.describe(note)
        finding.divergence = divergence.details()


def _surviving_parameters(subject: Subject, fates: list[Fate]) -> dict[str, str]:
    """The original's parameters the result still holds as trainable parameters, by their name in
    the original -> their name in the result (moved ones included: the same tensors under another
    path are no change). Raises a Finding for a parameter that no longer trains when the contract
    covers train mode, or for any parameter not kept when the contract does not allow changing them."""
    frozen = [f for f in fates if f.kind == FROZEN]
    if frozen and "train" in subject.contract.modes:
        raise Finding(f"{frozen[0].describe()} ({len(frozen)} of {len(fates)} parameters no longer train). Keep "
                      "it an nn.Parameter with requires_grad=True", where=f"parameter {frozen[0].name!r}")
    lost = [f for f in fates if not f.survives]
    if lost and not subject.contract.changes_parameters:
        raise Finding(
            f"{lost[0].describe()} ({len(lost)} of {len(fates)} parameters were not kept). "
            "If the transform is meant to rewrite parameters (a fusion, or freezing them for inference), declare "
            "@fxverify.contract(changes_parameters=True)",
            where=f"parameter {lost[0].name!r}",
        )
    return {f.name: str(f.now) for f in fates if f.survives}


def _loss(outputs: Any, seed: int) -> torch.Tensor:
    """sum(outputs * fixed random weights), over the outputs that require grad."""
    gen = torch.Generator().manual_seed(seed)
    weighted = [(o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum() for o in differentiable(outputs)]
    return sum(weighted)  # type: ignore[return-value]


def loss_gradients(module: nn.Module, inputs: tuple[torch.Tensor, ...], seed: int, params: dict[str, str],
               set_mode: Callable[[nn.Module], Any],
               keep: Callable[[str, torch.Tensor | None], Any] | None = None) -> dict[str, Any] | None:
    """Gradients of the loss w.r.t. the floating inputs and ``params`` (label -> name in ``module``),
    labelled ``input 0`` and ``parameter '<label>'``, with ``module`` put in its mode by ``set_mode``; None when
    no output requires grad. A parameter that gets no gradient has no entry. With ``keep``, what
    ``keep(label, gradient)`` returns is kept of each parameter's gradient instead, as soon as it is
    accumulated, and the gradient is let go: a large model's gradients are never all alive at once."""
    inputs = tuple(t.requires_grad_(True) if t.is_floating_point() else t for t in inputs)
    set_mode(module)  # also a fresh start for caches made by earlier runs under no_grad (timm's attention biases)
    module.zero_grad(set_to_none=True)
    named = dict(module.named_parameters(remove_duplicate=False))
    labels: dict[int, list[str]] = collections.defaultdict(list)  # one tensor, several names when tied
    tensors = {}
    for label, name in params.items():
        if name in named and named[name].requires_grad:
            labels[id(named[name])].append(f"parameter {label!r}")
            tensors[id(named[name])] = named[name]
    kept: dict[str, Any] = {}
    fired: set[int] = set()
    partial = False  # a gradient accumulated in two parts (reentrant checkpointing): compare only the sum

    def accumulated(parameter: torch.Tensor) -> None:
        nonlocal partial
        partial = partial or id(parameter) in fired
        fired.add(id(parameter))
        if keep is not None and not partial:
            kept.update(_kept(keep, labels[id(parameter)], parameter.grad))
            parameter.grad = None

    hooks = [t.register_post_accumulate_grad_hook(accumulated) for t in tensors.values()]
    try:
        outputs = module(*inputs)
        if not differentiable(outputs):
            return None
        _loss(outputs, seed).backward()
        if partial and keep is not None:  # parts were compared and let go: again, every gradient kept
            for t in inputs:
                t.grad = None
            whole = loss_gradients(module, inputs, seed, params, set_mode)
            assert whole is not None  # differentiable a moment ago
            return {label: _kept(keep, [label], grad)[label] if label.startswith("parameter") else grad
                    for label, grad in whole.items()}
        if keep is None:
            kept = {label: t.grad for key, t in tensors.items() if t.grad is not None for label in labels[key]}
    finally:
        for hook in hooks:
            hook.remove()
        module.zero_grad(set_to_none=True)
    grads = {f"input {i}": t.grad for i, t in enumerate(inputs) if t.is_floating_point() and t.grad is not None}
    grads.update({f"parameter {label!r}": kept[f"parameter {label!r}"] for label in params
                  if f"parameter {label!r}" in kept})
    return grads


def _kept(keep: Callable[[str, torch.Tensor | None], Any], labels: list[str], grad: torch.Tensor | None) -> dict[str, Any]:
    """``keep(label, grad)`` for each label; what it raises is fxverify's own error (in a hook, inside
    ``backward()``, it would pass for the module's)."""
    try:
        return {label: keep(label, grad) for label in labels}
    except Exception as exc:
        raise _ComparingRaised(exc) from exc


class _ComparingRaised(Exception):
    """fxverify's own comparison raised in a gradient hook (``error``): not the result's failure."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error
