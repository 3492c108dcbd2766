"""gradients: backward through the result matches backward through the original.

Gradients with respect to the inputs, and to every parameter the transform
kept unchanged, are compared in float64. Unless the contract says
``changes_parameters=True``, every parameter must be kept. A parameter of the
original that survives in the result as a tensor must still be a trainable
``nn.Parameter``. A gradient difference names the first kept node whose value
differs, or else the kept node nearest the outputs whose gradient differs
(:mod:`fxverify.localise`; ``details["divergence"]``).
"""

from __future__ import annotations

import textwrap
from typing import Any

import torch
from torch import fx, nn

from fxverify.compare import compare_values
from fxverify.localise import differentiable, localise, localise_gradients
from fxverify.module_state import resolve, tensors_equal
from fxverify.result import Finding, Skip, exception_summary


def check(v: Any) -> dict[str, Any]:
    applied = v.applied()
    original_params = dict(applied.original.named_parameters())
    _check_still_trainable(original_params, applied.result)
    kept = _kept_parameters(v, original_params, applied.result)
    if v.float64_problem is not None:
        raise Skip(f"gradients are compared in float64, and the original does not run in float64 ({v.float64_problem})")
    original, result = v.module("original", torch.float64), v.module("result", torch.float64)
    config = v.primary
    where = f"{config.describe()}, float64, {applied.mode} mode, loss = sum(outputs * fixed random weights)"
    try:
        expected = _gradients(original, config.make(v.case.seed, dtype=torch.float64), v.case.seed, kept)
    except Exception as exc:  # e.g. an op without a derivative (floor_divide), or an in-place op on a saved value
        raise Skip(f"backward through the original raised {exception_summary(exc)}: there are no gradients to "
                   "compare the result's with") from None
    if expected is None:
        raise Skip("the original's outputs do not depend differentiably on its inputs or parameters")
    try:
        actual = _gradients(result, config.make(v.case.seed, dtype=torch.float64), v.case.seed, kept)
    except Exception as exc:
        raise Finding(f"backward through the result raised {exception_summary(exc)}", input=where) from None
    if actual is None:
        raise Finding("the result's outputs no longer require grad: gradients do not flow", input=where)
    for name, grad in expected.items():
        if actual.get(name) is None and v.contract.changes_parameters and name.startswith("parameter"):
            continue  # a kept parameter the rewritten graph no longer reads (a folded BN)
        found = compare_values(actual.get(name), grad, path=f"grad of {name}", tolerance=v.float64_tolerance)
        if found is not None:
            finding = Finding(f"gradients differ: {found.describe()}", input=where, where=found.path)
            _localise_into(v, finding, original, result, config.make(v.case.seed, dtype=torch.float64))
            raise finding
    return {"inputs_and_parameters_compared": len(expected)}


def _localise_into(v: Any, finding: Finding, original: nn.Module, result: nn.Module, inputs: tuple[Any, ...]) -> None:
    """Name the first kept node whose value differs, else the kept node nearest the outputs
    whose gradient differs (see :mod:`fxverify.localise`)."""
    if not isinstance(original, fx.GraphModule) or not isinstance(result, fx.GraphModule):
        return
    try:
        divergence = localise(original, result, inputs, v.float64_tolerance).divergence
        note = " [float64 values]"
        if divergence is None:
            divergence = localise_gradients(original, result, inputs, v.float64_tolerance,
                                            lambda out: _loss(out, v.case.seed))
            note = " [float64 gradients, the kept node nearest the outputs]"
    except Exception as exc:  # the check's own finding stands; say why it has no node
        finding.node = f"not localised: {exception_summary(exc)}"
        return
    if divergence is not None:
        finding.node = textwrap.indent(divergence.describe(note), " " * 14).lstrip()
        finding.details["divergence"] = divergence.details()


def _kept_parameters(v: Any, original: dict[str, nn.Parameter], result: nn.Module) -> list[str]:
    now = dict(result.named_parameters())
    kept, changed = [], []
    for name, param in original.items():
        if name in now and tensors_equal(now[name], param):
            kept.append(name)
        else:
            changed.append(name)
    if changed and not v.contract.changes_parameters:
        name = changed[0]
        how = "was removed" if name not in now else "changed value or shape"
        raise Finding(
            f"parameter {name!r} {how} ({len(changed)} of {len(original)} parameters were not kept). "
            "If the transform is meant to rewrite parameters (a fusion), declare "
            "@fxverify.contract(changes_parameters=True)",
            where=f"parameter {name!r}",
        )
    return kept


def _check_still_trainable(original: dict[str, nn.Parameter], result: nn.Module) -> None:
    for name, param in original.items():
        try:
            now = resolve(result, name)
        except AttributeError:
            continue
        if isinstance(now, torch.Tensor) and (not isinstance(now, nn.Parameter) or not now.requires_grad):
            raise Finding(
                f"parameter {name!r} survives in the result as a {'frozen' if isinstance(now, nn.Parameter) else 'plain'} "
                "tensor: it will not train. Keep it an nn.Parameter with requires_grad=True",
                where=f"parameter {name!r}",
            )
    if isinstance(result, fx.GraphModule):
        for node in result.graph.find_nodes(op="get_attr"):
            value = resolve(result, str(node.target))
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                for name, param in original.items():
                    if tensors_equal(value, param):
                        raise Finding(
                            f"parameter {name!r} survives as the plain tensor {node.target!r} read by get_attr "
                            f"%{node.name}: it will not train. Register it as an nn.Parameter",
                            node=f"%{node.name}",
                        )


def _loss(outputs: Any, seed: int) -> torch.Tensor:
    """sum(outputs * fixed random weights), over the outputs that require grad."""
    gen = torch.Generator().manual_seed(seed)
    weighted = [(o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum() for o in differentiable(outputs)]
    return sum(weighted)  # type: ignore[return-value]


def _gradients(module: nn.Module, inputs: tuple[torch.Tensor, ...], seed: int, params: list[str]) -> dict[str, torch.Tensor] | None:
    inputs = tuple(t.requires_grad_(True) if t.is_floating_point() else t for t in inputs)
    module.zero_grad(set_to_none=True)
    outputs = module(*inputs)
    if not differentiable(outputs):
        return None
    _loss(outputs, seed).backward()
    grads = {f"input {i}": t.grad for i, t in enumerate(inputs) if t.is_floating_point() and t.grad is not None}
    named = dict(module.named_parameters())
    grads.update({f"parameter {n!r}": named[n].grad for n in params if n in named and named[n].grad is not None})
    module.zero_grad(set_to_none=True)
    return grads
