"""numerics: the result computes what the original computes.

Outputs are compared at every input configuration (batch sizes, spatial
sizes, a large-magnitude set) in float32, judged against a float64 reference
when not allclose; then in float64, tightly, together with the values of every
node the transform kept; then in train mode unless the contract is eval-only,
with the RNG reseeded so dropout masks match, including updated buffers such
as BatchNorm running statistics.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from fxverify.compare import Mismatch, compare_trees, compare_values
from fxverify.module_state import tensor_state
from fxverify.node_map import kept_nodes
from fxverify.recording import RecordingInterpreter
from fxverify.result import Finding, exception_summary


def check(v: Any) -> dict[str, Any]:
    compared = []
    for config in v.case.configs:
        expected = _run_original(lambda: v.outputs("original", config), config.describe() + ", float32")
        actual = _run(lambda: v.outputs("result", config), config.describe() + ", float32")
        found = compare_trees(
            actual,
            expected,
            tolerance=v.tolerance,
            fp64_expected=lambda config=config: v.outputs("original", config, torch.float64),
        )
        if found is not None:
            finding = _finding(found, f"{config.describe()}, float32, {v.contract.primary_mode} mode")
            try:
                finding.node = _float64_divergence(v)[1]
            except Finding as unrunnable:
                finding.node = f"not localised: {unrunnable.what}"
            raise finding
        compared.append(config.name)
    found, node, kept = _float64_divergence(v)
    if found is not None or node != NO_KEPT_NODE_DIVERGED:
        what = (
            f"outputs differ: {found.describe()}" if found
            else "outputs agree, but a value the transform kept differs (a later op hides it)"
        )
        raise Finding(what, input=_float64_input(v), where=found.path if found else None, node=node,
                      details=_numbers(found))
    modes = [m for m in v.contract.modes if m != v.contract.primary_mode]
    for mode in modes:
        _compare_other_mode(v, mode)
    return {"configs": compared, "kept_nodes_compared": kept, "other_modes": modes}


NO_KEPT_NODE_DIVERGED = "no kept node diverged: the difference arises in nodes the transform changed"


def _float64_input(v: Any) -> str:
    return f"{v.primary.describe()}, float64, {v.contract.primary_mode} mode"


def _float64_divergence(v: Any) -> tuple[Mismatch | None, str, int]:
    """Run both modules in float64 on the primary inputs, recording every kept node.

    Returns the first output difference, the first kept node that diverges
    (or :data:`NO_KEPT_NODE_DIVERGED`), and how many kept nodes were compared.
    """
    original, result = v.module("original", torch.float64), v.module("result", torch.float64)
    inputs = v.primary.make(v.case.seed, dtype=torch.float64)
    pairs = kept_nodes(original, result) if isinstance(result, fx.GraphModule) else []
    names = {new.name for _, new in pairs}
    with torch.no_grad():
        recorder = RecordingInterpreter(original, names)
        expected = recorder.run(*inputs)
        if isinstance(result, fx.GraphModule):
            result_recorder = RecordingInterpreter(result, names)
            actual = _run(lambda: result_recorder.run(*inputs), _float64_input(v))
            recorded = result_recorder.values
        else:
            actual = _run(lambda: result(*inputs), _float64_input(v))
            recorded = {}
    node = NO_KEPT_NODE_DIVERGED
    for old, new in pairs:
        diverged = compare_trees(
            recorded.get(new.name), recorder.values.get(old.name), tolerance=v.float64_tolerance, root=f"%{new.name}"
        )
        if diverged is not None:
            node = _node_text(new, diverged) + " [float64]"
            break
    return compare_trees(actual, expected, tolerance=v.float64_tolerance), node, len(pairs)


def _compare_other_mode(v: Any, mode: str) -> None:
    """Trace, transform and run in ``mode`` (train): outputs and buffers after one step."""
    original = v.case.trace(training=mode == "train")
    result = v.transformed_fresh(mode)
    config = v.primary
    where = f"{config.describe()}, float32, {mode} mode (RNG reseeded per run)"
    runs = []
    for module, run in ((original, _run_original), (result, _run)):
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(v.case.seed + 1)
            outputs = run(lambda: module(*config.make(v.case.seed)), where)
        runs.append((outputs, module))
    (expected, original), (actual, result) = runs
    found = compare_trees(actual, expected, tolerance=v.tolerance)
    if found is not None:
        raise _finding(found, where)
    before, after = tensor_state(original), tensor_state(result)
    parameters = {name for name, _ in original.named_parameters()}
    for name in sorted((before.keys() & after.keys()) - parameters):
        found_buffer = compare_values(after[name], before[name], path=f"buffer {name!r} after the forward pass", tolerance=v.tolerance)
        if found_buffer is not None:
            raise Finding(
                f"buffers updated differently: {found_buffer.describe()}", input=where, where=found_buffer.path
            )


def _finding(found: Mismatch, where: str) -> Finding:
    return Finding(f"outputs differ: {found.describe()}", input=where, where=found.path, details=_numbers(found))


def _numbers(found: Mismatch | None) -> dict[str, Any]:
    if found is None or found.max_abs is None:
        return {}
    return {"max_abs": found.max_abs, "max_rel": found.max_rel}


def _node_text(node: fx.Node, found: Mismatch) -> str:
    target = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
    return f"%{node.name} ({node.op} {target}): {found.describe()}"


ORIGINAL_RAISED = (
    "the original model itself raised when run, before any transform: {error}. Not the transform's doing: "
    "the corpus entry cannot run this configuration; fix its inputs, batch_sizes or spatial_sizes"
)
RESULT_RAISED = "the transformed module raised when run: {error}"


def _run_original(fn: Any, where: str) -> Any:
    return _run(fn, where, ORIGINAL_RAISED)


def _run(fn: Any, where: str, message: str = RESULT_RAISED) -> Any:
    try:
        return fn()
    except Exception as exc:
        raise Finding(message.format(error=exception_summary(exc)), input=where) from None
