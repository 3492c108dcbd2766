"""Transforms for testing fxverify itself: correct ones that every check must
pass, and realistic buggy ones, each a bug class transform authors really
make, with the check that must catch it.

``BUGGY`` maps each buggy transform to that check; ``CORRECT`` lists the
correct ones. Tests (and later benchmarks) reuse both from here.
"""

from __future__ import annotations

import copy
import operator

import torch
from torch import fx, nn
from torch.fx.experimental.normalize import NormalizeArgs
from torch.fx.experimental.optimization import fuse, remove_dropout

import fxverify

# -- correct transforms -----------------------------------------------------------


@fxverify.contract(modes=("eval",), changes_parameters=True)
def torch_fuse(gm: fx.GraphModule) -> nn.Module:
    """torch's conv/BN (and linear/BN) fusion: inference only, rewrites parameters."""
    return fuse(gm)


@fxverify.contract(modes=("eval",))
def torch_remove_dropout(gm: fx.GraphModule) -> nn.Module:
    """torch's remove_dropout: dropout is an identity in eval mode only."""
    return remove_dropout(gm)


def normalize_args(gm: fx.GraphModule) -> nn.Module:
    """torch's NormalizeArgs: calls rewritten to keyword arguments."""
    return NormalizeArgs(gm).transform()


def transformer_identity(gm: fx.GraphModule) -> nn.Module:
    """A torch.fx.Transformer that changes nothing."""
    return fx.Transformer(gm).transform()


def relu_to_clamp_in_place(gm: fx.GraphModule) -> None:
    """Rewrites functional relu to clamp(min=0) in place and returns None."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.nn.functional.relu:
            node.target = torch.clamp
            node.args = (node.args[0],)
            node.kwargs = {"min": 0.0}
    gm.recompile()


def retrace_with_tracer_class(m: nn.Module, tracer_class: type = fx.Tracer) -> nn.Module:
    """The torch.fx docs convention: transform(m, tracer_class)."""
    return fx.GraphModule(m, tracer_class().trace(m))


CORRECT = [torch_fuse, torch_remove_dropout, normalize_args, transformer_identity]

# -- buggy transforms ------------------------------------------------------------------


def _fold_bn(gm: fx.GraphModule, fold_weights) -> fx.GraphModule:
    """Shared skeleton of the BN folds below: conv -> bn pairs, folded by ``fold_weights``."""
    gm = copy.deepcopy(gm)
    modules = dict(gm.named_modules())
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or not isinstance(modules.get(node.target), nn.BatchNorm2d):
            continue
        conv_node = node.args[0]
        if not (isinstance(conv_node, fx.Node) and conv_node.op == "call_module"
                and isinstance(modules.get(conv_node.target), nn.Conv2d) and len(conv_node.users) == 1):
            continue
        conv, bn = modules[conv_node.target], modules[node.target]
        fused = copy.deepcopy(conv)
        weight, bias = fold_weights(conv, bn)
        fused.weight = nn.Parameter(weight)
        fused.bias = nn.Parameter(bias)
        parent, _, name = conv_node.target.rpartition(".")
        setattr(gm.get_submodule(parent) if parent else gm, name, fused)
        node.replace_all_uses_with(conv_node)
        gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return gm


def _correct_fold(conv: nn.Conv2d, bn: nn.BatchNorm2d, *, use_mean: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    conv_bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
    mean = bn.running_mean if use_mean else torch.zeros_like(bn.running_mean)
    weight = conv.weight * scale.reshape(-1, 1, 1, 1)
    bias = (conv_bias - mean) * scale + bn.bias
    return weight.detach(), bias.detach()


@fxverify.contract(modes=("eval",), changes_parameters=True)
def bn_fold_ignores_running_mean(gm: fx.GraphModule) -> nn.Module:
    """BN fold that drops the running_mean term: exact only at mean 0 (fresh init)."""
    return _fold_bn(gm, lambda conv, bn: _correct_fold(conv, bn, use_mean=False))


@fxverify.contract(modes=("eval",), changes_parameters=True)
def bn_fold_correct(gm: fx.GraphModule) -> nn.Module:
    """The same skeleton folding correctly (control for the buggy fold)."""
    return _fold_bn(gm, _correct_fold)


def forgets_recompile(gm: fx.GraphModule) -> nn.Module:
    """Inserts a clone after the first module call but never calls recompile()."""
    gm = copy.deepcopy(gm)
    node = next(n for n in gm.graph.nodes if n.op == "call_module")
    with gm.graph.inserting_after(node):
        clone = gm.graph.call_method("clone", (node,))
    node.replace_all_uses_with(clone, delete_user_cb=lambda user: user is not clone)
    return gm


def set_ordered_schedule(gm: fx.GraphModule) -> nn.Module:
    """Re-schedules independent nodes by iterating a set of nodes: order follows addresses."""
    gm = copy.deepcopy(gm)
    graph = gm.graph
    new_graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    remaining = set(graph.nodes)
    output = None
    while remaining:
        ready = [n for n in remaining if all(a in env for a in n.all_input_nodes)]
        for node in ready[:1]:  # the first ready node of the set's order
            remaining.discard(node)
            if node.op == "output":
                output = node
                continue
            env[node] = new_graph.node_copy(node, lambda a: env[a])
    assert output is not None
    new_graph.node_copy(output, lambda a: env[a])
    return fx.GraphModule(gm, new_graph)


def hash_ordered_names(gm: fx.GraphModule) -> nn.Module:
    """Renames call_module nodes in the order of a set of their names: depends on PYTHONHASHSEED."""
    gm = copy.deepcopy(gm)
    nodes = {n.name: n for n in gm.graph.nodes if n.op == "call_module"}
    for i, name in enumerate(set(nodes)):
        nodes[name].name = f"m{i}"
    gm.recompile()
    return gm


def bakes_eval_dropout_away(gm: fx.GraphModule) -> nn.Module:
    """Removes every Dropout, claiming to support train mode (no contract): wrong in training."""
    return remove_dropout(gm)


def specialises_batch_size(gm: fx.GraphModule) -> nn.Module:
    """Replaces flatten(x, 1) with a view using the batch size seen once (2): breaks batch 1."""
    gm = copy.deepcopy(gm)
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.flatten:
            node.target = torch.reshape
            node.args = (node.args[0], (2, -1))
            node.kwargs = {}
    gm.recompile()
    return gm


def _rewrite_output(gm: fx.GraphModule, build) -> fx.GraphModule:
    """Copy ``gm`` and replace its (single tensor) output value by ``build(graph, value)``."""
    gm = copy.deepcopy(gm)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    value = output.args[0]
    if isinstance(value, fx.Node):
        with gm.graph.inserting_before(output):
            output.args = (build(gm.graph, value),)
        gm.recompile()
    return gm


def unstable_log_exp(gm: fx.GraphModule) -> nn.Module:
    """Rewrites the output x as log(exp(x)): the identity on paper, inf once x > 88 in float32
    (the numerically unstable rewrite only large inputs reveal)."""
    return _rewrite_output(gm, lambda g, x: g.call_function(torch.log, (g.call_function(torch.exp, (x,)),)))


def plain_tensor_constant(gm: fx.GraphModule) -> nn.Module:
    """Multiplies the output by a scale stored as a plain tensor attribute: .to() leaves it behind."""
    gm = _rewrite_output(gm, lambda g, x: g.call_function(operator.mul, (x, g.get_attr("scale"))))
    gm.scale = torch.ones(())  # not register_buffer
    return gm


def hardcodes_cpu_device(gm: fx.GraphModule) -> nn.Module:
    """Adds zeros created with device='cpu' to the output: fails once the model is moved."""
    def build(g: fx.Graph, x: fx.Node) -> fx.Node:
        zeros = g.call_function(torch.zeros, (g.call_method("size", (x,)),), {"device": "cpu"})
        return g.call_function(operator.add, (x, zeros))

    return _rewrite_output(gm, build)


def freezes_parameters(gm: fx.GraphModule) -> nn.Module:
    """Turns every parameter into a plain (non-trainable) tensor attribute."""
    gm = copy.deepcopy(gm)
    for qualname, param in list(gm.named_parameters()):
        owner_name, _, attr = qualname.rpartition(".")
        owner = gm.get_submodule(owner_name) if owner_name else gm
        delattr(owner, attr)
        setattr(owner, attr, param.detach())
    return gm


def detaches_output(gm: fx.GraphModule) -> nn.Module:
    """Calls .detach() on the output: same values, no gradients."""
    return _rewrite_output(gm, lambda g, x: g.call_method("detach", (x,)))


def mutates_input(gm: fx.GraphModule) -> nn.Module:
    """Returns a new module but renames nodes of the one it was given on the way."""
    for node in gm.graph.nodes:
        if node.op == "call_module":
            node.name = node.name + "_seen"
    gm.recompile()
    return copy.deepcopy(gm)


def transposes_output_layout(gm: fx.GraphModule) -> nn.Module:
    """Returns the output through .t().contiguous().t(): same values, transposed strides."""
    return _rewrite_output(
        gm, lambda g, x: g.call_method("t", (g.call_method("contiguous", (g.call_method("t", (x,)),)),))
    )


def drops_kept_parameter(gm: fx.GraphModule) -> nn.Module:
    """Scales the classifier's weight by 1.0001 in place of a 'cleanup' (changes a parameter undeclared)."""
    gm = copy.deepcopy(gm)
    with torch.no_grad():
        last = [p for p in gm.parameters() if p.ndim == 2][-1]
        last.mul_(1.0001)
    return gm


def returns_graph(gm: fx.GraphModule) -> fx.Graph:
    """Returns the Graph instead of a GraphModule."""
    return copy.deepcopy(gm).graph


def raises(gm: fx.GraphModule) -> nn.Module:
    """Raises on every model."""
    raise RuntimeError("pattern matcher exploded")


def hangs(gm: fx.GraphModule) -> nn.Module:
    """Never returns."""
    while True:
        pass


BUGGY = {
    bn_fold_ignores_running_mean: "numerics",
    forgets_recompile: "lint",
    set_ordered_schedule: "determinism",
    hash_ordered_names: "determinism",
    bakes_eval_dropout_away: "numerics",
    specialises_batch_size: "numerics",
    unstable_log_exp: "numerics",
    plain_tensor_constant: "devices",
    hardcodes_cpu_device: "devices",
    freezes_parameters: "gradients",
    detaches_output: "gradients",
    mutates_input: "purity",
    transposes_output_layout: "purity",
    drops_kept_parameter: "gradients",
}
