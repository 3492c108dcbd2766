"""Variants of a pattern's search graph: the graphs a pattern-matcher pass meets in users' programs,
in context and as near misses.

A :class:`Variant` changes what the matcher leaves unpinned (``register_replacement`` traces the search
function with ints, floats, lists, dtypes and devices wildcarded): the example inputs' sizes (two sizes
**made equal on purpose**, a broadcast dimension), dtypes (all bfloat16, or one input only: mixed),
layout (an input's last two dims swapped in memory), and :class:`Edit` s of the traced search graph (another
permutation, another dim, another scalar constant, view sizes swapped, an inner node with a user outside the
pattern, an input defined late). Inputs are laid out as the example inputs are (shape, strides, storage
offset: a transposed head view stays one, whose matmul traces to a clone), and keep that layout at other sizes.
:func:`build` makes the program (a ``GraphModule`` and its inputs) that a variant describes, traced as the pass
meets it (as the declared hook receives graphs, :func:`~fxverify.inductor.graph_hooks.graph_at_hook`), or None where
the variant is not a well-typed program.

>>> import torch
>>> from torch._inductor.pattern_matcher import fwd_only
>>> graph = fwd_only(lambda x: x.permute(1, 0).relu(), [torch.randn(2, 3)])
>>> [edit.describe() for edit in edits_of(graph)][:2]
['aten.permute.default#0 dims=(0, 1)', 'aten.permute.default#0 feeds the output too']
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import fx

from fxverify.inductor.aot import aot_roles
from fxverify.inductor.graph_hooks import graph_at_hook
from fxverify.inductor.hooks import GRAPH_HOOKS, HookCapture, plain_captures

DIM_NAMES = ("dim", "dim0", "dim1", "start_dim", "end_dim")
# edit kinds that spell the same computation otherwise: operands of a commutative op the search function writes
# swapped (swap) or of one inside a decomposition of another op (inner_swap: no user writes that order), an input
# computed just before its first use (late_input)
SPELLINGS = frozenset({"swap", "inner_swap", "late_input"})
COMMUTATIVE = ("aten.add.Tensor", "aten.mul.Tensor", "aten.maximum.default", "aten.minimum.default")
LOW_PRECISION = torch.bfloat16  # a dtype fused kernels guard on


@dataclasses.dataclass(frozen=True)
class Edit:
    """One change to a traced search graph: the ``occurrence``-th node of ``target`` gets ``value`` as
    its argument ``position`` (kind ``dims``, ``dim``, ``scalar``, ``sizes``), or its value also
    feeds the output (kind ``extra_user``), or its two operands (named in ``value``) are swapped (kind ``swap``, a
    commutative op the search function writes; ``inner_swap``, one inside the decomposition of the op ``value``
    ends with), or input ``position`` is computed just before its first user (kind ``late_input``, with ``target``
    empty)."""

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
        if self.kind in ("swap", "inner_swap"):
            first, second, *inside = self.value or ("?", "?")
            within = f", inside {inside[0]}'s decomposition" if inside else ""
            return f"{where} operands swapped ({first}, {second} -> {second}, {first}{within})"
        return f"{where} {self.kind}={self.value}"


@dataclasses.dataclass(frozen=True)
class Variant:
    """How one program differs from the pattern's search function traced on its example inputs."""

    sizes: tuple[tuple[int, int], ...] = ()  # every input dimension of size a becomes b
    dtypes: tuple[str | None, ...] = ()  # per input: another floating dtype's name, or None
    strided: int | None = None  # an input in another layout: its last two dims swapped in memory
    broadcast: int | None = None  # an input whose first dimension becomes 1
    numbers: bool = False  # 0-dim tensor inputs given as Python numbers (constants of the program, as users write)
    edits: tuple[Edit, ...] = ()
    spelling: str | None = None  # another spelling of the search function its author declared, by label
    hook: str | None = None  # the Inductor capture whose hook receives the program (None: as trace_fn traces it)

    def describe(self) -> str:
        """The variant in words, e.g. ``sizes 8->4; input 1 bfloat16``."""
        parts = [f"sizes {', '.join(f'{a}->{b}' for a, b in self.sizes)} (made equal on purpose)"] if self.sizes else []
        parts += [f"input {i} {dtype}" for i, dtype in enumerate(self.dtypes) if dtype]
        if self.strided is not None:
            parts.append(f"input {self.strided} in another layout (its last two dims swapped in memory)")
        if self.broadcast is not None:
            parts.append(f"input {self.broadcast} broadcast (first dim 1)")
        if self.spelling is not None:
            parts.append(f"spelled as {self.spelling}")
        if self.numbers:
            parts.append("0-dim inputs as Python numbers")
        parts += [edit.describe() for edit in self.edits]
        described = "; ".join(parts) or "as registered (the example inputs)"
        return described + (f", at {hook_name(self.hook)}" if self.hook else "")

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


def dtype_options(inputs: Sequence[Any], uniform: Sequence[str] = ()) -> list[tuple[str | None, ...]]:
    """After the example dtypes: every floating input in bfloat16 and in each dtype of ``uniform`` (one program in
    another dtype), then each one alone in bfloat16, or in float32 where it is bfloat16 (mixed dtypes, for soundness
    only).

    >>> dtype_options([torch.zeros(2), torch.zeros(2)], uniform=("float64",))
    [(), ('bfloat16', 'bfloat16'), ('float64', 'float64'), ('bfloat16', None), (None, 'bfloat16')]
    """
    floating = [i for i, value in enumerate(inputs) if isinstance(value, torch.Tensor) and value.is_floating_point()]
    if not floating:
        return [()]
    low = str(LOW_PRECISION).removeprefix("torch.")
    given = {str(inputs[i].dtype).removeprefix("torch.") for i in floating}
    everies = [tuple(name if i in floating else None for i in range(len(inputs)))
               for name in dict.fromkeys((low, *uniform)) if given != {name}]
    other = {j: "float32" if inputs[j].dtype == LOW_PRECISION else low for j in floating}
    singles = [tuple(other[j] if i == j else None for i in range(len(inputs))) for j in floating] \
        if len(floating) > 1 else []
    return [(), *everies, *singles]


def uniform_dtype(dtypes: Sequence[str | None], inputs: Sequence[Any]) -> str | None:
    """The one dtype ``dtypes`` (a variant's) gives every floating input, or None (the example's, or mixed).

    >>> uniform_dtype(("bfloat16", None), [torch.zeros(2), torch.zeros(2, dtype=torch.long)])
    'bfloat16'
    >>> uniform_dtype(("bfloat16", None), [torch.zeros(2), torch.zeros(2)]) is None
    True
    """
    floating = [i for i, value in enumerate(inputs) if isinstance(value, torch.Tensor) and value.is_floating_point()]
    named = {dtypes[i] if i < len(dtypes) else None for i in floating}
    return next(iter(named)) if len(named) == 1 and None not in named else None


def inputs_for(example: Sequence[Any], variant: Variant, seed: int = 0) -> list[Any] | None:
    """Fresh inputs laid out as the example's (:func:`laid_out`), with the variant's sizes, dtypes, layout and
    broadcast (None where it makes no such input).

    >>> head_view = torch.zeros(2, 8, 4 * 16).view(2, 8, 4, 16).transpose(1, 2)  # (batch, heads, time, head_dim)
    >>> [(tuple(t.shape), t.stride()) for t in inputs_for([head_view], Variant(sizes=((16, 8),)))]
    [((2, 4, 8, 8), (256, 8, 32, 1))]
    """
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
    """A fresh tensor of ``shape`` laid out as ``value`` (:func:`laid_out`; ``strided``: its last two dims swapped in
    memory), requiring grad where a training pattern's example does. A bool tensor (a mask) is drawn too: an
    example made with ``torch.empty``, as Inductor's attention patterns make theirs, holds whatever memory held,
    and a verdict must not depend on that; other integer tensors (indices) keep the example's values at its shape."""
    if value.dtype == torch.bool:
        strides, offset = laid_out(value, shape, swap_last=strided)
        return _fresh(shape, strides, offset, torch.float32, generator, False) > 0
    if not value.is_floating_point():
        return value.clone() if list(value.shape) == shape else torch.zeros(shape, dtype=value.dtype)
    strides, offset = laid_out(value, shape, swap_last=strided)
    return _fresh(shape, strides, offset, dtype, generator, requires_grad)


def _fresh(shape: Sequence[int], strides: Sequence[int], offset: int, dtype: torch.dtype, generator: torch.Generator,
           requires_grad: bool) -> torch.Tensor:
    """Random values in a fresh storage, viewed with ``strides`` from ``offset`` (a contiguous tensor draws what
    ``torch.randn(shape)`` draws)."""
    extent = offset + sum((size - 1) * stride for size, stride in zip(shape, strides)) + 1 if all(shape) else offset
    storage = torch.randn(max(extent, 1), generator=generator).to(dtype)
    return storage.as_strided(list(shape), list(strides), offset).detach().requires_grad_(requires_grad)


def laid_out(value: torch.Tensor, shape: Sequence[int], swap_last: bool = False) -> tuple[list[int], int]:
    """Strides and storage offset for a tensor of ``shape`` laid out as ``value`` is: its dims in the same order in
    memory, with the same gaps between them (a slice of a packed projection keeps its gap) and the same storage
    offset; at ``value``'s own shape, exactly its strides. Dims of size 1 (whose stride means nothing) and expanded
    dims (stride 0) keep theirs. ``swap_last``: another layout, dense, with the last two dims swapped in memory.

    >>> head_view = torch.zeros(2, 8, 4 * 16).view(2, 8, 4, 16).transpose(1, 2)  # strides (512, 16, 64, 1)
    >>> laid_out(head_view, [2, 4, 8, 8])  # head_dim made 8: still (batch, time, heads, head_dim) in memory
    ([256, 8, 32, 1], 0)
    >>> laid_out(torch.zeros(3, 4), [3, 4], swap_last=True)
    ([1, 3], 0)
    """
    old_shape, old = list(value.shape), list(value.stride())
    if list(shape) == old_shape and not swap_last:
        return old, int(value.storage_offset())
    rank = len(shape)
    if swap_last:  # dense, in the example's order with the last two dims exchanged
        order = sorted(range(rank), key=lambda d: (old[d] if old_shape[d] != 1 else 0, -d))
        if rank >= 2:
            a, b = order.index(rank - 1), order.index(rank - 2)
            order[a], order[b] = order[b], order[a]
        strides, step = [0] * rank, 1
        for d in order:
            strides[d], step = step, step * max(shape[d], 1)
        return strides, 0
    chain = sorted((d for d in range(rank) if old[d] and old_shape[d] != 1), key=lambda d: (old[d], -d))
    strides = list(old)
    for below, d in zip(chain, chain[1:]):
        gap = max(old[d] - old[below] * old_shape[below], 0)
        strides[d] = strides[below] * shape[below] + gap
    return strides, int(value.storage_offset())


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
            operands = tuple(_operand(a) for a in node.args if isinstance(a, fx.Node))
            inside = _decomposed_from(node)
            found.append(Edit("inner_swap", target, occurrence, 0, (*operands, inside)) if inside
                         else Edit("swap", target, occurrence, 0, operands))
        if node not in returned and node.users:
            found.append(Edit("extra_user", target, occurrence, -1))
    placeholders = list(graph.graph.find_nodes(op="placeholder"))
    found += [Edit("late_input", "", 0, i) for i, node in enumerate(placeholders) if node.users]
    return found


def _operand(node: fx.Node) -> str:
    """How a user knows an operand: an input by its parameter's name (make_fx adds ``_1``), a node made by another
    op's decomposition by that op (``silu``), another node by its name."""
    if node.op == "placeholder":
        return node.name.removesuffix("_1")
    inside = _decomposed_from(node)
    return inside.split(".")[1] if inside and inside.count(".") >= 2 else inside or node.name


def _decomposed_from(node: fx.Node) -> str | None:
    """The op whose decomposition made ``node`` (make_fx's ``meta['original_aten']``: GELU's ``0.5 * x``), or None
    where the search function writes ``node``'s op itself (or the trace keeps no record)."""
    original = node.meta.get("original_aten")
    packet = getattr(original, "overloadpacket", None)
    if packet is None or packet is getattr(node.target, "overloadpacket", None):
        return None
    return str(original)


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
    inputs and then a tangent for each output, drawn here), then, where the variant names a hook, as that hook
    receives graphs (:func:`~fxverify.inductor.graph_hooks.graph_at_hook`: Inductor's own passes up to the hook, as on a
    model's graph, so an ``aten.view`` reaches a post-grad hook as ``aten.reshape``; random ops drawn as eager draws
    them, as the captures run those passes), and its inputs; None where the variant is no well-typed program (its
    edits do not apply at these inputs, or it raises). Edits change the forward program. Every node's ``meta['val']``
    comes from one fake mode, as in a graph Inductor compiles."""
    from torch._inductor import config

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
        if variant.hook is not None:
            at = hooks()[variant.hook]
            with config.patch(fallback_random=True):
                graph = graph_at_hook(graph, at.hook, is_inference=not (joint or at.training_graphs))
            graph(*inputs)
    except Exception:  # a near miss that is no program (a shape or dtype error) is no variant
        return None
    return graph, inputs


def hooks() -> dict[str, HookCapture]:
    """The Inductor captures pattern fuzzing traces programs at, by name: those of a plain compile's joint-graph and
    post-grad hooks (the graphs :func:`~fxverify.inductor.graph_hooks.graph_at_hook` reaches).

    >>> hooks()["inductor_train_joint"].training_graphs
    True
    """
    return plain_captures(GRAPH_HOOKS)


def hook_name(capture: str) -> str:
    """The Inductor hook whose graphs the capture ``capture`` gives.

    >>> hook_name("inductor_post"), hook_name("inductor_train_joint")
    ('post_grad_custom_post_pass', 'joint_custom_pre_pass')
    """
    return hooks()[capture].hook.name


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


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Without the errors torch logs for each near miss that is no program (a shape check failing on fake tensors)."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


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
    """For a permute of an input, give that input the shape and strides that keep the permute's output shape and
    strides under the new ``dims`` (a user permuting another layout into the same view, as
    ``key.permute(0, 2, 3, 1)``: the program traces to the same nodes but the permute); a permute of an inner node
    keeps its input, so its output shape changes (the program may not type-check)."""
    source = node.args[0]
    if not isinstance(source, fx.Node) or source not in placeholders:
        return
    index = placeholders.index(source)
    value = inputs[index]
    old: Sequence[int] = node.args[1]  # type: ignore[assignment]  # a permute's dims
    shape, strides = [0] * len(old), [0] * len(old)
    for position, d in enumerate(dims):
        shape[d], strides[d] = value.shape[old[position]], value.stride()[old[position]]
    inputs[index] = _fresh(shape, strides, value.storage_offset(), value.dtype, torch.Generator().manual_seed(index),
                           value.requires_grad)
