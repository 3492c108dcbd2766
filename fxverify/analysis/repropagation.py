"""Re-propagating FakeTensors through an ATen-level graph, on a copy of its ShapeEnv.

``torch.export`` and ``make_fx`` record on each node a FakeTensor (``meta['val']``) describing its
value, sizes and strides symbolic where a dimension is dynamic (``s77``). :func:`repropagate`
runs the graph again on FakeTensors made from its placeholders' descriptions, in a fresh
``FakeTensorMode`` over a copy of the ShapeEnv those descriptions share (never the ShapeEnv itself:
every copy of a program shares it, and a guard added there would specialise the caller's own
program). What it keeps, per node: a description of the value it computes now (sizes and strides
as sympy expressions over the input symbols), and the guards that running the node added. The
``meta`` check compares those descriptions with the recorded ones, the ``dynamic`` check judges the
guards against the range the capture promises (:func:`violation`).

Nothing real is touched: attributes are read as FakeTensors, a ``call_module`` node is taken at its
recorded description (running a module, an observer say, would update its real buffers).

>>> import torch
>>> from torch import nn
>>> batch = torch.export.Dim("batch", min=1, max=8)
>>> ep = torch.export.export(nn.Linear(4, 2), (torch.ones(2, 4),), dynamic_shapes=({0: batch},))
>>> gm = ep.module()
>>> found = repropagate(gm)
>>> linear = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default)[0]
>>> [batch] = found.ranges  # the batch's symbol, recorded in [2, 8] (export assumes it is not 0 or 1)
>>> found.ranges[batch], found.values["linear"].shape == (batch, 2), found.guards
((2, 8), True, [])
>>> difference(linear.meta["val"], found.values["linear"], found.ranges) is None
True
>>> violation(sympy.Lt(batch, 4), found.ranges) == {str(batch): 4}  # false at batch 4, inside [2, 8]
True
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import sympy
import torch
from torch import fx
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.fx.node import Target
from torch.utils import _pytree as pytree

SAMPLES = 64  # the most values of one symbol a comparison or guard is evaluated at
POINTS = 4096  # the most points (values of every symbol together) a comparison is evaluated at


@dataclasses.dataclass(frozen=True)
class Description:
    """What a tensor value is, without its data: sizes and strides as sympy expressions."""

    shape: tuple[sympy.Expr, ...]
    strides: tuple[sympy.Expr, ...]
    dtype: torch.dtype
    device: str

    def __repr__(self) -> str:
        return (f"Description(shape=({', '.join(map(str, self.shape))}{',' * (len(self.shape) == 1)}), strides=("
                f"{', '.join(map(str, self.strides))}{',' * (len(self.strides) == 1)}), dtype={self.dtype}, "
                f"device={self.device!r})")


@dataclasses.dataclass(frozen=True)
class AddedGuard:
    """A guard that running ``node`` on FakeTensors added to the ShapeEnv (a replacement ``s77 -> 2``
    is the guard ``Eq(s77, 2)``); ``node`` None: a guard a pass added while it ran, no node's."""

    node: str | None
    expr: sympy.Basic


@dataclasses.dataclass
class Repropagation:
    """What :func:`repropagate` found: ``values``, by node name, the description of what each node
    computes (a pytree of :class:`Description`, sympy expressions for symbolic sizes, other values as
    they are, None for a value it does not describe); ``guards`` the guards each node added, in order;
    ``ranges`` the range of each input symbol as the ShapeEnv recorded it before; ``stopped`` where and why
    it stopped before the output, or None."""

    values: dict[str, Any]
    guards: list[AddedGuard]
    ranges: dict[sympy.Symbol, tuple[int, int]]
    stopped: Stop | None = None


@dataclasses.dataclass(frozen=True)
class Stop:
    """Where a re-propagation stopped: ``node`` raised on FakeTensors (``raised``: what it raised), or, with
    ``raised`` None, is a ``call_module`` node without ``meta['val']`` (it is not run, see the module's
    docstring, and nothing describes what it gives the nodes after it)."""

    node: str
    raised: str | None

    def describe(self) -> str:
        return f"%{self.node} raised {self.raised}" if self.raised else \
            f"%{self.node} is a call_module node without meta['val']: what follows it is not described"


def repropagate(gm: fx.GraphModule, shape_env: ShapeEnv | None = None, *,
                python_dispatcher: bool = True) -> Repropagation | None:
    """``gm`` run on FakeTensors made from its placeholders' ``meta['val']``, in a fresh FakeTensorMode
    over a copy of ``shape_env`` (default: the ShapeEnv of the placeholders' sizes; a copy taken before a
    pass ran, so that the guards the pass itself added are added again, by the nodes that need them),
    with the Python dispatcher on, as ``torch.export`` traces (without it, as ``FakeTensorProp`` runs,
    some C++ kernels specialise symbolic sizes: ``aten.upsample_bilinear2d``); None when a placeholder
    has no ``meta['val']`` (a symbolically traced graph) or the ShapeEnv cannot be copied."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    if not placeholders or any(n.meta.get("val") is None for n in placeholders):
        return None
    shape_env = shape_env or shape_env_of(gm)
    copied = copied_shape_env(shape_env) if shape_env is not None else None
    if shape_env is not None and copied is None:
        return None
    ranges = input_ranges(gm, copied) if copied is not None else {}
    mode = FakeTensorMode(shape_env=copied, allow_non_fake_inputs=True)
    with mode:
        inputs = [pytree.tree_map(lambda v: _fake_like(v, copied), n.meta["val"]) for n in placeholders]
    runner = _FakeRunner(gm, mode, copied)
    found = Repropagation(runner.values, runner.guards, ranges)
    try:
        with mode, enable_python_dispatcher() if python_dispatcher else contextlib.nullcontext():
            runner.run(*inputs)
    except _Undescribed as undescribed:
        found.stopped = Stop(undescribed.node, None)
    except Exception as exc:  # whatever the node raised on FakeTensors: the caller judges it
        node = runner.current.name if runner.current is not None else "?"
        found.stopped = Stop(node, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")
    return found


def shape_env_of(gm: fx.GraphModule) -> ShapeEnv | None:
    """The ShapeEnv of the first symbolic size among ``gm``'s placeholders' ``meta['val']``, or None (static)."""
    for value in pytree.tree_leaves([n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]):
        sizes = (*value.shape, *value.stride()) if isinstance(value, torch.Tensor) else (value,)
        for size in sizes:
            if isinstance(size, torch.SymInt) and size.node.shape_env is not None:
                return size.node.shape_env
    return None


def copied_shape_env(shape_env: ShapeEnv) -> ShapeEnv | None:
    """A copy of ``shape_env`` that no guard added to it reaches, without the FakeTensors it tracks (which
    do not copy), or None when it cannot be copied (another torch's ShapeEnv)."""
    left_out = {id(getattr(shape_env, name)): type(getattr(shape_env, name))()
                for name in ("tracked_fakes", "fake_tensor_cache") if isinstance(getattr(shape_env, name, None), (list, dict))}
    try:
        return copy.deepcopy(shape_env, left_out)
    except Exception:  # whatever another torch's ShapeEnv holds that does not copy
        return None


@dataclasses.dataclass(frozen=True)
class DescriptionMismatch:
    """How a node's ``meta['val']`` differs from what it computes: the ``aspect`` (``tensors``, the number of
    tensors; ``dtype``, ``device``, ``shape``, ``strides``; ``size``, a symbolic size node's value), what
    ``meta['val']`` says and what the value is, as text; ``label`` names the output of a node of several."""

    aspect: str
    said: str
    gives: str
    label: str = ""

    def describe(self, source: str) -> str:
        """e.g. ``meta['val'] says dtype torch.float32, re-propagating gives torch.float64`` (``source``:
        what gives the value)."""
        if self.aspect == "tensors":
            return f"{self.label}meta['val'] describes {self.said} tensor(s), {source} gives {self.gives}"
        said = self.said if self.aspect == "size" else f"{self.aspect} {self.said}"
        return f"{self.label}meta['val'] says {said}, {source} gives {self.gives}"


def difference(meta: Any, value: Any, ranges: Mapping[sympy.Symbol, tuple[int, int]]) -> DescriptionMismatch | None:
    """How ``value`` (a node's value as :func:`repropagate` describes it) differs from ``meta`` (its
    ``meta['val']``), or None: dtypes, devices, shapes and, for dimensions of more than one element,
    strides. Sizes are compared at every point of the symbols' ranges (at most :data:`POINTS`), so
    ``Min(768, 768*s77)`` is ``768`` for ``s77`` in ``[2, 8]``; what holds a symbol the ranges do not
    know (an unbacked size, ``u0``) is not compared."""
    if isinstance(meta, (int, torch.SymInt)) and not isinstance(meta, bool):
        if not isinstance(value, (int, sympy.Expr)):
            return None
        said, gives = _expr(meta, as_created=True), sympy.sympify(value)
        return None if _same([said], [gives], ranges) else DescriptionMismatch("size", str(said), str(gives))
    metas = [m for m in pytree.tree_leaves(meta) if isinstance(m, torch.Tensor)]
    values = [v for v in pytree.tree_leaves(value, is_leaf=lambda x: isinstance(x, Description))
              if isinstance(v, Description)]
    if len(metas) != len(values):
        return DescriptionMismatch("tensors", str(len(metas)), str(len(values)))
    for i, (m, v) in enumerate(zip(metas, values, strict=True)):
        said = describe(m, as_created=True)
        label = f"output {i}: " if len(metas) > 1 else ""
        if said.dtype != v.dtype:
            return DescriptionMismatch("dtype", str(said.dtype), str(v.dtype), label)
        if said.device != v.device:
            return DescriptionMismatch("device", said.device, v.device, label)
        if len(said.shape) != len(v.shape) or not _same(said.shape, v.shape, ranges):
            return DescriptionMismatch("shape", shape_text(said.shape), shape_text(v.shape), label)
        if not _same_strides(said, v, ranges):
            return DescriptionMismatch("strides", f"({', '.join(map(str, said.strides))})",
                            f"({', '.join(map(str, v.strides))}) for shape {shape_text(v.shape)}", label)
    return None


def violation(guard: sympy.Basic, ranges: Mapping[sympy.Symbol, tuple[int, int]]) -> dict[str, int] | None:
    """A point of the symbols' ranges where ``guard`` is false (``{symbol name: value}``), or None when
    it holds at every point evaluated (all of each range up to :data:`SAMPLES` values) or holds a
    symbol the ranges do not know."""
    if not guard.free_symbols <= set(ranges):
        return None
    for point in _points({s: ranges[s] for s in guard.free_symbols}):
        value = guard.xreplace(point)
        if value in (sympy.false, False):
            return {str(s): int(v) for s, v in point.items()}
    return None


@dataclasses.dataclass(frozen=True)
class Violation:
    """A guard some node added that is false at ``point``, inside the ranges of the input symbols."""

    guard: AddedGuard
    point: dict[str, int]

    @property
    def at(self) -> str:
        """``s77 = 3``: where the guard is false."""
        return ", ".join(f"{name} = {value}" for name, value in self.point.items())

    def describe(self) -> str:
        return f"%{self.guard.node} adds the guard {self.guard.expr}, false at {self.at}"


def violations(found: Repropagation, exempt: Collection[str] = ()) -> list[Violation]:
    """The guards ``found`` records that are false somewhere inside its input symbols' ranges (a graph then
    computes what it claims for part of its range only), but those whose text is in ``exempt``."""
    listed = []
    for guard in found.guards:
        point = violation(guard.expr, found.ranges) if str(guard.expr) not in exempt else None
        if point is not None:
            listed.append(Violation(guard, point))
    return listed


def same_descriptions(a: fx.Graph, b: fx.Graph) -> bool:
    """Whether the nodes of ``a`` and ``b``, in order, have the same ``meta['val']``: dtypes, devices, sizes and
    strides as created (cheap: no FakeTensor runs). Re-propagating through two graphs of the same structure
    and descriptions finds the same."""
    def described(node: fx.Node) -> Any:
        return pytree.tree_map(lambda v: describe(v, as_created=True) if isinstance(v, torch.Tensor) else
                               _expr(v, as_created=True) if isinstance(v, torch.SymInt) else v, node.meta.get("val"))

    return len(a.nodes) == len(b.nodes) and all(described(x) == described(y) for x, y in zip(a.nodes, b.nodes))


def describe(tensor: torch.Tensor, *, as_created: bool = False) -> Description:
    """The description of a (fake) tensor, its symbolic sizes as sympy expressions (``as_created``: see
    :func:`_expr`)."""
    return Description(tuple(_expr(s, as_created=as_created) for s in tensor.shape),
                       tuple(_expr(s, as_created=as_created) for s in tensor.stride()), tensor.dtype, tensor.device.type)


class _FakeRunner(fx.Interpreter):
    """Runs a graph on FakeTensors, describing each node's value and noting the guards it adds."""

    def __init__(self, gm: fx.GraphModule, mode: FakeTensorMode, shape_env: ShapeEnv | None) -> None:
        super().__init__(gm)
        self.mode, self.shape_env = mode, shape_env
        self.values: dict[str, Any] = {}
        self.guards: list[AddedGuard] = []
        self.current: fx.Node | None = None

    def run_node(self, n: fx.Node) -> Any:
        self.current = n
        env = self.shape_env
        before = (len(env.guards), dict(env.replacements)) if env is not None else None
        value = super().run_node(n)
        if env is not None and before is not None:
            added = [g.expr for g in env.guards[before[0]:]]
            added += [sympy.Eq(s, e) for s, e in env.replacements.items() if before[1].get(s) != e]
            self.guards.extend(AddedGuard(n.name, expr) for expr in dict.fromkeys(added))
        self.values[n.name] = pytree.tree_map(_description, value)
        return value

    def get_attr(self, target: Target, args: Any, kwargs: Any) -> Any:
        value = super().get_attr(target, args, kwargs)
        if isinstance(value, torch.Tensor) and not isinstance(value, torch._subclasses.FakeTensor):
            return self.mode.from_tensor(value, static_shapes=True)  # a fake: an in-place op must not reach it
        return value

    def call_module(self, target: Target, args: Any, kwargs: Any) -> Any:
        assert self.current is not None
        recorded = self.current.meta.get("val")  # not run: a module's real buffers would be updated
        if recorded is None:
            if self.current.users:
                raise _Undescribed(self.current.name)
            return None  # nothing reads it (ep.module()'s _guards_fn)
        with self.mode:
            return pytree.tree_map(lambda v: _fake_like(v, self.shape_env), recorded)


class _Undescribed(Exception):
    """A ``call_module`` node without ``meta['val']`` that other nodes read: the re-propagation stops there."""

    def __init__(self, node: str) -> None:
        super().__init__(node)
        self.node = node


def _description(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return describe(value)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return value.node.expr
    return value if isinstance(value, (int, float, bool, str)) or value is None else None


def _expr(size: Any, *, as_created: bool = False) -> sympy.Expr:
    """``size`` as a sympy expression: with ``as_created``, as it was created, before any replacement its
    ShapeEnv holds now (a pass may have specialised it since: re-propagation runs on a copy from before)."""
    if not isinstance(size, torch.SymInt):
        return sympy.Integer(int(size))
    return getattr(size.node, "_expr", size.node.expr) if as_created else size.node.expr


def input_ranges(gm: fx.GraphModule, shape_env: ShapeEnv) -> dict[sympy.Symbol, tuple[int, int]]:
    """The integer range in ``shape_env`` of each symbol the sizes and strides of ``gm``'s placeholders hold,
    as created (no upper bound: capped at :data:`SAMPLES` past the lower one; sizes always have a lower one)."""
    symbols: set[sympy.Symbol] = set()
    for value in pytree.tree_leaves([n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]):
        if not isinstance(value, (torch.Tensor, int, torch.SymInt)):
            continue
        sizes = (*value.shape, *value.stride()) if isinstance(value, torch.Tensor) else (value,)
        symbols.update(*(_expr(s, as_created=True).free_symbols for s in sizes if isinstance(s, (int, torch.SymInt))))
    found = {}
    for symbol in symbols:
        bounds = shape_env.var_to_range.get(symbol)
        if bounds is None or not bounds.lower.is_finite:
            continue
        lower = int(bounds.lower)
        found[symbol] = (lower, int(bounds.upper) if bounds.upper.is_finite else lower + SAMPLES)
    return found


def _fake_like(value: Any, shape_env: ShapeEnv | None) -> Any:
    """A fresh FakeTensor (in the current mode) with ``value``'s dtype, device, sizes and strides, its
    symbolic sizes made in ``shape_env``; other values as they are (a SymInt remade there too)."""
    if isinstance(value, torch.Tensor):
        return torch.empty_strided([_symbolic(s, shape_env) for s in value.shape],
                                   [_symbolic(s, shape_env) for s in value.stride()],
                                   dtype=value.dtype, device=value.device, requires_grad=value.requires_grad)
    return _symbolic(value, shape_env)


def _symbolic(size: Any, shape_env: ShapeEnv | None) -> Any:
    """``size`` made in ``shape_env``: its expression as created, before any replacement its own ShapeEnv holds
    now (a pass may have specialised that one since the copy ``shape_env`` was taken)."""
    if isinstance(size, torch.SymInt) and shape_env is not None:
        return shape_env.create_symintnode(_expr(size, as_created=True), hint=size.node.hint)  # type: ignore[arg-type]
    return size


def _points(ranges: Mapping[sympy.Symbol, tuple[int, int]]) -> Iterator[dict[sympy.Symbol, sympy.Integer]]:
    """Points of the symbols' ranges: every value of a range of at most :data:`SAMPLES` values, else its ends
    and values between; at most :data:`POINTS` of them."""
    symbols = sorted(ranges, key=str)
    axes = [_samples(*ranges[s]) for s in symbols]
    for values in itertools.islice(itertools.product(*axes), POINTS):
        yield {s: sympy.Integer(v) for s, v in zip(symbols, values, strict=True)}


def _samples(lower: int, upper: int) -> list[int]:
    if upper - lower < SAMPLES:
        return list(range(lower, upper + 1))
    step = (upper - lower) / (SAMPLES - 1)
    return sorted({lower + round(i * step) for i in range(SAMPLES)})


def _evaluated(exprs: tuple[sympy.Expr, ...] | list[sympy.Expr], point: Mapping[sympy.Symbol, sympy.Integer]) -> list[Any]:
    values = []
    for expr in exprs:
        value = sympy.sympify(expr).xreplace(point)
        values.append(int(value) if value.is_number and value.is_integer else None)
    return values


def _comparable(exprs: Any, ranges: Mapping[sympy.Symbol, tuple[int, int]]) -> bool:
    return all(sympy.sympify(e).free_symbols <= set(ranges) for e in exprs)


def _same(said: Any, gives: Any, ranges: Mapping[sympy.Symbol, tuple[int, int]]) -> bool:
    """Whether two lists of size expressions are equal at every point evaluated (those holding symbols the
    ranges do not know count as equal)."""
    pairs = [(a, b) for a, b in zip(said, gives, strict=True)
             if sympy.sympify(a) != sympy.sympify(b) and _comparable((a, b), ranges)]
    if not pairs:
        return True
    symbols = set().union(*(sympy.sympify(a).free_symbols | sympy.sympify(b).free_symbols for a, b in pairs))
    for point in _points({s: ranges[s] for s in symbols}):
        left, right = _evaluated([a for a, _ in pairs], point), _evaluated([b for _, b in pairs], point)
        if any(x is not None and y is not None and x != y for x, y in zip(left, right, strict=True)):
            return False
    return True


def _same_strides(said: Description, gives: Description, ranges: Mapping[sympy.Symbol, tuple[int, int]]) -> bool:
    """Whether the strides agree wherever they matter: on dimensions of more than one element, of a
    tensor with elements."""
    exprs = (*said.shape, *said.strides, *gives.strides)
    if said.strides == gives.strides or not _comparable(exprs, ranges):
        return True
    symbols = set().union(*(sympy.sympify(e).free_symbols for e in exprs))
    for point in _points({s: ranges[s] for s in symbols}):
        sizes = _evaluated(said.shape, point)
        left, right = _evaluated(said.strides, point), _evaluated(gives.strides, point)
        if 0 in sizes:
            continue
        if any(n is not None and n > 1 and x is not None and y is not None and x != y
               for n, x, y in zip(sizes, left, right, strict=True)):
            return False
    return True


def shape_text(shape: tuple[Any, ...]) -> str:
    """``s77x3x16x16``; ``scalar`` for no dimensions."""
    return "x".join(map(str, shape)) or "scalar"
