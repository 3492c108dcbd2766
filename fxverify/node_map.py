"""Which nodes a transform kept: same name, opcode and target, and for
``call_module`` / ``get_attr`` the same parameters and buffers. Inputs may be
rewired (after a BN fold, the relu reads the conv directly), but the value
must not change: the values of kept nodes must agree between the original and
the transformed module, which is how fxverify finds the first node where
things went wrong.
"""

from __future__ import annotations

from torch import fx, nn

from fxverify.graph_text import target_name
from fxverify.module_state import resolve, tensors_equal


def kept_nodes(original: fx.GraphModule, result: fx.GraphModule) -> list[tuple[fx.Node, fx.Node]]:
    """Pairs ``(original_node, result_node)`` the transform kept, in result order.

    A fused conv keeps its node name but not its weights, so it is not kept;
    the relu after the removed BN is, and must see the same value.
    """
    by_name = {n.name: n for n in original.graph.nodes}
    same_state: dict[str, bool] = {}
    pairs = []
    for node in result.graph.nodes:
        old = by_name.get(node.name)
        if old is None or old.op != node.op or node.op in ("placeholder", "output"):
            continue
        if target_name(old) != target_name(node):
            continue
        if node.op in ("call_module", "get_attr"):
            target = str(node.target)
            if target not in same_state:
                same_state[target] = _same_attribute(original, result, target)
            if not same_state[target]:
                continue
        pairs.append((old, node))
    return pairs


def _same_attribute(original: nn.Module, result: nn.Module, target: str) -> bool:
    try:
        a, b = resolve(original, target), resolve(result, target)
    except AttributeError:
        return False
    if isinstance(a, nn.Module) and isinstance(b, nn.Module):
        sa, sb = a.state_dict(), b.state_dict()
        return type(a) is type(b) and sa.keys() == sb.keys() and all(tensors_equal(sa[k], sb[k]) for k in sa)
    return tensors_equal(a, b)
