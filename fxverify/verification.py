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
from fxverify.parameters import Fate, rewrites_state, tensor_fates
from fxverify.result import (ERROR, FAILED, PASSED, SKIPPED, XFAILED, CheckResult, Finding, ModuleRaised, Skip,
                             exception_summary)
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
    ``fates`` says what became of each parameter and buffer of the original (seen as
    the transform returned, see :mod:`fxverify.parameters`); ``rewrites_state``
    whether the result holds other parameters or buffers than the original's;
    ``changes`` which aspects of the module the transform changed (empty: none).
    """

    mode: str
    original: fx.GraphModule
    result: nn.Module
    in_place: bool
    input_change: str | None
    fates: list[Fate]
    rewrites_state: bool
    changes: list[str]


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
        self.float64_fallback: str | None = None  # why the transform could not be applied to a float64 copy
        self.uncopyable: dict[str, str] = {}  # "original" / "result" -> why copy.deepcopy of it raised

    @property
    def contract(self) -> Contract:
        return self.transform.contract

    @functools.cached_property
    def tolerance(self) -> Tolerance:
        entry = self.case.entry
        declared = Tolerance(self.contract.rtol, self.contract.atol, self.contract.range_tol)
        return declared.loosest(Tolerance(entry.rtol, entry.atol))

    @functools.cached_property
    def float64_tolerance(self) -> Tolerance:
        """Tolerance for float64 runs: tight, unless the transform rewrites parameters and
        could only be applied in float32, so its new parameters carry float32 rounding."""
        if self.float64_exact:
            return self.tolerance
        rtol, atol = self.tolerance.for_dtype(torch.float32)
        return Tolerance(rtol, atol, self.tolerance.range_tol)

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
        copies: dict[int, Any] = {}
        given = copy.deepcopy(original, copies)
        before = Snapshot.take(given)
        result, in_place = self.transform.apply(given, self.case.tracer_class, timeout=self.timeout)
        input_change = None if in_place else before.first_difference(given)
        result.train(mode == "train")
        changes = Snapshot.take(original).differences(result)
        fates = tensor_fates(original, result, copies)
        return Applied(mode, original, result, in_place, input_change, fates,
                       rewrites_state(original, result, copies), changes)

    def apply_to(self, gm: fx.GraphModule, mode: str) -> nn.Module:
        """The transform's result for ``gm`` (a fresh trace, or a copy of one), in ``mode``."""
        result, _ = self.transform.apply(gm, self.case.tracer_class, timeout=self.timeout)
        return result.train(mode == "train")

    def transformed_fresh(self, mode: str) -> nn.Module:
        """Only the result of the transform applied to a fresh trace in ``mode``, for work that
        needs no reference or snapshot (determinism reruns, train mode, the cross-process digest)."""
        return self.apply_to(self.case.trace(training=mode == "train"), mode)

    @functools.cached_property
    def changes(self) -> list[str] | None:
        """Which aspects of the model the transform changed in its primary mode (``state``, ``graph``,
        ``code``, ``modules``, ``meta``): empty for a no-op; None if the transform failed."""
        try:
            return self.applied().changes
        except TransformFailed:
            return None

    @property
    def no_op(self) -> bool | None:
        """True when the transform changed nothing at all, None if it failed."""
        return None if self.changes is None else not self.changes

    @functools.cached_property
    def float64_problem(self) -> str | None:
        """Why the original cannot run in float64 (a cast to float32 written into its graph, say),
        or None. The float64 stages of numerics and gradients need it; the float32 ones do not."""
        try:
            self.outputs("original", dtype=torch.float64)
        except ModuleRaised as raised:  # whatever the model raises: it cannot be compared in float64
            return raised.cause
        return None

    @functools.cached_property
    def result_float64_problem(self) -> str | None:
        """Why the result cannot be made or run in float64 (mkldnn tensors, an op taking float32
        only), or None. Not asked when the contract declares the result float32-only."""
        try:
            self.outputs("result", dtype=torch.float64)
        except ModuleRaised as raised:  # whatever converting or running the result raises
            problem = raised.cause
            if self.float64_fallback:
                problem = (f"the transform refuses a float64 copy of the model ({self.float64_fallback}), and its "
                           f"float32 result fails in float64: {problem}")
            return problem
        return None

    @functools.cached_property
    def float64_skip(self) -> str | None:
        """Why the float64 stages of numerics and gradients do not run, or None when they do."""
        if self.float64_problem is not None:
            return f"the original does not run in float64 ({self.float64_problem})"
        if not self.contract.supports_dtype("float64"):
            return "the contract declares the result float32-only (dtypes=float32)"
        if self.result_float64_problem is not None:
            return (f"the result does not run in float64 ({self.result_float64_problem}); the devices check "
                    "judges that")
        return None

    # -- running modules -----------------------------------------------------
    def outputs(self, which: str, config: InputConfig | None = None, dtype: torch.dtype | None = None) -> Any:
        """Eval-time outputs of the ``original`` or ``result`` module on ``config`` (cached), as built
        (inputs in their own dtypes, float32 for the corpus), or with every float in ``dtype``."""
        config = config or self.primary
        key = (which, config.name, str(dtype))
        if key not in self._outputs:
            self.applied()  # a transform that fails is its own finding, not a module that raised
            try:
                module = self.module(which, dtype)
                with torch.no_grad():
                    self._outputs[key] = module(*config.make(self.case.seed, dtype=dtype))
            except Exception as exc:
                where = f"{config.describe()}, {str(dtype or 'float32').removeprefix('torch.')}, {self.applied().mode} mode"
                self._outputs[key] = ModuleRaised(which, exc, where)
        found = self._outputs[key]
        if isinstance(found, ModuleRaised):
            raise found
        return found

    def module(self, which: str, dtype: torch.dtype | None = None) -> nn.Module:
        """The primary-mode ``original`` or ``result`` module as built, or in ``dtype`` (a copy, cached).

        A result holding other parameters than the original's (a fusion) is the transform applied
        to a ``dtype`` copy of the original, so that its new parameters are computed in ``dtype``;
        any other result is converted (``copy.deepcopy(result).to(dtype)``)."""
        applied = self.applied()
        module = applied.original if which == "original" else applied.result
        if dtype is None:
            return module
        key = f"{which}-{dtype}"
        if key not in self._float64:
            if which == "result" and applied.rewrites_state:
                self._float64[key] = self._transformed_in(dtype)
            else:
                self._float64[key] = self._copy(which, module).to(dtype)
        return self._float64[key]

    def _copy(self, which: str, module: nn.Module) -> nn.Module:
        """``copy.deepcopy(module)``; when that raises, why is remembered in ``uncopyable``: fxverify
        cannot make its converted copies, which says nothing of the module's dtypes (lint reports it)."""
        try:
            return copy.deepcopy(module)
        except Exception as exc:
            self.uncopyable[which] = exception_summary(exc)
            raise

    def _transformed_in(self, dtype: torch.dtype) -> nn.Module:
        """The transform applied to a ``dtype`` copy of the original: a pass that rewrites
        parameters computes them in the module's dtype, so float64 comparisons stay tight.
        Falls back to converting the float32 result when the transform fails on it."""
        applied = self.applied()
        try:
            result, _ = self.transform.apply(copy.deepcopy(applied.original).to(dtype), self.case.tracer_class,
                                             timeout=self.timeout)
        except TransformFailed as exc:
            self._float64_exact = False
            self.float64_fallback = exc.cause
            return self._copy("result", applied.result).to(dtype)
        return result.to(dtype).train(applied.mode == "train")

    @property
    def float64_exact(self) -> bool:
        """Whether the float64 result was made without float32 rounding of new parameters: converted
        from a result that keeps the original's parameters, or the transform applied in float64."""
        self.module("result", torch.float64)
        return self._float64_exact

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
        except Exception as exc:  # fxverify's own code raised: no verdict on the transform
            return self.internal_error(check, exc)
        return self._result(check, PASSED, "", details)

    def internal_error(self, check: str, exc: BaseException, doing: str = "") -> CheckResult:
        """The result of a check that fxverify itself could not complete: an ERROR naming the
        model and transform, saying it is no verdict on the transform, with the traceback."""
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        what = doing or f"running the {check} check"
        lines = [
            f"fxverify error in the {check} check (not a finding about the transform)",
            f"  model:      {self.case.name}",
            f"  transform:  {self.transform.spec}",
            f"  error:      {what} raised {exception_summary(exc)} inside fxverify; this says nothing about "
            "the transform. Please report it to fxverify's maintainers, with this message",
            tb.rstrip(),
        ]
        return self._result(check, ERROR, "\n".join(lines))

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
