"""Shrinking a failing model to the few nodes on which the transform still fails.

The search is torch's own minifier (``torch._functorch.fx_minifier.minifier``,
written for aten graphs but generic over a ``module_fails(gm, inputs)``
predicate): it truncates the suffix after the failure, removes outputs,
eliminates dead code, and replaces nodes by placeholders fed with the values
they had when the whole model ran (delta debugging), at halving granularity.
fxverify supplies the predicate: the candidate subgraph (a ``GraphModule`` whose
``call_module`` / ``get_attr`` targets are the original's) is transformed as the
user's transform is always called (a fresh copy, through the case's capture),
and fails when the result's outputs differ from the candidate's own beyond the
check's tolerance -- or, when the whole model's result raised, when it raises
too. A time budget bounds the search; when it runs out, the smallest failing
candidate seen so far is returned.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx
from torch._functorch.fx_minifier import minifier

from fxverify.analysis.compare import Mismatch, Tolerance, compare_trees
from fxverify.capture import Capture, for_entry
from fxverify.cases.inputs import InputConfig
from fxverify.core.results import exception_summary
from fxverify.core.transform import Transform, as_transform
from fxverify.diagnose.repro_script import DIFFERS, RAISES
from fxverify.engine.subject import Subject
from fxverify.errors import FxVerifyError, TransformFailed

DEFAULT_BUDGET = 120.0
Prepare = Callable[[fx.GraphModule, Sequence[Any]], fx.GraphModule]  # a candidate and its inputs -> what the transform takes


@dataclasses.dataclass(frozen=True)
class Minimised:
    """A small module on which the transform still fails, with its inputs.

    ``complete`` is False when the time budget ran out first (``module`` is then the
    smallest failing candidate found); ``failure`` describes how it fails, ``raised``
    names the exception type the result raised (RAISES; empty for DIFFERS).
    """

    module: fx.GraphModule
    inputs: tuple[Any, ...]
    transform: Transform
    tolerance: tuple[float, float]  # (rtol, atol) the failure exceeds
    kind: str  # RAISES (the result raises when run) or DIFFERS (its outputs differ)
    failure: str
    nodes_before: int
    nodes_after: int
    queries: int
    seconds: float
    complete: bool
    raised: str = ""
    given: tuple[str, str] | None = None  # the capture's repro_given where it captured each candidate again

    def describe(self) -> str:
        """e.g. ``4 nodes, minimised from 70 in 12 s, 31 tries``."""
        budget = "" if self.complete else "; time budget spent: not minimal"
        return (f"{self.nodes_after} nodes, minimised from {self.nodes_before} in {self.seconds:.0f} s, "
                f"{self.queries} tries{budget}")


def minimise_module(
    transform: Transform | Any,
    module: fx.GraphModule,
    inputs: Sequence[Any],
    *,
    tolerance: Tolerance = Tolerance(),
    capture: Capture | None = None,
    budget_s: float = DEFAULT_BUDGET,
    timeout: float | None = None,
    prepare: Prepare | None = None,
) -> Minimised:
    """Shrink ``module`` (left untouched) to a small subgraph on which ``transform`` still
    fails: its result differs from the subgraph's own outputs on the inputs the subgraph
    sees when ``module`` runs on ``inputs`` (or raises, if it raised on ``module``).
    ``prepare`` makes each candidate the graph the transform takes (an export capture exports it
    again, so that the pass gets ``meta['val']`` and the program as it always does; default: a copy).

    Raises :class:`FxVerifyError` when the transform does not fail on ``module`` itself.

    >>> import torch
    >>> from torch import nn
    >>> gm = torch.fx.symbolic_trace(nn.Sequential(nn.Tanh(), nn.Hardtanh(), nn.ReLU(), nn.Tanh()))
    >>> def relu_to_abs(gm):
    ...     for n in gm.graph.nodes:
    ...         if n.op == "call_module" and isinstance(gm.get_submodule(n.target), torch.nn.ReLU):
    ...             n.op, n.target = "call_function", torch.abs
    ...     gm.recompile()
    >>> found = minimise_module(relu_to_abs, gm, (torch.tensor([-1.0, 2.0]),))
    >>> found.nodes_before, found.nodes_after
    (6, 3)
    >>> print(found.module.code.strip())
    def forward(self, _1):
        _2 = getattr(self, "2")(_1);  _1 = None
        return (_2,)
    """
    transform = as_transform(transform)
    capture = capture or for_entry("plain")
    predicate = _Predicate(transform, capture, tolerance, timeout, time.monotonic() + budget_s, prepare)
    reference = copy.deepcopy(module)  # the minifier writes concrete values into node.meta
    inputs = _with_defaults(module, tuple(cloned(inputs)))
    for placeholder in reference.graph.find_nodes(op="placeholder"):
        placeholder.args = ()  # its default is among the inputs; new placeholders join without one
    reference.recompile()
    with torch.no_grad():
        predicate.kind = predicate.outcome(reference, inputs)
        if predicate.kind is None:
            raise FxVerifyError(
                f"transform {transform.spec} does not fail on this module at these inputs "
                "(nothing to minimise): pass the module and inputs of the failing check"
            )
        predicate.remember(reference, inputs)
        started, complete = time.monotonic(), True
        with contextlib.redirect_stderr(io.StringIO()):  # the minifier narrates every step
            try:
                minifier(reference, list(inputs), predicate, dump_state=lambda gm, inps: None)
                _drop_unread(*predicate.best, predicate)
            except _BudgetSpent:
                complete = False
    best, best_inputs = predicate.best
    for node in best.graph.nodes:
        node.meta.pop("concrete_value", None)
    failure = predicate.failure(best, best_inputs)
    return Minimised(
        module=best, inputs=tuple(best_inputs), transform=transform,
        tolerance=predicate.rtol_atol(best, best_inputs), kind=predicate.kind,
        failure=str(failure) if failure else "it no longer fails",
        nodes_before=len(module.graph.nodes), nodes_after=len(best.graph.nodes), queries=predicate.queries,
        seconds=time.monotonic() - started, complete=complete,
        raised=failure.error if isinstance(failure, _ResultRaised) else "",
    )


def minimise_failure(subject: Subject, *, budget_s: float = DEFAULT_BUDGET) -> Minimised:
    """Minimise a failing numerics check of a :class:`~fxverify.engine.subject.Subject`: the
    first input configuration at which the transform fails (float64 first, with its tight
    tolerance, then as built with the check's), on the primary-mode original. On a capture with a
    ``repro_given`` (``make_fx``) each candidate subgraph is captured again at its inputs, so that the
    transform gets ``meta['val']`` on every node as it always does (``Minimised.given``).

    Raises :class:`FxVerifyError` when the transform fails at none of them. For example
    (``my_passes.fold_bn`` is the transform)::

        from fxverify.diagnose.minimise import minimise_failure
        from fxverify.engine.subject import Subject
        from my_passes import fold_bn

        found = minimise_failure(Subject(fold_bn, "resnet18"), budget_s=60)
        print(found.describe())  # 4 nodes, minimised from 70 in 3 s, 25 tries
        print(found.module.code)  # the conv and the BN it folds, say
    """
    deadline = time.monotonic() + budget_s
    attempts: list[tuple[InputConfig, torch.dtype | None, Tolerance]] = [
        (config, torch.float64, subject.float64_tolerance) for config in subject.configs
    ]
    attempts += [(config, None, subject.tolerance) for config in subject.configs]  # None: as built
    recaptured = subject.capture if subject.capture.repro_given is not None else None
    training = subject.contract.primary_mode == "train"
    prepare: Prepare | None = None
    if recaptured is not None:
        prepare = lambda candidate, inputs: recaptured.capture(candidate, training=training, inputs=tuple(inputs))
    for config, dtype, tolerance in attempts:
        inputs = config.make(subject.case.seed, dtype=dtype)
        try:
            found = minimise_module(subject.transform, subject.module("original", dtype), inputs, tolerance=tolerance,
                                    capture=subject.capture, budget_s=max(0.0, deadline - time.monotonic()),
                                    timeout=subject.timeout, prepare=prepare)
        except FxVerifyError:
            continue
        return dataclasses.replace(found, given=subject.capture.repro_given)
    raise FxVerifyError(f"transform {subject.transform.spec} fails on none of {subject.case.name}'s input configurations")


def _drop_unread(gm: fx.GraphModule, inputs: Sequence[Any], fails: _Predicate) -> None:
    """What torch's minifier leaves: nodes nothing reads that dead-code elimination keeps as
    impure (``torch._assert`` of a shape check), tried one at a time, with the placeholders
    no longer read; ``fails`` remembers each smaller failing candidate."""
    for name in reversed([n.name for n in gm.graph.nodes if n.op not in ("placeholder", "output") and not n.users]):
        candidate = copy.deepcopy(gm)
        victim = next((n for n in candidate.graph.nodes if n.name == name), None)
        if victim is None or victim.users:  # gone with an earlier removal
            continue
        candidate.graph.erase_node(victim)
        candidate.graph.eliminate_dead_code()
        kept_inputs = []
        for placeholder, value in zip(list(candidate.graph.find_nodes(op="placeholder")), inputs):
            if placeholder.users:
                kept_inputs.append(value)
            else:
                candidate.graph.erase_node(placeholder)
        candidate.recompile()
        if fails(candidate, kept_inputs):
            gm, inputs = candidate, kept_inputs


def _with_defaults(module: fx.GraphModule, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """``inputs`` followed by the defaults of the placeholders they leave out (``forward(x, mask=None)``):
    the minifier feeds every placeholder, and appends placeholders that have no default."""
    missing = list(module.graph.find_nodes(op="placeholder"))[len(inputs):]
    without_default = [p.name for p in missing if not p.args]
    if without_default:
        raise FxVerifyError(f"cannot minimise: the module needs inputs {without_default} that were not given")
    return inputs + tuple(p.args[0] for p in missing)


class _BudgetSpent(Exception):
    pass


class _Predicate:
    """``module_fails(gm, inputs)`` for torch's minifier, remembering the smallest failing candidate."""

    def __init__(self, transform: Transform, capture: Capture, tolerance: Tolerance,
                 timeout: float | None, deadline: float, prepare: Prepare | None) -> None:
        self.transform, self.capture, self.tolerance = transform, capture, tolerance
        self.timeout, self.deadline, self.prepare = timeout, deadline, prepare
        self.kind: str | None = None
        self.queries = 0
        self.best: tuple[fx.GraphModule, Sequence[Any]]

    def __call__(self, candidate: fx.GraphModule, inputs: Sequence[Any]) -> bool:
        if time.monotonic() > self.deadline:
            raise _BudgetSpent()
        self.queries += 1
        failed = self.outcome(candidate, inputs) == self.kind
        if failed and len(candidate.graph.nodes) < len(self.best[0].graph.nodes):
            self.remember(candidate, inputs)
        return failed

    def remember(self, candidate: fx.GraphModule, inputs: Sequence[Any]) -> None:
        self.best = (candidate, list(inputs))

    def outcome(self, candidate: fx.GraphModule, inputs: Sequence[Any]) -> str | None:
        """RAISES or DIFFERS when the transform's result fails on ``candidate``, else None (the
        candidate itself cannot run, or the transform raised on it: another failure)."""
        try:
            self._compare(candidate, inputs)
        except _ResultRaised:
            return RAISES
        except _NotThisFailure:
            return None
        except _Differs:
            return DIFFERS
        return None

    def failure(self, candidate: fx.GraphModule, inputs: Sequence[Any]) -> Exception | None:
        """How the transform fails on ``candidate`` (None: it does not)."""
        try:
            self._compare(candidate, inputs)
        except (_ResultRaised, _NotThisFailure, _Differs) as failure:
            return failure
        return None

    def rtol_atol(self, candidate: fx.GraphModule, inputs: Sequence[Any]) -> tuple[float, float]:
        dtype = next((t.dtype for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point()),
                     torch.float32)
        return self.tolerance.for_dtype(dtype)

    def _compare(self, candidate: fx.GraphModule, inputs: Sequence[Any]) -> None:
        given = copy.deepcopy(candidate)
        for node in given.graph.nodes:  # the minifier's bookkeeping is no business of the transform
            node.meta.pop("concrete_value", None)
        try:
            expected = candidate(*cloned(inputs))
        except Exception as exc:
            raise _NotThisFailure(f"the subgraph itself raised {exception_summary(exc)}") from None
        if self.prepare is not None:
            try:
                given = self.prepare(given, cloned(inputs))
            except Exception as exc:  # whatever capturing the subgraph raises: not a candidate
                raise _NotThisFailure(f"capturing the subgraph raised {exception_summary(exc)}") from None
        try:
            result, _ = self.capture.apply(self.transform, given, timeout=self.timeout)
        except TransformFailed as exc:
            raise _NotThisFailure(exc.cause) from None
        try:
            actual = result(*cloned(inputs))
        except Exception as exc:
            raise _ResultRaised(exc) from None
        found = compare_trees(actual, expected, tolerance=self.tolerance,
                              fp64_expected=lambda: _in_float64(candidate, inputs))
        if found is not None:
            raise _Differs(found)


class _NotThisFailure(Exception):
    pass


class _ResultRaised(Exception):
    def __init__(self, error: Exception) -> None:
        super().__init__(f"the transformed subgraph raised {type(error).__name__}: {error}")
        self.error = type(error).__qualname__


class _Differs(Exception):
    def __init__(self, found: Mismatch) -> None:
        super().__init__(f"outputs differ: {found.describe()}")


def _in_float64(candidate: fx.GraphModule, inputs: Sequence[Any]) -> Any:
    double = [t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in cloned(inputs)]
    return copy.deepcopy(candidate).double()(*double)


def cloned(inputs: Sequence[Any]) -> list[Any]:
    """Fresh copies: in-place ops of one run must not reach the next."""
    return [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
