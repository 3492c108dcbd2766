"""Which nodes a transform kept: same name, opcode and target, the same input
nodes (by name), the same constant arguments (when the positional arguments are
as many), and for ``call_module`` / ``get_attr`` the same parameters and
buffers. An input may be rewired around a node the transform removed (after a
BN fold, the relu reads the conv directly), but the value must not change: the
values of kept nodes must agree between the original and the transformed
module, which is how fxverify finds the first node where things went wrong. A
retrace renumbers nodes, so a name alone says little.
"""

from __future__ import annotations

from torch import fx, nn
from torch.utils import _pytree as pytree

from fxverify.graph_text import target_name
from fxverify.module_state import resolve, tensors_equal


def kept_nodes(original: fx.GraphModule, result: fx.GraphModule) -> list[tuple[fx.Node, fx.Node]]:
    """Pairs ``(original_node, result_node)`` the transform kept, in result order.

    A fused conv keeps its node name but not its weights, so it is not kept;
    the relu after the removed BN is, and must see the same value.
    """
    by_name = {n.name: n for n in original.graph.nodes}
    result_names = {n.name for n in result.graph.nodes}
    same_state: dict[str, bool] = {}
    pairs = []
    kept = {n.name for n in result.graph.find_nodes(op="placeholder")}
    for node in result.graph.nodes:
        old = by_name.get(node.name)
        if old is None or old.op != node.op or node.op in ("placeholder", "output"):
            continue
        if target_name(old) != target_name(node) or not _same_constants(old, node):
            continue
        if not _same_inputs(old, node, result_names, kept):
            continue
        if node.op in ("call_module", "get_attr"):
            target = str(node.target)
            if target not in same_state:
                same_state[target] = _same_attribute(original, result, target)
            if not same_state[target]:
                continue
        pairs.append((old, node))
        kept.add(node.name)
    return pairs


def _same_inputs(old: fx.Node, new: fx.Node, result_names: set[str], kept: set[str]) -> bool:
    """Each input is a kept node of the same name, unless the old input is gone from the
    result (rewired around a removed node, as after a BN fold)."""
    before, after = old.all_input_nodes, new.all_input_nodes
    return len(before) == len(after) and all(
        (a.name == b.name and b.name in kept) or a.name not in result_names for a, b in zip(before, after)
    )


def _same_constants(old: fx.Node, new: fx.Node) -> bool:
    """A retrace renumbers nodes: ``getattr_2`` may now read another attribute. Normalising
    passes move arguments into kwargs, so only equally many positional arguments are compared."""
    if len(old.args) != len(new.args):
        return True
    constants = [[repr(a) for a in pytree.tree_leaves(n.args) if not isinstance(a, fx.Node)] for n in (old, new)]
    return constants[0] == constants[1]


def _same_attribute(original: nn.Module, result: nn.Module, target: str) -> bool:
    try:
        a, b = resolve(original, target), resolve(result, target)
    except AttributeError:
        return False
    if isinstance(a, nn.Module) and isinstance(b, nn.Module):
        sa, sb = a.state_dict(), b.state_dict()
        return type(a) is type(b) and sa.keys() == sb.keys() and all(tensors_equal(sa[k], sb[k]) for k in sa)
    return tensors_equal(a, b)
