"""Passes written for Inductor's ``pre_grad_custom_pass``: torch-level graphs as Dynamo makes them, parameters and
buffers graph inputs, before AOTAutograd differentiates them. The correct ones fold a BatchNorm in eval mode into
the convolution before it, computing the folded weight and bias in the graph (the parameters are inputs there:
nothing can be folded ahead of time), as Inductor's own ``efficient_conv_bn_eval`` does; each buggy one carries a
defect of real conv/BN folds, named in its docstring with the check meant to catch it.
"""

from __future__ import annotations

import inspect
import operator
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

_BATCH_NORM = inspect.signature(torch.nn.functional.batch_norm)
_CONVS = {torch.conv1d: 3, torch.conv2d: 4, torch.conv3d: 5}  # each convolution and its weight's dimensions


class Nothing(CustomGraphPass):
    """A ``CustomGraphPass`` that changes nothing: the graph-form identity."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        return None

    def uuid(self) -> Any:
        return get_hash_for_files((__file__,))


NOTHING = Nothing()  # what a user assigns to torch._inductor.config.pre_grad_custom_pass


def _fold(graph: torch.fx.Graph, *, eval_only: bool = True, conv_bias: bool = True) -> None:
    """Each ``F.batch_norm`` reading a convolution that nothing else reads becomes one convolution whose weight and
    bias fold the normalisation in (``eval_only``: where ``training`` is False; ``conv_bias``: the convolution's own
    bias kept in the folded one)."""
    for bn in graph.find_nodes(op="call_function", target=torch.nn.functional.batch_norm):
        bound = _BATCH_NORM.bind(*bn.args, **bn.kwargs)
        bound.apply_defaults()
        x, mean, var, weight, bias, training, _, eps = bound.args
        conv = x if isinstance(x, torch.fx.Node) else None
        if conv is None or conv.target not in _CONVS or len(conv.users) > 1 or mean is None or var is None:
            continue
        if eval_only and training is not False:
            continue
        conv_x, conv_weight, *rest = conv.args
        own_bias = rest.pop(0) if rest else conv.kwargs.get("bias")
        with graph.inserting_before(bn):
            scale = graph.call_function(torch.rsqrt, (graph.call_function(operator.add, (var, eps)),))
            if weight is not None:
                scale = graph.call_function(operator.mul, (scale, weight))
            shape = (-1,) + (1,) * (_CONVS[conv.target] - 1)
            folded_weight = graph.call_function(operator.mul, (conv_weight, graph.call_method("reshape", (scale, shape))))
            start = own_bias if conv_bias and own_bias is not None else graph.call_function(torch.zeros_like, (var,))
            folded_bias = graph.call_function(operator.mul, (graph.call_function(operator.sub, (start, mean)), scale))
            if bias is not None:
                folded_bias = graph.call_function(operator.add, (folded_bias, bias))
            kwargs = {k: v for k, v in conv.kwargs.items() if k != "bias"}
            fused = graph.call_function(conv.target, (conv_x, folded_weight, folded_bias, *rest), kwargs)
        bn.replace_all_uses_with(fused)
        graph.erase_node(bn)
        graph.erase_node(conv)


class FoldConvBn(CustomGraphPass):
    """BatchNorm in eval mode folded into the convolution before it, the folded weight and bias computed in the
    graph; a BatchNorm in train mode (batch statistics, running statistics updated) left alone."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        _fold(graph)

    def uuid(self) -> Any:
        return get_hash_for_files((__file__,))


FOLD_CONV_BN = FoldConvBn()


def fold_conv_bn_dropping_bias(graph: torch.fx.Graph) -> None:
    """BUG (numerics): the fold starts the folded bias from zero, dropping the convolution's own bias (right for
    the bias-free convolutions of torchvision's ResNets, wrong for a convolution with a bias)."""
    _fold(graph, conv_bias=False)


def fold_conv_bn_in_train_mode_too(graph: torch.fx.Graph) -> None:
    """BUG (numerics, train mode): the fold does not read ``batch_norm``'s ``training`` argument, so in a training
    graph it normalises with the running statistics instead of the batch's, and stops updating them; eval graphs
    are folded right."""
    _fold(graph, eval_only=False)


def inductor_efficient_conv_bn_eval(graph: torch.fx.Graph) -> None:
    """Inductor's own pre-grad pass ``efficient_conv_bn_eval_pass`` (a ``PatternMatcherPass``: ``F.batch_norm`` in
    eval mode after a convolution or linear becomes one call computing the folded weight on the fly), with
    ``config.efficient_conv_bn_eval_fx_passes`` on, as ``pre_grad_passes`` runs it when a user turns it on."""
    from torch._inductor import config
    from torch._inductor.fx_passes import efficient_conv_bn_eval  # noqa: F401  registers its patterns
    from torch._inductor.fx_passes.pre_grad import efficient_conv_bn_eval_pass

    with config.patch(efficient_conv_bn_eval_fx_passes=True):
        efficient_conv_bn_eval_pass.apply(graph)
