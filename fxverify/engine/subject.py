"""The subject of the checks: one transform on one model, and the expensive work every check
shares, done once and on demand (capture, transform, reference outputs, float64 copies, what the
transform changed). Checks read it and import nothing above it; the runner
(:mod:`fxverify.runner`) runs them.

>>> import fxverify
>>> s = Subject(fxverify.examples.identity, fxverify.load_case("edge_conv_bn_head"))
>>> s.applied().mode, s.changes
('eval', ['code', 'meta'])
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import gc
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar, cast, overload

import sympy
import torch
from torch import fx, nn
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._pytree import PyTree

from fxverify.analysis.compare import Tolerance
from fxverify.analysis.module_state import Snapshot, buffers_digest
from fxverify.analysis.parameters import Fate, rewrites_state, tensor_fates
from fxverify.analysis.recording import raising_node
from fxverify.analysis.repropagation import (
    copied_shape_env,
    shape_env_of,
)
from fxverify.capture import Capture
from fxverify.capture.export import symbol_ranges
from fxverify.cases.case import ModelCase, load_case
from fxverify.cases.inputs import InputConfig
from fxverify.core.contracts import Contract, Mode
from fxverify.core.memory import trim_heap
from fxverify.core.results import CaptureFailed, ModuleRaised, Skip, Which, exception_summary
from fxverify.core.stash import Stash
from fxverify.core.transform import Transform, as_transform
from fxverify.engine.references import ReferenceStore
from fxverify.errors import CopyFailed, TransformFailed

DEFAULT_TIMEOUT = 300.0
LARGE_MODEL_BYTES = 64 * 2**20  # a model whose dropped copies are worth a collection

ModuleT = TypeVar("ModuleT", bound=nn.Module)


@dataclasses.dataclass
class Applied:
    """The transform applied to a fresh trace in one mode.

    ``original`` is a trace the transform never saw; ``result`` is what the
    transform produced from an identical copy; ``input_change`` the first change
    the transform made to that copy, seen as it returned (None: untouched or in
    place). Running the result later may legitimately change state it shares with
    the copy (a leaf module caching by input size), so that is not compared.
    ``fates`` says what became of each parameter and buffer of the original (seen as
    the transform returned, see :mod:`fxverify.analysis.parameters`); ``rewrites_state``
    whether the result holds other parameters or buffers than the original's;
    ``changes`` which aspects of the module the transform changed (empty: none; ``guards``: it added guards to
    the ShapeEnv an export's copies share); ``buffers`` the
    checksums of the original's and the result's buffers as the transform left them (a model that
    updates buffers in forward, run by one check more often than by another, no longer has them);
    ``specialised`` the symbolic input sizes that became constants while the transform ran, with their
    ranges before (an export's copies share one ShapeEnv: an ``int()`` of a size adds ``Eq(s77, 2)``
    there, for the capture the copy came from too); ``shape_env`` a copy of that ShapeEnv taken before the
    transform ran (re-propagations start from it, so that a guard the transform added while it ran is added
    again by the node that needs it), and ``guards_added`` the guards it added while it ran.
    """

    mode: Mode
    original: fx.GraphModule
    result: nn.Module
    in_place: bool
    input_change: str | None
    fates: list[Fate]
    rewrites_state: bool
    changes: list[str]
    buffers: tuple[int, int]
    specialised: dict[str, tuple[Any, Any]] = dataclasses.field(default_factory=dict)
    shape_env: ShapeEnv | None = None
    guards_added: list[sympy.Basic] = dataclasses.field(default_factory=list)

    @property
    def state_advanced(self) -> bool:
        """Whether running the original or the result has changed their buffers since the transform."""
        return (buffers_digest(self.original), buffers_digest(self.result)) != self.buffers


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the checks need beyond the subject, built once for a run and handed whole to each subject.

    ``references`` keeps the original's outputs between transforms and runs (:mod:`fxverify.engine.references`);
    ``captures`` are the captures the run selects (the agreement check compares them); ``options``: the run's
    value of check options by key (each check declares the keys it reads and their defaults in its registry
    entry, and reads them with :func:`fxverify.checks.option`: the golden check's ``golden_dir``); ``services``:
    by check name, what the check's run-scoped service hands this subject (:class:`fxverify.checks.RunService`:
    the determinism check's cross-process digests).

    >>> Settings(options={"update_golden": True}).options["update_golden"]
    True
    """

    references: ReferenceStore | None = None
    captures: tuple[str, ...] = ()
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    services: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class Subject:
    """One transform on one model (a ``ModelCase`` or a corpus name), captured by ``capture`` (the
    case's own by default), with the work the checks share done lazily and kept."""

    def __init__(self, transform: Transform | Callable[..., Any] | str, case: ModelCase | str, *,
                 timeout: float | None = DEFAULT_TIMEOUT, settings: Settings = Settings(),
                 capture: Capture | None = None) -> None:
        self.transform = as_transform(transform)
        self.case = load_case(case) if isinstance(case, str) else case
        self.capture: Capture = (capture or self.case.capture).for_transform(self.transform)
        self.timeout = timeout
        self.settings = settings
        self._applied: dict[str, Applied | TransformFailed] = {}
        self._outputs: dict[tuple[str, str, str, str], Any] = {}
        self._float64: dict[str, nn.Module] = {}
        self._float64_exact: bool | None = None  # set by each float64 result made
        self.dtype_copies_fresh = False  # whether the dtype copies are a pair made from a fresh capture
        self.float64_fallback: str | None = None  # why the transform could not be applied to a float64 copy
        self.uncopyable: dict[str, str] = {}  # "original" / "result" -> why copy.deepcopy of it raised
        self.fresh_copies: str | None = None  # why copies of the result are made anew (see renew_result_copies)
        # (mode, dtype, static) -> the capture copied for each use, when the capture keeps captures; or why it failed
        self._captured: dict[tuple[str, str, bool], fx.GraphModule | CaptureFailed | Skip] = {}
        self.stash = Stash()  # what single checks keep per subject (fxverify.core.stash)
        self._changed_in: dict[str, list[str]] = {}  # another mode a check applied it in -> what it changed there

    @property
    def expected_failure(self) -> str | None:
        """Why the catalogue expects the model not to capture or run under this capture, or None."""
        return self.case.entry.expected_failure(self.capture.name)

    @property
    def contract(self) -> Contract:
        return self.transform.contract

    @functools.cached_property
    def tolerance(self) -> Tolerance:
        """The contract's, the entry's and the capture's tolerances (a quantized capture's: its quantization
        steps), the loosest of each."""
        entry = self.case.entry
        declared = Tolerance(self.contract.rtol, self.contract.atol, self.contract.range_tol)
        found = declared.loosest(Tolerance(entry.rtol, entry.atol))
        try:
            captured = self.capture.tolerance(self.capture_source(self.contract.primary_mode))
        except (CaptureFailed, Skip):  # no graph to read it from: the checks say so themselves
            captured = None
        return found if captured is None else found.loosest(captured)

    @property
    def float64_tolerance(self) -> Tolerance:
        """Tolerance for float64 runs: tight, unless the transform rewrites parameters and
        could only be applied in the model's dtype, so its new parameters carry that dtype's rounding (as of
        the float64 result last made: a released copy is made again, and a transform may fail only once)."""
        return self.tolerance if self.float64_exact else self.tolerance.at_least(getattr(torch, self.dtype))

    @property
    def primary(self) -> InputConfig:
        return self.case.configs[0]

    @functools.cached_property
    def configs(self) -> list[InputConfig]:
        """The case's input configurations the capture's graphs accept, the primary one first (a
        static export runs at the exported shapes only, a dynamic batch at other batch sizes)."""
        captured = [spec.shape for spec in self.primary.specs]
        return [c for c in self.case.configs if self.capture.accepts([spec.shape for spec in c.specs], captured)]

    # -- the transform -------------------------------------------------------
    def applied(self, mode: Mode | None = None) -> Applied:
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

    def apply_fresh(self, mode: Mode) -> Applied:
        """Trace the case anew in ``mode`` and apply the transform to a copy."""
        original = self.capture_fresh(mode)
        copies: dict[int, Any] = {}
        given = copy.deepcopy(original, copies)
        before, symbols = Snapshot.take(given), symbol_ranges(original)
        shared = shape_env_of(original)  # every copy of an export shares it
        pristine, count = (copied_shape_env(shared), len(shared.guards)) if shared is not None else (None, 0)
        result, in_place = self.capture.apply(self.transform, given, timeout=self.timeout)
        left = symbol_ranges(original)  # its sizes share the ShapeEnv of the copy given
        added = [g.expr for g in shared.guards[count:]] if shared is not None else []
        input_change = None if in_place else before.first_difference(given)
        if input_change is None and not in_place and self.transform.form == "program":
            input_change = self.capture.input_change(original, given)
        self.capture.set_mode(result, mode == "train")
        changes = Snapshot.take(original).differences(result) + (["guards"] if added else [])
        fired = self.capture.fired_in(result)  # the graphs of a capture of several the transform changed
        changes += [f"in {','.join(fired)}"] if fired else []
        fates = tensor_fates(original, result, copies)
        return Applied(mode, original, result, in_place, input_change, fates,
                       rewrites_state(original, result, copies), changes,
                       (buffers_digest(original), buffers_digest(result)),
                       {name: bounds for name, bounds in symbols.items() if name not in left}, pristine, added)

    def capture_fresh(self, mode: Mode, dtype: torch.dtype | None = None, *, static: bool = False) -> fx.GraphModule:
        """A fresh graph of a fresh instance of the model, in ``mode`` (with ``dtype``: of the instance
        in ``dtype``, for captures that bake dtypes into their graphs; ``static``: without dynamic
        dimensions, for a stage that runs the example inputs only); for a capture that
        ``keeps_captures``, a copy of the one capture made in that mode, dtype and shape.

        Raises :class:`CaptureFailed` (a finding against the model, not the transform) when
        building or capturing it raises.
        """
        captured = self.capture_source(mode, dtype, static=static)
        return copy.deepcopy(captured) if self.capture.keeps_captures else captured

    def capture_source(self, mode: Mode, dtype: torch.dtype | None = None, *, static: bool = False) -> fx.GraphModule:
        """What :meth:`capture_fresh` gives, without its copy of a kept capture: the graph to copy, never to
        change or run (:meth:`transformed_copy` copies it anyway; copying an export is not free).

        Raises :class:`CaptureFailed` as :meth:`capture_fresh` does.
        """
        key = (mode, str(dtype), static)
        if key not in self._captured:
            capture = self.capture.at_example_shapes() if static else self.capture
            try:
                captured = self._retyped(mode, dtype, static) or \
                    self.case.captured(training=mode == "train", capture=capture, dtype=dtype)
            except Skip as skip:  # the capture does not apply to the model: no check has a graph to run on
                self._captured[key] = skip
                raise
            except Exception as exc:
                failed = CaptureFailed(self.case.name, capture.describe(), exc, mode)
                self._captured[key] = failed
                raise failed from exc
            if not self.capture.keeps_captures:
                return captured
            self._captured[key] = captured
        kept = self._captured[key]
        if isinstance(kept, (CaptureFailed, Skip)):
            raise kept
        return kept

    def _retyped(self, mode: Mode, dtype: torch.dtype | None, static: bool) -> fx.GraphModule | None:
        """The capture kept in ``mode`` (and ``static``) as capturing the model in ``dtype`` gives it, made by
        the capture without capturing again (:meth:`~fxverify.capture.Capture.in_dtype`: exporting again
        costs several times more), or None."""
        kept = self._captured.get((mode, "None", static))
        return self.capture.in_dtype(kept, dtype) if dtype is not None and isinstance(kept, fx.GraphModule) else None

    def transformed_fresh(self, mode: Mode, *, static: bool = False) -> nn.Module:
        """Only the result of the transform applied to a fresh capture in ``mode`` (``static``: see
        :meth:`capture_fresh`), for work that needs no reference (train mode, the stateful check). The first
        in a mode other than the primary one records what the transform changed there (see :attr:`changes`)."""
        given = self.capture_fresh(mode, static=static)
        before = Snapshot.take(given) if mode != self.contract.primary_mode and mode not in self._changed_in else None
        result, _ = self.capture.apply(self.transform, given, timeout=self.timeout)
        if before is not None:
            self._changed_in[mode] = before.differences(result)
        return self.capture.set_mode(result, mode == "train")

    def copy_of(self, which: Which) -> nn.Module:
        """A copy of the primary-mode ``original`` or ``result`` to change or run (recompile it, switch its mode,
        step its buffers): ``copy.deepcopy`` of it; for a result that ``copy.deepcopy`` cannot copy, or whose
        copy is known not to run where it does (:meth:`renew_result_copies`), the transform applied to a fresh
        capture, as its users make another one. Raises :class:`TransformFailed` when that fails."""
        applied = self.applied()
        if which == "original":
            return copy.deepcopy(applied.original)
        if self.fresh_copies is None:
            try:
                return copy.deepcopy(applied.result)
            except Exception:  # the pickle check reports it; the checks that need a copy take another one
                pass
        return self.transformed_fresh(applied.mode)

    @functools.cached_property
    def result_copy_problem(self) -> str | None:
        """Why the module ``copy.deepcopy`` makes of the primary-mode result is not a working copy of it: it
        raises on the primary inputs, where the result runs (torch's ``FoldedGraphModule``, whose
        ``has_folding_been_run`` the copy lacks); None where it runs, where the result raises too (the
        result's own finding), and where ``copy.deepcopy`` itself raises (:attr:`uncopyable`)."""
        try:
            copied = copy.deepcopy(self.applied().result)
            self.outputs("result")
        except Exception:  # deepcopy raised (no copy to judge), or the result raised (no copy is to blame)
            return None
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                copied(*self.primary.make(self.case.seed))
        except Exception as exc:
            return (f"the module copy.deepcopy(result) makes raises {exception_summary(exc)} on "
                    f"{self.primary.describe()}, where the result itself runs")
        return None

    def renew_result_copies(self) -> bool:
        """Whether a failure seen running fxverify's copies of the result is their doing, not the result's:
        ``copy.deepcopy`` gives a copy that raises where the result runs (:attr:`result_copy_problem`). From
        then on the converted and plain copies of the result (:meth:`convert`, :meth:`copy_of`) are the
        transform applied to fresh captures, converted in place (:attr:`fresh_copies` says why), and those made
        so far are forgotten: the caller runs again. False where copies are already made so, or the copy
        works: the failure stands. The pickle check reports the broken copy."""
        if self.fresh_copies is not None or self.result_copy_problem is None:
            return False
        self.fresh_copies = self.result_copy_problem
        for copied in [k for k in self._float64 if k.startswith("result-")]:
            del self._float64[copied]
        for ran in [k for k in self._outputs if k[0] == "result" and k[2] != "None"]:
            del self._outputs[ran]
        return True

    @property
    def fresh_copies_note(self) -> str:
        """One line for the checks' messages where copies of the result are made anew (:attr:`fresh_copies`)."""
        return (f"fxverify's copies of the result here are the transform applied to fresh captures, not "
                f"copy.deepcopy(result): {self.fresh_copies} (fxverify's copy failing, not the result; the pickle "
                "check reports it)")

    @property
    def converts_result(self) -> bool:
        """Whether the result's dtype copies are converted copies of it (:meth:`module`), not the transform
        applied again to a copy of the original in that dtype (a result with new tensors; an ATen graph)."""
        return not (self.applied().rewrites_state or self.capture.bakes_dtypes)

    def transformed_copy(self, original: fx.GraphModule, mode: Mode, *, copies: dict[int, Any] | None = None) -> nn.Module:
        """The result of the transform applied to a ``copy.deepcopy`` of ``original``, a capture in
        ``mode`` (from :meth:`capture_source`, left as it is), as :meth:`apply_fresh` makes the result the
        checks judge (the determinism reruns and the cross-process digest: a copy orders each node's users
        as the graph orders the nodes, where ``torch.export`` leaves them in the order it made them).
        ``copies``: the ``copy.deepcopy`` memo, filled (what became of each of the original's tensors is then
        known by identity: :func:`~fxverify.analysis.parameters.tensor_fates`)."""
        given = copy.deepcopy(original, copies)
        result, _ = self.capture.apply(self.transform, given, timeout=self.timeout)
        return self.capture.set_mode(result, mode == "train")

    @property
    def dtype(self) -> str:
        """The model's floating dtype, as findings name it: its corpus entry's (``bfloat16``), else ``float32``,
        the corpus's."""
        return self.case.entry.dtype or "float32"

    @property
    def not_run(self) -> str | None:
        """Why the transform is not run on this model under this capture (its contract's captures or dtypes, or
        its form), or None."""
        return self.transform.skips_capture(self.capture.name) or self.transform.skips_dtype(self.dtype)

    @property
    def changes(self) -> list[str] | None:
        """Which aspects of the model the transform changed (``state``, ``graph``, ``code``, ``modules``,
        ``meta``) in its primary mode and in every other mode a check has applied it in so far (a dead-code
        elimination that drops BatchNorm's ``num_batches_tracked.add_`` changes only the train-mode capture
        of ``torch.export``): empty for a no-op; None if the transform failed in its primary mode, the model
        did not capture, the capture cannot judge the result (it raised :class:`Skip`), or the transform is not run on
        this capture (never called then)."""
        if self.not_run:
            return None
        try:
            primary = self.applied().changes
        except (TransformFailed, CaptureFailed, Skip):  # the transform's failure, the model's, or a result no check
            return None                                     # can judge (a lowering only Inductor's codegen runs)
        return list(dict.fromkeys([*primary, *(c for found in self._changed_in.values() for c in found)]))

    @property
    def no_op(self) -> bool | None:
        """True when the transform changed nothing at all, None if it failed."""
        return None if self.changes is None else not self.changes

    @property
    def compares_values(self) -> bool:
        """Whether the result's numbers are held to the original's: not for a quantizer under test (form
        ``quantizer``), whose result is the float original quantized, with an error no tolerance bounds that would
        still catch a defect (docs/quantization.md). The checks comparing values then ask that the result runs where
        the original runs, with outputs of the same shapes, finite where the original's are, and keeps updating the
        state the original updates; ``numerics`` holds the quantizer's float graph and parameters to the float model
        instead (:mod:`fxverify.checks._quantizer`)."""
        return self.transform.form != "quantizer"

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
    def outputs(self, which: Which, config: InputConfig | None = None, dtype: torch.dtype | None = None, *,
                threads: int | None = None) -> PyTree:
        """Eval-time outputs of the ``original`` or ``result`` module on ``config`` (cached), as built
        (inputs in their own dtypes, float32 for the corpus), or with every float in ``dtype``; with
        torch on ``threads`` threads (default: as it is). The original's come from the settings'
        reference store when it has them (see :mod:`fxverify.engine.references`)."""
        config = config or self.primary
        key = (which, config.name, str(dtype), str(threads))
        if key not in self._outputs:
            mode = self.applied().mode  # a transform that fails is its own finding, not a module that raised
            store = self.settings.references
            stored = None if store is None or which != "original" or mode != "eval" else \
                store.key(self.case, self.capture, config, dtype, mode, threads=threads)
            found = store.load(stored) if store is not None else None
            if found is None:
                found = self._run(which, config, dtype, threads)
                if isinstance(found, ModuleRaised) and which == "result" and dtype is not None and \
                        self.converts_result and self.renew_result_copies():
                    found = self._run(which, config, dtype, threads)  # on a fresh result, converted
                if store is not None and not isinstance(found, ModuleRaised):
                    store.save(stored, found)
            self._outputs[key] = found
        found = self._outputs[key]
        if isinstance(found, ModuleRaised):
            raise found
        return found

    def _run(self, which: Which, config: InputConfig, dtype: torch.dtype | None, threads: int | None) -> PyTree:
        """What :meth:`outputs` computes: the outputs, or the :class:`ModuleRaised` of the module."""
        now = torch.get_num_threads()
        module: nn.Module | None = None
        try:
            module = self.module(which, dtype)
            torch.set_num_threads(threads or now)
            with torch.no_grad():
                return module(*config.make(self.case.seed, dtype=dtype))
        except Exception as exc:
            where = f"{config.describe()}, {str(dtype or 'float32').removeprefix('torch.')}, {self.applied().mode} mode"
            raised = ModuleRaised(which, exc, where)
            at = raising_node(module, config.make(self.case.seed, dtype=dtype)) \
                if which == "result" and isinstance(module, fx.GraphModule) else None
            raised.node = at.format_node() if at is not None else None
            return raised
        finally:
            torch.set_num_threads(now)

    @overload
    def module(self, which: Literal["original"], dtype: torch.dtype | None = None) -> fx.GraphModule: ...
    @overload
    def module(self, which: Which, dtype: torch.dtype | None = None) -> nn.Module: ...

    def module(self, which: Which, dtype: torch.dtype | None = None) -> nn.Module:
        """The primary-mode ``original`` or ``result`` module as built, or in ``dtype`` (a copy, cached).

        A result holding other parameters than the original's (a fusion) is the transform applied
        to a ``dtype`` copy of the original, so that its new parameters are computed in ``dtype``;
        any other result is converted (``copy.deepcopy(result).to(dtype)``). Where the capture bakes
        dtypes into its graphs (``torch.export``), the original is the ``dtype`` model captured
        again and the result the transform applied to that."""
        applied = self.applied()
        module = applied.original if which == "original" else applied.result
        if dtype is None:
            return module
        key = f"{which}-{dtype}"
        if key not in self._float64:
            if applied.state_advanced:  # running them moved their buffers apart: copies start from one fresh pair
                self._fresh_pair(dtype)
            elif which == "original" and self.capture.bakes_dtypes:
                self._float64[key] = self.capture_fresh(applied.mode, dtype)
            elif which == "result" and not self.converts_result:
                self._float64[key] = self._transformed_in(dtype)
            else:
                self._float64[key] = self.convert(which, module, dtype=dtype)
                if which == "result":
                    self._float64_exact = True
        return self._float64[key]

    def release_copy(self, which: Which, dtype: torch.dtype) -> None:
        """Forget the ``dtype`` copy of the ``original`` or the ``result`` (:meth:`module` makes it again
        when asked), so that a stage done with it leaves its memory to the next one. Made again, the
        result's copy of a fusion is the transform applied again: for a transform that does not give
        the same result twice, another valid result (the determinism check judges that)."""
        if self._float64.pop(f"{which}-{dtype}", None) is not None:
            self.collect_garbage()

    @property
    def model_bytes(self) -> int:
        """The bytes of the original's parameters and buffers (what each whole copy of it costs); 0
        before anything was captured, or when nothing could be."""
        for applied in self._applied.values():
            if isinstance(applied, Applied):
                tensors = (*applied.original.parameters(), *applied.original.buffers())
                return sum(t.numel() * t.element_size() for t in tensors)
        return 0

    def collect_garbage(self) -> None:
        """Collect reference cycles now when the model is large (:data:`LARGE_MODEL_BYTES`): the
        fresh traces, copies and results a check dropped hold whole copies of its tensors until
        Python's cycle collector runs (see :mod:`fxverify.core.memory`)."""
        if self.model_bytes >= LARGE_MODEL_BYTES:
            gc.collect()
            trim_heap()

    def convert(self, which: Which, module: ModuleT, *, dtype: torch.dtype | None = None,
                device: str | None = None) -> ModuleT:
        """``module`` (the ``original``'s or the ``result``'s) converted by the capture; when copying it
        raises, why is remembered in ``uncopyable``: fxverify cannot make its converted copies, which
        says nothing of the module's dtypes or devices (lint reports a result that cannot be copied). Where
        copies of the result are made anew (:meth:`renew_result_copies`), the transform applied to a fresh
        capture, converted in place."""
        if which == "result" and self.fresh_copies is not None:
            fresh = self.transformed_fresh(self.applied().mode)
            return cast(ModuleT, fresh.to(device=device, dtype=dtype))
        try:
            return self.capture.convert(module, dtype=dtype, device=device)
        except CopyFailed as exc:
            self.uncopyable[which] = str(exc)
            raise

    def _fresh_pair(self, dtype: torch.dtype) -> None:
        """The ``dtype`` original and result made together from a fresh capture, for a model whose runs
        changed its buffers (a running statistic, a counter, a cache): a copy of the original and of the
        result as they are now would start from buffers the runs so far left apart."""
        applied = self.applied()
        self.release_copy("original", dtype)
        self.release_copy("result", dtype)
        original = self.capture_fresh(applied.mode, dtype) if self.capture.bakes_dtypes else \
            self.capture.convert(self.capture_fresh(applied.mode), dtype=dtype)
        self._float64[f"result-{dtype}"] = self._applied_in(copy.deepcopy(original), dtype)
        self._float64[f"original-{dtype}"] = original
        self._float64_exact = True
        self.dtype_copies_fresh = True

    def _transformed_in(self, dtype: torch.dtype) -> nn.Module:
        """The transform applied to a ``dtype`` copy of the original: a pass that rewrites
        parameters computes them in the module's dtype, so float64 comparisons stay tight.
        Falls back to converting the float32 result when the transform fails on it."""
        applied = self.applied()
        given = self.capture_fresh(applied.mode, dtype) if self.capture.bakes_dtypes else \
            self.capture.convert(applied.original, dtype=dtype)
        try:
            result = self._applied_in(given, dtype)
        except TransformFailed as exc:
            self._float64_exact = False
            self.float64_fallback = exc.cause
            return self.convert("result", applied.result, dtype=dtype)
        self._float64_exact = True
        return result

    def _applied_in(self, given: fx.GraphModule, dtype: torch.dtype) -> nn.Module:
        """The transform applied to ``given``, a ``dtype`` capture of the original, in the subject's mode."""
        result, _ = self.capture.apply(self.transform, given, timeout=self.timeout)
        if not self.capture.bakes_dtypes:  # new parameters made in float32, say; an ATen graph's result is as made
            result = result.to(dtype)  # (its tensor constants stay float32 in the dtype model, as the original's do)
        return self.capture.set_mode(result, self.applied().mode == "train")

    @property
    def float64_exact(self) -> bool:
        """Whether the float64 result was made without float32 rounding of new parameters: converted
        from a result that keeps the original's parameters, or the transform applied in float64 (as
        of the float64 result last made)."""
        if self._float64_exact is None:  # none made yet
            self.module("result", torch.float64)
        return bool(self._float64_exact)

