"""The ``inductor`` captures: the graphs Inductor's custom-pass hooks receive, made offline as ``torch.compile``
makes them, without code generation. Eight, one for each graph (inference or training) and hook:

============================  ===================================  ================================
capture                       graphs                               hook
============================  ===================================  ================================
``inductor``                  inference                            ``post_grad_custom_pre_pass``
``inductor_post``             inference                            ``post_grad_custom_post_pass``
``inductor_train``            training forward and backward        ``post_grad_custom_pre_pass``
``inductor_train_post``       training forward and backward        ``post_grad_custom_post_pass``
``inductor_joint``            inference                            ``joint_custom_pre_pass``
``inductor_joint_post``       inference                            ``joint_custom_post_pass``
``inductor_train_joint``      training joint (before partitioning) ``joint_custom_pre_pass``
``inductor_train_joint_post`` training joint (before partitioning) ``joint_custom_post_pass``
============================  ===================================  ================================

Each starts from what AOTAutograd receives (:func:`~fxverify.capture.pre_grad.as_aot_receives`): Dynamo's graph
after Inductor's own pre-grad passes, reading the model's parameters and buffers (the model itself where Dynamo
splits it into several graphs).

Inference (as Inductor compiles a model run under ``torch.no_grad()``): AOTAutograd's inference graph, its parameters
and buffers lifted to inputs, with Inductor's decomposition table
(:func:`~fxverify.capture.aot_inference.aot_inference_graph`), then Inductor's ``joint_graph_passes`` (stopped at a
joint hook: the pre hook comes after ``canonicalize_aten_ir_passes``, the post hook after Inductor's own joint-graph
pattern passes, sorted as torch sorts it after that hook: :func:`sorted_as_after_the_hook`), then ``view_to_reshape``
and ``post_grad_passes(gm, is_inference=True)`` up to a post-grad hook (the pre hook after dead-code elimination and
``reorder_for_locality``, the post hook after Inductor's own post-grad pattern passes). Parameters and buffers are
placeholders while torch's passes and the transform run, among the model's inputs in Dynamo's order
(:func:`~fxverify.capture.aot_call.aot_call`), as AOTAutograd receives them (Inductor's constant folders fold
``get_attr`` tensors: a counter's update would be folded); the captured ``GraphModule`` reads them as ``get_attr``
nodes of the module's own tensors under their own names, so it takes the model's inputs and returns its outputs.

Training (as Inductor compiles a model whose parameters require grad): AOTAutograd's joint graph (primals and
tangents to forward outputs and gradients) traced as ``compile_fx`` calls AOTAutograd (the flat inputs in
Dynamo's order; Inductor's decompositions; ``keep_inference_input_mutations``, so a BatchNorm's running
statistics are written back in the forward graph with ``copy_``), handed to Inductor's own ``partition_fn``, told
that the parameters and buffers are static inputs, as Dynamo marks them. At a joint hook the joint graph is taken
where ``joint_graph_passes`` calls it, before partitioning: the submodule ``joint_graph``. At a post-grad hook it
is partitioned (the joint-graph passes, then the min-cut partitioner) into a forward and a backward graph, each
taken where ``post_grad_passes(gm, is_inference=False)`` calls the hook: the submodules ``forward_graph`` and
``backward_graph``. Parameters are placeholders there, as Inductor has them. The submodules are inlined into one
graph that runs them on fixed tangents (buffers ``tangent_<i>``, drawn from a fixed seed), writes back the
buffers the model updates, and returns ``{"outputs": (...), "grads": {name: gradient}}``: every check of
outputs (numerics against float64, determinism, devices...) then judges gradients too, and names the first
divergent node (backward nodes are named ``backward_<name>``). :meth:`Inductor.apply` runs the transform once
on each submodule's graph, as torch runs a pass once per graph, and inlines them again.

Each graph a transform returns is carried on as torch carries it on after the hook (:func:`carried_on`): sorted
topologically (and linted, at a joint hook), its new and changed nodes' ``meta['val']`` computed again at a
post-grad hook; what torch cannot repair (a cycle, a read of an erased node, a graph out of order at
``joint_custom_pre_pass``, a FakeTensor nothing can compute) fails as the transform's, every check saying so.

Where the transform changed a graph is :func:`fired_in` of its result (``inference``, ``forward``,
``backward``, ``joint``); a contract with ``fires_in`` fails a transform that changes another graph.

>>> capture = Inductor(training_graphs=True, hook="joint")
>>> capture.name, capture.traits.opset, capture.traits.carries_meta_val
('inductor_train_joint', 'functional', True)
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from fxverify.analysis.graph_text import canonical_text
from fxverify.capture.aot_call import aot_call
from fxverify.capture.aot_inference import HandedReturn, aot_inference_graph
from fxverify.capture.base import Capture
from fxverify.capture.hook_stops import HookReached, stop_at_hook
from fxverify.capture.lifted_buffers import (
    LIFTED,
    attach,
    read_state_as_attributes,
    state_as_attributes,
    state_as_placeholders,
)
from fxverify.capture.lowerings import replay
from fxverify.capture.pre_grad import as_aot_receives
from fxverify.core import captures
from fxverify.core.graph_passes import at_joint_hook, training_graph
from fxverify.core.results import Skip
from fxverify.core.transform import Transform
from fxverify.errors import TransformFailed

if TYPE_CHECKING:
    from torch._subclasses.fake_tensor import FakeTensorMode

FIRED = "fxverify_fired"  # gm.meta key: the graphs the transform changed, in order

_LAYOUT = "fxverify_training_layout"  # gm.meta key: what each input and output of the training graphs is
_TANGENT_SEED = 0
HOOKS = ("post_grad", "joint")  # Inductor's hook families: <hook>_custom_pre_pass, <hook>_custom_post_pass


@dataclasses.dataclass(frozen=True)
class Inductor(Capture):
    """The graph (``training_graphs``: the training graphs) Inductor's ``<hook>_custom_<position>_pass``
    receives, made offline: decompositions and Inductor's graph passes, no code generation."""

    training_graphs: bool = False
    position: str = "pre"  # the hook's place: <hook>_custom_pre_pass ("pre") or <hook>_custom_post_pass ("post")
    hook: str = "post_grad"  # the hook family (HOOKS): post_grad (after partitioning) or joint (before it)
    bakes_dtypes = True  # ATen nodes bake dtype=: a float64 copy is the float64 model captured again
    switches_mode = False  # the mode is traced in
    keeps_captures = True  # a capture costs 10-100 symbolic traces

    @property
    def name(self) -> str:
        return ("inductor" + ("_train" if self.training_graphs else "") + ("_joint" if self.hook == "joint" else "")
                + ("_post" if self.position == "post" else ""))

    def capture(self, module: nn.Module, *, training: bool, inputs: tuple[Any, ...] = ()) -> fx.GraphModule:
        """A fresh graph of ``module`` in the given mode, traced on ``inputs``, as Inductor's hook receives it."""
        from torch._inductor import config, lowering  # noqa: F401  Inductor's decompositions read its lowering
        from torch._inductor.decomposition import select_decomp_table

        if not inputs:
            raise ValueError(f"the {self.name} capture needs example inputs")
        with config.patch(fallback_random=True):  # random ops as eager draws them, not Inductor's own generator
            handed = as_aot_receives(module, inputs, training=training)  # after Inductor's pre-grad passes
            if self.training_graphs:
                return _training_package(handed, inputs, self.hook, self.position)
            gm = aot_inference_graph(handed, inputs, select_decomp_table())
            returned = HandedReturn.of(gm)
            with graph_fake_mode(gm):  # as compile_fx sets it around AOTAutograd
                if self.hook == "joint":
                    gm = at_joint_pass(gm, position=self.position)
                else:
                    gm = at_custom_pass(_joint_passes(gm), is_inference=True, position=self.position)
            returned.restore(gm)  # where torch's passes made the graph anew
            return state_as_attributes(gm, handed)

    def apply(self, transform: Transform, gm: fx.GraphModule, *, timeout: float | None) -> tuple[nn.Module, bool]:
        """``transform`` run on the inference graph, or once on each training graph (an inference-aware pass told
        ``is_inference`` at the post-grad hooks, nothing at the joint hooks, as torch tells it), each result carried
        on as torch carries it on (:func:`carried_on`); where it changed a graph is recorded (:func:`fired_in`)."""
        if not self.training_graphs:
            given = state_as_placeholders(gm)  # parameters and buffers as AOTAutograd hands them to Inductor
            before = canonical_text(given.graph)
            returned = HandedReturn.of(given)
            updater = _updater(given, self.hook)
            with self._told(), graph_fake_mode(given):  # as compile_fx sets it around AOTAutograd
                result, in_place = transform.apply(given, timeout=timeout)
            graph_module = isinstance(result, fx.GraphModule)
            if graph_module:
                carried_on(transform, result, graph="inference", hook=self.hook, position=self.position, updater=updater)
                replay(result)  # lowering-pattern nodes as the ATen ops they compute, or a skip saying why not
            fired = ("inference",) if not graph_module or canonical_text(result.graph) != before else ()
            if not in_place and canonical_text(given.graph) != before:  # it changed the graph it was given, too
                returned.restore(given)
                gm.graph = state_as_attributes(given, gm).graph
                gm.recompile()
            if graph_module:  # another module holds no meta: fired_in says None for it
                returned.restore(result)
                result.meta.setdefault(LIFTED, given.meta[LIFTED])  # a GraphModule made anew holds no meta
                result = state_as_attributes(result, gm)
                result.meta[FIRED] = fired
            else:  # the module returned may run the graph it was given
                read_state_as_attributes(given, gm)
            check_placement(transform, fired)
            return result, in_place
        changed: list[str] = []
        layout: _Layout = gm.meta[_LAYOUT]
        with self._told():
            for part in layout.parts:
                given = _part(gm, part.attribute)
                before = canonical_text(given.graph)
                updater = _updater(given, self.hook)
                with graph_fake_mode(given):  # as compile_fx sets it around AOTAutograd
                    result, _ = transform.apply(given, timeout=timeout)
                if not isinstance(result, fx.GraphModule):
                    raise TransformFailed(f"transform {transform.spec} returned a {type(result).__name__} for the "
                                          f"{part.graph} graph: Inductor's hooks change the graph they are given")
                carried_on(transform, result, graph=part.graph, hook=self.hook, position=self.position, updater=updater)
                replay(result)
                _check_well_formed(transform, result, part.graph)
                setattr(gm, part.attribute, result)
                if canonical_text(result.graph) != before:
                    changed.append(part.graph)
        gm.graph = _inlined(gm)
        gm.recompile()
        gm.meta[FIRED] = tuple(changed)
        check_placement(transform, tuple(changed))
        return gm, True

    def fired_in(self, result: nn.Module) -> tuple[str, ...] | None:
        return fired_in(result)

    def _told(self) -> contextlib.AbstractContextManager[None]:
        """What the hook tells an inference-aware pass: nothing at a joint hook, ``is_inference`` at a post-grad one."""
        if self.hook == "joint":
            return at_joint_hook()
        return training_graph() if self.training_graphs else contextlib.nullcontext()

    def describe(self) -> str:
        graphs = ("inference graph" if not self.training_graphs
                  else "joint graph" if self.hook == "joint" else "forward and backward graphs")
        return f"{self.name} (the {graphs} {self.hook}_custom_{self.position}_pass receives; static shapes)"


def for_model(facts: captures.ModelFacts) -> Inductor:
    """The ``inductor`` capture of a model (the registry's factory): static shapes."""
    return Inductor()


def post_for_model(facts: captures.ModelFacts) -> Inductor:
    """The ``inductor_post`` capture of a model (the registry's factory): the inference graph at the post hook."""
    return Inductor(position="post")


def training_for_model(facts: captures.ModelFacts) -> Inductor:
    """The ``inductor_train`` capture of a model (the registry's factory): static shapes."""
    return Inductor(training_graphs=True)


def training_post_for_model(facts: captures.ModelFacts) -> Inductor:
    """The ``inductor_train_post`` capture of a model (the registry's factory): the training graphs at the post hook."""
    return Inductor(training_graphs=True, position="post")


def joint_for_model(facts: captures.ModelFacts) -> Inductor:
    """The ``inductor_joint`` capture of a model (the registry's factory): the inference graph at
    ``joint_custom_pre_pass``."""
    return Inductor(hook="joint")


def joint_post_for_model(facts: captures.ModelFacts) -> Inductor:
    """The ``inductor_joint_post`` capture of a model (the registry's factory): the inference graph at
    ``joint_custom_post_pass``."""
    return Inductor(hook="joint", position="post")


def training_joint_for_model(facts: captures.ModelFacts) -> Inductor:
    """The ``inductor_train_joint`` capture of a model (the registry's factory): the training joint graph at
    ``joint_custom_pre_pass``."""
    return Inductor(training_graphs=True, hook="joint")


def training_joint_post_for_model(facts: captures.ModelFacts) -> Inductor:
    """The ``inductor_train_joint_post`` capture of a model (the registry's factory): the training joint graph
    at ``joint_custom_post_pass``."""
    return Inductor(training_graphs=True, hook="joint", position="post")


def fired_in(module: nn.Module) -> tuple[str, ...] | None:
    """The graphs a transform changed, for a result of the ``inductor`` captures (``("forward", "backward")``,
    ``("joint",)``); None for another module."""
    return module.meta.get(FIRED) if isinstance(module, fx.GraphModule) else None


def at_custom_pass(gm: fx.GraphModule, *, is_inference: bool, position: str = "pre") -> fx.GraphModule:
    """``gm`` (after the joint-graph passes) as ``post_grad_custom_<position>_pass`` receives it: ``view_to_reshape``,
    then ``post_grad_passes`` up to that hook, which stops it (the post hook comes after Inductor's own post-grad
    pattern passes)."""
    from torch._inductor.fx_passes.post_grad import post_grad_passes, view_to_reshape

    view_to_reshape(gm)
    with graph_fake_mode(gm):
        _stopped_at("post_grad", position, lambda: post_grad_passes(gm, is_inference))
    gm.recompile()
    return gm


def at_joint_pass(gm: fx.GraphModule, *, position: str = "pre") -> fx.GraphModule:
    """``gm`` as ``joint_custom_<position>_pass`` receives it: Inductor's ``joint_graph_passes`` up to that hook,
    which stops them (the pre hook comes after ``canonicalize_aten_ir_passes``, the post hook after Inductor's own
    joint-graph pattern passes)."""
    _stopped_at("joint", position, lambda: _joint_passes(gm))
    sorted_as_after_the_hook(gm)
    return gm


def sorted_as_after_the_hook(gm: fx.GraphModule) -> None:
    """``gm`` where a joint hook stopped Inductor's passes, sorted as torch sorts it right after the hook
    (``stable_topological_sort``), then recompiled. Inductor's own pattern replacements (its attention fusion,
    before ``joint_custom_post_pass``) can leave nodes out of order, and torch hands the pass the graph so; the
    capture is also the model's reference, run by every check, so the pass receives it in the order torch gives it
    after the hook (unchanged where it was in order already)."""
    from torch._inductor.pattern_matcher import stable_topological_sort

    stable_topological_sort(gm.graph)
    gm.recompile()


def _joint_passes(gm: fx.GraphModule) -> fx.GraphModule:
    from torch._inductor.fx_passes.joint_graph import joint_graph_passes

    return joint_graph_passes(gm)


def _stopped_at(hook: str, position: str, run: Callable[[], Any]) -> None:
    """``run()`` with Inductor's ``<hook>_custom_<position>_pass`` stopping it (the other hook of the family
    unset); AssertionError where it never calls the hook."""
    from torch._inductor import config

    name = f"{hook}_custom_{position}_pass"
    with config.patch({f"{hook}_custom_{place}_pass": stop_at_hook if place == position else None
                       for place in ("pre", "post")}):
        try:
            run()
        except HookReached:
            return
    raise AssertionError(f"Inductor's passes did not call {name}")


# -- what torch does after a hook ------------------------------------------------------------------------
def carried_on(transform: Transform, result: fx.GraphModule, *, graph: str, hook: str, position: str,
               updater: Any = None) -> None:
    """``result``, the ``graph`` graph as ``transform`` left it at ``<hook>_custom_<position>_pass``, repaired as
    torch repairs it before anything reads it again; :class:`TransformFailed` (the transform's fault) where torch
    cannot, saying that ``torch.compile`` would refuse it there. As torch 2.14.1 does:

    - ``joint_graph_passes`` (``fx_passes/joint_graph.py``), once a custom pass ran: ``stable_topological_sort(
      graph.graph); graph.graph.lint(); graph.recompile()``. After the *pre* hook, ``constant_fold_uniform_value``
      (an ``fx.Interpreter``, ``config.joint_graph_constant_folding``) runs first: a graph out of order fails there;
    - ``post_grad_passes`` (``fx_passes/post_grad.py``): ``FakeTensorUpdater(gm)`` made before the custom pre pass
      (``updater``, made by :func:`_updater` before the transform ran), then after the custom post pass
      ``stable_topological_sort(gm.graph)`` and ``fake_tensor_updater.incremental_update()``: the ``meta['val']``
      of each node the pass added or changed (and of its users, while they change) is computed again; a node whose
      target and arguments it left alone keeps its ``meta['val']``, stale or not.

    ``stable_topological_sort`` raises where no order exists: a cycle, or a node reading one the pass erased.

    >>> import torch
    >>> from torch import fx
    >>> gm = fx.symbolic_trace(lambda x: torch.relu(x) + 1)
    >>> relu, add = list(gm.graph.nodes)[1:3]
    >>> add.append(relu)                     # now %add reads %relu before it is defined
    >>> carried_on(Transform.from_callable(lambda gm: gm, "my:pass"), gm, graph="inference", hook="joint",
    ...            position="post")
    >>> [node.name for node in gm.graph.nodes]
    ['x', 'relu', 'add', 'output']
    """
    from torch._inductor.pattern_matcher import stable_topological_sort

    where = f"{hook}_custom_{position}_pass"
    if hook == "joint" and position == "pre":
        problem = ordering_problem(result.graph)
        if problem is not None:
            raise _refused(transform, graph, where, problem, "joint_graph_passes runs constant_fold_uniform_value, an "
                           "fx.Interpreter, on the graph after this hook and before its stable_topological_sort")
    try:
        stable_topological_sort(result.graph)
    except AssertionError:
        problem = ordering_problem(result.graph) or "no topological order"
        raise _refused(transform, graph, where, problem, "stable_topological_sort, which torch runs after the hook, "
                       "asserts 'topological sort did not consume all nodes'") from None
    if hook == "joint":
        try:
            result.graph.lint()
        except RuntimeError as error:
            raise _refused(transform, graph, where, str(error).splitlines()[0],
                           "joint_graph_passes lints the graph after its stable_topological_sort") from None
    elif updater is not None:
        _update_fake_tensors(transform, result, updater, graph, where)
    result.recompile()


def ordering_problem(graph: fx.Graph) -> str | None:
    """Why ``graph`` is not in topological order (a node reading one no longer in the graph, a cycle, a node read
    before it is defined), or None where it is.

    >>> import torch
    >>> from torch import fx
    >>> gm = fx.symbolic_trace(lambda x: torch.relu(x) + 1)
    >>> relu, add = list(gm.graph.nodes)[1:3]
    >>> relu.args = (add,)
    >>> ordering_problem(gm.graph)
    'a cycle: %relu -> %add -> %relu (each reads the next)'
    """
    present = set(graph.nodes)
    for node in graph.nodes:
        gone = [arg for arg in node.all_input_nodes if arg not in present]
        if gone:
            return f"%{node.name} reads %{gone[0].name}, which is no longer in the graph (erased)"
    cycle = _cycle(graph)
    if cycle:
        return f"a cycle: {' -> '.join('%' + node.name for node in (*cycle, cycle[0]))} (each reads the next)"
    seen: set[fx.Node] = set()
    for node in graph.nodes:
        late = [arg for arg in node.all_input_nodes if arg not in seen]
        if late:
            return f"%{node.name} reads %{late[0].name} before it is defined (acyclic: nodes out of order)"
        seen.add(node)
    return None


def _cycle(graph: fx.Graph) -> list[fx.Node]:
    """The nodes of one cycle of ``graph`` (each reading the next, the last reading the first), or []."""
    state: dict[fx.Node, int] = {}  # 1: on the current path, 2: done
    for root in graph.nodes:
        if root in state:
            continue
        path: list[fx.Node] = []
        stack: list[tuple[fx.Node, Iterator[fx.Node]]] = [(root, iter(root.all_input_nodes))]
        state[root] = 1
        path.append(root)
        while stack:
            node, inputs = stack[-1]
            following = next(inputs, None)
            if following is None:
                stack.pop()
                path.pop()
                state[node] = 2
            elif state.get(following) == 1:
                return path[path.index(following):]
            elif following not in state:
                state[following] = 1
                path.append(following)
                stack.append((following, iter(following.all_input_nodes)))
    return []


def backward_on_zeros(outputs: Any) -> None:
    """Backward from zero gradients of the tensors among ``outputs`` that require grad: what makes AOTAutograd
    compile the backward graph of a training compile (its compilers run at the first backward), leaving no
    gradient but zeros.

    >>> w = torch.ones(2, requires_grad=True)
    >>> backward_on_zeros({"y": w * 3, "n": 1}); w.grad
    tensor([0., 0.])
    """
    leaves = [out for out in pytree.tree_leaves(outputs) if isinstance(out, torch.Tensor) and out.requires_grad]
    torch.autograd.backward(leaves, [torch.zeros_like(out) for out in leaves])


def graph_fake_mode(gm: fx.GraphModule) -> contextlib.AbstractContextManager[Any]:
    """``V.fake_mode`` set to the FakeTensorMode of ``gm``'s ``meta['val']``, as ``compile_fx`` sets it around
    AOTAutograd, so around Inductor's joint-graph and post-grad passes and every hook's pass (a pattern's
    ``replace_by_example`` traces its replacement in it: ``torch.scalar_tensor`` in ``mul_softmax_pattern`` makes a
    FakeTensor there, a real tensor otherwise); nothing where ``gm`` has none."""
    from torch._inductor.virtualized import V

    fake_mode = fake_mode_of(gm)
    return contextlib.nullcontext() if fake_mode is None else V.set_fake_mode(fake_mode)


def fake_mode_of(gm: fx.GraphModule) -> FakeTensorMode | None:
    """The FakeTensorMode of the FakeTensors in ``gm``'s ``meta['val']``, None where it holds none.

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> traced = make_fx(torch.relu, tracing_mode="fake")(torch.ones(2))
    >>> fake_mode_of(fx.symbolic_trace(nn.ReLU())) is None, type(fake_mode_of(traced)).__name__
    (True, 'FakeTensorMode')
    """
    from torch._guards import detect_fake_mode

    return detect_fake_mode([node.meta.get("val") for node in gm.graph.nodes])


def _updater(gm: fx.GraphModule, hook: str) -> Any:
    """Inductor's ``FakeTensorUpdater`` of ``gm``, made before a post-grad custom pass runs as ``post_grad_passes``
    makes it (it remembers each node's target and arguments); None at a joint hook, where torch makes none."""
    if hook != "post_grad":
        return None
    from torch._inductor.fx_utils import FakeTensorUpdater

    return FakeTensorUpdater(gm)


def _update_fake_tensors(transform: Transform, result: fx.GraphModule, updater: Any, graph: str, where: str) -> None:
    """``updater.incremental_update()`` on ``result`` in the fake mode of its ``meta['val']``, as ``post_grad_passes``
    runs it; :class:`TransformFailed` where it raises (a new node's target has no FakeTensor implementation...)."""
    from torch._inductor.virtualized import V

    fake_mode = fake_mode_of(result)
    if fake_mode is None:
        return
    updater.gm = result  # the graph a pass returning another GraphModule made: each of its nodes is new to it
    try:
        with V.set_fake_mode(fake_mode):
            updater.incremental_update()
    except Exception as error:  # whatever a node's FakeTensor computation raises
        summary = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        lowering = "_inductor_lowering_function" in summary  # torch cannot compute a lowering node's FakeTensor
        advice = ((", except a lowering node's (the call of an Inductor lowering handler, which takes Inductor IR): "
                   "it must keep the meta['val'] it had, and its inputs theirs. A pass that rebuilds or copies the "
                   "graph (fx.Transformer, a graph copy) drops that meta: copy each node's meta along, or change the "
                   "graph in place") if lowering else
                  "; give each new node's target a FakeTensor implementation (torch.library.register_fake for a "
                  "custom op)")
        raise _refused(transform, graph, where, f"Inductor's FakeTensorUpdater raised {type(error).__name__}: {summary}",
                       "post_grad_passes computes the FakeTensor of each node the pass added or changed "
                       f"(FakeTensorUpdater.incremental_update){advice}") from error


def _refused(transform: Transform, graph: str, where: str, problem: str, why: str) -> TransformFailed:
    return TransformFailed(f"transform {transform.spec} left the {graph} graph at {where} where torch.compile would "
                           f"refuse it: {problem}; {why}", f"{graph} graph refused at {where}: {problem}")


# -- the training graphs -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Part:
    """One training graph of a package: the submodule, the graph it is (``forward``, ``backward``, ``joint``),
    what each of its placeholders reads and what each of its outputs is (from AOTAutograd's descriptors)."""

    attribute: str
    graph: str
    reads: tuple[tuple[str, int], ...]  # ("flat", flat input) | ("tangent", i) | ("saved", i of the saved values)
    gives: tuple[tuple[str, int], ...]  # ("output" | "mutation" | "grad", flat index) | ("saved", i) | ("other", -1)

    @property
    def prefix(self) -> str:
        """What its nodes' names start with inlined (the backward's collide with the forward's)."""
        return "backward_" if self.graph == "backward" else ""


@dataclasses.dataclass(frozen=True)
class _Layout:
    """The training graphs of a package, run in order, and what the flat inputs are."""

    held: tuple[str | None, ...]  # the flat inputs in Dynamo's order: the state each holds (None: a model input)
    parts: tuple[_Part, ...]

    def input_name(self, index: int) -> str:
        """What flat input ``index`` is called: its state's name, ``input_<i>`` for the model's i-th input."""
        name = self.held[index]
        return name if name is not None else f"input_{self.held[:index].count(None)}"


def _training_package(module: nn.Module, inputs: tuple[Any, ...], hook: str, position: str) -> fx.GraphModule:
    """The training graphs of ``module`` at ``<hook>_custom_<position>_pass``, inlined into one module. AOTAutograd
    traces them as ``compile_fx`` calls it: the flat inputs in Dynamo's order (:func:`aot_call`), Inductor's
    decompositions, ``keep_inference_input_mutations`` (a buffer's update stays in the forward graph as ``copy_``),
    and Inductor's partitioner told Dynamo's static inputs (the parameters and buffers, kept alive, not saved)."""
    from torch._functorch.aot_autograd import aot_function, make_boxed_func
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.decomposition import select_decomp_table

    parameters = dict(module.named_parameters())
    call = aot_call(module, inputs)
    kept: dict[str, fx.GraphModule] = {}
    inference = Skip("nothing in the model requires grad (no parameter does, nor its inputs): torch.compile compiles "
                     "its inference graph, which the "
                     f"{Inductor(hook=hook, position=position).name} capture gives; there is no training graph")
    if not any(parameter.requires_grad for parameter in parameters.values()):
        raise inference

    def keep(part: str, is_inference: bool) -> Callable[..., Any]:
        def compiler(gm: fx.GraphModule, example_inputs: Any) -> Any:
            kept[part] = gm
            if is_inference:
                raise inference
            return make_boxed_func(gm.forward)
        return compiler

    def partitioned(gm: fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        kwargs["static_lifetime_input_indices"] = list(call.static)  # as Dynamo marks them (aot_function cannot)
        with graph_fake_mode(gm):  # as compile_fx sets it around AOTAutograd
            return partition_fn(gm, joint_inputs, **kwargs)

    def joint_only(gm: fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        kept["joint"] = gm  # changed in place by the joint-graph passes up to the hook, which stops them
        _stopped_at("joint", position, lambda: partitioned(gm, joint_inputs, **kwargs))
        sorted_as_after_the_hook(gm)
        raise HookReached  # no partitioning: the joint graph is the capture

    compiled = aot_function(call.run, fw_compiler=keep("forward", False), bw_compiler=keep("backward", False),
                            inference_compiler=keep("inference", True),
                            partition_fn=joint_only if hook == "joint" else partitioned,
                            decompositions=select_decomp_table(), keep_inference_input_mutations=True)
    copies = [value.detach().clone().requires_grad_(name in parameters and value.requires_grad)  # the model untouched
              if name is not None else value for name, value in zip(call.held, call.flat, strict=True)]
    package = fx.GraphModule(nn.Module(), fx.Graph())
    if hook == "joint":
        try:
            compiled(*copies)
        except HookReached:
            pass
        parts = {"joint": kept["joint"]}
        parts["joint"].recompile()
    else:
        backward_on_zeros(compiled(*copies))
        parts = {part: at_custom_pass(kept[part], is_inference=False, position=position)
                 for part in ("forward", "backward")}
    for name, value in zip(call.held, call.flat, strict=True):
        if name is not None:
            attach(package, module, name, value, parameter=name in parameters)
    layout = _Layout(call.held, tuple(_part_of(graph, f"{graph}_graph", gm) for graph, gm in parts.items()))
    generator = torch.Generator().manual_seed(_TANGENT_SEED)
    for part in layout.parts:
        setattr(package, part.attribute, parts[part.graph])
        for (kind, index), node in zip(part.reads, parts[part.graph].graph.find_nodes(op="placeholder"), strict=True):
            if kind == "tangent":
                fake = node.meta["val"]
                drawn = torch.randn(tuple(fake.shape), dtype=torch.float64, generator=generator).to(fake.dtype)
                package.register_buffer(f"tangent_{index}", drawn, persistent=False)
    package.meta[_LAYOUT] = layout
    package.graph = _inlined(package)
    package.recompile()
    return package


def _part_of(graph: str, attribute: str, gm: fx.GraphModule) -> _Part:
    """The ``graph`` graph ``gm``, kept as the package's submodule ``attribute``, with its roles (:func:`aot_roles`)."""
    return _Part(attribute, graph, *aot_roles(gm, graph))


def aot_roles(gm: fx.GraphModule, graph: str = "joint"
              ) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]:
    """What each placeholder of an AOTAutograd graph ``gm`` (the ``graph`` graph: ``forward``, ``backward``,
    ``joint``) reads and what each of its outputs is, from AOTAutograd's descriptors: reads ``("flat", flat
    input)``, ``("tangent", i)`` or ``("saved", i)`` (the backward reads what the forward saved, in order, a primal
    among them); outputs ``("output" | "mutation" | "grad", flat index)``, ``("saved", i)`` or ``("other", -1)``."""
    from torch._functorch._aot_autograd.descriptors import (
        GradAOTOutput,
        InputMutationAOTOutput,
        PlainAOTInput,
        PlainAOTOutput,
        SavedForBackwardsAOTOutput,
        TangentAOTInput,
    )

    tangents, saved_read, saved_given = itertools.count(), itertools.count(), itertools.count()

    def read(desc: Any) -> tuple[str, int]:
        if isinstance(desc, TangentAOTInput):
            return "tangent", next(tangents)
        if graph != "backward" and isinstance(desc, PlainAOTInput):
            return "flat", desc.idx
        return "saved", next(saved_read)  # the backward's other inputs, a saved primal among them, in order

    def given(desc: Any) -> tuple[str, int]:
        if isinstance(desc, PlainAOTOutput):
            return "output", desc.idx
        if isinstance(desc, InputMutationAOTOutput) and isinstance(desc.mutated_input, PlainAOTInput):
            return "mutation", desc.mutated_input.idx
        if isinstance(desc, GradAOTOutput) and isinstance(desc.grad_of, PlainAOTInput):
            return "grad", desc.grad_of.idx
        if isinstance(desc, SavedForBackwardsAOTOutput):
            return "saved", next(saved_given)
        return "other", -1

    reads = tuple(read(node.meta.get("desc")) for node in gm.graph.find_nodes(op="placeholder"))
    return reads, tuple(given(desc) for desc in gm.graph.output_node().meta["desc"])


def _inlined(package: fx.GraphModule) -> fx.Graph:
    """One graph running the package's training graphs in order (the backward on the tangents), writing back the
    buffers the model updates, returning ``{"outputs": ..., "grads": {name: gradient}}``."""
    layout: _Layout = package.meta[_LAYOUT]
    graph = fx.Graph()
    reads: dict[int, fx.Node] = {}  # the flat inputs, read once
    found: dict[str, list[tuple[int, Any]]] = collections.defaultdict(list)
    for part in layout.parts:
        given = _part(package, part.attribute)
        saved = [value for _, value in found["saved"]]
        env: dict[fx.Node, Any] = {}
        for (kind, index), node in zip(part.reads, given.graph.find_nodes(op="placeholder"), strict=True):
            if kind == "saved":
                env[node] = saved[index]
                continue
            if kind == "flat" and index in reads:
                env[node] = reads[index]
                continue
            held = layout.held[index] if kind == "flat" else None
            new = (graph.get_attr(f"tangent_{index}") if kind == "tangent" else graph.placeholder(node.name)
                   if held is None else graph.get_attr(held))
            new.meta.update(node.meta)
            env[node] = new
            if kind == "flat":
                reads[index] = new
        for (kind, index), value in zip(part.gives, _copy_body(graph, part.attribute, given, env, prefix=part.prefix),
                                        strict=True):
            found[kind].append((index, value))
    grads = {layout.input_name(index): grad for index, grad in found["grad"] if isinstance(grad, fx.Node)}
    for index, value in found["mutation"]:
        graph.call_function(torch.ops.aten.copy_.default, (reads[index], value))
    graph.output({"outputs": tuple(value for _, value in sorted(found["output"], key=lambda pair: pair[0])),
                  "grads": grads})
    return graph


def _copy_body(graph: fx.Graph, owner: str, part: fx.GraphModule, env: dict[fx.Node, Any], *, prefix: str) -> list[Any]:
    """The nodes of ``part`` other than its placeholders copied into ``graph`` (named ``prefix + name``, their
    attributes read through ``owner``); what its output returns, as a flat list of new nodes."""
    for node in _body(part):
        target = f"{owner}.{node.target}" if node.op in ("get_attr", "call_module") else node.target
        new = graph.create_node(node.op, target, fx.map_arg(node.args, env.__getitem__),
                                fx.map_arg(node.kwargs, env.__getitem__), name=prefix + node.name)
        new.meta.update(node.meta)
        env[node] = new
    returned = fx.map_arg(part.graph.output_node().args[0], env.__getitem__)
    assert isinstance(returned, (list, tuple)), "AOTAutograd's graphs return a flat list"
    return list(returned)


def _part(package: fx.GraphModule, name: str) -> fx.GraphModule:
    found = package.get_submodule(name)
    assert isinstance(found, fx.GraphModule), f"{name} is a {type(found).__name__}"
    return found


def _body(part: fx.GraphModule) -> Iterator[fx.Node]:
    return (node for node in part.graph.nodes if node.op not in ("placeholder", "output"))


def _check_well_formed(transform: Transform, result: fx.GraphModule, graph: str) -> None:
    """TransformFailed where the transform left a training graph ``Graph.lint()`` refuses once torch's repairs are
    made (:func:`carried_on`; a get_attr of a missing attribute): Inductor fails on it too, and the training graphs
    cannot be inlined."""
    try:
        result.graph.lint()
    except RuntimeError as error:
        raise TransformFailed(f"transform {transform.spec} left the {graph} graph malformed, as torch.compile "
                              f"would refuse it: {error}", f"malformed {graph} graph: {error}") from error


def check_placement(transform: Transform, fired: tuple[str, ...]) -> None:
    allowed = transform.contract.fires_in
    outside = [graph for graph in fired if allowed is not None and graph not in allowed]
    if outside:
        raise TransformFailed(
            f"transform {transform.spec} changed the {' and '.join(outside)} graph, which its contract excludes "
            f"(fires_in={'+'.join(allowed or ())}): it fired in {', '.join(fired)}. Guard the pass (a pattern's "
            "extra_check, or the is_inference flag of a CustomInferenceAwareGraphPass), or declare where it fires",
            f"fired in the {outside[0]} graph")
