"""Passes written for Inductor's hooks (``post_grad_custom_pre_pass`` and its siblings), in each form their
authors register them: a ``CustomGraphPass``, a function on a ``torch.fx.Graph``, a ``PatternMatcherPass``,
a function registering replacements into one. The correct ones rewrite ``x + x`` into ``x * 2``; each buggy
one carries a defect of real fusion passes, named in its docstring with the check meant to catch it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, CustomInferenceAwareGraphPass, get_hash_for_files
from torch._inductor.pattern_matcher import PatternMatcherPass, fwd_only, register_replacement

import fxverify
from tests.bf16_passes import EPS, _rms_norm

aten = torch.ops.aten


def add_to_mul(graph: torch.fx.Graph) -> None:
    """``aten.add(x, x)`` -> ``aten.mul(x, 2)``, on the Graph as Inductor's hooks hand it."""
    _add_to_mul(graph)


def _add_to_mul(graph: torch.fx.Graph, *, at_top: bool = False, meta: bool = True) -> None:
    """:func:`add_to_mul`, each ``mul`` inserted before the ``add`` it replaces (``at_top``: before the graph's first
    node that is no placeholder), its meta copied from the ``add`` (``meta``)."""
    top = next(node for node in graph.nodes if node.op != "placeholder")
    for node in graph.find_nodes(op="call_function", target=aten.add.Tensor):
        if node.args[0] is node.args[1] and not node.kwargs:
            with graph.inserting_before(top if at_top else node):
                doubled = graph.call_function(aten.mul.Tensor, (node.args[0], 2))
            if meta:
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


def add_to_mul_out_of_order(graph: torch.fx.Graph) -> None:
    """:func:`add_to_mul` inserting each ``mul`` at the top of the graph (before its first node that is no
    placeholder), where the node it reads is not yet defined: acyclic, only out of order, so ``Graph.lint()``
    refuses it as the pass leaves it. Torch sorts the graph after the hook: ``torch.compile`` runs it at
    ``joint_custom_post_pass`` and both post-grad hooks; at ``joint_custom_pre_pass`` it raises (Inductor's
    constant folding interprets the graph before the sort), and every check fails there, saying so."""
    _add_to_mul(graph, at_top=True)


def add_to_mul_without_meta(graph: torch.fx.Graph) -> None:
    """:func:`add_to_mul` leaving each new ``mul`` without ``meta['val']``. At the post-grad hooks torch computes it
    (its FakeTensorUpdater): every check passes there. At the joint hooks nothing does before the partitioner reads
    it (``torch.compile`` of a training graph raises ``Node mul_tensor didn't have `val` metadata``): meta fails."""
    _add_to_mul(graph, meta=False)


def _copy_addmm_outputs(graph: torch.fx.Graph, *, rerouting_itself: bool) -> None:
    for addmm in graph.find_nodes(op="call_function", target=aten.addmm.default):
        with graph.inserting_after(addmm):
            copied = graph.call_function(aten.clone.default, (addmm,))
        copied.meta.update(addmm.meta)
        addmm.replace_all_uses_with(copied, delete_user_cb=lambda user, copied=copied: rerouting_itself or user is not copied)


def copy_addmm_outputs(graph: torch.fx.Graph) -> None:
    """Each ``addmm``'s users read a copy of it (``aten.clone``, as a layout pass inserts one): what each
    computes is unchanged."""
    _copy_addmm_outputs(graph, rerouting_itself=False)


def copy_addmm_outputs_cyclic(graph: torch.fx.Graph) -> None:
    """BUG (a cycle): :func:`copy_addmm_outputs` rerouting every user of each ``addmm`` to its copy, the copy
    among them (``replace_all_uses_with`` without ``delete_user_cb``), so the ``clone`` reads itself. Torch's
    ``stable_topological_sort`` after the hook asserts (``torch.compile`` raises at every hook); every check
    fails, naming the cycle."""
    _copy_addmm_outputs(graph, rerouting_itself=True)


# -- a fused kernel as vLLM and torchao write them: a custom op with a FakeTensor implementation, no autograd -----
@torch.library.custom_op("fxverify_tests::rms_norm", mutates_args=())
def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """A fused RMSNorm kernel as vLLM's ``rms_norm``: the mean square in float32, the normalised input cast back to
    ``x``'s dtype, times ``weight``."""
    upcast = x.float()
    return (upcast * torch.rsqrt(upcast.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


@torch.library.custom_op("fxverify_tests::rms_norm_by_variance", mutates_args=())
def fused_rms_norm_by_variance(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """BUG (the math wrong): :func:`fused_rms_norm` normalising by the variance (LayerNorm's statistic, the mean
    subtracted) instead of the mean square."""
    upcast = x.float()
    return (upcast * torch.rsqrt(upcast.var(-1, keepdim=True, correction=0) + eps)).to(x.dtype) * weight


@fused_rms_norm.register_fake
@fused_rms_norm_by_variance.register_fake
def _fused_rms_norm_fake(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x, dtype=torch.promote_types(x.dtype, weight.dtype))


def _fused(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.fxverify_tests.rms_norm(x, weight, EPS)


def _fused_by_variance(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.fxverify_tests.rms_norm_by_variance(x, weight, EPS)


def register_rms_norm_fusion(patterns: PatternMatcherPass) -> None:
    """The RMSNorm of ``edge_tiny_decoder_block`` (``x * rsqrt(mean(x ** 2) + eps) * weight``) -> the fused kernel
    :func:`fused_rms_norm`, registered as vLLM registers its fusions (``register_replacement``, ``fwd_only``)."""
    register_replacement(_rms_norm, _fused, [torch.empty(4, 8), torch.empty(8)], fwd_only, patterns)


def register_rms_norm_fusion_by_variance(patterns: PatternMatcherPass) -> None:
    """BUG (the math wrong): :func:`register_rms_norm_fusion` into :func:`fused_rms_norm_by_variance`. Caught by
    numerics, at the fused node."""
    register_replacement(_rms_norm, _fused_by_variance, [torch.empty(4, 8), torch.empty(8)], fwd_only, patterns)


@torch.library.custom_op("fxverify_tests::silu_and_mul", mutates_args=())
def fused_silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """A fused SwiGLU kernel as vLLM's ``silu_and_mul``: ``silu(gate) * up`` in one op."""
    return torch.nn.functional.silu(gate) * up


@fused_silu_and_mul.register_fake
def _fused_silu_and_mul_fake(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(gate, dtype=torch.promote_types(gate.dtype, up.dtype))


def _silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(gate) * up


def _fused_silu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.ops.fxverify_tests.silu_and_mul(gate, up)


def register_silu_and_mul_fusion(patterns: PatternMatcherPass) -> None:
    """``silu(gate) * up`` -> the fused kernel :func:`fused_silu_and_mul`."""
    register_replacement(_silu_and_mul, _fused_silu, [torch.empty(4, 8), torch.empty(4, 8)], fwd_only, patterns)


class SiluAndMulFusion(CustomInferenceAwareGraphPass):
    """:func:`register_silu_and_mul_fusion` as a vLLM-style inference pass: a ``CustomInferenceAwareGraphPass`` holding
    its ``PatternMatcherPass``, which fuses inference graphs only (Inductor's post-grad hooks tell it which graph it
    gets; the joint-graph hooks tell it nothing and ``torch.compile`` raises there)."""

    def __init__(self) -> None:
        self.patterns = PatternMatcherPass(pass_name="silu_and_mul")
        register_silu_and_mul_fusion(self.patterns)

    def __call__(self, graph: torch.fx.Graph, is_inference: bool) -> None:
        if is_inference:
            self.patterns.apply(graph)

    def uuid(self) -> Any:
        return get_hash_for_files((__file__,))


POST_GRAD_CAPTURES = ("inductor", "inductor_post", "inductor_train", "inductor_train_post")

# what a vLLM-style inference pass declares: it changes inference graphs only, and is installed at the post-grad hooks
SILU_AND_MUL_INFERENCE = fxverify.contract(fires_in=("inference",), captures=POST_GRAD_CAPTURES)(SiluAndMulFusion())


def inductor_post_grad_patterns(graph: torch.fx.Graph) -> None:
    """Inductor's own post-grad pattern passes, as ``post_grad_passes`` runs them (``lazy_init()``, then each of
    ``pass_patterns`` in order): real passes nobody here wrote, run as a transform over the corpus."""
    from torch._inductor.fx_passes import post_grad

    post_grad.lazy_init()
    for patterns in post_grad.pass_patterns:
        patterns.apply(graph)


def _contiguous_after_permutes(graph: torch.fx.Graph, *, meta_of_copy: bool) -> None:
    """Each ``aten.permute`` followed by a contiguous copy (``aten.clone`` with ``torch.contiguous_format``,
    as a layout pass inserts one before a kernel that wants dense rows), its users reading the copy: what each
    computes is unchanged, the copy's layout is not the permute's."""
    for permuted in graph.find_nodes(op="call_function", target=aten.permute.default):
        with graph.inserting_after(permuted):
            copied = graph.call_function(aten.clone.default, (permuted,), {"memory_format": torch.contiguous_format})
        copied.meta.update(permuted.meta)
        if not meta_of_copy:  # the copy's meta['val'] computed from its input's, as the op computes it
            copied.meta["val"] = permuted.meta["val"].clone(memory_format=torch.contiguous_format)
        permuted.replace_all_uses_with(copied, delete_user_cb=lambda user, copied=copied: user is not copied)


def contiguous_after_permutes(graph: torch.fx.Graph) -> None:
    """A contiguous copy after each permute, its ``meta['val']`` computed for the copy."""
    _contiguous_after_permutes(graph, meta_of_copy=False)


def contiguous_after_permutes_stale_meta(graph: torch.fx.Graph) -> None:
    """BUG (a stale description on a node the pass made): :func:`contiguous_after_permutes` giving each copy the
    permute's ``meta['val']``, whose strides are the permuted ones: ``meta`` fails naming the copy, at the
    joint hooks too (where a node the pass left alone may keep stale strides, as torch's own patterns leave them)."""
    _contiguous_after_permutes(graph, meta_of_copy=True)
