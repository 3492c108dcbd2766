"""Compile backends under test: what ``torch.compile(model, backend=fn)`` does with ``fn(gm, example_inputs)``
and the callable it returns, checked on a corpus model one aspect at a time (:func:`check_backend`).

Every compile wraps the backend in a :class:`Recorder`, which notes each call dynamo makes of it (the graph's
size, its example inputs, what the backend changed in the GraphModule it was handed) and nothing else. Outputs
and gradients are judged against eager by fxverify's float64 rule
(:func:`fxverify.analysis.compare.compare_trees`): where not allclose, the compiled model's error against the
eager model run in float64 may be a small multiple of eager's own. The aspects, in :data:`ASPECTS` order:

- ``backend-outputs``: the model compiled with static shapes, eval mode, on its primary input;
- ``backend-recompile``: the same compiled model at another batch size of the entry (``batch_sizes``): dynamo
  specialises the graph again and hands it to the backend again (a backend caching its artifact by a key the
  two graphs share is wrong there);
- ``backend-input-unchanged``: every GraphModule handed to the backend is unchanged when the backend returns (its
  graph, code and tensors; pytorch#138980: ``compile_fx`` rewrote the output node's args to ``(None,)``);
- ``backend-graph-breaks``: on a model dynamo splits into several graphs, every graph went through the backend and
  the outputs agree;
- ``backend-dynamic-shapes``: ``torch.compile(dynamic=True)`` at two batch sizes;
- ``backend-gradients``: gradients of ``sum(outputs * fixed random weights)`` with respect to the inputs and
  parameters, in eval mode (no dropout mask or batch statistics to match);
- ``backend-backward-graph``: for a backend made by ``aot_autograd``, its ``bw_compiler`` got the backward graph.
  Dynamo hands any backend forward graphs only (pytorch#114189): a plain callable never sees a backward graph,
  autograd differentiates what it returns, and the aspect skips saying so.

A backend that raises, hangs or returns what is not callable fails the aspects that needed it, naming it, the model
and the graph it was handed. Costs measured on 2 cores: 0.1-0.8 s a dynamo capture of an edge entry or resnet18.
"""

from __future__ import annotations

import dataclasses
import functools
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx, nn
from torch._dynamo.backends.common import AotAutograd
from torch._dynamo.utils import counters

from fxverify.analysis.compare import Mismatch, Tolerance, compare_trees, compare_values
from fxverify.analysis.graph_text import node_line
from fxverify.analysis.module_state import Snapshot
from fxverify.cases.case import ModelCase, load_case
from fxverify.cases.inputs import InputConfig, with_batch
from fxverify.checks.gradients import loss_gradients
from fxverify.core.results import ERROR, FAILED, PASSED, SKIPPED, CheckResult, Finding, Outcome, Skip, exception_summary
from fxverify.core.transform import CallTimedOut, call_with_timeout, load_object
from fxverify.engine.subject import DEFAULT_TIMEOUT
from fxverify.errors import TransformLoadError

Backend = Callable[[fx.GraphModule, list[torch.Tensor]], Callable[..., Any]]

ASPECTS: tuple[str, ...] = (
    "backend-outputs",
    "backend-recompile",
    "backend-input-unchanged",
    "backend-graph-breaks",
    "backend-dynamic-shapes",
    "backend-gradients",
    "backend-backward-graph",
)
LOSS = "loss = sum(outputs * fixed random weights)"


@dataclasses.dataclass(frozen=True)
class BackendCall:
    """One call dynamo made of the backend under test: the ``number``-th, with a graph of ``nodes`` nodes and
    example inputs of ``shapes``; ``changed`` says what the backend changed in that GraphModule (None: nothing)
    and ``node`` is the first node that differs; ``raised`` what the backend raised, or why what it returned is
    no compiled graph."""

    number: int
    nodes: int
    shapes: str
    changed: str | None = None
    node: str | None = None
    raised: str | None = None

    def describe(self) -> str:
        """e.g. ``graph 2 (14 nodes, example inputs 1x8, 8x8)``."""
        return f"graph {self.number} ({self.nodes} nodes, example inputs {self.shapes})"


class Recorder:
    """``backend`` as dynamo is handed it: each call is recorded as a :class:`BackendCall`, the GraphModule
    snapshot before the backend runs and compared after it returns. A backend made by ``aot_autograd`` is
    called through a copy whose compilers count the forward and backward graphs they get; the backend's own
    object is left as it was.

    >>> recorder = Recorder(lambda gm, example_inputs: gm.forward, "identity")
    >>> gm = fx.symbolic_trace(nn.ReLU())
    >>> _ = recorder(gm, [torch.ones(2)]); recorder.calls[0].describe(), recorder.calls[0].changed
    ('graph 1 (3 nodes, example inputs 2)', None)
    """

    def __init__(self, backend: Backend, name: str) -> None:
        self.backend, self.name = backend, name
        self.calls: list[BackendCall] = []
        self.forward_graphs = 0  # graphs the aot_autograd compilers got: forward or inference
        self.backward_graphs = 0

    @property
    def made_by_aot_autograd(self) -> bool:
        return isinstance(self.backend, AotAutograd)

    def __call__(self, gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
        before, lines = Snapshot.take(gm), node_lines(gm)
        call = BackendCall(len(self.calls) + 1, len(gm.graph.nodes), _shapes(example_inputs))
        try:
            compiled = self._observed()(gm, example_inputs)
        except Exception as exc:
            if _timed_out(exc):
                raise
            self.calls.append(dataclasses.replace(call, raised=exception_summary(exc)))
            raise
        changed = before.first_difference(gm)
        call = dataclasses.replace(call, changed=changed, node=changed and first_changed_node(lines, gm))
        if not callable(compiled):
            why = f"it returned {type(compiled).__name__}, which is not callable"
            self.calls.append(dataclasses.replace(call, raised=why))
            raise TypeError(f"backend {self.name} returned {type(compiled).__name__} for {call.describe()}")
        self.calls.append(call)
        return compiled

    def _observed(self) -> Backend:
        if not isinstance(self.backend, AotAutograd):
            return self.backend
        kwargs: dict[str, Any] = dict(self.backend.kwargs)  # AotAutograd writes its kwargs when called
        forward = kwargs["fw_compiler"]
        backward = kwargs.get("bw_compiler") or forward
        inference = kwargs.get("inference_compiler") or forward

        def counted(compiler: Callable[..., Any], which: str) -> Callable[..., Any]:
            def compile_counted(gm: fx.GraphModule, example_inputs: Any) -> Any:
                setattr(self, which, getattr(self, which) + 1)
                return compiler(gm, example_inputs)

            return compile_counted

        kwargs.update(fw_compiler=counted(forward, "forward_graphs"), bw_compiler=counted(backward, "backward_graphs"),
                      inference_compiler=counted(inference, "forward_graphs"))
        return AotAutograd(**kwargs)

    @property
    def failed(self) -> BackendCall | None:
        """The call in which the backend raised or returned no callable, if any."""
        return next((call for call in self.calls if call.raised), None)


def node_lines(gm: fx.GraphModule) -> list[str]:
    """Each node of ``gm`` as its canonical line without its users (:func:`fxverify.analysis.graph_text.node_line`):
    a node whose line differs later is one that changed, not one whose user did."""
    return [node_line(node, users=False) for node in gm.graph.nodes]


def first_changed_node(before: list[str], gm: fx.GraphModule) -> str | None:
    """The first of the ``before`` lines (:func:`node_lines`) that ``gm``'s nodes no longer read, as it read before;
    None when none changed.

    >>> gm = fx.symbolic_trace(nn.ReLU()); before = node_lines(gm)
    >>> gm.graph.output_node().args = (None,)  # what compile_fx did to the graph it was handed (pytorch#138980)
    >>> first_changed_node(before, gm)
    'output output target=output args=(%relu,) kwargs={}'
    """
    now = node_lines(gm)
    for was, line in zip(before, now):
        if was != line:
            return was
    if len(before) != len(now):
        return before[len(now)] if len(before) > len(now) else f"(added) {now[len(before)]}"
    return None


def resolve_backend(backend: Backend | str) -> tuple[Backend, str]:
    """The backend and its name for messages: a callable as given, or the object a ``'package.module:name'``
    spec names (:func:`fxverify.core.transform.load_object`).

    >>> resolve_backend("torch._dynamo.backends.debugging:eager")[1]
    'torch._dynamo.backends.debugging:eager'
    >>> resolve_backend("fxverify.compile.backend:ASPECTS")
    Traceback (most recent call last):
    fxverify.errors.TransformLoadError: backend spec 'fxverify.compile.backend:ASPECTS' names a tuple, not a ...
    """
    if isinstance(backend, str):
        loaded = load_object(backend, "backend")
        if not callable(loaded):
            raise TransformLoadError(
                f"backend spec {backend!r} names a {type(loaded).__name__}, not a callable: a backend is what "
                "torch.compile(model, backend=fn) takes, fn(gm, example_inputs) returning a callable")
        return loaded, backend
    if not callable(backend):
        raise TransformLoadError(f"a backend must be callable, fn(gm, example_inputs) returning a callable; got "
                                 f"{type(backend).__name__}")
    return backend, _name_of(backend)


def check_backend(backend: Backend | str, case: ModelCase | str, *, aspects: Sequence[str] | None = None,
                  dtype: torch.dtype = torch.float32, timeout: float | None = DEFAULT_TIMEOUT) -> list[CheckResult]:
    """One :class:`~fxverify.core.results.CheckResult` per aspect (:data:`ASPECTS`, or those named) of
    ``backend`` compiling corpus model ``case`` in ``dtype``; each compile may take ``timeout`` seconds.

    >>> from functorch.compile import make_boxed_func
    >>> from torch._dynamo.backends.common import aot_autograd
    >>> boxed = aot_autograd(fw_compiler=lambda gm, example_inputs: make_boxed_func(gm.forward))
    >>> [r.outcome.value for r in check_backend(boxed, "edge_conv_bn_head")]  # doctest: +SKIP
    ['passed', 'passed', 'passed', 'skipped', 'passed', 'passed', 'passed']
    """
    unknown = [name for name in aspects or () if name not in ASPECTS]
    if unknown:
        raise TransformLoadError(f"unknown backend aspect(s) {unknown}; the aspects are {', '.join(ASPECTS)}")
    fn, name = resolve_backend(backend)
    trial = Trial(fn, name, load_case(case) if isinstance(case, str) else case, dtype, timeout)
    return [trial.result(aspect) for aspect in (aspects or ASPECTS)]


@dataclasses.dataclass
class Run:
    """One compile of the model (a fresh instance) with the recorded backend and what came of it: the outputs
    (or gradients) at each input configuration run, or the ``error`` that stopped it and the configuration it
    stopped at; ``graphs`` is how many graphs dynamo compiled."""

    recorder: Recorder
    values: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None
    stopped_at: InputConfig | None = None
    graphs: dict[str, int] = dataclasses.field(default_factory=dict)  # graphs dynamo compiled until a config ran
    breaks: list[str] = dataclasses.field(default_factory=list)  # dynamo's reasons for graph breaks


class Trial:
    """``backend`` (named ``name``) on ``case`` in ``dtype``: the compiles the aspects share, each made once and
    on demand, and the eager references they are judged against."""

    def __init__(self, backend: Backend, name: str, case: ModelCase, dtype: torch.dtype, timeout: float | None) -> None:
        self.backend, self.name, self.case, self.dtype, self.timeout = backend, name, case, dtype, timeout
        self.primary = case.configs[0]
        batch = self.primary.specs[0].shape[0]
        self.other = next((with_batch(self.primary, b) for b in case.entry.batch_sizes if b != batch), None)
        self.tolerance = Tolerance(case.entry.rtol, case.entry.atol)
        self._outputs_of: dict[tuple[str, torch.dtype], Any] = {}  # eager outputs by configuration and dtype
        self._gradients_of: dict[torch.dtype, dict[str, Any]] = {}

    def result(self, aspect: str) -> CheckResult:
        check = getattr(self, "_" + aspect.removeprefix("backend-").replace("-", "_"))
        try:
            details = check() or {}
        except Skip as skip:
            return self._result(aspect, SKIPPED, message=str(skip))
        except Finding as finding:
            return self._failed(aspect, finding)
        except Exception as exc:  # fxverify's own code raised: no verdict on the backend
            message = (f"fxverify error in the {aspect} check (not a finding about the backend): running it on "
                       f"{self.case.name} raised {exception_summary(exc)} inside fxverify; please report it")
            return self._result(aspect, ERROR, message=message, finding=message)
        return self._result(aspect, PASSED, details=details)

    # the aspects

    def _outputs(self) -> dict[str, Any]:
        run = self._static
        self._judge(run, self.primary)
        return {"graphs": run.graphs[self.primary.name], "backend_calls": len(run.recorder.calls)}

    def _recompile(self) -> dict[str, Any]:
        if self.other is None:
            raise Skip(f"corpus entry {self.case.name} lists one batch size ({self.case.entry.batch_sizes}): "
                       "no recompile at another size to check")
        run = self._static
        self._judge(run, self.primary)
        self._judge(run, self.other, after=self.primary)
        return {"configs": [self.primary.name, self.other.name], "backend_calls": len(run.recorder.calls)}

    def _input_unchanged(self) -> dict[str, Any]:
        run = self._static
        for call in run.recorder.calls:
            if call.changed:
                raise Finding(
                    f"backend {self.name} changed the GraphModule dynamo handed it ({call.describe()}): "
                    f"{call.changed}. Dynamo and the code around a backend still read that graph after the call "
                    "(pytorch#138980: compile_fx rewrote the output node's args to (None,)); work on a copy "
                    "(copy.deepcopy(gm)) and return a callable of the copy",
                    where=f"{call.describe()} handed to the backend", node=call.node)
        if not any(not call.raised for call in run.recorder.calls):
            self._raise_if_stopped(run)
        return {"graphs_checked": len(run.recorder.calls)}

    def _graph_breaks(self) -> dict[str, Any]:
        run = self._static
        self._raise_if_stopped(run, self.primary)
        graphs = run.graphs[self.primary.name]
        if graphs <= 1:
            raise Skip(f"dynamo captured {self.case.name} whole, in one graph: no graph break to check (models with "
                       "data-dependent control flow, such as edge_data_dependent_flow, have one)")
        called = len([call for call in run.recorder.calls if call.number <= graphs])
        if called != graphs:
            raise Finding(f"dynamo compiled {graphs} graphs but the backend {self.name} was called {called} times: "
                          "a graph went round it", where="the graphs of the graph break", details={"breaks": run.breaks})
        self._judge(run, self.primary)
        return {"graphs": graphs, "breaks": run.breaks}

    def _dynamic_shapes(self) -> dict[str, Any]:
        if self.other is None:
            raise Skip(f"corpus entry {self.case.name} lists one batch size ({self.case.entry.batch_sizes}): "
                       "dynamic=True is checked at two")
        run = self._dynamic
        self._judge(run, self.primary, how="dynamic=True")
        self._judge(run, self.other, after=self.primary, how="dynamic=True")
        return {"configs": [self.primary.name, self.other.name], "backend_calls": len(run.recorder.calls)}

    def _gradients(self) -> dict[str, Any]:
        expected = self._eager_gradients(self.dtype)
        run = self._training
        self._raise_if_stopped(run, how=f"backward, {LOSS}")
        actual = run.values[self.primary.name]
        if actual is None:
            raise Finding("the compiled model's outputs do not require grad, where eager's do: gradients do not flow "
                          f"through what backend {self.name} returned", input=self._where(self.primary, LOSS))
        for label in expected:
            found = compare_values(actual.get(label), expected[label], path=f"grad of {label}", tolerance=self.tolerance,
                                   fp64=functools.partial(self._eager_gradient, label))
            if found is not None:
                raise Finding(f"gradients differ: {found.describe()}", input=self._where(self.primary, LOSS),
                              where=found.path, max_abs=found.max_abs, max_rel=found.max_rel)
        return {"compared": len(expected)}

    def _backward_graph(self) -> dict[str, Any]:
        if not isinstance(self.backend, AotAutograd):
            raise Skip(f"backend {self.name} is a plain callable, not made by aot_autograd: dynamo hands a backend "
                       "forward graphs only and autograd differentiates what it returns (pytorch#114189); "
                       "backend-gradients compares its gradients. To compile backward graphs, build it with "
                       "torch._dynamo.backends.common.aot_autograd(fw_compiler=..., bw_compiler=...)")
        run = self._training
        self._raise_if_stopped(run, how=f"backward, {LOSS}")
        if run.values[self.primary.name] is None:
            raise Skip("the compiled model's outputs do not require grad: no backward ran (backend-gradients says why)")
        recorder = run.recorder
        if recorder.backward_graphs == 0:
            raise Finding(
                f"backward ran through the model compiled with backend {self.name}, made by aot_autograd, but its "
                f"bw_compiler never got a backward graph ({recorder.forward_graphs} forward graphs compiled): the "
                "gradients came from elsewhere than the compiled backward. Make fw_compiler's callable keep autograd's "
                "graph (return a callable of the graph it is handed)", input=self._where(self.primary, LOSS))
        return {"forward_graphs": recorder.forward_graphs, "backward_graphs": recorder.backward_graphs}

    # the compiles

    @functools.cached_property
    def _static(self) -> Run:
        return self._compiled(dynamic=False, configs=[self.primary] + ([self.other] if self.other else []))

    @functools.cached_property
    def _dynamic(self) -> Run:
        assert self.other is not None
        return self._compiled(dynamic=True, configs=[self.primary, self.other])

    @functools.cached_property
    def _training(self) -> Run:
        return self._compiled(dynamic=False, configs=[self.primary], backward=True)

    def _compiled(self, *, dynamic: bool, configs: list[InputConfig], backward: bool = False) -> Run:
        run = Run(Recorder(self.backend, self.name))
        model = self._model(self.dtype)
        graphs, breaks = counters["stats"]["unique_graphs"], dict(counters["graph_break"])

        def compile_and_run() -> None:
            torch._dynamo.reset()
            compiled = torch.compile(model, backend=run.recorder, dynamic=dynamic)
            assert isinstance(compiled, nn.Module)  # torch.compile of a module is an OptimizedModule
            for config in configs:
                run.stopped_at = config
                inputs = config.make(self.case.seed, dtype=self.dtype)
                if backward:
                    params = {name: f"_orig_mod.{name}" for name, _ in model.named_parameters()}
                    run.values[config.name] = loss_gradients(compiled, inputs, self.case.seed, params, lambda m: m.eval())
                else:
                    with torch.no_grad():
                        run.values[config.name] = compiled(*inputs)
                run.graphs[config.name] = counters["stats"]["unique_graphs"] - graphs
            run.stopped_at = None

        try:
            call_with_timeout(compile_and_run, (), self.timeout)
        except Exception as exc:
            run.error = (f"did not finish within {self.timeout:g} s (raise timeout= if it is just slow)"
                         if _timed_out(exc) else exception_summary(exc))
        finally:
            torch._dynamo.reset()
        run.breaks = sorted(reason for reason, count in counters["graph_break"].items() if count > breaks.get(reason, 0))
        return run

    # the eager references

    def _model(self, dtype: torch.dtype) -> nn.Module:
        return self.case.build().to(dtype)

    def _eager(self, config: InputConfig, dtype: torch.dtype) -> Any:
        key = (config.name, dtype)
        if key not in self._outputs_of:
            with torch.no_grad():
                self._outputs_of[key] = self._model(dtype)(*config.make(self.case.seed, dtype=dtype))
        return self._outputs_of[key]

    def _eager_gradients(self, dtype: torch.dtype) -> dict[str, Any]:
        if dtype not in self._gradients_of:
            self._gradients_of[dtype] = self._eager_gradients_uncached(dtype)
        return self._gradients_of[dtype]

    def _eager_gradients_uncached(self, dtype: torch.dtype) -> dict[str, Any]:
        model = self._model(dtype)
        params = {name: name for name, _ in model.named_parameters()}
        try:
            grads = loss_gradients(model, self.primary.make(self.case.seed, dtype=dtype), self.case.seed, params,
                               lambda m: m.eval())
        except Exception as exc:
            raise Skip(f"backward through the eager model raised {exception_summary(exc)}: no gradients to compare "
                       "with") from None
        if grads is None:
            raise Skip(f"{self.case.name}'s outputs do not depend differentiably on its inputs or parameters")
        return grads

    def _eager_gradient(self, label: str) -> Any:
        return self._eager_gradients(torch.float64).get(label)

    # judging

    def _judge(self, run: Run, config: InputConfig, *, after: InputConfig | None = None, how: str = "static shapes") -> None:
        """Raise the finding of the compiled outputs at ``config`` against eager's (or of the run stopping
        before they were had); ``after``: the configuration the same compiled model ran right at before."""
        self._raise_if_stopped(run, config, how=how, after=after)
        found: Mismatch | None = compare_trees(
            run.values[config.name], self._eager(config, self.dtype), tolerance=self.tolerance,
            fp64_expected=functools.partial(self._eager, config, torch.float64))
        if found is not None:
            raise Finding(f"outputs of the model compiled with backend {self.name} differ from eager: "
                          f"{found.describe()}{_second(run, after, config)}\n{self._calls(run)}",
                          input=self._where(config, how), where=found.path, max_abs=found.max_abs,
                          max_rel=found.max_rel)

    def _raise_if_stopped(self, run: Run, config: InputConfig | None = None, *, how: str = "static shapes",
                          after: InputConfig | None = None) -> None:
        """The finding of a run that stopped (at ``config`` or before it; any configuration when None)."""
        if run.error is None or (config is not None and config.name in run.values):
            return
        at = run.stopped_at or self.primary
        failed = run.recorder.failed
        if failed is not None:
            raise Finding(f"backend {self.name} failed on {failed.describe()}: {failed.raised}. A backend must return "
                          "a callable computing the graph it is handed (gm.forward, at least)",
                          input=self._where(at, how), where=failed.describe())
        if self._eager_raises(at):
            raise Skip(f"the eager model raises at {at.name}: nothing to compile")
        if _dynamo_itself_fails(self._model(self.dtype), at.make(self.case.seed, dtype=self.dtype)):
            raise Skip(f"torch.compile with backend='eager' fails on {self.case.name} too ({run.error}): dynamo, not "
                       f"backend {self.name}, cannot compile it")
        raise Finding(f"the model compiled with backend {self.name} raised at {at.name}, where eager runs: {run.error}"
                      f"{_second(run, after if at == config else None, at)}\n{self._calls(run)}", input=self._where(at, how))

    def _eager_raises(self, config: InputConfig) -> bool:
        try:
            self._eager(config, self.dtype)
        except Exception:
            return True
        return False

    def _calls(self, run: Run) -> str:
        calls = "; ".join(call.describe() for call in run.recorder.calls) or "none"
        return f"backend calls: {calls}"

    def _where(self, config: InputConfig, how: str) -> str:
        return f"{config.describe()}, {str(self.dtype).removeprefix('torch.')}, eval mode, {how}"

    # results

    def _result(self, aspect: str, outcome: Outcome, **fields: Any) -> CheckResult:
        return CheckResult(aspect, self.case.name, self.name, outcome, **fields)

    def _failed(self, aspect: str, finding: Finding) -> CheckResult:
        entry = self.case.entry
        lines = [f"fxverify {aspect} check failed",
                 f"  model:      {entry.name} ({entry.source}, torch.compile)",
                 f"  backend:    {self.name}"]
        if finding.input:
            lines.append(f"  input:      {finding.input}")
        if finding.where:
            lines.append(f"  first diff: {finding.where}")
        if finding.node:
            lines.append(f"  first node: {finding.node}")
        lines.append("  finding:    " + textwrap.indent(finding.what, " " * 14).lstrip())
        return self._result(aspect, FAILED, message="\n".join(lines), details=finding.details, finding=finding.what,
                            input=finding.input, where=finding.where, node=finding.node, max_abs=finding.max_abs,
                            max_rel=finding.max_rel)


def _dynamo_itself_fails(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> bool:
    """Whether ``torch.compile(model, backend="eager")`` raises on ``inputs``: the failure is dynamo's then."""
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            torch.compile(model, backend="eager")(*inputs)
    except Exception:
        return True
    finally:
        torch._dynamo.reset()
    return False


def _second(run: Run, first: InputConfig | None, then: InputConfig) -> str:
    """What a failure at ``then``, after the same compiled model ran right at ``first``, points to."""
    if first is None:
        return ""
    if len(run.recorder.calls) <= run.graphs.get(first.name, 0):
        return f"; right at {first.name}, run first, and dynamo reused what it compiled for it"
    return (f"; right at {first.name}, run first. Dynamo compiled the graph again for {then.name} and handed it to "
            "the backend: what the backend returned for it is wrong for these inputs. A backend specialising on its "
            "example inputs (shapes baked into what it compiles) must not reuse that for a graph with other example "
            "inputs, as a cache keyed by the graph's code alone does")


def _timed_out(exc: BaseException | None) -> bool:
    """Whether ``exc`` is the timeout of :func:`~fxverify.core.transform.call_with_timeout`, or wraps it (dynamo
    wraps what a backend raises in ``BackendCompilerFailed``)."""
    while exc is not None:
        if isinstance(exc, CallTimedOut):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _shapes(example_inputs: Sequence[Any]) -> str:
    return ", ".join("x".join(map(str, x.shape)) or "scalar" if isinstance(x, torch.Tensor) else repr(x)
                     for x in example_inputs)


def _name_of(backend: Any) -> str:
    """How messages name a backend given as an object: its qualified name, or its class's."""
    if isinstance(backend, AotAutograd):
        compilers = ", ".join(f"{key}={_name_of(fn)}" for key, fn in backend.kwargs.items()
                              if key in ("fw_compiler", "bw_compiler") and fn is not None)
        return f"aot_autograd({compilers})"
    named = backend if hasattr(backend, "__qualname__") else type(backend)
    return f"{named.__module__}:{named.__qualname__}"


__all__ = ["ASPECTS", "BackendCall", "Recorder", "check_backend", "first_changed_node", "node_lines", "resolve_backend"]
