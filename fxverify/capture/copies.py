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
from torch import fx, nn
from torch.fx.node import Target
from torch.fx.passes.shape_prop import TensorMetadata
from torch.utils import _pytree as pytree

from fxverify.analysis.module_state import resolve
from fxverify.core.results import exception_summary
from fxverify.errors import CopyFailed

ModuleT = TypeVar("ModuleT", bound=nn.Module)

_META = torch.device("meta")  # where retyped_copy runs a graph to learn its dtypes


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


def retyped_copy(gm: fx.GraphModule, dtype: torch.dtype) -> tuple[fx.GraphModule | None, str]:
    """A copy of ``gm``, an ATen graph (``ep.module()``), in ``dtype`` with every ``meta['val']`` and
    ``meta['tensor_meta']`` describing the copy, and ``""``; or ``(None, why)`` where it would not be
    what capturing the model in ``dtype`` gives, so that the model must be captured again.

    ATen nodes bake dtypes into their arguments (``x.float()`` is ``aten._to_copy(x, dtype=torch.float32)``):
    a graph with a floating dtype in a node's arguments is refused, and so is one reading a floating
    tensor constant (neither a parameter nor a buffer), whose dtype in the model in ``dtype`` depends on
    how the model made it (a plain attribute keeps float32; swin's ``lifted_tensor``, made in forward,
    follows the input). Otherwise every floating tensor comes from a floating input, parameter or
    buffer (which the model in ``dtype`` has in ``dtype``) or from a factory that follows the default
    dtype, as the model in ``dtype`` does. Which dtype each node then has is found by running the
    converted copy on the meta device at the example shapes (:class:`_DtypeRecorder`; not on FakeTensors
    in the graph's ShapeEnv: a run there adds guards to the original's symbols); the description of a
    node whose dtype changed is its own, retyped, so symbolic sizes stay as exported.

    >>> ep = torch.export.export(nn.Linear(2, 2), (torch.ones(1, 2),))
    >>> copied, why = retyped_copy(ep.module(), torch.float64)
    >>> [n.meta["val"].dtype for n in copied.graph.nodes if n.op == "call_function"], why
    ([torch.float64], '')
    """
    for node in gm.graph.nodes:
        baked = next((a for a in pytree.tree_leaves((node.args, node.kwargs))
                      if isinstance(a, torch.dtype) and a.is_floating_point), None)
        if baked is not None:
            return None, f"node {node.name} bakes {baked} into its arguments"
    state = {name for name, _ in (*gm.named_parameters(remove_duplicate=False), *gm.named_buffers(remove_duplicate=False))}
    for node in gm.graph.find_nodes(op="get_attr"):
        value = resolve(gm, node.target)
        if node.target not in state and isinstance(value, torch.Tensor) and value.is_floating_point():
            return None, f"node {node.name} reads the floating tensor constant {node.target}"
    try:
        copied = converted_copy(gm, dtype=dtype)
        ran = _DtypeRecorder(copied)
        ran.run(*(_example_like(n.meta.get("val"), dtype) for n in copied.graph.find_nodes(op="placeholder")))
    except Exception as exc:  # an op the meta device cannot run (one that reads values): capture the model again
        return None, f"converting a copy and running it on the meta device raised {exception_summary(exc)}"
    for node in copied.graph.nodes:
        val = node.meta.get("val")
        if node.name not in ran.dtypes or val is None:
            continue
        found = pytree.tree_leaves(val)
        wanted = ran.dtypes[node.name]
        if len(found) != len(wanted):
            return None, f"node {node.name}'s meta['val'] describes {len(found)} values, the node gives {len(wanted)}"
        if all(getattr(f, "dtype", None) == w for f, w in zip(found, wanted, strict=True)):
            continue
        node.meta["val"] = pytree.tree_unflatten(
            [_retyped(f, w) for f, w in zip(found, wanted, strict=True)], pytree.tree_structure(val))
        if "tensor_meta" in node.meta:
            node.meta["tensor_meta"] = _retyped_metadata(node.meta["tensor_meta"], iter(wanted))
    return copied, ""


class _DtypeRecorder(fx.Interpreter):
    """Runs a graph on the meta device, keeping the dtype of each tensor every node gives (None for any other
    value): its parameters and buffers are put there as they are fetched, and a device named in a node's
    arguments (a factory's ``device=cpu``) is replaced by it, so that nothing is computed: the dtypes a
    FakeTensor run gives, in a fraction of its time."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.dtypes: dict[str, list[torch.dtype | None]] = {}

    def fetch_attr(self, target: str) -> Any:
        value = super().fetch_attr(target)
        return value.to(_META) if isinstance(value, torch.Tensor) else value

    def call_function(self, target: Target, args: Any, kwargs: Any) -> Any:
        args, kwargs = pytree.tree_map_only(torch.device, lambda _: _META, (args, kwargs))
        return super().call_function(target, args, kwargs)

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        self.dtypes[n.name] = [getattr(v, "dtype", None) for v in pytree.tree_leaves(value)]
        return value


def _example_like(val: Any, dtype: torch.dtype) -> Any:
    """A meta tensor like the placeholder's ``val`` at the sizes it was exported with, floating in ``dtype``
    (as :meth:`fxverify.cases.inputs.InputConfig.make` recasts floating inputs)."""
    if not isinstance(val, torch.Tensor):
        return val
    hint = [s.node.hint if isinstance(s, torch.SymInt) else s for s in val.shape]
    strides = [s.node.hint if isinstance(s, torch.SymInt) else s for s in val.stride()]
    if None in hint or None in strides:
        raise ValueError(f"input of unbacked size {tuple(val.shape)}")
    return torch.empty_strided(hint, strides, dtype=dtype if val.is_floating_point() else val.dtype, device=_META)


def _retyped(found: Any, wanted: torch.dtype | None) -> Any:
    if not isinstance(found, torch.Tensor) or wanted is None or found.dtype == wanted:
        return found
    return found.to(wanted)


def _retyped_metadata(metadata: Any, wanted: Any) -> Any:
    """``meta['tensor_meta']`` (a ``TensorMetadata``, or a tuple / list of them and None) with the dtypes
    ``wanted`` gives, in order."""
    if isinstance(metadata, TensorMetadata):
        return metadata._replace(dtype=next(wanted) or metadata.dtype)
    if isinstance(metadata, (tuple, list)):
        return type(metadata)(_retyped_metadata(m, wanted) for m in metadata)
    next(wanted, None)
    return metadata
