"""Inductor lowering-pattern nodes in a transform's result, replaced by the ATen ops their handlers call.

A ``register_lowering_pattern`` rewrite (among Inductor's post-grad ``pass_patterns``: ``splitwithsizes_cat_replace``,
``cat_slice_cat``, the quantization lowerings on CPU; torchao's int8 SDPA fusion) replaces the matched nodes by one
call of its handler bound to the match (``pattern_matcher.LoweringPatternEntry.apply``), marked
``_inductor_lowering_function``. Inductor calls it when it lowers the graph, on IR ``TensorBox``es: the graph as
the pass leaves it cannot run eagerly, pickle, or print as ATen, and every check would fail it, a false alarm.

Many handlers compute Python values from the match and end in ``L[op](...)`` (``torch._inductor.lowering.lowerings``)
or return an input: with each ``L[op]`` the op itself (:func:`eager_lowerings`), ``make_fx`` traces what the handler
computes into ATen ops, and :func:`replay` puts them in the node's place, so the checks judge what the lowering
computes. A handler that builds Inductor IR (``post_grad.cat_slice_cat`` reads ``V.graph``'s size variables) cannot
be traced: no check can judge that result eagerly, and :func:`replay` raises :class:`~fxverify.core.results.Skip`
saying so (judge it by compiling with the pass installed).

A graph handed over *with* lowering nodes (a hook after Inductor's lowering patterns ran: the frozen compile's
``post_grad_custom_post_pass``, where torchao's quantized concat-linear fusion matches the ``qlinear`` lowerings
torchao's x86 lowerings left) must keep them as they are for the pass, and still run for the checks:
:func:`runnable` wraps each handler in an :class:`EagerLowering` (the same name, module and marks, so a pass
recognises it; called on tensors it computes eagerly what its lowering computes) and returns the module as a
:class:`LoweringModule`, which runs its graph node by node (its generated code names the handler by a qualified
name no module holds).
"""

from __future__ import annotations

import contextlib
import functools
import operator
from collections.abc import Iterator
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from fxverify.capture.base import interpreted
from fxverify.core.results import Skip, exception_summary


def is_lowering(target: object) -> bool:
    """Whether a node's target is an Inductor lowering-pattern handler.

    >>> is_lowering(torch.ops.aten.add.Tensor)
    False
    """
    return bool(getattr(target, "_inductor_lowering_function", False))


def lowering_nodes(graph: fx.Graph) -> list[fx.Node]:
    """The nodes of ``graph`` that call a lowering handler.

    >>> lowering_nodes(fx.symbolic_trace(lambda x: x + 1).graph)
    []
    """
    return [node for node in graph.nodes if node.op == "call_function" and is_lowering(node.target)]


@contextlib.contextmanager
def eager_lowerings() -> Iterator[None]:
    """Inside the block each ``torch._inductor.lowering.lowerings[op]`` is ``op`` itself, so a handler calling
    ``L[op](...)`` computes eagerly what its lowering computes."""
    from torch._inductor.lowering import lowerings

    saved = dict(lowerings)
    lowerings.clear()
    lowerings.update({op: op for op in saved})  # type: ignore[misc]  # the keys are the ops, callable
    try:
        yield
    finally:
        lowerings.clear()
        lowerings.update(saved)


def replay(gm: fx.GraphModule) -> None:
    """Replace each lowering node of ``gm`` by the ATen ops its handler calls, traced with ``make_fx``; raise
    :class:`Skip` where a handler cannot be traced (it builds Inductor IR)."""
    nodes = lowering_nodes(gm.graph)
    for node in nodes:
        _inline(gm, node, _traced(node))
    if nodes:
        gm.graph.lint()
        gm.recompile()


class EagerLowering:
    """A lowering handler as a node's target that also runs on tensors: called with Inductor IR (``TensorBox``es,
    as Inductor lowers the graph) it is the handler; called with tensors, the handler under :func:`eager_lowerings`.
    It carries the handler's name, module and attributes (its ``_inductor_lowering_function`` mark), which passes
    and torch read to recognise it.

    >>> def handler(match, x):
    ...     return x + 1
    >>> handler._inductor_lowering_function = True
    >>> wrapped = EagerLowering(handler)
    >>> wrapped.__name__, is_lowering(wrapped), wrapped(None, torch.ones(1))
    ('handler', True, tensor([2.]))
    """

    def __init__(self, handler: Any) -> None:
        functools.update_wrapper(self, handler)
        self.handler = handler

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from torch._inductor.ir import IRNode

        if any(isinstance(leaf, IRNode) for leaf in pytree.tree_leaves((args, kwargs))):
            return self.handler(*args, **kwargs)
        with eager_lowerings():
            return self.handler(*args, **kwargs)


class LoweringModule(fx.GraphModule):
    """A ``GraphModule`` that runs its graph with ``torch.fx.Interpreter`` while the graph holds lowering nodes
    (:func:`runnable`), its generated code otherwise; the code is kept as text (``gm.code``) all the same."""

    def recompile(self) -> Any:
        found = super().recompile()
        if lowering_nodes(self.graph):
            type(self).forward = interpreted
        return found


def runnable(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` as a :class:`LoweringModule` (itself where it is one) whose lowering nodes call :class:`EagerLowering`
    handlers, so that the graph, as a pass at a later hook receives it, also runs eagerly; raise :class:`Skip` where a
    handler cannot run on tensors (it builds Inductor IR: :func:`replay` says so).

    >>> runnable(fx.symbolic_trace(lambda x: x + 1))(torch.ones(1))
    tensor([2.])
    """
    for node in lowering_nodes(gm.graph):
        if not isinstance(node.target, EagerLowering):
            _traced(node)  # the Skip where the handler does not run on tensors
            node.target = EagerLowering(node.target)
    if not isinstance(gm, LoweringModule):
        module = LoweringModule(gm, gm.graph)
        module.meta.update(gm.meta)
        module.train(gm.training)
        return module
    gm.recompile()
    return gm


def _traced(node: fx.Node) -> fx.GraphModule:
    """The handler of ``node`` traced on tensors laid out as its arguments' ``meta['val']``, one placeholder for each
    argument node in the order ``pytree`` flattens ``(args, kwargs)``."""
    from torch.fx.experimental.proxy_tensor import make_fx

    flat, spec = pytree.tree_flatten((node.args, node.kwargs))
    positions = [i for i, arg in enumerate(flat) if isinstance(arg, fx.Node)]
    examples = []
    for i in positions:
        val = flat[i].meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise Skip(f"{_described(node)} reads {flat[i].name}, which holds no tensor meta['val'] to trace the handler "
                       "on: no check can judge this result eagerly")
        examples.append(torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device=val.device))

    def computed(*tensors: torch.Tensor) -> Any:
        values = list(flat)
        for i, tensor in zip(positions, tensors):
            values[i] = tensor
        args, kwargs = pytree.tree_unflatten(values, spec)
        with eager_lowerings():
            return node.target(*args, **kwargs)  # type: ignore[operator]

    try:
        return make_fx(computed, tracing_mode="fake")(*examples)
    except Exception as exc:
        raise Skip(f"{_described(node)}, which runs only when Inductor generates code: its handler does not trace "
                   f"into ATen ops ({exception_summary(exc)}; it builds Inductor IR), so no check can judge this "
                   "result eagerly. Judge it by compiling with the pass installed") from exc


def _inline(gm: fx.GraphModule, node: fx.Node, traced: fx.GraphModule) -> None:
    """Put ``traced``'s ops in ``node``'s place, its constants registered on ``gm``."""
    arguments = [arg for arg in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(arg, fx.Node)]
    env: dict[fx.Node, fx.Node] = dict(zip(traced.graph.find_nodes(op="placeholder"), arguments))
    for constant in traced.graph.find_nodes(op="get_attr"):
        name = _fresh_attribute(gm, f"{node.name}_{constant.target}")
        setattr(gm, name, getattr(traced, str(constant.target)))
        constant.target = name
    with gm.graph.inserting_before(node):
        out = gm.graph.graph_copy(traced.graph, env)
    if isinstance(out, fx.Node):
        node.replace_all_uses_with(out)
    elif isinstance(out, (tuple, list)) and all(user.target is operator.getitem for user in node.users):
        for user in list(node.users):
            user.replace_all_uses_with(out[user.args[1]])  # type: ignore[index]
            gm.graph.erase_node(user)
    else:
        raise Skip(f"{_described(node)}: its handler returns {type(out).__name__}, which no node can stand for: no check "
                   "can judge this result eagerly")
    gm.graph.erase_node(node)


def _fresh_attribute(gm: fx.GraphModule, base: str) -> str:
    name, count = base, 0
    while hasattr(gm, name):
        count += 1
        name = f"{base}_{count}"
    return name


def _described(node: fx.Node) -> str:
    target = node.target
    return (f"the result calls Inductor lowering {getattr(target, '__module__', '?')}."
            f"{getattr(target, '__name__', '?')} (%{node.name})")
