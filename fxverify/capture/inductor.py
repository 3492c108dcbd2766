"""The ``inductor`` captures: the graphs Inductor's joint-graph and post-grad hooks receive, made offline as
``torch.compile`` makes them, without code generation: one for each row of the hooks table
(:data:`fxverify.inductor.hooks.CAPTURES`) at one of those hooks in a plain compile, the inference graph or the
training graphs (``inductor``, ``inductor_post``, ``inductor_train``, ``inductor_train_post`` at
``post_grad_custom_pre_pass`` and ``post_grad_custom_post_pass``; ``inductor_joint``, ``inductor_joint_post``,
``inductor_train_joint``, ``inductor_train_joint_post`` at ``joint_custom_pre_pass`` and ``joint_custom_post_pass``).

Each starts from what AOTAutograd receives (:func:`~fxverify.capture.pre_grad.as_aot_receives`): Dynamo's graph
after Inductor's own pre-grad passes, reading the model's parameters and buffers (the model itself where Dynamo
splits it into several graphs).

Inference (as Inductor compiles a model run under ``torch.no_grad()``): AOTAutograd's inference graph, its parameters
and buffers lifted to inputs, with Inductor's decomposition table
(:func:`~fxverify.capture.aot_inference.aot_inference_graph`), taken to the hook as torch takes it
(:func:`~fxverify.inductor.graph_hooks.graph_at_hook`). Parameters and buffers are placeholders while torch's passes
and the transform run, among the model's inputs in Dynamo's order (:func:`~fxverify.capture.aot_call.aot_call`), as
AOTAutograd receives them (Inductor's constant folders fold ``get_attr`` tensors: a counter's update would be folded);
the captured ``GraphModule`` reads them as ``get_attr`` nodes of the module's own tensors under their own names, so it
takes the model's inputs and returns its outputs.

Training (as Inductor compiles a model whose parameters require grad): AOTAutograd's joint graph (primals and
tangents to forward outputs and gradients) traced as ``compile_fx`` calls AOTAutograd (the flat inputs in
Dynamo's order; Inductor's decompositions; ``keep_inference_input_mutations``, so a BatchNorm's running
statistics are written back in the forward graph with ``copy_``), handed to Inductor's own ``partition_fn``, told
that the parameters and buffers are static inputs, as Dynamo marks them. At a joint hook the joint graph is taken
where ``joint_graph_passes`` calls it, before partitioning: the submodule ``joint_graph``. At a post-grad hook it
is partitioned (the joint-graph passes, then the min-cut partitioner) into a forward and a backward graph, each
taken where ``post_grad_passes(gm, is_inference=False)`` calls the hook
(:func:`~fxverify.inductor.graph_hooks.at_post_grad_hook`): the submodules ``forward_graph`` and
``backward_graph``. Parameters are placeholders there, as Inductor has them. The submodules are inlined into one
graph that runs them on fixed tangents (buffers ``tangent_<i>``, drawn from a fixed seed), writes back the
buffers the model updates, and returns ``{"outputs": (...), "grads": {name: gradient}}``: every check of
outputs (numerics against float64, determinism, devices...) then judges gradients too, and names the first
divergent node (backward nodes are named ``backward_<name>``). :meth:`Inductor.apply` runs the transform once
on each submodule's graph, as torch runs a pass once per graph, and inlines them again.

Each graph a transform returns is carried on as torch carries it on after the hook
(:func:`~fxverify.inductor.after.carried_on`); what torch cannot repair fails as the transform's, every check saying
so.

Where the transform changed a graph is :func:`fired_in` of its result (``inference``, ``forward``,
``backward``, ``joint``); a contract with ``fires_in`` fails a transform that changes another graph.

>>> capture = Inductor("inductor_train_joint")
>>> capture.name, capture.traits.opset, capture.traits.carries_meta_val, capture.at.hook.name
('inductor_train_joint', 'functional', True, 'joint_custom_pre_pass')
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import fx, nn

from fxverify.analysis.graph_text import canonical_text
from fxverify.capture.aot_call import aot_call
from fxverify.capture.aot_inference import HandedReturn, aot_inference_graph
from fxverify.capture.at_hooks import AtHook
from fxverify.capture.lifted_buffers import (
    LIFTED,
    attach,
    read_state_as_attributes,
    state_as_attributes,
    state_as_placeholders,
)
from fxverify.capture.lowerings import replay
from fxverify.capture.pre_grad import as_aot_receives
from fxverify.core.graph_passes import at_joint_hook, training_graph
from fxverify.core.results import Skip
from fxverify.core.transform import Transform
from fxverify.errors import TransformFailed
from fxverify.inductor import hooks
from fxverify.inductor.after import before_pass, carried_on
from fxverify.inductor.aot import aot_roles, backward_on_zeros
from fxverify.inductor.fake_mode import graph_fake_mode
from fxverify.inductor.graph_hooks import at_post_grad_hook, graph_at_hook, sorted_as_after_the_hook
from fxverify.inductor.stops import HookReached, stopped_at

FIRED = "fxverify_fired"  # gm.meta key: the graphs the transform changed, in order

_LAYOUT = "fxverify_training_layout"  # gm.meta key: what each input and output of the training graphs is
_TANGENT_SEED = 0


@dataclasses.dataclass(frozen=True)
class Inductor(AtHook):
    """The capture ``name`` (its row of the hooks table, :attr:`at`): the graph, or the training graphs, a joint-graph
    or post-grad hook receives in a plain compile, made offline: decompositions and Inductor's graph passes, no code
    generation."""

    name: str = "inductor"
    stages = ("joint", "post_grad")
    bakes_dtypes = True  # ATen nodes bake dtype=: a float64 copy is the float64 model captured again
    switches_mode = False  # the mode is traced in
    keeps_captures = True  # a capture costs 10-100 symbolic traces

    def capture(self, module: nn.Module, *, training: bool, inputs: tuple[Any, ...] = ()) -> fx.GraphModule:
        """A fresh graph of ``module`` in the given mode, traced on ``inputs``, as Inductor's hook receives it."""
        from torch._inductor import config, lowering  # noqa: F401  Inductor's decompositions read its lowering
        from torch._inductor.decomposition import select_decomp_table

        if not inputs:
            raise ValueError(f"the {self.name} capture needs example inputs")
        with config.patch(fallback_random=True):  # random ops as eager draws them, not Inductor's own generator
            handed = as_aot_receives(module, inputs, training=training)  # after Inductor's pre-grad passes
            if self.at.training_graphs:
                return _training_package(handed, inputs, self.at.hook)
            gm = aot_inference_graph(handed, inputs, select_decomp_table())
            returned = HandedReturn.of(gm)
            with graph_fake_mode(gm):  # as compile_fx sets it around AOTAutograd
                gm = graph_at_hook(gm, self.at.hook)
            returned.restore(gm)  # where torch's passes made the graph anew
            return state_as_attributes(gm, handed)

    def apply(self, transform: Transform, gm: fx.GraphModule, *, timeout: float | None) -> tuple[nn.Module, bool]:
        """``transform`` run on the inference graph, or once on each training graph (an inference-aware pass told
        ``is_inference`` at the post-grad hooks, nothing at the joint hooks, as torch tells it), each result carried
        on as torch carries it on (:func:`~fxverify.inductor.after.carried_on`); where it changed a graph is recorded
        (:func:`fired_in`)."""
        hook = self.at.hook
        if not self.at.training_graphs:
            given = state_as_placeholders(gm)  # parameters and buffers as AOTAutograd hands them to Inductor
            before = canonical_text(given.graph)
            returned = HandedReturn.of(given)
            kept = before_pass(hook, given)
            with self._told(), graph_fake_mode(given):  # as compile_fx sets it around AOTAutograd
                result, in_place = transform.apply(given, timeout=timeout)
            graph_module = isinstance(result, fx.GraphModule)
            if graph_module:
                carried_on(transform.spec, result, hook, kept)
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
                kept = before_pass(hook, given)
                with graph_fake_mode(given):  # as compile_fx sets it around AOTAutograd
                    result, _ = transform.apply(given, timeout=timeout)
                if not isinstance(result, fx.GraphModule):
                    raise TransformFailed(f"transform {transform.spec} returned a {type(result).__name__} for the "
                                          f"{part.graph} graph: Inductor's hooks change the graph they are given")
                carried_on(transform.spec, result, hook, kept, graph=part.graph)
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
        if self.at.hook.stage == "joint":
            return at_joint_hook()
        return training_graph() if self.at.training_graphs else contextlib.nullcontext()

    def describe(self) -> str:
        graphs = ("inference graph" if not self.at.training_graphs
                  else "joint graph" if self.at.hook.stage == "joint" else "forward and backward graphs")
        return f"{self.name} (the {graphs} {self.at.hook.name} receives; static shapes)"


def fired_in(module: nn.Module) -> tuple[str, ...] | None:
    """The graphs a transform changed, for a result of the ``inductor`` captures (``("forward", "backward")``,
    ``("joint",)``); None for another module."""
    return module.meta.get(FIRED) if isinstance(module, fx.GraphModule) else None


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


def _training_package(module: nn.Module, inputs: tuple[Any, ...], hook: hooks.Hook) -> fx.GraphModule:
    """The training graphs of ``module`` at ``hook``, inlined into one module. AOTAutograd
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
                     f"{hooks.inference_at(hook).name} capture gives; there is no training graph")
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
        stopped_at(hook, lambda: partitioned(gm, joint_inputs, **kwargs))
        sorted_as_after_the_hook(gm)
        raise HookReached  # no partitioning: the joint graph is the capture

    compiled = aot_function(call.run, fw_compiler=keep("forward", False), bw_compiler=keep("backward", False),
                            inference_compiler=keep("inference", True),
                            partition_fn=joint_only if hook.stage == "joint" else partitioned,
                            decompositions=select_decomp_table(), keep_inference_input_mutations=True)
    copies = [value.detach().clone().requires_grad_(name in parameters and value.requires_grad)  # the model untouched
              if name is not None else value for name, value in zip(call.held, call.flat, strict=True)]
    package = fx.GraphModule(nn.Module(), fx.Graph())
    if hook.stage == "joint":
        try:
            compiled(*copies)
        except HookReached:
            pass
        parts = {"joint": kept["joint"]}
        parts["joint"].recompile()
    else:
        backward_on_zeros(compiled(*copies))
        parts = {part: at_post_grad_hook(kept[part], hook, is_inference=False)
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
    made (:func:`~fxverify.inductor.after.carried_on`; a get_attr of a missing attribute): Inductor fails on it too,
    and the training graphs cannot be inlined."""
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
