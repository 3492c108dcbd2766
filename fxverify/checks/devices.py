"""devices: every tensor the result reads moves with ``.to(device)`` and ``.to(dtype)``.

A plain tensor attribute (not a registered parameter or buffer) stays behind
when the module is moved: fine on CPU in float32, wrong on CUDA or in float64.
Checked on CPU: after ``.to(torch.float64)`` every floating tensor the graph
reads must be float64, and after ``.to("meta")`` every tensor must be on the
meta device and the module must run there (a hard-coded ``device="cpu"``
fails). Tensors that the original already left behind are not blamed on the
transform.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import fx, nn

from fxverify.recording import RecordingInterpreter
from fxverify.result import Finding, Skip


def check(v: Any) -> dict[str, Any]:
    applied = v.applied()
    result = applied.result
    if not isinstance(result, fx.GraphModule):
        raise Skip(f"the transform returned a {type(result).__name__}, not a GraphModule")
    already_stuck = set(_stuck_tensors(applied.original, torch.float64, "cpu")) | set(
        _stuck_tensors(applied.original, torch.float32, "meta")
    )
    for dtype, device in ((torch.float64, "cpu"), (torch.float32, "meta")):
        for where, tensor in _stuck_tensors(result, dtype, device).items():
            if where in already_stuck:
                continue
            moved_to = f".to({dtype})" if device == "cpu" else f".to({device!r})"
            raise Finding(
                f"{where} is a {tensor.dtype} tensor on {tensor.device} after {moved_to}: it is a plain "
                "attribute, so moving the module leaves it behind. Register it with "
                "register_buffer() (or as an nn.Parameter)",
                where=where,
            )
    ran_on_meta = _run_on_meta(v, applied)
    return {"meta_run": ran_on_meta}


def _stuck_tensors(module: nn.Module, dtype: torch.dtype, device: str) -> dict[str, torch.Tensor]:
    """Tensors the graph reads that ``module.to(dtype/device)`` does not convert, by description."""
    moved = copy.deepcopy(module).to(dtype if device == "cpu" else device)
    stuck = {}
    for qualname, sub in moved.named_modules():
        for attr, value in vars(sub).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter) and _left_behind(value, dtype, device):
                stuck[f"tensor attribute {'.'.join(filter(None, (qualname, attr)))!r}"] = value
    if isinstance(moved, fx.GraphModule):
        for node in moved.graph.nodes:
            values = []
            fx.node.map_aggregate((node.args, node.kwargs), lambda a: values.append(a) or a)
            for value in values:
                if isinstance(value, torch.Tensor) and _left_behind(value, dtype, device):
                    stuck[f"a tensor literal in the arguments of %{node.name}"] = value
    return stuck


def _left_behind(t: torch.Tensor, dtype: torch.dtype, device: str) -> bool:
    if device == "meta":
        return t.device.type != "meta"
    return t.is_floating_point() and t.dtype != dtype


def _run_on_meta(v: Any, applied: Any) -> bool:
    config = v.primary
    inputs = config.make(v.case.seed, device="meta")

    def run(module: fx.GraphModule) -> tuple[Exception | None, fx.Node | None]:
        interpreter = RecordingInterpreter(copy.deepcopy(module).to("meta"))
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
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise Finding(
            f"the result moved to the meta device fails to run: {type(error).__name__}: {first}. "
            "Look for a hard-coded device or a tensor created outside the graph",
            input=f"{config.describe()} on device 'meta'",
            node=f"%{node.name} ({node.op} {node.target})" if node is not None else None,
        )
    return True
