"""Which nodes of a transform's result correspond to which nodes of the original,
and which of them the transform kept.

Correspondence (:func:`correspondence`) is tried three ways, in order:

- ``name``: same name, opcode and target;
- ``provenance``: what the transform left in ``node.meta`` names the original node:
  ``from_node`` (``torch.fx.Transformer`` and ``preserve_node_meta`` record it),
  ``original_aten``, ``nn_module_stack`` or ``stack_trace`` with the same opcode
  and target, when exactly one original node fits;
- ``position``: the remaining nodes aligned in topological order by opcode and
  target (``difflib.SequenceMatcher``), placeholders by their order.

A corresponding node is *kept* (:func:`kept_nodes`) when it computes the same
thing: same opcode and target, the same constant arguments (when the positional
arguments are as many), inputs that are kept nodes corresponding to its original
inputs, and for ``call_module`` / ``get_attr`` the same parameters and buffers.
An input may be rewired around nodes the transform removed (after a BN fold,
the relu reads the conv directly: a node upstream of the removed BN), but the
value must not change: the values of kept nodes must agree between the original
and the transformed module, which is how fxverify finds the first node where
things went wrong. A node that reads a new node in place of a removed one (a
partition's output, a decomposition's last op) is not kept, even when its name
matches: what it reads is not known to be the same value.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from torch import fx, nn
from torch.utils import _pytree as pytree

from fxverify.analysis.graph_text import target_name
from fxverify.analysis.module_state import resolve, tensors_equal


class Match(NamedTuple):
    """The original node a result node corresponds to, and how that was decided."""

    original: fx.Node
    how: str  # "name", "provenance" or "position"


def correspondence(original: fx.GraphModule, result: fx.GraphModule) -> dict[fx.Node, Match]:
    """Map result nodes to original nodes by name, then provenance, then position.

    >>> import torch
    >>> gm = fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh()))
    >>> renamed = fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh()))
    >>> for i, node in enumerate(renamed.graph.find_nodes(op="call_module")):
    ...     node.name = f"n{i}"
    >>> matches = correspondence(gm, renamed)
    >>> [(new.name, matches[new].original.name, matches[new].how) for new in renamed.graph.nodes][1:]
    [('n0', '_0', 'provenance'), ('n1', '_1', 'provenance'), ('output', 'output', 'name')]
    """
    matches: dict[fx.Node, Match] = {}
    taken: set[fx.Node] = set()

    def take(new: fx.Node, old: fx.Node, how: str) -> None:
        matches[new] = Match(old, how)
        taken.add(old)

    old_inputs, new_inputs = (list(gm.graph.find_nodes(op="placeholder")) for gm in (original, result))
    for old, new in zip(old_inputs, new_inputs):
        take(new, old, "name" if old.name == new.name else "position")
    by_name = {n.name: n for n in original.graph.nodes}
    for new in result.graph.nodes:
        old = by_name.get(new.name)
        if new not in matches and old is not None and old not in taken and _signature(old) == _signature(new):
            take(new, old, "name")
    for key in _PROVENANCE:
        index = _unique_index(original.graph.nodes, key, taken)
        for new in result.graph.nodes:
            if new in matches:
                continue
            old = next((index[k] for k in key(new) if k in index and index[k] not in taken), None)
            if old is not None:
                take(new, old, "provenance")
    left_old = [n for n in original.graph.nodes if n not in taken]
    left_new = [n for n in result.graph.nodes if n not in matches]
    aligner = difflib.SequenceMatcher(None, [_signature(n) for n in left_old], [_signature(n) for n in left_new],
                                      autojunk=False)
    for block in aligner.get_matching_blocks():
        for i in range(block.size):
            take(left_new[block.b + i], left_old[block.a + i], "position")
    return matches


def kept_nodes(original: fx.GraphModule, result: fx.GraphModule,
               matches: dict[fx.Node, Match] | None = None, *, strict: bool = True) -> list[tuple[fx.Node, fx.Node]]:
    """Pairs ``(original_node, result_node)`` the transform kept, in result order.

    A fused conv keeps its node name but not its weights, so it is not kept;
    the relu after the removed BN is, and must see the same value. With
    ``strict=False`` a node that reads a new node in place of a removed one (the
    conv after a relu swapped for a sigmoid) counts as kept too: its value is only
    expected to agree if the new node computes what the removed one did, which is
    what a failure's localisation assumes, never what makes a failure.
    """
    matches = correspondence(original, result) if matches is None else matches
    counterpart = {m.original: new for new, m in matches.items()}
    same_state: dict[str, bool] = {}
    pairs = []
    kept = {n for n in result.graph.find_nodes(op="placeholder")}
    for node in result.graph.nodes:
        match = matches.get(node)
        if match is None or node.op in ("placeholder", "output"):
            continue
        old = match.original
        if not _same_constants(old, node) or not _same_inputs(old, node, counterpart, kept, matches, strict):
            continue
        if node.op in ("call_module", "get_attr"):
            target = str(node.target)
            if target not in same_state:
                same_state[target] = _same_attribute(original, result, target)
            if not same_state[target]:
                continue
        pairs.append((old, node))
        kept.add(node)
    return pairs


def _signature(node: fx.Node) -> tuple[str, str]:
    return node.op, target_name(node)


def _from_node(node: fx.Node) -> list[tuple[Any, ...]]:
    """Names in the node's ``from_node`` chain, most recent pass first (``NodeSource`` objects)."""
    keys, sources = [], list(node.meta.get("from_node") or ())
    while sources:
        source = sources.pop(0)
        keys.append((*_signature(node), getattr(source, "name", None)))
        sources.extend(getattr(source, "from_node", None) or ())
    return keys


def _meta_key(field: str) -> Callable[[fx.Node], list[tuple[Any, ...]]]:
    def key(node: fx.Node) -> list[tuple[Any, ...]]:
        value = node.meta.get(field)
        if value is None:
            return []
        if isinstance(value, dict):  # nn_module_stack: the module path the node was traced in
            value = tuple(value)
        return [(*_signature(node), str(value))]

    return key


def _own_name(node: fx.Node) -> list[tuple[Any, ...]]:
    return [(*_signature(node), node.name)]


# a result node's provenance keys, matched against the original nodes' own keys
_PROVENANCE: list[Callable[[fx.Node], list[tuple[Any, ...]]]] = [
    _from_node, _meta_key("original_aten"), _meta_key("nn_module_stack"), _meta_key("stack_trace"),
]


def _unique_index(nodes: Iterable[fx.Node], key: Callable[[fx.Node], list[tuple[Any, ...]]],
                  taken: set[fx.Node]) -> dict[tuple[Any, ...], fx.Node]:
    """Original nodes by the keys ``key`` gives them, keeping only keys that name exactly one node.
    ``from_node`` names an original node by its own name."""
    own = _own_name if key is _from_node else key
    seen: dict[tuple[Any, ...], list[fx.Node]] = {}
    for node in nodes:
        if node not in taken:
            for k in own(node):
                seen.setdefault(k, []).append(node)
    return {k: found[0] for k, found in seen.items() if len(found) == 1}


def _same_inputs(old: fx.Node, new: fx.Node, counterpart: dict[fx.Node, fx.Node], kept: set[fx.Node],
                 matches: dict[fx.Node, Match], strict: bool) -> bool:
    """Each input is the kept counterpart of the original input, or the original input was removed
    and the result reads, in its place, the counterpart of a node upstream of it through removed
    nodes only (rewired around a removed node, as after a BN fold the relu reads the conv). A new
    node in place of a removed one (a partition's output, a decomposition) is no correspondence,
    unless not ``strict``."""
    before, after = old.all_input_nodes, new.all_input_nodes
    return len(before) == len(after) and all(
        (counterpart.get(a) is b and b in kept)
        or (a not in counterpart and (_rewired_around(a, b, counterpart, matches) or (not strict and b not in matches)))
        for a, b in zip(before, after)
    )


def _rewired_around(removed: fx.Node, new_input: fx.Node, counterpart: dict[fx.Node, fx.Node],
                    matches: dict[fx.Node, Match]) -> bool:
    """Whether ``new_input`` stands for a node that feeds ``removed`` through removed nodes only."""
    match = matches.get(new_input)
    if match is None:
        return False
    stack, seen = [removed], set()
    while stack:
        node = stack.pop()
        for upstream in node.all_input_nodes:
            if upstream is match.original:
                return True
            if upstream not in counterpart and upstream not in seen:
                seen.add(upstream)
                stack.append(upstream)
    return False


def _same_constants(old: fx.Node, new: fx.Node) -> bool:
    """A retrace renumbers nodes: ``getattr_2`` may now read another attribute. Normalising
    passes move arguments into kwargs, so only equally many positional arguments are compared, after filling the
    shorter list from the operator's schema (an argument given as a keyword or left to its default: a pass that
    drops ``keepdim=True`` from a ``mean`` changes what it computes)."""
    size = max(len(old.args), len(new.args))
    filled = [_positional(node, size) for node in (old, new)]
    if filled[0] is None or filled[1] is None:
        return True
    constants = [[repr(a) for a in pytree.tree_leaves(args) if not isinstance(a, fx.Node)] for args in filled]
    return constants[0] == constants[1]


def _positional(node: fx.Node, size: int) -> list[Any] | None:
    """The first ``size`` positional arguments of ``node``: its own, then from its keywords or its operator schema's
    defaults; None where they are not known (no schema, a keyword-only or required argument)."""
    args = list(node.args)
    if len(args) >= size:
        return args
    schema = getattr(node.target, "_schema", None)
    arguments = list(getattr(schema, "arguments", ()))
    if len(arguments) < size:
        return None
    for argument in arguments[len(args):size]:
        if argument.kwarg_only:
            return None
        if argument.name in node.kwargs:
            args.append(node.kwargs[argument.name])
        elif argument.has_default_value():
            args.append(argument.default_value)
        else:
            return None
    return args


def _same_attribute(original: nn.Module, result: nn.Module, target: str) -> bool:
    try:
        a, b = resolve(original, target), resolve(result, target)
    except AttributeError:
        return False
    if isinstance(a, nn.Module) and isinstance(b, nn.Module):
        sa, sb = a.state_dict(), b.state_dict()
        return type(a) is type(b) and sa.keys() == sb.keys() and all(tensors_equal(sa[k], sb[k]) for k in sa)
    return tensors_equal(a, b)
