"""numerics: the result computes what the original computes.

Outputs are compared at every input configuration (batch sizes, spatial
sizes, a large-magnitude set) in float32, judged against a float64 reference
when not allclose; then in float64, tightly, together with the values of every
node the transform kept; then in train mode unless the contract is eval-only,
with the RNG reseeded so dropout masks match, including updated buffers such
as BatchNorm running statistics.

A failure names the first node whose float64 value diverges (see
:mod:`fxverify.localise`; ``details["divergence"]``). With a repro directory
(``--fxverify-repro-dir``), a failure in the contract's primary mode is
minimised (:mod:`fxverify.minimise`) and written as a standalone file
(:mod:`fxverify.repro`; ``details["repro"]``).
"""

from __future__ import annotations

import textwrap
from typing import Any

import torch

from fxverify.compare import Mismatch, compare_trees, compare_values
from fxverify.errors import FxVerifyError
from fxverify.localise import Localisation, localise
from fxverify.module_state import tensor_state
from fxverify.result import Finding, exception_summary


def check(v: Any) -> dict[str, Any]:
    compared = []
    for config in v.case.configs:
        expected = _run_original(lambda: v.outputs("original", config), config.describe() + ", float32")
        try:
            actual = _run(lambda: v.outputs("result", config), config.describe() + ", float32")
        except Finding as raised:
            raise _with_repro(v, raised) from None
        found = compare_trees(
            actual,
            expected,
            tolerance=v.tolerance,
            fp64_expected=None if v.float64_problem else lambda config=config: v.outputs("original", config, torch.float64),
        )
        if found is not None:
            finding = _finding(found, f"{config.describe()}, float32, {v.contract.primary_mode} mode")
            try:
                _localise_into(finding, _float64_localisation(v))
            except Finding as unrunnable:
                finding.node = f"not localised: {unrunnable.what}"
            except Exception as exc:  # the float32 finding stands; say why it has no node
                finding.node = f"not localised: {exception_summary(exc)}"
            raise _with_repro(v, finding)
        compared.append(config.name)
    if v.float64_problem is not None:  # a float32 cast pinned in the graph, say: float32 results stand alone
        located = None
    else:
        located = _float64_localisation(v)
    if located is not None and (located.outputs is not None or located.divergence is not None):
        found = located.outputs
        what = (
            f"outputs differ: {found.describe()}" if found
            else "outputs agree, but a value the transform kept differs (a later op hides it)"
        )
        finding = Finding(what, input=_float64_input(v), where=found.path if found else None, details=_numbers(found))
        _localise_into(finding, located)
        raise _with_repro(v, finding)
    modes = [m for m in v.contract.modes if m != v.contract.primary_mode]
    for mode in modes:
        try:
            _compare_other_mode(v, mode)
        except Finding as finding:
            if v.repro_dir:
                finding.what += f"\nno repro written: only failures in {v.contract.primary_mode} mode are minimised"
            raise
    return {
        "configs": compared,
        "float64": "compared" if located else f"skipped: the original does not run in float64 ({v.float64_problem})",
        "kept_nodes_compared": located.compared if located else 0,
        "other_modes": modes,
    }


NO_KEPT_NODE_DIVERGED = "no kept node diverged: the difference arises in nodes the transform changed"


def _float64_input(v: Any) -> str:
    return f"{v.primary.describe()}, float64, {v.contract.primary_mode} mode"


def _float64_localisation(v: Any) -> Localisation:
    """Both modules run in float64 on the primary inputs, every kept node recorded."""
    original, result = v.module("original", torch.float64), v.module("result", torch.float64)
    inputs = v.primary.make(v.case.seed, dtype=torch.float64)
    return localise(original, result, inputs, v.float64_tolerance, guard=lambda run: _run(run, _float64_input(v)))


def _localise_into(finding: Finding, located: Localisation) -> None:
    """Name the first divergent kept node (or the changed nodes feeding the outputs) in ``finding``."""
    if located.divergence is not None:
        finding.node = textwrap.indent(located.divergence.describe(" [float64]"), " " * 14).lstrip()
        finding.details["divergence"] = located.divergence.details()
    elif located.changed_before_output:
        finding.node = f"{NO_KEPT_NODE_DIVERGED}: {located.changed_before_output}"
    else:
        finding.node = NO_KEPT_NODE_DIVERGED


def _with_repro(v: Any, finding: Finding) -> Finding:
    """With a repro directory (``--fxverify-repro-dir``): minimise the failure and write a
    standalone repro there, named in the finding and in ``details["repro"]``."""
    if not v.repro_dir:
        return finding
    from fxverify.minimise import minimise_failure
    from fxverify.repro import repro_stem, write_repro

    try:
        found = minimise_failure(v)
        path = write_repro(found, v.repro_dir, repro_stem(v.case.name, "numerics", v.transform.spec),
                           title=f"{v.transform.spec} fails numerics on a subgraph of {v.case.name}")
    except FxVerifyError as exc:
        finding.what += f"\nno repro written: {exc}"
        return finding
    except Exception as exc:  # torch's minifier on a graph it was not written for: the finding stands
        finding.what += (f"\nno repro written: minimising raised {exception_summary(exc)}; "
                         "please report this to fxverify")
        return finding
    finding.details["repro"] = str(path)
    finding.what += f"\nrepro:      python {path}  ({found.describe()})"
    return finding


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
