"""Converted copies of captured modules: what every capture's ``convert`` gives (the float64, meta
and CUDA runs).

>>> m = converted_copy(nn.Linear(2, 2), dtype=torch.float64)
>>> m.weight.dtype, isinstance(m.weight, nn.Parameter)
(torch.float64, True)
"""

from __future__ import annotations

import copy
from typing import Any, TypeVar

import torch
from torch import nn

from fxverify.engine.results import exception_summary
from fxverify.errors import CopyFailed

ModuleT = TypeVar("ModuleT", bound=nn.Module)


def not_moved(capture: str) -> str:
    """Why the devices and cuda checks skip on ``capture``'s ATen graphs."""
    return (f"ATen nodes bake device= into their arguments: a {capture} graph is moved by capturing it on the "
            "device, which fxverify does not do yet")


def converted_copy(module: ModuleT, *, dtype: torch.dtype | None = None, device: str | None = None) -> ModuleT:
    """A copy of ``module`` in ``dtype`` and / or on ``device``; :class:`~fxverify.errors.CopyFailed`
    when it cannot be copied. Parameters and buffers are converted as they are copied, not copied
    first (``copy.deepcopy(module).to(torch.float64)`` holds a third copy of a large model's
    tensors while it converts; ``.to("meta")`` would copy their data for nothing); the module's
    ``.to()`` still runs, for modules that do more there (timm's clear their caches)."""
    memo: dict[int, Any] = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        if id(tensor) in memo or (dtype is not None and not tensor.is_floating_point() and device is None):
            continue
        moved = tensor.detach().to(dtype=dtype if tensor.is_floating_point() else None, device=device, copy=True)
        memo[id(tensor)] = nn.Parameter(moved, tensor.requires_grad) if isinstance(tensor, nn.Parameter) else moved
    try:
        copied = copy.deepcopy(module, memo)
    except Exception as exc:
        raise CopyFailed(f"copy.deepcopy raised {exception_summary(exc)}") from exc
    options: dict[str, Any] = {k: v for k, v in (("dtype", dtype), ("device", device)) if v is not None}
    return copied.to(**options)
