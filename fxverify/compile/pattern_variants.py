"""Variants of a pattern's search graph: the graphs a pattern-matcher pass meets in users' programs,
in context and as near misses.

A :class:`Variant` changes what the matcher leaves unpinned (``register_replacement`` traces the search
function with ints, floats, lists, dtypes and devices wildcarded): the example inputs' sizes (two sizes
**made equal on purpose**, a broadcast dimension), dtypes (all bfloat16, or one input only: mixed),
strides (a non-contiguous input), and :class:`Edit` s of the traced search graph (another permutation,
another dim, another scalar constant, view sizes swapped, an inner node with a user outside the
pattern, an input defined late). :func:`build` makes the program (a ``GraphModule`` and its inputs)
that a variant describes, or None where the variant is not a well-typed program.

>>> import torch
>>> from torch._inductor.pattern_matcher import fwd_only
>>> graph = fwd_only(lambda x: x.permute(1, 0).relu(), [torch.randn(2, 3)])
>>> [edit.describe() for edit in edits_of(graph)][:2]
['aten.permute.default#0 dims=(0, 1)', 'aten.permute.default#0 feeds the output too']
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from fxverify.capture.inductor import aot_roles

DIM_NAMES = ("dim", "dim0", "dim1", "start_dim", "end_dim")
SPELLINGS = frozenset({"swap", "late_input"})  # edit kinds that spell the same computation otherwise
COMMUTATIVE = ("aten.add.Tensor", "aten.mul.Tensor", "aten.maximum.default", "aten.minimum.default")
LOW_PRECISION = torch.bfloat16  # a dtype fused kernels guard on


@dataclasses.dataclass(frozen=True)
class Edit:
    """One change to a traced search graph: the ``occurrence``-th node of ``target`` gets ``value`` as
    its argument ``position`` (kind ``dims``, ``dim``, ``scalar``, ``sizes``), or its value also
    feeds the output (kind ``extra_user``), or its two operands are swapped (kind ``swap``, a commutative op),
    or input ``position`` is computed just before its
    first user (kind ``late_input``, with ``target`` empty)."""

    kind: str
    target: str
    occurrence: int
    position: int
    value: Any = None  # hashable: a tuple stands for a list argument

    def describe(self) -> str:
        where = f"{self.target}#{self.occurrence}"
        if self.kind == "extra_user":
            return f"{where} feeds the output too"
        if self.kind == "late_input":
            return f"input {self.position} computed just before its first use"
        if self.kind == "swap":
            return f"{where} operands swapped"
        return f"{where} {self.kind}={self.value}"


@dataclasses.dataclass(frozen=True)
class Variant:
    """How one program differs from the pattern's search function traced on its example inputs."""

    sizes: tuple[tuple[int, int], ...] = ()  # every input dimension of size a becomes b
    dtypes: tuple[str | None, ...] = ()  # per input: another floating dtype's name, or None
    strided: int | None = None  # an input given non-contiguous strides (its last two dims swapped in memory)
    broadcast: int | None = None  # an input whose first dimension becomes 1
    numbers: bool = False  # 0-dim tensor inputs given as Python numbers (constants of the program, as users write)
    edits: tuple[Edit, ...] = ()
    spelling: str | None = None  # another spelling of the search function its author declared, by label

    def describe(self) -> str:
        """The variant in words, e.g. ``sizes 8->4; input 1 bfloat16``."""
        parts = [f"sizes {', '.join(f'{a}->{b}' for a, b in self.sizes)} (made equal on purpose)"] if self.sizes else []
        parts += [f"input {i} {dtype}" for i, dtype in enumerate(self.dtypes) if dtype]
        if self.strided is not None:
            parts.append(f"input {self.strided} non-contiguous")
        if self.broadcast is not None:
            parts.append(f"input {self.broadcast} broadcast (first dim 1)")
        if self.spelling is not None:
            parts.append(f"spelled as {self.spelling}")
        if self.numbers:
            parts.append("0-dim inputs as Python numbers")
        parts += [edit.describe() for edit in self.edits]
        return "; ".join(parts) or "as registered (the example inputs)"

    @property
    def equivalent(self) -> bool:
        """Whether it spells the search function's computation at other inputs only (no graph edit), so a
        complete pattern should fire on it."""
        return all(edit.kind in SPELLINGS for edit in self.edits)


def size_options(inputs: Sequence[Any]) -> list[tuple[tuple[int, int], ...]]:
    """The size substitutions worth trying: each pair of distinct input sizes made equal (the larger becomes
    the smaller), the example sizes first.

    >>> size_options([torch.zeros(2, 4, 8)])
    [(), ((4, 2),), ((8, 2),), ((8, 4),)]
    """
    sizes = sorted({size for value in inputs if isinstance(value, torch.Tensor) for size in value.shape if size > 1})
    return [(), *(((big, small),) for small, big in itertools.combinations(sizes, 2))]


def dtype_options(inputs: Sequence[Any]) -> list[tuple[str | None, ...]]:
    """All floating inputs in bfloat16, then each one alone (mixed dtypes), after the example dtypes."""
    floating = [i for i, value in enumerate(inputs) if isinstance(value, torch.Tensor) and value.is_floating_point()
                and value.dtype != LOW_PRECISION]
    name = str(LOW_PRECISION).removeprefix("torch.")
    if not floating:
        return [()]
    every = tuple(name if i in floating else None for i in range(len(inputs)))
    singles = [tuple(name if i == j else None for i in range(len(inputs))) for j in floating] if len(floating) > 1 else []
    return [(), every, *singles]


def inputs_for(example: Sequence[Any], variant: Variant, seed: int = 0) -> list[Any] | None:
    """Fresh inputs as the example's, with the variant's sizes, dtypes, strides and broadcast (None where it
    makes no such input)."""
    generator = torch.Generator().manual_seed(seed)
    made: list[Any] = []
    for i, value in enumerate(example):
        if not isinstance(value, torch.Tensor):
            made.append(value)
            continue
        shape = [dict(variant.sizes).get(size, size) for size in value.shape]
        if variant.broadcast == i:
            if not shape or shape[0] == 1:
                return None
            shape[0] = 1
        named = variant.dtypes[i] if i < len(variant.dtypes) else None
        dtype = getattr(torch, named) if named else value.dtype
        made.append(_tensor_like(value, shape, dtype, variant.strided == i, generator, value.requires_grad))
    if variant.strided is not None and not (0 <= variant.strided < len(made) and made[variant.strided].dim() >= 2):
        return None
    return made


def _tensor_like(value: torch.Tensor, shape: list[int], dtype: torch.dtype, strided: bool,
                 generator: torch.Generator, requires_grad: bool = False) -> torch.Tensor:
    """A fresh tensor like ``value`` (requiring grad where a training pattern's example does)."""
    if not value.is_floating_point():
        return value.clone() if list(value.shape) == shape else torch.zeros(shape, dtype=value.dtype)
    if strided and len(shape) >= 2:
        swapped = [*shape[:-2], shape[-1], shape[-2]]
        return torch.randn(swapped, generator=generator).to(dtype).requires_grad_(requires_grad).transpose(-1, -2)
    return torch.randn(shape, generator=generator).to(dtype).requires_grad_(requires_grad)


def edits_of(graph: fx.GraphModule) -> list[Edit]:
    """Every single edit of a traced search graph that keeps it a program of the same ops: each permutation,
    dim, scalar constant and view size the matcher wildcards, changed; each inner node given a user outside
    the pattern; each input defined late."""
    found: list[Edit] = []
    counts: dict[str, int] = {}
    output = next(iter(graph.graph.find_nodes(op="output")))
    returned = set(output.all_input_nodes)
    for node in graph.graph.nodes:
        if node.op != "call_function":
            continue
        target = str(node.target)
        occurrence = counts[target] = counts.get(target, -1) + 1
        schema = getattr(node.target, "_schema", None)
        names = [a.name for a in schema.arguments] if schema is not None else []
        rank = _rank(node)
        for position, value in enumerate(node.args):
            name = names[position] if position < len(names) else ""
            for kind, new in _changes(name, value, rank):
                found.append(Edit(kind, target, occurrence, position, new))
        if target in COMMUTATIVE and len(node.args) == 2 and all(isinstance(a, fx.Node) for a in node.args) \
                and node.args[0] is not node.args[1] and not node.kwargs:
            found.append(Edit("swap", target, occurrence, 0))
        if node not in returned and node.users:
            found.append(Edit("extra_user", target, occurrence, -1))
    placeholders = list(graph.graph.find_nodes(op="placeholder"))
    found += [Edit("late_input", "", 0, i) for i, node in enumerate(placeholders) if node.users]
    return found


def _rank(node: fx.Node) -> int | None:
    first = node.args[0] if node.args else None
    value = first.meta.get("val") if isinstance(first, fx.Node) else None
    return value.dim() if isinstance(value, torch.Tensor) else None


def _changes(name: str, value: Any, rank: int | None) -> list[tuple[str, Any]]:
    """The near misses of one argument: ``(kind, new value)`` pairs."""
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
        items = list(value)
        if name == "dims" and sorted(items) == list(range(len(items))):
            others = itertools.permutations(items) if len(items) <= 4 else (_swapped(items, i) for i in range(len(items) - 1))
            return [("dims", tuple(p)) for p in others if list(p) != items]
        if name in ("size", "shape"):
            return [("sizes", tuple(_swapped(items, i))) for i in range(len(items) - 1) if items[i] != items[i + 1]]
        if name == "dim" and rank:
            return [("dim", (d,)) for d in range(rank) if [d] != [v % rank for v in items]]
        return []
    if isinstance(value, int) and name in DIM_NAMES and rank:
        return [("dim", d) for d in range(rank) if d != value % rank]
    if isinstance(value, (int, float)) and name not in DIM_NAMES and name not in ("size", "shape"):
        return [("scalar", new) for new in (value * 2 if value else 1, -value if value else -1)]
    return []


def _swapped(items: list[int], i: int) -> list[int]:
    swapped = list(items)
    swapped[i], swapped[i + 1] = swapped[i + 1], swapped[i]
    return swapped


def build(search: Callable[..., Any], trace_fn: Callable[..., Any], example: Sequence[Any], variant: Variant
          ) -> tuple[fx.GraphModule, list[Any]] | None:
    """The program ``variant`` describes, traced as the pass meets it (``trace_fn``: Inductor's ``fwd_only``, or
    ``joint_fwd_bwd`` for a training pattern, whose program is the joint graph of the variant's forward, taking its
    inputs and then a tangent for each output, drawn here), and its inputs; None where the variant is no well-typed
    program (its edits do not apply at these inputs, or it raises). Edits change the forward program. Every node's
    ``meta['val']`` comes from one fake mode, as in a graph Inductor compiles."""
    inputs = inputs_for(example, variant)
    if inputs is None:
        return None
    if variant.numbers:
        search, inputs = _numbers_bound(search, inputs)
    joint = traces_joint(trace_fn)
    forward = forward_trace(trace_fn)
    try:
        graph = forward(search, inputs)
        if variant.edits:
            edited = _edited(graph, variant.edits, inputs)
            if edited is None:
                return None
            graph, inputs = edited
            graph = forward(graph, inputs)
        if joint:
            graph, inputs = _joint(trace_fn, graph if variant.edits else search, inputs)
        graph(*inputs)
        fake_outputs(graph, inputs)
    except Exception:  # a near miss that is no program (a shape or dtype error) is no variant
        return None
    return graph, inputs


def compiled_trace(fn: Callable[..., Any], inputs: Sequence[Any]) -> fx.GraphModule:
    """``fn``'s inference graph as ``torch.compile`` hands it to Inductor: AOTAutograd's functionalized trace with
    Inductor's decompositions, so a mutable op (one writing into an ``out`` buffer) arrives as
    ``auto_functionalized``, as the post-grad passes meet it."""
    from torch._functorch.aot_autograd import aot_function, make_boxed_func
    from torch._inductor.decomposition import select_decomp_table

    kept: list[fx.GraphModule] = []

    def keep(gm: fx.GraphModule, example_inputs: Any) -> Any:
        kept.append(gm)
        return make_boxed_func(gm.forward)

    with torch.no_grad():
        aot_function(fn, fw_compiler=keep, decompositions=select_decomp_table(),
                     keep_inference_input_mutations=True)(*inputs)
    return kept[0]


def traces_joint(trace_fn: Callable[..., Any]) -> bool:
    """Whether ``trace_fn`` is Inductor's ``joint_fwd_bwd`` (a training pattern's), or a ``functools.partial`` of it."""
    from torch._inductor.pattern_matcher import joint_fwd_bwd

    return unwrapped(trace_fn) is joint_fwd_bwd


def forward_trace(trace_fn: Callable[..., Any]) -> Callable[..., Any]:
    """How a pattern's forward program is traced, the program edits change: ``fwd_only`` for a training pattern
    (``joint_fwd_bwd``), else ``trace_fn`` itself."""
    from torch._inductor.pattern_matcher import fwd_only

    return fwd_only if traces_joint(trace_fn) else trace_fn


def unwrapped(function: Any) -> Any:
    """The function a ``functools.partial`` (however nested) wraps, else ``function``."""
    while isinstance(function, functools.partial):
        function = function.func
    return function


def _joint(trace_fn: Callable[..., Any], forward: Callable[..., Any], inputs: list[Any]
           ) -> tuple[fx.GraphModule, list[Any]]:
    """The joint graph of ``forward`` (``trace_fn`` is ``joint_fwd_bwd``) and its inputs: ``inputs`` (AOTAutograd's
    primals, as given), then a tangent for each output needing a gradient, drawn from a fixed seed."""
    graph = trace_fn(forward, inputs)
    placeholders = graph.graph.find_nodes(op="placeholder")
    for node in placeholders:  # joint_fwd_bwd renames them (primals_2 reads argument primals_1): code that runs
        node.target = node.name
    graph.recompile()
    generator = torch.Generator().manual_seed(len(inputs))
    reads, _ = aot_roles(graph)
    tangents = [node.meta["val"] for node, (kind, _) in zip(placeholders, reads, strict=True) if kind == "tangent"]
    drawn = [torch.randn(tuple(fake.shape), generator=generator).to(fake.dtype) for fake in tangents]
    primals = [value.detach() if isinstance(value, torch.Tensor) else value for value in inputs]
    return graph, [*primals, *drawn]


def _numbers_bound(search: Callable[..., Any], inputs: list[Any]) -> tuple[Callable[..., Any], list[Any]]:
    """``search`` with its 0-dim tensor inputs bound to their values as Python numbers, and the other inputs."""
    numbers = {i: value.item() for i, value in enumerate(inputs) if isinstance(value, torch.Tensor) and value.dim() == 0}
    rest = [value for i, value in enumerate(inputs) if i not in numbers]

    def bound(*given: Any) -> Any:
        supplied = iter(given)
        return search(*(numbers[i] if i in numbers else next(supplied) for i in range(len(inputs))))

    return bound, rest


def fake_outputs(graph: fx.GraphModule, inputs: Sequence[Any], mode: Any = None) -> Any:
    """``graph`` run on fake copies of ``inputs`` in ``mode`` (a fresh ``FakeTensorMode``: None), every node's
    ``meta['val']`` set from that one mode (tracing leaves fake tensors of several); its outputs."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = mode if mode is not None else FakeTensorMode(allow_non_fake_inputs=True)
    fakes = (mode.from_tensor(value) if isinstance(value, torch.Tensor) else value for value in inputs)
    return FakeTensorProp(graph, mode).propagate(*fakes)


def copied(graph: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``graph`` whose nodes share the original's ``meta`` values (``copy.deepcopy`` would give each
    fake tensor a fake mode of its own, which Inductor's replacement tracing rejects)."""
    new = fx.Graph()
    new.output(new.graph_copy(graph.graph, {}))
    return fx.GraphModule(graph, new)


def _edited(graph: fx.GraphModule, edits: Sequence[Edit], inputs: list[Any]
            ) -> tuple[fx.GraphModule, list[Any]] | None:
    graph = copied(graph)
    inputs = list(inputs)
    nodes: dict[tuple[str, int], fx.Node] = {}
    counts: dict[str, int] = {}
    for node in graph.graph.nodes:
        if node.op == "call_function":
            occurrence = counts[str(node.target)] = counts.get(str(node.target), -1) + 1
            nodes[(str(node.target), occurrence)] = node
    placeholders = list(graph.graph.find_nodes(op="placeholder"))
    output = next(iter(graph.graph.find_nodes(op="output")))
    for edit in edits:
        if edit.kind == "late_input":
            if edit.position >= len(placeholders) or not placeholders[edit.position].users:
                return None
            _define_late(graph.graph, placeholders[edit.position])
            continue
        node = nodes.get((edit.target, edit.occurrence))
        if node is None:
            return None
        if edit.kind == "swap":
            node.args = (node.args[1], node.args[0])
            continue
        if edit.kind == "extra_user":
            returned = output.args[0]
            output.args = ((*returned, node) if isinstance(returned, (list, tuple)) else (returned, node),)
            continue
        if edit.position >= len(node.args):
            return None
        value = list(edit.value) if isinstance(edit.value, tuple) else edit.value
        if edit.kind == "dims":
            _keep_permuted_shape(node, value, placeholders, inputs)
        node.args = (*node.args[:edit.position], value, *node.args[edit.position + 1:])
    for node in graph.graph.nodes:  # an edit may leave a view of a tensor it cannot view (a permuted input), which a
        if node.target is torch.ops.aten.view.default:  # user's matmul reshapes: trace_fn decomposes reshape again
            node.target = torch.ops.aten.reshape.default
    graph.graph.lint()
    graph.recompile()
    return graph, inputs


def _define_late(graph: fx.Graph, placeholder: fx.Node) -> None:
    """Route ``placeholder``'s uses through ``neg(neg(placeholder))`` computed just before its first user."""
    first = min(placeholder.users, key=lambda user: list(graph.nodes).index(user))
    with graph.inserting_before(first):
        negated = graph.call_function(torch.ops.aten.neg.default, (placeholder,))
        again = graph.call_function(torch.ops.aten.neg.default, (negated,))
    placeholder.replace_all_uses_with(again, delete_user_cb=lambda user: user is not negated)


def _keep_permuted_shape(node: fx.Node, dims: list[int], placeholders: list[fx.Node], inputs: list[Any]) -> None:
    """For a permute of an input, give that input the shape that keeps the permute's output shape under the
    new ``dims`` (a user permuting another layout into the same shape, as ``key.permute(0, 2, 3, 1)``); a
    permute of an inner node keeps its input, so its output shape changes (the program may not type-check)."""
    source = node.args[0]
    if not isinstance(source, fx.Node) or source not in placeholders:
        return
    index = placeholders.index(source)
    value = inputs[index]
    old: Sequence[int] = node.args[1]  # type: ignore[assignment]  # a permute's dims
    out = [value.shape[d] for d in old]
    shape = [0] * len(out)
    for position, d in enumerate(dims):
        shape[d] = out[position]
    inputs[index] = _tensor_like(value, shape, value.dtype, False, torch.Generator().manual_seed(index),
                                 value.requires_grad)
