"""One transform on one model: the expensive work (build, trace, transform,
reference outputs) done once and shared by every check.

>>> import fxverify
>>> v = Verification(fxverify.examples.identity, fxverify.load_case("resnet18"))
>>> v.run("lint").outcome
'passed'
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import textwrap
import traceback
from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn

from fxverify.cases import ModelCase
from fxverify.compare import Tolerance
from fxverify.contracts import Contract
from fxverify.errors import FxVerifyError, TransformFailed
from fxverify.inputs import InputConfig
from fxverify.module_state import Snapshot
from fxverify.result import FAILED, PASSED, SKIPPED, XFAILED, CheckResult, Finding, Skip, exception_summary
from fxverify.transform import Transform, as_transform

DEFAULT_TIMEOUT = 300.0


def library_versions(source: str) -> str:
    """The versions that decide whether a model of ``source`` traces, e.g. ``torch 2.14.1, timm 1.0.31``."""
    versions = [f"torch {torch.__version__}"]
    if source in ("torchvision", "timm"):
        module = __import__(source)
        versions.append(f"{source} {module.__version__}")
    return ", ".join(versions)


@dataclasses.dataclass
class Applied:
    """The transform applied to a fresh trace in one mode.

    ``original`` is a trace the transform never saw; ``result`` is what the
    transform produced from an identical copy; ``input_change`` the first change
    the transform made to that copy, seen as it returned (None: untouched or in
    place). Running the result later may legitimately change state it shares with
    the copy (a leaf module caching by input size), so that is not compared.
    """

    mode: str
    original: fx.GraphModule
    result: nn.Module
    in_place: bool
    input_change: str | None


class Verification:
    """Runs checks of ``transform`` on ``case``, sharing the expensive work.

    ``cross_process`` supplies digests of the transform's result computed in
    another process (see :mod:`fxverify.checks.determinism`). ``golden_dir`` and
    ``update_golden`` are for the golden check (see :mod:`fxverify.checks.golden`).
    With ``repro_dir``, a failing numerics check writes a minimised standalone repro
    there (see :mod:`fxverify.repro`).
    """

    def __init__(
        self,
        transform: Transform | Callable[..., Any] | str,
        case: ModelCase | str,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        cross_process: Callable[[str], str] | None = None,
        golden_dir: str | os.PathLike[str] | None = None,
        update_golden: bool = False,
        repro_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        from fxverify.cases import load_case

        self.transform = as_transform(transform)
        self.case = load_case(case) if isinstance(case, str) else case
        self.timeout = timeout
        self.cross_process = cross_process
        self.golden_dir = golden_dir
        self.update_golden = update_golden
        self.repro_dir = repro_dir  # a failing numerics check minimises itself and writes a repro there
        self._applied: dict[str, Applied | TransformFailed] = {}
        self._outputs: dict[tuple[str, str, str], Any] = {}
        self._float64: dict[str, nn.Module] = {}
        self._float64_exact = True

    @property
    def contract(self) -> Contract:
        return self.transform.contract

    @functools.cached_property
    def tolerance(self) -> Tolerance:
        entry = self.case.entry
        return Tolerance(self.contract.rtol, self.contract.atol).loosest(Tolerance(entry.rtol, entry.atol))

    @functools.cached_property
    def float64_tolerance(self) -> Tolerance:
        """Tolerance for float64 runs: tight, unless the transform rewrites parameters and
        could only be applied in float32, so its new parameters carry float32 rounding."""
        self.module("result", torch.float64)  # decides how the float64 result is made
        if self._float64_exact:
            return self.tolerance
        rtol, atol = self.tolerance.for_dtype(torch.float32)
        return Tolerance(rtol, atol)

    @property
    def primary(self) -> InputConfig:
        return self.case.configs[0]

    # -- the transform -------------------------------------------------------
    def applied(self, mode: str | None = None) -> Applied:
        """The transform applied to a fresh trace in ``mode`` (default: the contract's primary mode).

        Raises :class:`TransformFailed` (remembered, not retried) when the transform fails.
        """
        mode = mode or self.contract.primary_mode
        if mode not in self._applied:
            try:
                self._applied[mode] = self.apply_fresh(mode)
            except TransformFailed as exc:
                self._applied[mode] = exc
        found = self._applied[mode]
        if isinstance(found, TransformFailed):
            raise found
        return found

    def apply_fresh(self, mode: str) -> Applied:
        """Trace the case anew in ``mode`` and apply the transform to a copy."""
        original = self.case.trace(training=mode == "train")
        given = copy.deepcopy(original)
        before = Snapshot.take(given)
        result, in_place = self.transform.apply(given, self.case.tracer_class, timeout=self.timeout)
        input_change = None if in_place else before.first_difference(given)
        result.train(mode == "train")
        return Applied(mode, original, result, in_place, input_change)

    def transformed_fresh(self, mode: str) -> nn.Module:
        """Only the result of the transform applied to a fresh trace in ``mode``, for work that
        needs no reference or snapshot (determinism reruns, train mode, the cross-process digest)."""
        traced = self.case.trace(training=mode == "train")
        result, _ = self.transform.apply(traced, self.case.tracer_class, timeout=self.timeout)
        return result.train(mode == "train")

    @functools.cached_property
    def no_op(self) -> bool | None:
        """True when the transform changed nothing (graph and state), None if it failed."""
        try:
            applied = self.applied()
        except TransformFailed:
            return None
        return Snapshot.take(applied.original).first_difference(applied.result, code=False) is None

    @functools.cached_property
    def float64_problem(self) -> str | None:
        """Why the original cannot run in float64 (a cast to float32 written into its graph, say),
        or None. The float64 stages of numerics and gradients need it; the float32 ones do not."""
        try:
            self.outputs("original", dtype=torch.float64)
        except TransformFailed:
            raise
        except Exception as exc:  # whatever the model raises: it cannot be compared in float64
            return exception_summary(exc)
        return None

    # -- running modules -----------------------------------------------------
    def outputs(self, which: str, config: InputConfig | None = None, dtype: torch.dtype | None = None) -> Any:
        """Eval-time outputs of the ``original`` or ``result`` module on ``config`` (cached), as built
        (inputs in their own dtypes, float32 for the corpus), or with every float in ``dtype``."""
        config = config or self.primary
        key = (which, config.name, str(dtype))
        if key not in self._outputs:
            module = self.module(which, dtype)
            with torch.no_grad():
                self._outputs[key] = module(*config.make(self.case.seed, dtype=dtype))
        return self._outputs[key]

    def module(self, which: str, dtype: torch.dtype | None = None) -> nn.Module:
        """The primary-mode ``original`` or ``result`` module as built, or in ``dtype`` (a copy, cached)."""
        applied = self.applied()
        module = applied.original if which == "original" else applied.result
        if dtype is None:
            return module
        key = f"{which}-{dtype}"
        if key not in self._float64:
            if which == "result" and self.contract.changes_parameters:
                self._float64[key] = self._transformed_in(dtype)
            else:
                self._float64[key] = copy.deepcopy(module).to(dtype)
        return self._float64[key]

    def _transformed_in(self, dtype: torch.dtype) -> nn.Module:
        """The transform applied to a ``dtype`` copy of the original: a pass that rewrites
        parameters computes them in the module's dtype, so float64 comparisons stay tight.
        Falls back to converting the float32 result when the transform fails on it."""
        applied = self.applied()
        try:
            result, _ = self.transform.apply(copy.deepcopy(applied.original).to(dtype), self.case.tracer_class,
                                             timeout=self.timeout)
        except TransformFailed:
            self._float64_exact = False
            return copy.deepcopy(applied.result).to(dtype)
        return result.to(dtype).train(applied.mode == "train")

    # -- checks ----------------------------------------------------------------
    def run(self, check: str) -> CheckResult:
        """Run the named check and return its result (never raises for a finding)."""
        from fxverify.checks import CHECKS

        if check not in CHECKS:
            raise FxVerifyError(f"unknown check {check!r}; known checks: {', '.join(CHECKS)}")
        if self.case.entry.xfail:
            return self._expected_failure(check)
        try:
            details = CHECKS[check](self) or {}
        except Skip as skip:
            return self._result(check, SKIPPED, str(skip))
        except Finding as finding:
            return self._result(check, FAILED, self._failure_message(check, finding), finding.details)
        except TransformFailed as exc:
            message = self._failure_message(check, Finding(f"the transform failed on this model:\n{exc}"))
            return self._result(check, FAILED, message)
        except Exception as exc:  # a crash while checking is a finding too, with its traceback
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            finding = Finding(f"running the check raised {type(exc).__name__}: {exc}\n{tb}")
            return self._result(check, FAILED, self._failure_message(check, finding))
        return self._result(check, PASSED, "", details)

    @functools.cached_property
    def model_error(self) -> str | None:
        """Why the untransformed model fails to trace or run on its primary inputs (None if it works)."""
        try:
            traced = self.case.trace()
            with torch.no_grad():
                traced(*self.primary.make(self.case.seed))
        except Exception as exc:  # any failure to trace or run is what an xfail entry records
            return exception_summary(exc)
        return None

    def _expected_failure(self, check: str) -> CheckResult:
        """A catalogue entry marked ``xfail``: no check runs; the model must still fail to trace or run."""
        entry = self.case.entry
        if self.model_error is not None:
            return self._result(check, XFAILED, f"expected failure: {entry.xfail} (now: {self.model_error})")
        message = (
            f"corpus entry {entry.name!r} is listed as an expected failure ({entry.xfail}), but it now "
            f"traces and runs with {library_versions(entry.source)}: remove `xfail` from its catalogue "
            "entry so the checks run on it"
        )
        return self._result(check, FAILED, message)

    def run_all(self, checks: list[str] | None = None) -> list[CheckResult]:
        """Every check (or the named ones), in the canonical order."""
        from fxverify.checks import CHECKS

        return [self.run(name) for name in (checks or list(CHECKS))]

    def _result(self, check: str, outcome: str, message: str, details: dict[str, Any] | None = None) -> CheckResult:
        return CheckResult(check, self.case.name, self.transform.spec, outcome, message, details or {})

    def _failure_message(self, check: str, finding: Finding) -> str:
        entry = self.case.entry
        lines = [
            f"fxverify {check} check failed",
            f"  model:      {entry.name} ({entry.source}, tracer {entry.tracer})",
            f"  transform:  {self.transform.spec}",
            f"  contract:   {self.contract.describe()}",
        ]
        if finding.input:
            lines.append(f"  input:      {finding.input}")
        if finding.where:
            lines.append(f"  first diff: {finding.where}")
        if finding.node:
            lines.append(f"  first node: {finding.node}")
        lines.append("  finding:    " + textwrap.indent(finding.what, " " * 14).lstrip())
        repro = self.repro_command(check)
        if repro:
            lines.append(f"  reproduce:  {repro}")
        return "\n".join(lines)

    def repro_command(self, check: str) -> str | None:
        """A command that reruns this check alone, when the transform and model can be named
        (not for golden: its folder is a pytest option that the command would not know)."""
        from fxverify import catalogue

        if check == "golden":
            return None

        shipped = any(e.name == self.case.name for e in catalogue.catalogue())
        if not self.transform.reloadable or not shipped:
            return None
        return (
            f'python -c "import fxverify; fxverify.assert_{check}(\'{self.transform.spec}\', \'{self.case.name}\')"'
        )
