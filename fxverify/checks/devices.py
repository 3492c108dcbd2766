"""devices: every tensor the result reads moves with ``.to(device)`` and ``.to(dtype)``.

A plain tensor attribute (not a registered parameter or buffer) stays behind
when the module is moved: fine on CPU in float32, wrong on CUDA or in float64.
Checked on CPU: the result must hold no tensor that ``.to()`` cannot convert
(tensors the original already held that way are not blamed on the
transform), no node may create tensors on a hard-coded device, it must run in
float64 where the original does, and moved to the meta device it must run there. On ATen graphs
(``torch.export``, ``make_fx``) a literal ``device=`` is no finding: they bake it into every factory
call, and ``move_to_device_pass`` rewrites it; nor are the constants torch's ``ep.module()`` holds as
plain attributes.

A result built for one backend by design (mkldnn layouts, an op with CPU
kernels only, as ``optimize_for_inference`` and dynamic quantization make) is
told apart from a graph that forgets to move: the failure says which, and a
contract that declares it (``devices=("cpu",)``, ``dtypes=("float32",)``)
skips the stages that do not apply, saying why.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from fxverify.analysis.module_state import tensor_attributes
from fxverify.analysis.recording import run_recorded
from fxverify.capture.export import program_of
from fxverify.checks._common import graph_result
from fxverify.core.results import Finding, Which, exception_summary
from fxverify.engine.subject import Applied, Subject
from fxverify.errors import CopyFailed

_NO_KERNEL = re.compile(r"Could not run '(?P<op>[\w:.]+)' with arguments from the '\w+' backend"
                        r"|(?P<fake>[\w:.]+): We could not find the fake impl")
_DEVICE_MISMATCH = ("Expected all tensors to be on the same device", "found at least two devices",
                    "is not on the expected device")
_DATA_DEPENDENT = ("cannot be called on meta tensors", "Cannot copy out of meta tensor", "data-dependent",
                   "item() on meta", "meta tensors have no data")


def check(subject: Subject) -> dict[str, Any]:
    applied = subject.applied()
    result = applied.result
    result = graph_result(result)
    contract = subject.contract
    moves = contract.moves or contract.supports_dtype("float64")
    if moves:
        _check_unmovable(applied.original, result)
    if contract.moves and subject.capture.traits.moves_device:  # ATen and Dynamo graphs bake device= into their calls
        already_pinned = _pinned_devices(applied.original)
        for name, device in _pinned_devices(result).items():
            if already_pinned.get(name) != device:
                raise Finding(
                    f"%{name} creates a tensor on the hard-coded device {device!r}: it stays there when the "
                    "module is moved. Derive the device from an input (x.device) instead",
                    node=f"%{name}",
                )
    details: dict[str, Any] = {"float64": _check_float64(subject)}
    if contract.moves:
        details["meta_run"] = _run_on_meta(subject, applied)
    else:
        details["meta_run"] = f"skipped: the contract declares devices={'+'.join(contract.devices or ())}"
    return details


def _check_unmovable(original: nn.Module, result: fx.GraphModule) -> None:
    already_stuck = set(_unmovable_tensors(original))
    program = program_of(result)  # torch's ep.module() holds a program's constants as plain attributes itself
    already_stuck |= {f"tensor attribute {name!r}" for name in program.constants} if program is not None else set()
    for where, (tensor, reader) in _unmovable_tensors(result).items():
        if where not in already_stuck:
            raise Finding(
                f"{where} ({tensor.dtype}, {tensor.device}) is not a registered parameter or buffer, so "
                "module.to(device) and module.to(dtype) leave it behind. Register it with register_buffer() "
                "(or as an nn.Parameter)",
                where=where, node=(reader.format_node() or reader.name) if reader is not None else None,
            )


def _check_float64(subject: Subject) -> str:
    """The result must run in float64 where the original does, unless the contract says float32 only."""
    if not subject.contract.supports_dtype("float64"):
        return "skipped: the contract declares dtypes=float32"
    if subject.float64_problem is not None:
        return f"skipped: the original does not run in float64 ({subject.float64_problem})"
    problem = subject.result_float64_problem
    if problem is None:
        return "runs"
    if "result" in subject.uncopyable:
        return (f"not judged: {subject.uncopyable['result']} (fxverify cannot copy the result to convert it; the lint "
                "check reports it)")
    raise Finding(
        f"the result does not run in float64 where the original does: {problem}. A module moved with "
        "module.to(torch.float64) (or another dtype) fails. If the transform makes float32-only modules by "
        "design (mkldnn layouts, quantized kernels), declare @fxverify.contract(dtypes=('float32',)); "
        "otherwise keep dtypes out of the graph (read them from the inputs)",
        input=f"{subject.primary.describe()}, float64",
    )


def _pinned_devices(module: fx.GraphModule) -> dict[str, str]:
    """Nodes whose ``device=`` keyword is a literal rather than a value from the graph."""
    return {
        n.name: str(n.kwargs["device"])
        for n in module.graph.nodes
        if "device" in n.kwargs and isinstance(n.kwargs["device"], (str, torch.device))
    }


def _unmovable_tensors(module: nn.Module) -> dict[str, tuple[torch.Tensor, fx.Node | None]]:
    """Tensors ``module.to(...)`` does not convert: plain tensor attributes and tensor literals in
    node arguments, by description, each with the node that reads it (None: none found)."""
    graph = module.graph if isinstance(module, fx.GraphModule) else fx.Graph()
    readers = {node.target: node for node in graph.nodes if node.op == "get_attr"}
    found = {f"tensor attribute {name!r}": (value, readers.get(name)) for name, value in tensor_attributes(module)}
    for node in graph.nodes:
        for value in pytree.tree_leaves((node.args, node.kwargs)):
            if isinstance(value, torch.Tensor):
                found[f"a tensor literal in the arguments of %{node.name}"] = (value, node)
    return found


def _run_on_meta(subject: Subject, applied: Applied) -> str:
    config = subject.primary
    inputs = config.make(subject.case.seed, device="meta")
    where = f"{config.describe()} on device 'meta'"

    def run(which: Which, module: nn.Module) -> tuple[Exception | None, fx.Node | None]:
        try:
            moved = subject.convert(which, module, device="meta")
        except CopyFailed:  # no copy, no verdict (lint reports a result that cannot be copied)
            raise
        except Exception as exc:  # the module's tensors do not move to meta
            return exc, None
        return run_recorded(moved, inputs)

    try:
        error, _ = run("original", applied.original)
        if error is not None:
            return "not judged: the original does not run on meta either"  # data-dependent ops, say
        error, node = run("result", applied.result)
        if error is not None and subject.renew_result_copies():  # the copy raised, not the result: a fresh one, moved
            error, node = run("result", applied.result)
    except CopyFailed as exc:
        return f"not judged: {exc} (fxverify cannot copy the module; the lint check reports a result that cannot be)"
    if error is None:
        return "runs"
    at = f"%{node.name} ({node.op} {node.target})" if node is not None else None
    backend = _backend_specific(applied.result, error)
    if backend is not None:
        raise Finding(
            f"the result is specific to one backend: {backend}. It cannot move off the CPU (to CUDA, or to meta, "
            "where it was tried). If the transform makes CPU-only modules by design, declare "
            "@fxverify.contract(devices=('cpu',)); otherwise keep backend-specific tensors and ops out of it",
            input=where, node=at,
        )
    text = exception_summary(error)
    if any(marker in text for marker in _DATA_DEPENDENT) or _no_kernel(error) is not None:
        return f"not judged: {text}"
    advice = ""
    if any(marker in text for marker in _DEVICE_MISMATCH):
        advice = (". A tensor the graph reads is not on the module's device: look for a hard-coded device, or a "
                  "tensor created without device= (derive it from an input: x.device)")
    raise Finding(f"the result moved to the meta device fails to run, while the original runs there: "
                  f"{text.rstrip('.!')}{advice}", input=where, node=at)


def _no_kernel(error: BaseException) -> str | None:
    """The op named by a dispatcher error saying it has no kernel for a backend, else None."""
    found = _NO_KERNEL.search(exception_summary(error))
    return (found.group("op") or found.group("fake")) if found else None


def _backend_specific(result: nn.Module, error: BaseException) -> str | None:
    """Why ``result`` cannot leave the CPU by design, or None: it holds tensors of a CPU-only
    layout (mkldnn), or the op that failed on meta has kernels for the CPU only."""
    for name, tensor in [*result.named_parameters(), *result.named_buffers()]:
        if tensor.layout == torch._mkldnn:  # type: ignore[attr-defined]  # a layout torch's stubs do not declare
            return f"it holds mkldnn tensors ({name!r}), which exist on the CPU only"
    op = _no_kernel(error)
    if op is not None and _has_kernel(op, "Meta") is False and _has_kernel(op, "CUDA") is False:
        return f"it calls {op}, which has kernels for the CPU only (none for meta or CUDA)"
    if "mkldnn" in exception_summary(error).lower():
        return f"it uses mkldnn, which runs on the CPU only ({exception_summary(error)})"
    return None


def _has_kernel(op: str, backend: str) -> bool | None:
    """Whether the dispatcher has a kernel of ``op`` (``quantized::linear_dynamic_fp16``) for
    ``backend``; None when it does not know the name."""
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(op, backend))
    except RuntimeError:
        return None
