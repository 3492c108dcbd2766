"""The ``inductor`` and ``inductor_train`` captures: the graphs Inductor's ``post_grad_custom_pre_pass`` hook
receives, made offline as ``torch.compile`` makes them, without code generation.

``inductor`` (inference, as Inductor compiles a model run under ``torch.no_grad()``): ``make_fx`` of the
functionalized model with its parameters and buffers lifted to inputs (as AOTAutograd lifts them) and
Inductor's decomposition table (``select_decomp_table()``), then Inductor's ``joint_graph_passes``, then
``view_to_reshape`` and ``post_grad_passes(gm, is_inference=True)`` up to the point where it calls
``post_grad_custom_pre_pass`` (after dead-code elimination and ``reorder_for_locality``): the graph is taken
there. Parameters and buffers are ``get_attr`` nodes of the module's own tensors under their own names, so the
``GraphModule`` takes the model's inputs and returns its outputs.

``inductor_post`` and ``inductor_train_post``: the same graphs where ``post_grad_custom_post_pass`` receives them,
after Inductor's own post-grad pattern passes (a pass that fires at the pre hook may find nothing left to
rewrite here).

``inductor_train`` (training, as Inductor compiles a model whose parameters require grad): AOTAutograd's joint
graph with Inductor's decompositions, partitioned by Inductor's own ``partition_fn`` (its joint-graph passes,
then the min-cut partitioner) into a forward and a backward graph, each taken where
``post_grad_passes(gm, is_inference=False)`` calls the hook. The two are kept as the submodules
``forward_graph`` and ``backward_graph`` (parameters as placeholders, as Inductor has them) and inlined into one
graph that runs the forward, then the backward on fixed tangents (buffers ``tangent_<i>``, drawn from a fixed
seed), and returns ``{"outputs": (...), "grads": {name: gradient}}``: every check of outputs (numerics against
float64, determinism, devices...) then judges gradients too, and names the first divergent node (backward nodes
are named ``backward_<name>``). :meth:`Inductor.apply` runs the transform on each submodule's graph separately,
as torch runs a pass once per graph, and inlines them again.

Where the transform changed a graph is :func:`fired_in` of its result (``inference``, ``forward``,
``backward``); a contract with ``fires_in`` fails a transform that changes another graph.

>>> capture = Inductor(training_graphs=True)
>>> capture.name, capture.traits.opset, capture.traits.carries_meta_val
('inductor_train', 'functional', True)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from fxverify.analysis.graph_text import canonical_text
from fxverify.capture.base import Capture
from fxverify.capture.lifted_buffers import attach, lifted_make_fx
from fxverify.core import captures
from fxverify.core.graph_passes import training_graph
from fxverify.core.transform import Transform
from fxverify.errors import TransformFailed

FIRED = "fxverify_fired"  # gm.meta key: the graphs the transform changed, in order

_LAYOUT = "fxverify_training_layout"  # gm.meta key: what each input and output of the two graphs is
_PARTS = (("forward_graph", "forward"), ("backward_graph", "backward"))
_TANGENT_SEED = 0


@dataclasses.dataclass(frozen=True)
class Inductor(Capture):
    """The graph (``training_graphs``: the forward and backward graphs) Inductor's ``post_grad_custom_pre_pass``
    receives, made offline: decompositions and Inductor's graph passes, no code generation."""

    training_graphs: bool = False
    position: str = "pre"  # the hook: post_grad_custom_pre_pass ("pre") or post_grad_custom_post_pass ("post")
    bakes_dtypes = True  # ATen nodes bake dtype=: a float64 copy is the float64 model captured again
    switches_mode = False  # the mode is traced in
    keeps_captures = True  # a capture costs 10-100 symbolic traces

    @property
    def name(self) -> str:
        return ("inductor_train" if self.training_graphs else "inductor") + ("_post" if self.position == "post" else "")

    def capture(self, module: nn.Module, *, training: bool, inputs: tuple[Any, ...] = ()) -> fx.GraphModule:
        """A fresh graph of ``module`` in the given mode, traced on ``inputs``, as Inductor's hook receives it."""
        from torch._inductor.decomposition import select_decomp_table
        from torch._inductor.fx_passes.joint_graph import joint_graph_passes

        if not inputs:
            raise ValueError(f"the {self.name} capture needs example inputs")
        from torch._inductor import config

        module.train(training)
        with config.patch(fallback_random=True):  # random ops as eager draws them, not Inductor's own generator
            if self.training_graphs:
                return _training_package(module, inputs, self.position)
            with torch.no_grad():
                gm = lifted_make_fx(module, inputs, select_decomp_table())
            return at_custom_pass(joint_graph_passes(gm), is_inference=True, position=self.position)

    def apply(self, transform: Transform, gm: fx.GraphModule, *, timeout: float | None) -> tuple[nn.Module, bool]:
        """``transform`` run on the inference graph, or on the forward and the backward graph separately (told
        ``is_inference=False`` where it asks); where it changed a graph is recorded (:func:`fired_in`)."""
        if not self.training_graphs:
            before = canonical_text(gm.graph)
            result, in_place = transform.apply(gm, timeout=timeout)
            graph_module = isinstance(result, fx.GraphModule)
            fired = ("inference",) if not graph_module or canonical_text(result.graph) != before else ()
            if graph_module:  # another module holds no meta: fired_in says None for it
                result.meta[FIRED] = fired
            _check_placement(transform, fired)
            return result, in_place
        changed: list[str] = []
        with training_graph():
            for part, graph in _PARTS:
                given = _part(gm, part)
                before = canonical_text(given.graph)
                result, _ = transform.apply(given, timeout=timeout)
                if not isinstance(result, fx.GraphModule):
                    raise TransformFailed(f"transform {transform.spec} returned a {type(result).__name__} for the "
                                          f"{graph} graph: Inductor's hooks change the graph they are given")
                setattr(gm, part, result)
                if canonical_text(result.graph) != before:
                    changed.append(graph)
        gm.graph = _inlined(gm)
        gm.recompile()
        gm.meta[FIRED] = tuple(changed)
        _check_placement(transform, tuple(changed))
        return gm, True

    def fired_in(self, result: nn.Module) -> tuple[str, ...] | None:
        return fired_in(result)

    def describe(self) -> str:
        graphs = "forward and backward graphs" if self.training_graphs else "inference graph"
        return f"{self.name} (the {graphs} post_grad_custom_{self.position}_pass receives; static shapes)"


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


def fired_in(module: nn.Module) -> tuple[str, ...] | None:
    """The graphs a transform changed, for a result of the ``inductor`` captures (``("forward", "backward")``);
    None for another module."""
    return module.meta.get(FIRED) if isinstance(module, fx.GraphModule) else None


def at_custom_pass(gm: fx.GraphModule, *, is_inference: bool, position: str = "pre") -> fx.GraphModule:
    """``gm`` (after the joint-graph passes) as ``post_grad_custom_<position>_pass`` receives it: ``view_to_reshape``,
    then ``post_grad_passes`` up to that hook, which stops it (the post hook comes after Inductor's own post-grad
    pattern passes)."""
    from torch._guards import detect_fake_mode
    from torch._inductor import config
    from torch._inductor.fx_passes.post_grad import post_grad_passes, view_to_reshape
    from torch._inductor.virtualized import V

    view_to_reshape(gm)
    fake_mode = detect_fake_mode([node.meta.get("val") for node in gm.graph.nodes])
    hooks = {"post_grad_custom_pre_pass": _stop if position == "pre" else None,
             "post_grad_custom_post_pass": _stop if position == "post" else None}
    with config.patch(hooks), V.set_fake_mode(fake_mode):
        try:
            post_grad_passes(gm, is_inference)
        except _Reached:
            pass
        else:
            raise AssertionError(f"post_grad_passes did not call post_grad_custom_{position}_pass")
    gm.recompile()
    return gm


class _Reached(Exception):
    """Raised by the hook to stop ``post_grad_passes`` where a custom pre pass runs."""


def _stop(graph: fx.Graph) -> None:
    raise _Reached


# -- the training graphs -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Layout:
    """What the forward's outputs and the backward's inputs and outputs are (from AOTAutograd's descriptors)."""

    inputs: int  # the model's own inputs, before the lifted parameters and buffers
    state: tuple[str, ...]  # the lifted parameters and buffers, in order
    forward_outputs: tuple[tuple[str, int], ...]  # ("output" | "mutation" | "saved" | "other", index)
    backward_inputs: tuple[tuple[str, int], ...]  # ("saved" | "tangent", index)
    backward_outputs: tuple[int | None, ...]  # the flat input each gradient is of


def _training_package(module: nn.Module, inputs: tuple[Any, ...], position: str = "pre") -> fx.GraphModule:
    from torch._functorch.aot_autograd import aot_function, make_boxed_func
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.decomposition import select_decomp_table

    parameters = dict(module.named_parameters())
    state = {**parameters, **dict(module.named_buffers())}
    names = list(state)
    count = len(inputs)
    kept: dict[str, fx.GraphModule] = {}

    def lifted(*flat: Any) -> Any:
        return torch.func.functional_call(module, dict(zip(names, flat[count:], strict=True)), tuple(flat[:count]))

    def keep(part: str, is_inference: bool) -> Callable[..., Any]:
        def compiler(gm: fx.GraphModule, example_inputs: Any) -> Any:
            kept[part] = gm
            if is_inference:
                raise TransformFailed("nothing in the model requires grad: Inductor compiles no backward graph "
                                      "(use the inductor capture)")
            return make_boxed_func(gm.forward)
        return compiler

    compiled = aot_function(lifted, fw_compiler=keep("forward", False), bw_compiler=keep("backward", False),
                            inference_compiler=keep("inference", True), partition_fn=partition_fn,
                            decompositions=select_decomp_table())
    copies = [t.detach().clone().requires_grad_(name in parameters and t.requires_grad)  # the model untouched
              for name, t in state.items()]
    outputs = [out for out in pytree.tree_leaves(compiled(*inputs, *copies))
               if isinstance(out, torch.Tensor) and out.requires_grad]
    torch.autograd.backward(outputs, [torch.zeros_like(out) for out in outputs])  # compiles the backward
    forward, backward = (at_custom_pass(kept[part], is_inference=False, position=position)
                         for part in ("forward", "backward"))
    package = fx.GraphModule(nn.Module(), fx.Graph())
    for name, tensor in state.items():
        attach(package, module, name, tensor, parameter=name in parameters)
    package.forward_graph = forward
    package.backward_graph = backward
    layout = _layout_of(forward, backward, count, tuple(names))
    generator = torch.Generator().manual_seed(_TANGENT_SEED)
    tangents = [node.meta["val"] for (kind, _), node in zip(layout.backward_inputs,
                                                             backward.graph.find_nodes(op="placeholder"), strict=True)
                if kind == "tangent"]
    for index, fake in enumerate(tangents):
        drawn = torch.randn(tuple(fake.shape), dtype=torch.float64, generator=generator).to(fake.dtype)
        package.register_buffer(f"tangent_{index}", drawn, persistent=False)
    package.meta[_LAYOUT] = layout
    package.graph = _inlined(package)
    package.recompile()
    return package


def _layout_of(forward: fx.GraphModule, backward: fx.GraphModule, inputs: int, state: tuple[str, ...]) -> _Layout:
    from torch._functorch._aot_autograd.descriptors import (
        GradAOTOutput,
        InputMutationAOTOutput,
        PlainAOTInput,
        PlainAOTOutput,
        SavedForBackwardsAOTOutput,
        TangentAOTInput,
    )

    def flat_index(desc: Any) -> int | None:
        return desc.idx if isinstance(desc, PlainAOTInput) else None

    outputs: list[tuple[str, int]] = []
    saved = 0
    for desc in forward.graph.output_node().meta["desc"]:
        if isinstance(desc, PlainAOTOutput):
            outputs.append(("output", desc.idx))
        elif isinstance(desc, InputMutationAOTOutput) and flat_index(desc.mutated_input) is not None:
            outputs.append(("mutation", flat_index(desc.mutated_input) or 0))
        elif isinstance(desc, SavedForBackwardsAOTOutput):
            outputs.append(("saved", saved))
            saved += 1
        else:
            outputs.append(("other", -1))
    placeholders = backward.graph.find_nodes(op="placeholder")
    backward_inputs = [("tangent", i) if isinstance(node.meta.get("desc"), TangentAOTInput) else ("saved", i)
                       for i, node in enumerate(placeholders)]
    grads = tuple(flat_index(desc.grad_of) if isinstance(desc, GradAOTOutput) else None
                  for desc in backward.graph.output_node().meta["desc"])
    return _Layout(inputs, state, tuple(outputs), tuple(backward_inputs), grads)


def _inlined(package: fx.GraphModule) -> fx.Graph:
    """One graph running ``package.forward_graph``, then ``package.backward_graph`` on the tangents, writing back
    the buffers the forward updates, returning ``{"outputs": ..., "grads": {name: gradient}}``."""
    layout: _Layout = package.meta[_LAYOUT]
    graph = fx.Graph()
    env: dict[fx.Node, Any] = {}
    forward, backward = (_part(package, part) for part, _ in _PARTS)
    reads: dict[int, fx.Node] = {}
    for index, node in enumerate(forward.graph.find_nodes(op="placeholder")):
        new = graph.placeholder(node.name) if index < layout.inputs else graph.get_attr(layout.state[index - layout.inputs])
        new.meta.update(node.meta)
        env[node] = reads[index] = new
    returned = _copy_body(graph, "forward_graph", forward, env, prefix="")
    found: dict[str, list[Any]] = {"output": [], "mutation": [], "saved": []}
    for (kind, index), value in zip(layout.forward_outputs, returned, strict=True):
        if kind != "other":
            found[kind].append((index, value))
    saved = [value for _, value in found["saved"]]
    tangents = 0
    benv: dict[fx.Node, Any] = {}
    for (kind, _), node in zip(layout.backward_inputs, backward.graph.find_nodes(op="placeholder"), strict=True):
        if kind == "saved":
            benv[node] = saved.pop(0)
        else:
            benv[node] = graph.get_attr(f"tangent_{tangents}")
            benv[node].meta.update(node.meta)
            tangents += 1
    gradients = _copy_body(graph, "backward_graph", backward, benv, prefix="backward_")
    grads = {_input_name(layout, index): grad for index, grad in zip(layout.backward_outputs, gradients, strict=True)
             if index is not None and isinstance(grad, fx.Node)}
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


def _input_name(layout: _Layout, index: int) -> str:
    return layout.state[index - layout.inputs] if index >= layout.inputs else f"input_{index}"


def _check_placement(transform: Transform, fired: tuple[str, ...]) -> None:
    allowed = transform.contract.fires_in
    outside = [graph for graph in fired if allowed is not None and graph not in allowed]
    if outside:
        raise TransformFailed(
            f"transform {transform.spec} changed the {' and '.join(outside)} graph, which its contract excludes "
            f"(fires_in={'+'.join(allowed or ())}): it fired in {', '.join(fired)}. Guard the pass (a pattern's "
            "extra_check, or the is_inference flag of a CustomInferenceAwareGraphPass), or declare where it fires",
            f"fired in the {outside[0]} graph")
