"""cuda: on a GPU, the result moved to CUDA computes what the original computes on CPU.

Skips with the reason when no CUDA device is available. TF32 is disabled
during the check so the float32 comparison is meaningful.
"""

from __future__ import annotations

from typing import Any

import torch

from fxverify.analysis.compare import compare_trees
from fxverify.core.results import Finding, Skip, exception_summary
from fxverify.engine.subject import Subject
from fxverify.errors import CopyFailed


def check(subject: Subject) -> dict[str, Any]:
    if not subject.contract.supports_device("cuda"):
        raise Skip(f"the contract declares devices={'+'.join(subject.contract.devices or ())}: the result is not meant "
                   "to run on CUDA")
    if not torch.cuda.is_available():
        raise Skip("CUDA is not available (torch.cuda.is_available() is False): run on a GPU machine to check CUDA numerics")
    result = subject.applied().result
    config = subject.primary
    where = f"{config.describe()}, {subject.dtype}, on {torch.cuda.get_device_name()} vs the original on CPU"
    previous = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        try:
            actual = _run_on_cuda(subject, result, where)
        except Finding:
            if not subject.renew_result_copies():
                raise
            actual = _run_on_cuda(subject, result, where)  # the copy raised, not the result: a fresh one, moved
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous
    actual = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.cpu(), actual)
    found = compare_trees(
        actual,
        subject.outputs("original", config),
        tolerance=subject.tolerance,
        fp64_expected=None if subject.float64_problem else lambda: subject.outputs("original", config, torch.float64),
    )
    if found is not None:
        raise Finding(f"CUDA outputs differ from the CPU reference: {found.describe()}", input=where, where=found.path)
    return {"device": torch.cuda.get_device_name()}


def _run_on_cuda(subject: Subject, result: torch.nn.Module, where: str) -> Any:
    """The outputs of a copy of ``result`` moved to CUDA on the primary inputs there (a finding where it raises)."""
    try:
        module = subject.convert("result", result, device="cuda")
    except CopyFailed as exc:  # no copy, no verdict (lint reports a result that cannot be copied)
        raise Skip(f"not judged: {exc}") from None
    try:
        with torch.no_grad():
            return module(*subject.primary.make(subject.case.seed, device="cuda"))
    except Exception as exc:
        raise Finding(f"the result moved to CUDA raised {exception_summary(exc)}", input=where) from None
