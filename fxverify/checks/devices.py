"""devices: every tensor the result reads moves with ``.to(device)`` and ``.to(dtype)``.

A plain tensor attribute (not a registered parameter or buffer) stays behind
when the module is moved: fine on CPU in float32, wrong on CUDA or in float64.
Checked on CPU: the result must hold no tensor that ``.to()`` cannot convert
(tensors the original already held that way are not blamed on the
transform), no node may create tensors on a hard-coded device, and moved to
the meta device it must run there.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import fx, nn

from fxverify.recording import RecordingInterpreter
from fxverify.result import Finding, Skip, exception_summary


def check(v: Any) -> dict[str, Any]:
    applied = v.applied()
    result = applied.result
    if not isinstance(result, fx.GraphModule):
        raise Skip(f"the transform returned a {type(result).__name__}, not a GraphModule")
    already_stuck = set(_unmovable_tensors(applied.original))
    for where, tensor in _unmovable_tensors(result).items():
        if where not in already_stuck:
            raise Finding(
                f"{where} ({tensor.dtype}, {tensor.device}) is not a registered parameter or buffer, so "
                "module.to(device) and module.to(dtype) leave it behind. Register it with register_buffer() "
                "(or as an nn.Parameter)",
                where=where,
            )
    already_pinned = _pinned_devices(applied.original)
    for name, device in _pinned_devices(result).items():
        if already_pinned.get(name) != device:
            raise Finding(
                f"%{name} creates a tensor on the hard-coded device {device!r}: it stays there when the "
                "module is moved. Derive the device from an input (x.device) instead",
                node=f"%{name}",
            )
    return {"meta_run": _run_on_meta(v, applied)}


def _pinned_devices(module: fx.GraphModule) -> dict[str, str]:
    """Nodes whose ``device=`` keyword is a literal rather than a value from the graph."""
    return {
        n.name: str(n.kwargs["device"])
        for n in module.graph.nodes
        if "device" in n.kwargs and isinstance(n.kwargs["device"], (str, torch.device))
    }


def _unmovable_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """Tensors ``module.to(...)`` does not convert: plain tensor attributes (nn.Module keeps
    parameters and buffers in its own tables, not in ``__dict__``) and tensor literals in node
    arguments, by description."""
    found = {}
    for qualname, sub in module.named_modules():
        for attr, value in vars(sub).items():
            if isinstance(value, torch.Tensor):
                found[f"tensor attribute {'.'.join(filter(None, (qualname, attr)))!r}"] = value
    if isinstance(module, fx.GraphModule):
        for node in module.graph.nodes:
            values: list[Any] = []
            fx.node.map_aggregate((node.args, node.kwargs), lambda a: values.append(a) or a)
            for value in values:
                if isinstance(value, torch.Tensor):
                    found[f"a tensor literal in the arguments of %{node.name}"] = value
    return found


def _run_on_meta(v: Any, applied: Any) -> bool:
    config = v.primary
    inputs = config.make(v.case.seed, device="meta")

    def run(module: fx.GraphModule) -> tuple[Exception | None, fx.Node | None]:
        interpreter = RecordingInterpreter(_meta_copy(module))
        try:
            with torch.no_grad():
                interpreter.run(*inputs)
        except Exception as exc:
            return exc, interpreter.current
        return None, None

    error, _ = run(applied.original)
    if error is not None:
        return False  # the original cannot run on meta (data-dependent ops): nothing to compare
    error, node = run(applied.result)
    if error is not None:
        raise Finding(
            f"the result moved to the meta device fails to run: {exception_summary(error)}. "
            "Look for a hard-coded device or a tensor created outside the graph",
            input=f"{config.describe()} on device 'meta'",
            node=f"%{node.name} ({node.op} {node.target})" if node is not None else None,
        )
    return True


def _meta_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` on the meta device, without copying its parameters' and
    buffers' data first (``deepcopy(module).to("meta")`` would)."""
    memo: dict[int, Any] = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        meta = tensor.to("meta")
        memo[id(tensor)] = nn.Parameter(meta, tensor.requires_grad) if isinstance(tensor, nn.Parameter) else meta
    return copy.deepcopy(module, memo).to("meta")
