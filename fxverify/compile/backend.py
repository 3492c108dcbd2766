"""Compile backends under test: what ``torch.compile(model, backend=fn)`` does with ``fn(gm, example_inputs)``
and the callable it returns, checked on a corpus model one aspect at a time (:func:`check_backend`).

Every compile wraps the backend in a :class:`Recorder`, which notes each call dynamo makes of it (the graph's
size, its example inputs, what the backend changed in the GraphModule it was handed) and nothing else. A compiled
model is called in a sequence of :class:`Call` s (a :class:`Run`), and each call is judged against a fresh eager
model given the same sequence of calls, in the same mode (a :class:`Replay`): a model that updates buffers in
forward (a running mean, a call counter, a KV cache) starts each call from the state its earlier calls left, in
both. Each call's outputs, then the model's buffers after it, are judged by fxverify's float64 rule
(:func:`fxverify.analysis.compare.compare_trees`): where not allclose, the compiled model's error against the
eager model run in float64 may be a small multiple of eager's own. The aspects, each a check of the registry
(:mod:`fxverify.checks`) taking a :class:`Trial`, in its order:

- ``backend-outputs``: the model compiled with static shapes, eval mode, under ``torch.no_grad()``, on its
  primary input;
- ``backend-recompile``: the same compiled model at another batch size of the entry (``batch_sizes``): dynamo
  specialises the graph again and hands it to the backend again (a backend caching its artifact by a key the
  two graphs share is wrong there);
- ``backend-dtypes``: one backend (its own state kept) compiles the model in bfloat16, then in float32, at sizes
  the earlier aspects did not compile: each call must give eager's outputs in its own dtype (a cache of
  compiled graphs keyed by the graph's code and shapes, not dtypes, serves the bfloat16 artifact to float32);
- ``backend-input-unchanged``: every GraphModule handed to the backend, with static shapes and under
  ``dynamic=True``, is unchanged when the backend returns (its graph, code and tensors; pytorch#138980:
  ``compile_fx`` rewrote the output node's args to ``(None,)``; a backend specialising a dynamic graph to its
  example's sizes in place changes what dynamo reuses at other sizes), and so are the values of its example
  inputs (the model's own parameters and buffers: a backend warming up on them steps a buffer-updating model's
  state while compiling, which ``backend-outputs`` then names as the cause);
- ``backend-graph-breaks``: on a model dynamo splits into several graphs, every graph went through the backend and
  the outputs agree;
- ``backend-dynamic-shapes``: ``torch.compile(dynamic=True)`` called at every size the model's inputs allow, one
  dimension at a time (:meth:`Trial.variations`: each size of the primary input eager also runs at, such as a
  sequence length, then the batch at a size dynamo keeps symbolic, then the entry's other batch size). The
  dimensions no call varies are marked static (``torch._dynamo.mark_static``): eager runs at no other size of
  them, so no call could show a backend wrong there, and symbolic they can cost dynamo more than the whole check
  (maxvit_t's window partitioning: many times the whole check's time in shape reasoning);
- ``backend-gradients``: gradients of ``sum(outputs * fixed random weights)`` with respect to the inputs and
  parameters, in eval mode (no dropout mask or batch statistics to match);
- ``backend-backward-graph``: for a backend made by ``aot_autograd``, its ``bw_compiler`` got the backward graph.
  Dynamo hands any backend forward graphs only (pytorch#114189): a plain callable never sees a backward graph,
  autograd differentiates what it returns, and the aspect skips saying so.

A backend declares what it promises with :func:`fxverify.contract` (:class:`~fxverify.core.contracts.Contract`):
``modes=("eval",)``, an inference backend, promises eager's results under ``torch.no_grad()`` (the two gradient
aspects skip, saying so); ``dtypes`` the dtypes it runs (the other parts of the dtype sequence, or every aspect of
a model in another dtype, skip); ``rtol`` / ``atol`` / ``range_tol`` loosen the tolerances.

A backend that raises, hangs or returns what is not callable fails the aspects that needed it, naming it, the model
and the graph it was handed; where ``torch.compile(backend="eager")`` (dynamo alone) fails on the same calls too,
the aspect skips, naming dynamo. What it costs: a dynamo capture a run of calls, two static compiles a model for
the dtype sequence, one call (and an eager probe) a size ``backend-dynamic-shapes`` varies (docs/performance.md).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx, nn
from torch._dynamo.backends.common import AotAutograd
from torch._dynamo.utils import counters
from torch._subclasses.fake_tensor import is_fake
from torch.utils._pytree import tree_leaves, tree_map

from fxverify import checks
from fxverify.analysis.compare import Mismatch, Tolerance, compare_trees, compare_values
from fxverify.analysis.graph_text import node_line
from fxverify.analysis.module_state import Snapshot, tensors_equal
from fxverify.cases.case import ModelCase, load_case
from fxverify.cases.inputs import InputConfig, with_batch, with_size
from fxverify.checks.gradients import loss_gradients
from fxverify.core.contracts import STRICT, Contract, contract_of
from fxverify.core.results import CheckResult, Finding, Skip, exception_summary
from fxverify.core.transform import CallTimedOut, call_with_timeout, load_object
from fxverify.engine.judging import judge
from fxverify.engine.subject import DEFAULT_TIMEOUT
from fxverify.errors import TransformLoadError

Backend = Callable[[fx.GraphModule, list[torch.Tensor]], Callable[..., Any]]

GRADIENT_ASPECTS = ("backend-gradients", "backend-backward-graph")  # the calls that record autograd
DTYPE_SEQUENCE = (torch.bfloat16, torch.float32)  # backend-dtypes: compiled in this order, one backend
LOSS = "loss = sum(outputs * fixed random weights)"


@dataclasses.dataclass(frozen=True)
class BackendCall:
    """One call dynamo made of the backend under test: the ``number``-th, with a graph of ``nodes`` nodes and
    example inputs of ``shapes``; ``changed`` says what the backend changed in that GraphModule (None: nothing)
    and ``node`` is the first node that differs; ``inputs_changed`` the first of its example inputs whose values it
    changed; ``raised`` what the backend raised, or why what it returned is no compiled graph."""

    number: int
    nodes: int
    shapes: str
    changed: str | None = None
    node: str | None = None
    raised: str | None = None
    inputs_changed: str | None = None  # the first example input whose values the backend changed, and how

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
        return isinstance(undecorated(self.backend), AotAutograd)

    def __call__(self, gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
        before, lines = Snapshot.take(gm), node_lines(gm)
        values = [x.detach().clone() if _real_tensor(x) else None for x in example_inputs]
        call = BackendCall(len(self.calls) + 1, len(gm.graph.nodes), _shapes(example_inputs))
        try:
            compiled = self._observed()(gm, example_inputs)
        except Exception as exc:
            if _timed_out(exc) or isinstance(exc, torch._dynamo.exc.RestartAnalysis):  # dynamo's, traced again
                raise
            self.calls.append(dataclasses.replace(call, raised=exception_summary(exc)))
            raise
        changed = before.first_difference(gm)
        call = dataclasses.replace(call, changed=changed, node=changed and first_changed_node(lines, gm),
                                   inputs_changed=_changed_input(values, example_inputs))
        if not callable(compiled):
            why = f"it returned {type(compiled).__name__}, which is not callable"
            self.calls.append(dataclasses.replace(call, raised=why))
            raise TypeError(f"backend {self.name} returned {type(compiled).__name__} for {call.describe()}")
        self.calls.append(call)
        return compiled

    def _observed(self) -> Backend:
        made = undecorated(self.backend)
        if not isinstance(made, AotAutograd):
            return self.backend
        kwargs: dict[str, Any] = dict(made.kwargs)  # AotAutograd writes its kwargs when called
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


def undecorated(backend: Any) -> Any:
    """The object ``@fxverify.contract`` wrapped, where ``backend`` is its wrapper (the wrapper only calls it): an
    ``aot_autograd`` backend is recognised, and its compilers observed, under a contract.

    >>> import fxverify
    >>> from torch._dynamo.backends.common import aot_autograd
    >>> boxed = aot_autograd(fw_compiler=lambda gm, example_inputs: gm)
    >>> undecorated(fxverify.contract(modes=("eval",))(boxed)) is boxed
    True
    """
    while contract_of(backend) is not STRICT and hasattr(backend, "__wrapped__"):
        backend = backend.__wrapped__
    return backend


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
    >>> resolve_backend("fxverify.compile.backend:DTYPE_SEQUENCE")
    Traceback (most recent call last):
    fxverify.errors.TransformLoadError: backend spec 'fxverify.compile.backend:DTYPE_SEQUENCE' names a tuple, not ...
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
    """One :class:`~fxverify.core.results.CheckResult` per aspect (the registry's backend checks, or those named, in
    that order)
    of ``backend`` compiling corpus model ``case`` in ``dtype``; each run of compiled calls may take ``timeout``
    seconds. The backend's contract (:func:`fxverify.contract`) says which aspects apply.

    >>> from functorch.compile import make_boxed_func
    >>> from torch._dynamo.backends.common import aot_autograd
    >>> boxed = aot_autograd(fw_compiler=lambda gm, example_inputs: make_boxed_func(gm.forward))
    >>> [r.outcome.value for r in check_backend(boxed, "edge_conv_bn_head")]  # doctest: +SKIP
    ['passed', 'passed', 'passed', 'passed', 'skipped', 'passed', 'passed', 'passed']
    """
    known = checks.names(checks.BACKEND)
    unknown = [name for name in aspects or () if name not in known]
    if unknown:
        raise TransformLoadError(f"unknown backend aspect(s) {unknown}; the aspects are {', '.join(known)}")
    trial = trial_of(backend, case, dtype=dtype, timeout=timeout)
    return [judge(aspect, checks.get(aspect), trial) for aspect in known if aspects is None or aspect in aspects]


def trial_of(backend: Backend | str, case: ModelCase | str, *, dtype: torch.dtype = torch.float32,
             timeout: float | None = DEFAULT_TIMEOUT) -> Trial:
    """The :class:`Trial` of ``backend`` (a callable or a spec) on corpus model ``case``: the subject of the backend
    checks, whose runs they share."""
    fn, name = resolve_backend(backend)
    return Trial(fn, name, load_case(case) if isinstance(case, str) else case, dtype, timeout)


def backend_subjects(spec: str, given: checks.Given) -> list[tuple[str, Callable[[], Trial]]]:
    """The subjects of backend ``spec`` in a run: a :class:`Trial` on each model it selects (``given.cases``), in
    ``given.dtype``, made when its first check runs."""
    fn, name = resolve_backend(spec)
    dtype = getattr(torch, given.dtype)
    return [(case.name, functools.partial(Trial, fn, name, case, dtype, given.timeout)) for case in given.cases]


@dataclasses.dataclass(frozen=True)
class Call:
    """One call of a compiled model: the inputs of ``config`` given to the model in ``dtype`` (each dtype of a run is
    a model of its own, with its own state); ``varies`` says which dimension the call varies, for messages."""

    config: InputConfig
    dtype: torch.dtype
    varies: str = ""

    def describe(self) -> str:
        """e.g. ``b2-9x16 in float32``."""
        return f"{self.config.name} in {dtype_name(self.dtype)}"


@dataclasses.dataclass
class Run:
    """The ``calls`` of one compile of the model (a fresh instance a dtype) with the recorded backend, and what came
    of them: for each call made, its outputs (or, ``backward``, its gradients), the model's buffers after it, and
    the graphs dynamo and calls of the backend made so far; ``error`` is what stopped the run, at
    ``calls[len(outputs)]``."""

    recorder: Recorder
    calls: tuple[Call, ...]
    dynamic: bool = False
    backward: bool = False
    outputs: list[Any] = dataclasses.field(default_factory=list)
    returned: list[Any] = dataclasses.field(default_factory=list)  # each call's outputs cloned as it returned
    overwritten: dict[int, int] = dataclasses.field(default_factory=dict)  # call -> the later call that changed them
    state: list[dict[str, torch.Tensor]] = dataclasses.field(default_factory=list)
    graphs: list[int] = dataclasses.field(default_factory=list)  # graphs dynamo had compiled when each call returned
    backend_calls: list[int] = dataclasses.field(default_factory=list)  # calls of the backend by then
    error: str | None = None
    timed_out: bool = False  # the error is the time limit
    seconds: float = 0.0  # wall time of the compiles and calls
    tries: int = 1  # runs made of these calls: a second where the first ran out of time and dynamo alone did not
    breaks: list[str] = dataclasses.field(default_factory=list)  # dynamo's reasons for graph breaks

    @property
    def made(self) -> int:
        """How many calls returned."""
        return len(self.outputs)

    def compiled_for(self, i: int) -> list[BackendCall]:
        """The calls dynamo made of the backend for call ``i`` (none where it reused a graph)."""
        before = self.backend_calls[i - 1] if i else 0
        through = self.backend_calls[i] if i < len(self.backend_calls) else len(self.recorder.calls)
        return self.recorder.calls[before:through]


@dataclasses.dataclass
class Replay:
    """Eager's side of a run: a fresh model a dtype given the same calls, in the same mode; the outputs of each call
    and the buffers after it, until ``error``, what eager raised at the call after the last."""

    outputs: list[Any] = dataclasses.field(default_factory=list)
    returned: list[Any] = dataclasses.field(default_factory=list)
    overwritten: dict[int, int] = dataclasses.field(default_factory=dict)
    state: list[dict[str, torch.Tensor]] = dataclasses.field(default_factory=list)
    error: str | None = None


class Trial:
    """``backend`` (named ``name``) on ``case`` in ``dtype``: the runs the aspects share, each made once and on
    demand, and the eager replays they are judged against."""

    def __init__(self, backend: Backend, name: str, case: ModelCase, dtype: torch.dtype, timeout: float | None) -> None:
        self.backend, self.name, self.case, self.dtype, self.timeout = backend, name, case, dtype, timeout
        self.contract: Contract = contract_of(backend)
        self.primary = case.configs[0]
        self.batch = self.primary.specs[0].shape[0]
        self.other = next((with_batch(self.primary, b) for b in case.entry.batch_sizes if b != self.batch), None)
        declared = Tolerance(self.contract.rtol, self.contract.atol, self.contract.range_tol)
        self.tolerance = declared.loosest(Tolerance(case.entry.rtol, case.entry.atol))
        self._replays: dict[tuple[Any, ...], Replay] = {}
        self._dynamo_runs: dict[tuple[Any, ...], Run] = {}
        self._gradients_of: dict[torch.dtype, dict[str, Any]] = {}

    capture = "torch.compile"  # how the model becomes graphs: dynamo hands them to the backend
    about = "the backend"

    # the subject, as results and messages name it (fxverify.engine.judging.Judged)

    @property
    def model(self) -> str:
        return self.case.name

    @property
    def under_test(self) -> str:
        return self.name

    def header(self) -> list[tuple[str, str]]:
        entry = self.case.entry
        return [("model", f"{entry.name} ({entry.source}, torch.compile)"), ("backend", self.name)]

    def reproduce(self, check: str) -> None:
        return None

    def not_applicable(self, aspect: str) -> str | None:
        """Why ``aspect`` is outside what the backend's contract promises, or None."""
        declared = f"backend {self.name} declares"
        dtypes, modes = self.contract.dtypes, self.contract.modes
        if not self.contract.supports_dtype(dtype_name(self.dtype)):
            return (f"{declared} dtypes={'+'.join(dtypes or ())} (@fxverify.contract): not run on a "
                    f"{dtype_name(self.dtype)} model")
        if aspect in GRADIENT_ASPECTS and "train" not in modes:
            return (f"{declared} modes=eval (@fxverify.contract): an inference backend, whose promise is eager's "
                    "results under torch.no_grad(); gradients through what it returns are outside it")
        if aspect not in GRADIENT_ASPECTS and aspect != "backend-input-unchanged" and "eval" not in modes:
            return (f"{declared} modes=train (@fxverify.contract): its promise is the gradients of the calls that "
                    "record autograd (backend-gradients); this aspect's calls run under torch.no_grad()")
        return None

    # the aspects

    def outputs(self) -> dict[str, Any]:
        run = self._static
        self._judge(run, 0)
        return {"graphs": run.graphs[0], "backend_calls": len(run.recorder.calls)}

    def recompile(self) -> dict[str, Any]:
        if self.other is None:
            raise Skip(f"corpus entry {self.case.name} lists one batch size ({self.case.entry.batch_sizes}): "
                       "no recompile at another size to check")
        run = self._static
        self._judge(run, 0)
        self._judge(run, 1)
        return {"configs": [call.config.name for call in run.calls], "backend_calls": len(run.recorder.calls)}

    def dtypes(self) -> dict[str, Any]:
        kept = [dtype for dtype in DTYPE_SEQUENCE if self.contract.supports_dtype(dtype_name(dtype))]
        if len(kept) < len(DTYPE_SEQUENCE):
            left = ", ".join(dtype_name(d) for d in DTYPE_SEQUENCE if d not in kept)
            raise Skip(f"backend {self.name} declares dtypes={'+'.join(self.contract.dtypes or ())} "
                       f"(@fxverify.contract): the {left} part of the dtype sequence ("
                       f"{' then '.join(dtype_name(d) for d in DTYPE_SEQUENCE)}, one backend) is not run, and "
                       "one dtype makes no sequence")
        run = self._dtype_run
        for i in range(len(run.calls)):
            self._judge(run, i)
        return {"sequence": [call.describe() for call in run.calls], "backend_calls": len(run.recorder.calls)}

    def input_unchanged(self) -> dict[str, Any]:
        runs = [self._static, self._dynamic] if "eval" in self.contract.modes else [self._training]
        for run in runs:
            for call in run.recorder.calls:
                if call.changed:
                    dynamic = " under dynamic=True" if run.dynamic else ""
                    advice = (", and keep its sizes symbolic: dynamo reuses the graph at every size its guards "
                              "accept" if run.dynamic else "")
                    raise Finding(
                        f"backend {self.name} changed the GraphModule dynamo handed it{dynamic} ({call.describe()}): "
                        f"{call.changed}. Dynamo and the code around a backend still read that graph after the call "
                        "(pytorch#138980: compile_fx rewrote the output node's args to (None,)); work on a copy "
                        f"(copy.deepcopy(gm)) and return a callable of the copy{advice}",
                        where=f"{call.describe()} handed to the backend{dynamic}", node=call.node)
                if call.inputs_changed:
                    raise Finding(f"backend {self.name} changed the values of the example_inputs dynamo handed it "
                                  f"({call.describe()}): {call.inputs_changed}. {INPUTS_ARE_THE_MODELS}",
                                  where=f"example_inputs of {call.describe()}")
        if not any(not call.raised for run in runs for call in run.recorder.calls):
            self._raise_if_stopped(runs[0])
        return {"graphs_checked": sum(len(run.recorder.calls) for run in runs),
                "under_dynamic_true": sum(len(run.recorder.calls) for run in runs if run.dynamic)}

    def graph_breaks(self) -> dict[str, Any]:
        run = self._static
        self._raise_if_stopped(run, 0)
        graphs = run.graphs[0]
        if graphs <= 1:
            raise Skip(f"dynamo captured {self.case.name} whole, in one graph: no graph break to check (models with "
                       "data-dependent control flow, such as edge_data_dependent_flow, have one)")
        called = len([call for call in run.recorder.calls if call.number <= graphs])
        if called != graphs:
            raise Finding(f"dynamo compiled {graphs} graphs but the backend {self.name} was called {called} times: "
                          "a graph went round it", where="the graphs of the graph break", details={"breaks": run.breaks})
        self._judge(run, 0)
        return {"graphs": graphs, "breaks": run.breaks}

    def dynamic_shapes(self) -> dict[str, Any]:
        run = self._dynamic
        if len(run.calls) == 1:
            raise Skip(f"eager runs {self.case.name} at no other size of any dimension of its inputs (each tried at "
                       "another size raised, and the entry lists one batch size): nothing to vary under dynamic=True")
        for i in range(len(run.calls)):
            self._judge(run, i)
        return {"configs": [call.config.name for call in run.calls], "varied": [call.varies for call in run.calls[1:]],
                "backend_calls": len(run.recorder.calls)}

    def gradients(self) -> dict[str, Any]:
        expected = self._eager_gradients(self.dtype)
        run = self._training
        self._raise_if_stopped(run)
        actual = run.outputs[0]
        if actual is None:
            raise Finding("the compiled model's outputs do not require grad, where eager's do: gradients do not flow "
                          f"through what backend {self.name} returned", input=self._where(run, 0))
        for label in expected:
            found = compare_values(actual.get(label), expected[label], path=f"grad of {label}", tolerance=self.tolerance,
                                   fp64=functools.partial(self._eager_gradient, label))
            if found is not None:
                raise Finding(f"gradients differ: {found.describe()}", input=self._where(run, 0),
                              where=found.path, max_abs=found.max_abs, max_rel=found.max_rel)
        return {"compared": len(expected)}

    def backward_graph(self) -> dict[str, Any]:
        if not isinstance(undecorated(self.backend), AotAutograd):
            raise Skip(f"backend {self.name} is not an aot_autograd(...) object whose compilers fxverify can observe: "
                       "dynamo hands a backend forward graphs only, and autograd differentiates what it returns "
                       "(pytorch#114189), or, where it calls aot_autograd itself (aot_eager does), compiles the "
                       "backward out of sight; backend-gradients compares its gradients. To have fxverify see the "
                       "backward graphs, give it torch._dynamo.backends.common.aot_autograd(fw_compiler=..., "
                       "bw_compiler=...)")
        run = self._training
        self._raise_if_stopped(run)
        if run.outputs[0] is None:
            raise Skip("the compiled model's outputs do not require grad: no backward ran (backend-gradients says why)")
        recorder = run.recorder
        if recorder.backward_graphs == 0:
            raise Finding(
                f"backward ran through the model compiled with backend {self.name}, made by aot_autograd, but its "
                f"bw_compiler never got a backward graph ({recorder.forward_graphs} forward graphs compiled): the "
                "gradients came from elsewhere than the compiled backward. Make fw_compiler's callable keep autograd's "
                "graph (return a callable of the graph it is handed)", input=self._where(run, 0))
        return {"forward_graphs": recorder.forward_graphs, "backward_graphs": recorder.backward_graphs}

    # the runs

    @functools.cached_property
    def _static(self) -> Run:
        configs = [self.primary] + ([self.other] if self.other else [])
        return self._backend_run(tuple(Call(config, self.dtype) for config in configs))

    @functools.cached_property
    def _dynamic(self) -> Run:
        varied = tuple(Call(config, self.dtype, varies) for config, varies in self.variations)
        return self._backend_run((Call(self.primary, self.dtype),) + varied, dynamic=True)

    @functools.cached_property
    def _dtype_run(self) -> Run:
        """The dtype sequence at sizes no earlier run compiled with static shapes (the first size varied, else the
        primary input's), so that the backend compiles them first in bfloat16."""
        config = next((config for config, _ in self.variations if config != self.other), self.primary)
        return self._backend_run(tuple(Call(config, dtype) for dtype in DTYPE_SEQUENCE))

    @functools.cached_property
    def _training(self) -> Run:
        return self._backend_run((Call(self.primary, self.dtype),), backward=True)

    @functools.cached_property
    def variations(self) -> list[tuple[InputConfig, str]]:
        """The primary input with one dimension at another size, each where eager runs, with what it varies: each
        size past the batch (every dimension of that size in every input, else each alone; to the size the entry's
        spatial sizes give, else half as large again), then the batch at a size dynamo keeps symbolic (not 1), then
        the entry's other batch size."""
        primary, found = self.primary, []
        dims = [(i, d, n) for i, spec in enumerate(primary.specs) for d, n in enumerate(spec.shape) if d > 0 and n > 1]
        taken = {n for spec in primary.specs for n in spec.shape}
        declared = {}
        for config in self.case.configs[1:]:
            first, was = config.specs[0].shape, primary.specs[0].shape
            if len(first) == len(was) and first[0] == was[0]:
                declared.update({n: m for n, m in zip(was[1:], first[1:]) if n != m and n not in declared})
        for size in dict.fromkeys(n for _, _, n in dims):
            new = declared.get(size) or _another_size(size, taken)
            where = [(i, d) for i, d, n in dims if n == size]
            tries = [(with_size(primary, size, new), _dimensions(where))]
            if len(where) > 1:
                tries += [(with_size(primary, size, new, only=at), _dimensions([at])) for at in where]
            accepted = next(((config, f"{what}: {size} -> {new}") for config, what in tries if self._accepts(config)),
                            None)
            if accepted:
                found.append(accepted)
        batches = [(with_batch(primary, _another_size(self.batch, {0, 1, self.batch})), "the batch")]
        if self.other is not None:
            batches.append((self.other, "the batch (the entry's other batch size)"))
        for config, what in batches:
            if config.name not in (c.name for c, _ in found) and (config == self.other or self._accepts(config)):
                found.append((config, f"{what}: {self.batch} -> {config.specs[0].shape[0]}"))
        return found

    def _accepts(self, config: InputConfig) -> bool:
        """Whether the eager model runs at ``config``."""
        try:
            with torch.no_grad():
                self._probe(*config.make(self.case.seed, dtype=self.dtype))
        except Exception:
            return False
        return True

    @functools.cached_property
    def _probe(self) -> nn.Module:
        return self._model(self.dtype)

    def _backend_run(self, calls: tuple[Call, ...], *, dynamic: bool = False, backward: bool = False) -> Run:
        """``calls`` compiled with the backend under test, made once more where they ran out of time and dynamo alone
        (run in between) made them in half the limit: a machine busy with other work slows one run, a backend that
        hangs slows both."""
        run = self._compiled(calls, dynamic=dynamic, backward=backward)
        if run.timed_out:
            alone = self._dynamo_alone(run)
            if alone.error is None and alone.seconds <= (self.timeout or 0) / 2:  # else the verdict is a Skip
                run = dataclasses.replace(self._compiled(calls, dynamic=dynamic, backward=backward), tries=2)
        return run

    def _compiled(self, calls: tuple[Call, ...], *, dynamic: bool = False, backward: bool = False,
                  backend: tuple[Backend, str] | None = None) -> Run:
        run = Run(Recorder(*(backend or (self.backend, self.name))), calls, dynamic, backward)
        graphs, breaks = counters["stats"]["unique_graphs"], dict(counters["graph_break"])
        fixed = _fixed_dimensions(calls) if dynamic else set()

        def compile_and_run() -> None:
            torch._dynamo.reset()
            compiled: dict[torch.dtype, tuple[nn.Module, nn.Module]] = {}
            built = 0  # graphs dynamo made while a model was built (a factory exporting it, as torchao's PT2E flow does)
            for call in calls:
                if call.dtype not in compiled:
                    before = counters["stats"]["unique_graphs"]
                    model = self._model(call.dtype)
                    built += counters["stats"]["unique_graphs"] - before
                    optimized = torch.compile(model, backend=run.recorder, dynamic=dynamic)
                    assert isinstance(optimized, nn.Module)  # torch.compile of a module is an OptimizedModule
                    compiled[call.dtype] = model, optimized
                model, optimized = compiled[call.dtype]
                inputs = call.config.make(self.case.seed, dtype=call.dtype)
                for i, d in fixed:
                    torch._dynamo.mark_static(inputs[i], d)
                if backward:
                    params = {name: f"_orig_mod.{name}" for name, _ in model.named_parameters()}
                    outputs = loss_gradients(optimized, inputs, self.case.seed, params, lambda m: m.eval())
                else:
                    with torch.no_grad():
                        outputs = optimized(*inputs)
                run.outputs.append(outputs)
                _note_returned(run, outputs)
                run.state.append(_buffers(model))
                run.graphs.append(counters["stats"]["unique_graphs"] - graphs - built)
                run.backend_calls.append(len(run.recorder.calls))

        start = time.perf_counter()
        try:
            call_with_timeout(compile_and_run, (), self.timeout)
        except Exception as exc:
            run.timed_out = _timed_out(exc)
            run.error = (f"did not finish within {self.timeout:g} s (raise timeout= if it is just slow)"
                         if run.timed_out else exception_summary(exc))
        finally:
            run.seconds = time.perf_counter() - start
            torch._dynamo.reset()
        run.breaks = sorted(reason for reason, count in counters["graph_break"].items() if count > breaks.get(reason, 0))
        return run

    def _dynamo_alone(self, run: Run) -> Run:
        """``run``'s calls compiled with ``backend="eager"``: what dynamo alone does with them."""
        key = (run.calls, run.dynamic, run.backward)
        if key not in self._dynamo_runs:
            eager = torch._dynamo.lookup_backend("eager")
            self._dynamo_runs[key] = self._compiled(run.calls, dynamic=run.dynamic, backward=run.backward,
                                                    backend=(eager, "eager"))
        return self._dynamo_runs[key]

    # the eager references

    def _model(self, dtype: torch.dtype) -> nn.Module:
        return self.case.build().to(dtype)

    def _replay(self, calls: tuple[Call, ...], *, float64: bool = False) -> Replay:
        """A fresh eager model a dtype (in float64 with ``float64``) given ``calls`` under ``torch.no_grad()``."""
        key = (tuple((call.config, call.dtype) for call in calls), float64)
        if key not in self._replays:
            replay, models = Replay(), dict[torch.dtype, nn.Module]()
            with torch.no_grad():
                for call in calls:
                    dtype = torch.float64 if float64 else call.dtype
                    model = models.get(call.dtype) or models.setdefault(call.dtype, self._model(dtype))
                    try:
                        outputs = model(*call.config.make(self.case.seed, dtype=dtype))
                        replay.outputs.append(outputs)
                        _note_returned(replay, outputs)
                    except Exception as exc:
                        replay.error = exception_summary(exc)
                        break
                    replay.state.append(_buffers(model))
            self._replays[key] = replay
        return self._replays[key]

    def _replayed64(self, calls: tuple[Call, ...], i: int, part: str) -> Any:
        """``part`` (``outputs`` or ``state``) of call ``i`` in the float64 replay of ``calls``; None where eager
        raised before it in float64."""
        replay = self._replay(calls, float64=True)
        return getattr(replay, part)[i] if i < len(replay.returned) else None

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

    def _judge(self, run: Run, i: int) -> None:
        """Raise the finding of call ``i`` of ``run`` against eager's replay of the same calls (its outputs, then the
        model's buffers after it), or of the run stopping before it returned."""
        self._raise_if_stopped(run, i)
        replay = self._replay(run.calls)
        if i >= len(replay.outputs):
            raise Skip(f"the eager model raises at {run.calls[i].describe()}{_after_calls(run, i)} ({replay.error}), "
                       "where the compiled one runs: nothing to compare with")
        if i in run.overwritten and i not in replay.overwritten:
            later = run.calls[run.overwritten[i]]
            changed = compare_trees(run.outputs[i], run.returned[i], tolerance=Tolerance(0.0, 0.0))
            raise Finding(
                f"the outputs the model compiled with backend {self.name} returned at {run.calls[i].describe()} "
                f"changed when it was called again at {later.describe()}"
                f"{': ' + changed.describe() if changed else ''}. What the backend returns shares memory with buffers "
                "of its own that its next call overwrites (or frees and reallocates), where eager's outputs stay as "
                "returned: a caller keeping the outputs of several calls (a list of batches) reads another call's "
                "values. Return tensors the caller owns (copy the runtime's output buffers: torch.from_numpy of a "
                "runtime's output array shares its memory)"
                f"\n{self._calls(run)}", input=self._where(run, i), where=changed.path if changed else "output",
                max_abs=changed.max_abs if changed else None)
        parts = (("returned", "output", "outputs of the model compiled with backend {} differ from eager's: {}"),
                 ("state", "buffer", "the buffers of the model compiled with backend {} differ from eager's after "
                                     "the call: {}. The graphs dynamo hands a backend update the model's buffers in "
                                     "place, through their inputs: what the backend returns must make those updates, "
                                     "on the tensors it is called with"))
        for part, root, what in parts:
            found: Mismatch | None = compare_trees(
                getattr(run, part)[i], getattr(replay, part)[i], tolerance=self.tolerance, root=root,
                fp64_expected=functools.partial(self._replayed64, run.calls, i, part))
            if found is not None:
                raise Finding(f"{what.format(self.name, found.describe())}{_after(run, i)}{_inputs_note(run)}"
                              f"\n{self._calls(run)}",
                              input=self._where(run, i), where=found.path, max_abs=found.max_abs,
                              max_rel=found.max_rel)

    def _raise_if_stopped(self, run: Run, i: int | None = None) -> None:
        """The finding of a run that stopped (at call ``i`` or before it; at any call when None)."""
        if run.error is None or (i is not None and i < run.made):
            return
        at, call = run.made, run.calls[run.made]
        failed = run.recorder.failed
        if failed is not None:
            raise Finding(f"backend {self.name} failed on {failed.describe()}: {failed.raised}. A backend must return "
                          "a callable computing the graph it is handed (gm.forward, at least)",
                          input=self._where(run, at), where=failed.describe())
        replay = self._replay(run.calls)
        if at >= len(replay.outputs):
            raise Skip(f"the eager model raises at {call.describe()}{_after_calls(run, at)} ({replay.error}): nothing "
                       "to compile")
        alone = self._dynamo_alone(run)
        how = " under dynamic=True" if run.dynamic else ""
        if alone.error is not None and alone.made <= at:
            cannot = "does not compile it in time either" if alone.timed_out else "cannot compile it"
            raise Skip(f"torch.compile with backend='eager' (dynamo alone) fails on {self.case.name}{how} too, at "
                       f"{alone.calls[alone.made].describe()} ({alone.error}): dynamo, not backend {self.name}, "
                       f"{cannot}")
        if run.timed_out and (alone.timed_out or alone.seconds > (self.timeout or 0) / 2):
            took = "longer than that" if alone.timed_out else f"{alone.seconds:.0f} s"
            raise Skip(f"the calls compiled with backend {self.name}{how} did not finish within {self.timeout:g} s, and "
                       f"dynamo alone (backend='eager') takes {took} for them: too close to the limit to tell the "
                       "backend's share; raise the limit (timeout=, --fxverify-timeout)")
        twice = " in each of two runs" if run.tries > 1 else ""
        error = run.error + (f"{twice}; dynamo alone (backend='eager') made the same calls{how} in {alone.seconds:.1f} s"
                             if run.timed_out else "")
        advice = (". A backend meant for inference alone (its results under torch.no_grad()) declares it: "
                  "@fxverify.contract(modes=(\"eval\",))" if run.backward else "")
        stopped = "ran out of time" if run.timed_out else "raised"
        raise Finding(f"the model compiled with backend {self.name} {stopped} at {call.describe()}, where eager runs: "
                      f"{error}{_after(run, at)}{advice}\n{self._calls(run)}", input=self._where(run, at))

    def _calls(self, run: Run) -> str:
        calls = "; ".join(call.describe() for call in run.recorder.calls) or "none"
        return f"backend calls: {calls}"

    def _where(self, run: Run, i: int) -> str:
        """Call ``i`` of ``run`` as findings name their input: its configuration, dtype, mode, how it was compiled
        and the calls before it."""
        call = run.calls[i]
        how = "backward, " + LOSS if run.backward else "dynamic=True" if run.dynamic else "static shapes"
        varied = f" ({call.varies})" if call.varies else ""
        return (f"{call.config.describe()}, {dtype_name(call.dtype)}, eval mode, {how}{varied}"
                f"{_after_calls(run, i)}")

def _note_returned(run: Run | Replay, outputs: Any) -> None:
    """Record ``outputs`` of the call just made as they were returned (cloned), and note each earlier call's
    outputs that this call changed (a backend returning views of buffers it reuses)."""
    run.returned.append(tree_map(lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, outputs))
    now = len(run.returned) - 1
    for i in range(now):
        if i not in run.overwritten and not _identical(run.outputs[i], run.returned[i]):
            run.overwritten[i] = now


def _identical(a: Any, b: Any) -> bool:
    """Whether two output trees hold the same values (NaN equal to NaN)."""
    leaves_a, leaves_b = tree_leaves(a), tree_leaves(b)
    return len(leaves_a) == len(leaves_b) and all(map(tensors_equal, leaves_a, leaves_b))


def _buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of ``model``'s buffers, by name."""
    return {name: buffer.detach().clone() for name, buffer in model.named_buffers()}


def _fixed_dimensions(calls: Sequence[Call]) -> set[tuple[int, int]]:
    """The dimensions ``(input, dim)`` of the inputs that no call of ``calls`` gives another size than the first.

    >>> from fxverify.cases.case import load_case
    >>> first = load_case("edge_conv_bn_head").configs[0]
    >>> sorted(_fixed_dimensions([Call(first, torch.float32), Call(with_batch(first, 3), torch.float32)]))
    [(0, 1), (0, 2), (0, 3)]
    """
    first = calls[0].config.specs
    return {(i, d) for i, spec in enumerate(first) for d, n in enumerate(spec.shape)
            if all(call.config.specs[i].shape[d] == n for call in calls)}


def _another_size(size: int, taken: set[int]) -> int:
    """A size for a dimension of ``size`` to vary to: half as large again (at least one more), and none of ``taken``
    (two dimensions of one size share a symbol under dynamic=True: a size made equal to another's would not vary
    one alone).

    >>> _another_size(6, {2, 6, 16}), _another_size(2, {0, 1, 2, 3})
    (9, 4)
    """
    new = size + max(1, size // 2)
    while new in taken:
        new += 1
    return new


def _dimensions(where: list[tuple[int, int]]) -> str:
    """``(input, dimension)`` pairs as messages name them.

    >>> _dimensions([(0, 2), (0, 3)]), _dimensions([(0, 1), (1, 1)])
    ('dimensions 2, 3 of x0', 'dimension 1 of x0 and dimension 1 of x1')
    """
    by_input: dict[int, list[str]] = {}
    for i, d in where:
        by_input.setdefault(i, []).append(str(d))
    return " and ".join(f"dimension{'s' if len(dims) > 1 else ''} {', '.join(dims)} of x{i}"
                        for i, dims in by_input.items())


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` as contracts and messages name it, ``bfloat16``."""
    return str(dtype).removeprefix("torch.")


def _after_calls(run: Run, i: int) -> str:
    """The calls of ``run`` before call ``i``, for messages: e.g. ``, after b2-8 in float32``."""
    return f", after {', '.join(call.describe() for call in run.calls[:i])}" if i else ""


def _after(run: Run, i: int) -> str:
    """What a failure at call ``i`` of ``run``, after the same compiled model ran right at the calls before it, points
    to: dynamo compiled the graph again for it (the backend's artifact is wrong for these inputs: specialised to
    others, or served from a cache whose key misses what differs) or reused a graph (under dynamic=True, one the
    backend specialised to its example's sizes)."""
    if i == 0:
        return ""
    before, call = run.calls[i - 1], run.calls[i]
    again = run.compiled_for(i)
    changed = next((c for c in run.recorder.calls if c.changed), None)
    in_place = (f" (backend-input-unchanged: it changed {changed.describe()}, the GraphModule it was handed)"
                if changed else "")
    if before.dtype != call.dtype:
        if not again:
            return f"; right after {before.describe()}, and dynamo reused what it compiled for it"
        return (f"; right after {before.describe()}, at the same sizes. Dynamo handed the backend the "
                f"{dtype_name(call.dtype)} graph ({again[0].describe()}), and what it returned is wrong for "
                f"{dtype_name(call.dtype)} inputs: computed as the {dtype_name(before.dtype)} compile was. A backend "
                "caching what it compiles must key the cache by the inputs' dtypes too (the graph's code and the "
                "shapes are the same for both)")
    if not again:
        if run.dynamic:
            return (f"; right at {before.config.name}, and dynamo reused the graph it compiled under dynamic=True "
                    f"(its guards accept {call.config.name}): what the backend returned for a dynamic graph must "
                    f"compute it at every size its symbols take, not only at its example inputs'{in_place}")
        return f"; right at {before.config.name}, run first, and dynamo reused what it compiled for it"
    return (f"; right at {before.config.name}, run first. Dynamo compiled the graph again for {call.config.name} and "
            "handed it to the backend: what the backend returned for it is wrong for these inputs. A backend "
            "specialising on its example inputs (shapes baked into what it compiles) must not reuse that for a graph "
            f"with other example inputs, as a cache keyed by the graph's code alone does{in_place}")


INPUTS_ARE_THE_MODELS = (
    "They are not copies: dynamo hands a backend the model's own parameters and buffers and the caller's inputs, so "
    "running the graph on them while compiling (a warm-up, a calibration, a benchmark) updates a model's buffers (a "
    "running mean, a counter, a cache) once more than eager does. Run on clones ([x.clone() for x in example_inputs]) "
    "or on fresh tensors of the same shapes")


def _inputs_note(run: Run) -> str:
    """For an outputs or buffers finding: the backend changing its example inputs' values while compiling, which
    moves the model's state before the call runs (``backend-input-unchanged``), where it did."""
    changed = next((call for call in run.recorder.calls if call.inputs_changed), None)
    if changed is None:
        return ""
    return (f". The backend changed the values of the example_inputs dynamo handed it while compiling "
            f"({changed.describe()}: {changed.inputs_changed}; backend-input-unchanged). {INPUTS_ARE_THE_MODELS}")


def _real_tensor(value: Any) -> bool:
    """Whether ``value`` is a tensor with values to compare (not a FakeTensor or a size)."""
    return isinstance(value, torch.Tensor) and not is_fake(value)


def _changed_input(before: Sequence[torch.Tensor | None], example_inputs: Sequence[Any]) -> str | None:
    """The first of ``example_inputs`` whose values differ from ``before`` (their clones), e.g. ``example input 3
    (1 int64): values differ ...``; None where none does."""
    for index, (old, now) in enumerate(zip(before, example_inputs)):
        if old is not None and not tensors_equal(old, now):
            where = f"example input {index} ({_shapes([now])} {dtype_name(now.dtype)})"
            found = compare_values(now, old, path=where, tolerance=Tolerance(0.0, 0.0))
            return found.describe() if found is not None else f"{where} changed"
    return None


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
    backend = undecorated(backend)
    if isinstance(backend, AotAutograd):
        compilers = ", ".join(f"{key}={_name_of(fn)}" for key, fn in backend.kwargs.items()
                              if key in ("fw_compiler", "bw_compiler") and fn is not None)
        return f"aot_autograd({compilers})"
    named = backend if hasattr(backend, "__qualname__") else type(backend)
    return f"{named.__module__}:{named.__qualname__}"


__all__ = ["DTYPE_SEQUENCE", "BackendCall", "Call", "Recorder", "Replay", "Run", "Trial", "backend_subjects",
           "check_backend", "dtype_name", "first_changed_node", "node_lines", "resolve_backend", "trial_of", "undecorated"]
