"""Building a ``torch.fx.Graph`` node by node from drawn choices, tracking every
value's predicted shape and dtype (:class:`~fxverify.strategies.meta.Meta`).

The choices come from Hypothesis (:class:`DrawnChoices`: under ``@given``, recorded
so that a failing graph shrinks) or from ``random.Random(seed)`` (:class:`SeededChoices`:
the same graph for a seed in every process, at a fraction of the cost, no shrinking).

The builder owns the graph, the root module holding parameters, buffers,
constants and submodules, and the pool of values operations may consume. An
operation (:mod:`fxverify.strategies.ops`) asks it for operands (an existing
value, a new placeholder, a ``get_attr`` or a Python scalar) and emits nodes
through it. It never draws something it would have to reject.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from hypothesis import strategies as st
from torch import fx, nn
from torch.fx.node import Target

from fxverify.strategies.meta import INTS, Meta, broadcast, broadcastable, promote, with_scalar

# Value ranges of integer and bool placeholders (``inputs_for`` draws within them).
INT_RANGE = (-4, 5)

ATTRIBUTE_KINDS = ("parameter", "buffer", "constant")


@dataclasses.dataclass
class Value:
    """A node with its predicted meta.

    ``fresh``: the node owns its memory (not a view, an input or an attribute), so an
    in-place op may write to it. ``contiguous``: known to be contiguous, so ``view`` applies.
    """

    node: fx.Node
    meta: Meta
    fresh: bool = True
    contiguous: bool = False


@dataclasses.dataclass(frozen=True)
class Limits:
    """The options of ``graph_modules`` the builder needs."""

    dtypes: tuple[torch.dtype, ...]
    max_nodes: int
    max_side: int
    max_rank: int
    allow_modules: bool
    allow_inplace: bool


class Choices(Protocol):
    """Where a builder's choices come from: every choice is an int, a bool or a permutation."""

    def integer(self, low: int, high: int) -> int:
        """An int in ``low..high`` (shrinking, where there is any, goes towards ``low``)."""

    def flag(self) -> bool:
        """True or False (shrinking goes towards False)."""

    def permutation(self, n: int) -> list[int]:
        """A permutation of ``range(n)`` (shrinking goes towards the identity)."""


class DrawnChoices:
    """Choices drawn with a Hypothesis ``draw`` function (``@st.composite``'s), so recorded and shrunk.

    ``@st.composite``'s draw is ``ConjectureData.draw``, whose ``draw_integer`` /
    ``draw_boolean`` make the very choices ``st.integers`` / ``st.booleans`` make without the
    strategy machinery (validation, a span) around each of a graph's ~90 small draws, which
    was most of the drawing time. Any other draw function goes through the strategies.
    """

    def __init__(self, draw: Callable[[st.SearchStrategy[Any]], Any]) -> None:
        self.draw = draw
        data = getattr(draw, "__self__", None)
        self._data = data if hasattr(data, "draw_integer") and hasattr(data, "draw_boolean") else None

    def integer(self, low: int, high: int) -> int:
        if self._data is not None:
            return self._data.draw_integer(low, high)
        return self.draw(st.integers(low, high))

    def flag(self) -> bool:
        return self._data.draw_boolean() if self._data is not None else self.draw(st.booleans())

    def permutation(self, n: int) -> list[int]:
        return self.draw(st.permutations(range(n)))


class SeededChoices:
    """Choices from ``random.Random(seed)``: the same for a seed in every process, not
    recorded (nothing to shrink: a failing seeded graph is minimised by
    fxverify's minimiser instead), about twice as fast to build a graph with.

    >>> SeededChoices(7).integer(0, 100) == SeededChoices(7).integer(0, 100)
    True
    """

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)

    def integer(self, low: int, high: int) -> int:
        return self._random.randint(low, high)

    def flag(self) -> bool:
        return self._random.getrandbits(1) == 1

    def permutation(self, n: int) -> list[int]:
        order = list(range(n))
        self._random.shuffle(order)
        return order


class Builder:
    """One graph under construction, shaped by ``choices``."""

    def __init__(self, choices: Choices, limits: Limits) -> None:
        self.choices = choices
        self.limits = limits
        self.graph = fx.Graph()
        self.root = nn.Module()
        self.values: list[Value] = []
        self.inputs: list[Meta] = []
        self.used = 0  # computation nodes (get_attr and call_*) so far
        self.constants: list[str] = []  # plain tensor attributes (neither parameter nor buffer)

    # -- budget ------------------------------------------------------------------
    @property
    def room(self) -> int:
        """How many more computation nodes fit in ``max_nodes``."""
        return self.limits.max_nodes - self.used

    # -- drawing small things -------------------------------------------------------
    def side(self, low: int = 1, high: int | None = None) -> int:
        """A dimension size; shrinks towards ``low``."""
        return self.integer(low, max(low, high or self.limits.max_side))

    def shape(self, rank: int, low: int = 1) -> tuple[int, ...]:
        return tuple(self.side(low) for _ in range(rank))

    def dtype(self, accepted: Sequence[torch.dtype]) -> torch.dtype:
        """One of ``accepted`` that the options allow (callers ensure there is one)."""
        return self.choice([d for d in self.limits.dtypes if d in accepted])

    def integer(self, low: int, high: int) -> int:
        """An int in ``low..high``; shrinks towards ``low``."""
        return self.choices.integer(low, high)

    def index(self, size: int) -> int:
        return self.integer(0, size - 1)

    def flag(self) -> bool:
        return self.choices.flag()

    def choice(self, options: Sequence[Any]) -> Any:
        """One of ``options`` (one option: no choice made); shrinks towards the first."""
        return options[0] if len(options) == 1 else options[self.integer(0, len(options) - 1)]

    def permutation(self, n: int) -> list[int]:
        return self.choices.permutation(n)

    # -- values ----------------------------------------------------------------------
    def add(self, value: Value) -> Value:
        self.values.append(value)
        return value

    def candidates(self, accepts: Callable[[Value], bool]) -> list[Value]:
        """Values an operation accepts, most recent first (so chains shrink to index 0)."""
        return [v for v in reversed(self.values) if accepts(v)]

    def placeholder(self, meta: Meta) -> Value:
        node = self.graph.placeholder(f"x{len(self.inputs)}")
        self.inputs.append(meta)
        return self.add(Value(node, meta, fresh=False))

    def attribute(self, tensor: torch.Tensor, kind: str) -> Value:
        """A ``get_attr`` node for ``tensor`` held by the root as a parameter, buffer or plain constant."""
        prefix = {"parameter": "weight", "buffer": "buf", "constant": "const"}[kind]
        name = f"{prefix}{sum(1 for n in self.graph.nodes if n.op == 'get_attr')}"
        if kind == "parameter":
            self.root.register_parameter(name, nn.Parameter(tensor, requires_grad=tensor.is_floating_point()))
        elif kind == "buffer":
            self.root.register_buffer(name, tensor)
        else:
            setattr(self.root, name, tensor)
            self.constants.append(name)
        self.used += 1
        node = self.graph.get_attr(name)
        return Value(node, Meta(tuple(tensor.shape), tensor.dtype), fresh=False, contiguous=True)

    def tensor(self, meta: Meta, *, reserve: int = 1) -> Value:
        """A new input of ``meta``: a placeholder, or a get_attr of random values when that
        leaves room for ``reserve`` more computation nodes (the graph's first input is a placeholder)."""
        kinds = ("placeholder",) + (ATTRIBUTE_KINDS if self.room > reserve and self.inputs else ())
        kind = self.choice(kinds)
        if kind == "placeholder":
            return self.placeholder(meta)
        if kind == "parameter" and not meta.dtype.is_floating_point:
            kind = "buffer"  # only floating tensors can be trainable parameters
        return self.attribute(random_tensor(meta), kind)

    def new_input(self, meta: Meta, *, reserve: int = 1) -> Value:
        """A new value of ``meta`` that later operations may use too."""
        return self.add(self.tensor(meta, reserve=reserve))

    # -- emitting nodes ---------------------------------------------------------------
    def call(self, target: Target, *args: Any, meta: Meta, method: bool = False, fresh: bool = True,
             contiguous: bool = False, **kwargs: Any) -> Value:
        """A ``call_function`` (or with ``method``, ``call_method``) node producing ``meta``."""
        args = tuple(a.node if isinstance(a, Value) else a for a in args)
        kwargs = {k: a.node if isinstance(a, Value) else a for k, a in kwargs.items()}
        op = "call_method" if method else "call_function"
        node = self.graph.create_node(op, target, args, kwargs)
        self.used += 1
        return self.add(Value(node, meta, fresh=fresh, contiguous=contiguous))

    def call_either(self, function: Callable[..., Any], x: Value, *args: Any, meta: Meta, **kwargs: Any) -> Value:
        """``torch.fn(x, ...)`` or ``x.fn(...)``, drawn (the function form first, for shrinking)."""
        name = function.__name__
        if hasattr(torch.Tensor, name) and self.flag():
            return self.call(name, x, *args, meta=meta, method=True, **kwargs)
        return self.call(function, x, *args, meta=meta, **kwargs)

    def item(self, value: Value, index: int, meta: Meta, *, fresh: bool = True) -> Value:
        """``operator.getitem(value, index)``: one output of a multi-output op."""
        import operator

        return self.call(operator.getitem, value, index, meta=meta, fresh=fresh)

    def module(self, module: nn.Module, *args: Value, meta: Meta, fresh: bool = True) -> Value:
        """A ``call_module`` node calling ``module`` (registered on the root); ``fresh`` as for :meth:`call`
        (``nn.Identity`` returns its input)."""
        name = f"{type(module).__name__.lower()}{len(self.root._modules)}"
        self.root.add_module(name, module)
        node = self.graph.call_module(name, tuple(a.node for a in args))
        self.used += 1
        value = self.add(Value(node, meta, fresh=fresh))
        if args and args[0].meta == meta and self.room > 0 and self.flag():
            # a shape-preserving module called again on its own output: one module, two call sites
            again = self.graph.call_module(name, (node,))
            self.used += 1
            value = self.add(Value(again, meta, fresh=fresh))
        return value

    # -- second operands ----------------------------------------------------------------
    def operand(self, x: Meta, accepted: Sequence[torch.dtype], *, scalar: bool = True,
                same_dtype: bool = False) -> tuple[Any, Meta]:
        """A second operand for an elementwise op on ``x``: an existing value or a new
        tensor whose shape broadcasts with ``x`` (either way round), or a Python scalar.

        Returns the argument (a :class:`Value` or a scalar) and the result meta.
        """
        dtypes = (x.dtype,) if same_dtype else tuple(d for d in accepted if d in self.limits.dtypes)
        kind = self.choice(("existing", "new", "scalar") if scalar else ("existing", "new"))
        if kind == "scalar":
            value = self.scalar(x.dtype, accepted)
            return value, Meta(x.shape, with_scalar(x.dtype, value))
        if kind == "existing":
            found = self.candidates(
                lambda v: v.meta.rank > 0 and v.meta.dtype in dtypes and broadcastable(v.meta.shape, x.shape)
                and len(broadcast(v.meta.shape, x.shape)) <= self.limits.max_rank
            )
            if found:
                other = found[self.index(len(found))]
                return other, Meta(broadcast(x.shape, other.meta.shape), promote(Meta(x.shape, x.dtype), other.meta))
        shape = self.broadcast_partner(x.shape)
        dtype = x.dtype if same_dtype or not dtypes or not self.flag() else self.dtype(dtypes)
        other = self.new_input(Meta(shape, dtype))
        return other, Meta(broadcast(x.shape, shape), promote(x, other.meta))

    def broadcast_partner(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts with ``shape``: trailing dims kept or set to 1, size-1 dims
        possibly widened, possibly leading dims added. Shrinks to ``shape`` itself."""
        dims = list(shape)
        for i, size in enumerate(dims):
            if size == 1:
                dims[i] = self.side()
            elif self.flag():
                dims[i] = 1
        drop = self.integer(0, len(dims) - 1) if dims else 0
        if drop:
            return tuple(dims[drop:])
        extra = self.integer(0, self.limits.max_rank - len(shape))  # new leading dims
        return tuple([self.side() for _ in range(extra)] + dims)

    def scalar(self, dtype: torch.dtype, accepted: Sequence[torch.dtype]) -> bool | int | float:
        """A Python scalar for a ``dtype`` tensor: of its own kind first, then of another
        kind the op accepts (an int for a float tensor, a float for an int tensor)."""
        own = "float" if dtype.is_floating_point else "bool" if dtype == torch.bool else "int"
        kinds = [own]
        if own != "int" and any(d in INTS for d in accepted) or own == "float":
            kinds.append("int")
        if own != "float" and any(d.is_floating_point for d in accepted):
            kinds.append("float")
        kind = self.choice(kinds)
        if kind == "float":
            return self.choice((1.0, 2.0, 0.5, -1.5, 0.0, 3.25))
        if kind == "int":
            return self.choice((1, 2, -1, 0, 3))
        return self.flag()

    # -- finishing ------------------------------------------------------------------------
    def finish(self) -> tuple[fx.GraphModule, Any]:
        """Emit the output node (single value, tuple or dict of every unused value) and
        build the GraphModule, in eval mode. Returns it and the predicted output (a Meta tree)."""
        sinks = [v for v in self.values if not v.node.users and v.node.op != "placeholder"]
        if not sinks:
            sinks = [self.values[-1]]
        kind = self.choice(("single", "tuple", "dict"))
        out: fx.node.Argument
        predicted: Meta | dict[str, Meta] | tuple[Meta, ...]
        if kind == "single" and len(sinks) == 1:
            out, predicted = sinks[0].node, sinks[0].meta
        elif kind == "dict":
            out = {f"out{i}": v.node for i, v in enumerate(sinks)}
            predicted = {f"out{i}": v.meta for i, v in enumerate(sinks)}
        else:
            out, predicted = tuple(v.node for v in sinks), tuple(v.meta for v in sinks)
        self.graph.output(out)
        module = fx.GraphModule(self.root, self.graph, class_name="RandomGraph").eval()  # deterministic: no dropout
        for name in self.constants:  # GraphModule registers every tensor it copies as a buffer: undo that
            setattr(module, name, module._buffers.pop(name))
        return module, predicted


def random_tensor(meta: Meta, low: float = -2.0, high: float = 2.0) -> torch.Tensor:
    """Random values of ``meta`` from torch's global RNG (the strategy seeds it)."""
    if meta.dtype == torch.bool:
        return torch.rand(meta.shape) > 0.5
    if not meta.dtype.is_floating_point:
        return torch.randint(INT_RANGE[0], INT_RANGE[1], meta.shape, dtype=meta.dtype)
    return (torch.rand(meta.shape, dtype=torch.float64) * (high - low) + low).to(meta.dtype)

