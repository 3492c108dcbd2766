"""Passes written for Inductor's hooks (``post_grad_custom_pre_pass`` and its siblings), in each form their
authors register them: a ``CustomGraphPass``, a function on a ``torch.fx.Graph``, a ``PatternMatcherPass``,
a function registering replacements into one. The correct ones rewrite ``x + x`` into ``x * 2``; each buggy
one carries a defect of real fusion passes, named in its docstring with the check meant to catch it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch._inductor.pattern_matcher import PatternMatcherPass, fwd_only, register_replacement

aten = torch.ops.aten


def add_to_mul(graph: torch.fx.Graph) -> None:
    """``aten.add(x, x)`` -> ``aten.mul(x, 2)``, on the Graph as Inductor's hooks hand it."""
    for node in graph.find_nodes(op="call_function", target=aten.add.Tensor):
        if node.args[0] is node.args[1] and not node.kwargs:
            with graph.inserting_before(node):
                doubled = graph.call_function(aten.mul.Tensor, (node.args[0], 2))
            doubled.meta.update(node.meta)
            node.replace_all_uses_with(doubled)
            graph.erase_node(node)


class AddToMul(CustomGraphPass):
    """:func:`add_to_mul` as a ``CustomGraphPass``, its ``uuid()`` the hash of this file."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        add_to_mul(graph)

    def uuid(self) -> Any:
        return get_hash_for_files((__file__,))


ADD_TO_MUL = AddToMul()  # what a user assigns to torch._inductor.config.post_grad_custom_pre_pass


def _doubled(x: torch.Tensor) -> torch.Tensor:
    return aten.add.Tensor(x, x)


def _times_two(x: torch.Tensor) -> torch.Tensor:
    return aten.mul.Tensor(x, 2)


def register_add_to_mul(patterns: PatternMatcherPass) -> None:
    """``x + x`` -> ``x * 2`` registered with ``register_replacement`` into ``patterns``."""
    register_replacement(_doubled, _times_two, [torch.empty(4)], fwd_only, patterns)


ADD_TO_MUL_PATTERNS = PatternMatcherPass(pass_name="add_to_mul")
register_add_to_mul(ADD_TO_MUL_PATTERNS)


class Fusions(CustomGraphPass):
    """A ``CustomGraphPass`` holding its ``PatternMatcherPass``, as serving engines write fusion passes."""

    def __init__(self) -> None:
        self.patterns = PatternMatcherPass()
        register_add_to_mul(self.patterns)

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.patterns.apply(graph)

    def uuid(self) -> Any:
        return get_hash_for_files((__file__,))


def _sigmoid_gates(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """Each ``mul(a, sigmoid(b))`` of ``graph`` (its arguments read when it is rewritten: an earlier rewrite may
    have replaced them)."""
    return [node for node in graph.find_nodes(op="call_function", target=aten.mul.Tensor)
            if isinstance(node.args[1], torch.fx.Node) and node.args[1].target is aten.sigmoid.default]


def _to_silu(graph: torch.fx.Graph, mul: torch.fx.Node) -> None:
    with graph.inserting_before(mul):
        silu = graph.call_function(aten.silu.default, (mul.args[1].args[0],))
    silu.meta.update(mul.meta)
    mul.replace_all_uses_with(silu)
    graph.erase_node(mul)


def fuse_silu(graph: torch.fx.Graph) -> None:
    """``x * sigmoid(x)`` -> ``silu(x)``, where both operands are the same node."""
    for mul in _sigmoid_gates(graph):
        gated, gate = mul.args
        if gated is gate.args[0]:
            _to_silu(graph, mul)


def fuse_silu_unpinned(graph: torch.fx.Graph) -> None:
    """BUG (an argument the matcher leaves unpinned): ``a * sigmoid(b)`` -> ``silu(b)`` without checking that ``a``
    is ``b``, so a gated unit ``x * sigmoid(gate(x))`` loses ``x``. Caught by numerics, at the ``silu`` node."""
    for mul in _sigmoid_gates(graph):
        _to_silu(graph, mul)


def _relu_gradients(graph: torch.fx.Graph) -> list[tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node]]:
    """Each relu gradient ``where(out <= 0, 0, grad)`` of ``graph`` (only the backward part of a joint graph has
    one): ``(where, out, grad)``."""
    found = []
    for node in graph.find_nodes(op="call_function", target=aten.where.self):
        mask, zero, grad = node.args
        if (isinstance(mask, torch.fx.Node) and mask.target is aten.le.Scalar and mask.args[1] == 0
                and isinstance(zero, torch.fx.Node) and zero.target is aten.scalar_tensor.default and zero.args[0] == 0):
            found.append((node, mask.args[0], grad))
    return found


def _masked(graph: torch.fx.Graph, comparison: Any, *, stale: bool = False) -> None:
    for where, out, grad in _relu_gradients(graph):
        if not stale:  # an earlier rewrite may have replaced the gradient this one reads (a relu of a relu)
            out, grad = where.args[0].args[0], where.args[2]
        with graph.inserting_before(where):
            mask = graph.call_function(comparison, (out, 0))
            masked = graph.call_function(aten.mul.Tensor, (grad, mask))
        mask.meta.update(where.args[0].meta)
        masked.meta.update(where.meta)
        where.replace_all_uses_with(masked)
        graph.erase_node(where)


def relu_gradient_as_mask(graph: torch.fx.Graph) -> None:
    """A joint-graph pass: the relu gradient ``where(out <= 0, 0, grad)`` -> ``grad * (out > 0)``."""
    _masked(graph, aten.gt.Scalar)


def relu_gradient_as_mask_inclusive(graph: torch.fx.Graph) -> None:
    """BUG (a boundary flipped, wrong only in the backward part of the joint graph): ``where(out <= 0, 0, grad)``
    -> ``grad * (out >= 0)``: relu's output is never negative, so the gradient flows through every inactive unit.
    Nothing in a forward graph has the pattern: caught by numerics on the gradients, at the ``ge`` node."""
    _masked(graph, aten.ge.Scalar)


def inductor_joint_patterns(graph: torch.fx.Graph) -> None:
    """Inductor's own joint-graph pattern passes, as ``joint_graph_passes`` runs them (``early_patterns``, then each
    of ``pass_patterns``): real passes nobody here wrote, run as a transform over the corpus (``pass_patterns`` is
    a list, which no spec names)."""
    from torch._inductor.fx_passes import joint_graph

    joint_graph.lazy_init()
    for patterns in (joint_graph.early_patterns, *joint_graph.pass_patterns):
        patterns.apply(graph)


def relu_gradient_as_mask_stale(graph: torch.fx.Graph) -> None:
    """BUG (a stale node reference): :func:`relu_gradient_as_mask` reading each match's gradient as it was when the
    matches were collected, so where one relu gradient feeds another (``relu(relu(x))``) the second reads the erased
    first: ``torch.compile`` raises (``Node ... referenced nonexistent value``); every check fails, naming
    the graph ``Graph.lint()`` refuses."""
    _masked(graph, aten.gt.Scalar, stale=True)
