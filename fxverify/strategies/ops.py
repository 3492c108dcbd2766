"""The operator catalogue: every torch operation the graph strategies can emit, with
the input it accepts (dtypes, ranks, a shape condition) and a rule that emits the
node(s) and predicts the result's shape and dtype.

>>> len(CATALOGUE) >= 140
True
>>> sorted(FAMILIES)[:4]
['activation', 'binary', 'cast', 'comparison']

An :class:`Op`'s ``emit(builder, x)`` draws whatever else it needs (dims, kernel
sizes, second operands) through the builder, always within what is valid, so no
drawn graph is ever rejected.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fxverify.strategies.builder import Builder, Value, random_tensor
from fxverify.strategies.meta import (
    ANY,
    BOOL,
    FLOATS,
    INTS,
    NUMBERS,
    Meta,
    accumulated,
    broadcast,
    broadcastable,
    floating,
)

Emit = Callable[[Builder, Value], Any]


@dataclasses.dataclass(frozen=True, repr=False)
class Op:
    """One catalogue entry.

    ``ranks``: accepted ranks of the primary input; ``grows``: how many dims the op may
    add (the input's rank stays at most ``max_rank - grows``); ``fits``: a further
    condition on the input meta, with ``example`` drawing a meta that meets it;
    ``cost``: the fewest computation nodes it emits; ``module``: emits ``call_module``;
    ``inplace``: writes into its input.
    """

    name: str
    family: str
    emit: Emit
    dtypes: tuple[torch.dtype, ...] = FLOATS
    ranks: tuple[int, int] = (1, 4)
    grows: int = 0
    fits: Callable[[Meta], bool] | None = None
    example: Callable[[Builder, torch.dtype], Meta] | None = None
    cost: int = 1
    module: bool = False
    inplace: bool = False

    def __repr__(self) -> str:
        return f"Op({self.name!r})"

    def accepts(self, value: Value, max_rank: int) -> bool:
        meta = value.meta
        return (
            meta.dtype in self.dtypes
            and self.ranks[0] <= meta.rank <= min(self.ranks[1], max_rank - self.grows)
            and (self.fits is None or self.fits(meta))
            and (not self.inplace or value.fresh)
        )

    def input_meta(self, b: Builder) -> Meta:
        """A meta this op accepts, for a new input when no existing value fits."""
        dtype = b.dtype(self.dtypes)
        if self.example is not None:
            return self.example(b, dtype)
        low, high = self.ranks[0], min(self.ranks[1], b.limits.max_rank - self.grows)
        return Meta(b.shape(b.integer(low, high)), dtype)


CATALOGUE: list[Op] = []
FAMILIES: dict[str, list[str]] = {}


def _register(op: Op) -> None:
    assert op.name not in {o.name for o in CATALOGUE}, op.name
    CATALOGUE.append(op)
    FAMILIES.setdefault(op.family, []).append(op.name)


def _op(name: str, family: str, **fields: Any) -> Callable[[Emit], Emit]:
    def decorate(emit: Emit) -> Emit:
        _register(Op(name, family, emit, **fields))
        return emit

    return decorate


def _same(m: Meta, dtype: torch.dtype | None = None, shape: Sequence[int] | None = None) -> Meta:
    return Meta(tuple(m.shape if shape is None else shape), m.dtype if dtype is None else dtype)


def _dim(b: Builder, rank: int) -> int:
    """A dim, sometimes written negative (rewrite rules often mishandle those)."""
    d = b.index(rank)
    return d - rank if b.flag() else d


def _exact(b: Builder, meta: Meta) -> Value:
    """An existing value of exactly ``meta``, or a new input of it."""
    found = b.candidates(lambda v: v.meta == meta)
    if found and b.flag():
        return found[b.index(len(found))]
    return b.new_input(meta)


def _weight(b: Builder, shape: tuple[int, ...], dtype: torch.dtype) -> Value:
    """A trainable parameter (get_attr) of ``shape``, default-initialised scale."""
    fan_in = max(1, math.prod(shape[1:]))
    bound = 1.0 / math.sqrt(fan_in)
    return b.attribute(random_tensor(Meta(shape, dtype), -bound, bound), "parameter")


def _optional_weight(b: Builder, shape: tuple[int, ...], dtype: torch.dtype) -> Value | None:
    return _weight(b, shape, dtype) if b.room > 1 and b.flag() else None


# -- elementwise unary ----------------------------------------------------------------------
def _unary(name: str, fn: Callable[..., Any], family: str, dtypes: tuple[torch.dtype, ...],
           out: Callable[[torch.dtype], torch.dtype], either: bool = True, **kwargs: Any) -> None:
    def emit(b: Builder, x: Value) -> Value:
        meta = _same(x.meta, out(x.meta.dtype))
        if either:
            return b.call_either(fn, x, meta=meta, **kwargs)
        return b.call(fn, x, meta=meta, **kwargs)

    _register(Op(name, family, emit, dtypes=dtypes))


def _keep(dtype: torch.dtype) -> torch.dtype:
    return dtype


def _to_bool(dtype: torch.dtype) -> torch.dtype:
    return torch.bool


_fn: Callable[..., Any]  # the loop variable of the registrations below, each time another torch function
for _fn in (torch.exp, torch.exp2, torch.expm1, torch.log, torch.log2, torch.log10, torch.log1p, torch.sqrt,
            torch.rsqrt, torch.sin, torch.cos, torch.tan, torch.asin, torch.acos, torch.atan, torch.sinh,
            torch.cosh, torch.tanh, torch.asinh, torch.acosh, torch.atanh, torch.sigmoid, torch.erf, torch.erfc,
            torch.erfinv, torch.reciprocal, torch.lgamma, torch.digamma, torch.deg2rad, torch.rad2deg,
            torch.sinc, torch.logit, torch.i0):
    _unary(_fn.__name__, _fn, "unary", ANY, floating)
for _fn in (torch.floor, torch.ceil, torch.round, torch.trunc):
    _unary(_fn.__name__, _fn, "unary", NUMBERS, _keep)
_unary("frac", torch.frac, "unary", FLOATS, _keep)
for _fn in (torch.abs, torch.neg, torch.square):
    _unary(_fn.__name__, _fn, "unary", NUMBERS, _keep)
for _fn in (torch.sign, torch.sgn, torch.nan_to_num):
    _unary(_fn.__name__, _fn, "unary", ANY, _keep)
_unary("bitwise_not", torch.bitwise_not, "unary", INTS + BOOL, _keep)
for _fn in (torch.isnan, torch.isinf, torch.isfinite, torch.isneginf, torch.isposinf, torch.signbit,
            torch.logical_not):
    _unary(_fn.__name__, _fn, "comparison", ANY, _to_bool)

for _fn in (F.relu, F.relu6, F.gelu, F.silu, F.mish, F.softplus, F.elu, F.selu, F.celu, F.leaky_relu, F.hardtanh,
            F.hardswish, F.hardsigmoid, F.softsign, F.tanhshrink, F.logsigmoid, F.hardshrink, F.softshrink):
    _unary(f"F.{_fn.__name__}", _fn, "activation", FLOATS, _keep, either=False)


@_op("clamp", "unary", dtypes=NUMBERS)
def _clamp(b: Builder, x: Value) -> Value:
    low = b.choice((-1, 0, -2))
    high = b.choice((1, 2, 3))
    if x.meta.dtype.is_floating_point and b.flag():
        low, high = low - 0.5, high + 0.5
    return b.call_either(torch.clamp, x, meta=x.meta, min=low, max=high)


@_op("clamp_min", "unary", dtypes=FLOATS)
def _clamp_min(b: Builder, x: Value) -> Value:
    return b.call_either(torch.clamp_min, x, b.choice((0.0, -1.0)), meta=x.meta)


@_op("F.threshold", "activation")
def _threshold(b: Builder, x: Value) -> Value:
    return b.call(F.threshold, x, b.choice((0.0, 0.5)), b.choice((0.0, -1.0)), meta=x.meta)


@_op("F.glu", "activation", fits=lambda m: any(s % 2 == 0 for s in m.shape),
     example=lambda b, dtype: Meta(b.shape(b.integer(1, 2)) + (2 * b.side(),), dtype))
def _glu(b: Builder, x: Value) -> Value:
    dims = [d for d, s in enumerate(x.meta.shape) if s % 2 == 0]
    dim = b.choice(dims)
    shape = list(x.meta.shape)
    shape[dim] //= 2
    return b.call(F.glu, x, dim, meta=_same(x.meta, shape=shape))


@_op("F.prelu", "activation", ranks=(2, 4), cost=2)
def _prelu(b: Builder, x: Value) -> Value:
    channels = b.choice((1, x.meta.shape[1]))
    weight = b.attribute(torch.full((channels,), 0.25).to(x.meta.dtype) + torch.rand(channels).to(x.meta.dtype) * 0.1,
                         "parameter")
    return b.call(F.prelu, x, weight, meta=x.meta)


def _softmax_like(name: str, fn: Callable[..., Any]) -> None:
    def emit(b: Builder, x: Value) -> Value:
        return b.call(fn, x, dim=_dim(b, x.meta.rank), meta=x.meta)

    _register(Op(name, "activation", emit))


for _fn in (F.softmax, F.log_softmax, F.softmin):
    _softmax_like(f"F.{_fn.__name__}", _fn)


# -- elementwise binary with broadcasting -------------------------------------------------------
def _binary(name: str, fn: Callable[..., Any], family: str, dtypes: tuple[torch.dtype, ...],
            out: Callable[[Meta, Meta], torch.dtype] | None = None, *, scalar: bool = True,
            same_dtype: bool = False, method: str | None = None) -> None:
    def emit(b: Builder, x: Value) -> Value:
        other, meta = b.operand(x.meta, dtypes, scalar=scalar, same_dtype=same_dtype)
        if out is not None:
            meta = _same(meta, out(x.meta, meta))
        if method is not None and b.flag():
            return b.call(method, x, other, meta=meta, method=True)
        return b.call(fn, x, other, meta=meta)

    _register(Op(name, family, emit, dtypes=dtypes, cost=2))


def _true_div(x: Meta, result: Meta) -> torch.dtype:
    return floating(result.dtype)


def _boolean(x: Meta, result: Meta) -> torch.dtype:
    return torch.bool


for _name, _fn in (("add", torch.add), ("sub", torch.sub), ("mul", torch.mul)):
    _binary(_name, _fn, "binary", NUMBERS, method=_name)
for _name, _fn in (("operator.add", operator.add), ("operator.sub", operator.sub), ("operator.mul", operator.mul)):
    _binary(_name, _fn, "binary", NUMBERS)
_binary("div", torch.div, "binary", NUMBERS, _true_div, method="div")
_binary("operator.truediv", operator.truediv, "binary", NUMBERS, _true_div)
_binary("true_divide", torch.true_divide, "binary", NUMBERS, _true_div)
for _fn in (torch.maximum, torch.minimum):
    _binary(_fn.__name__, _fn, "binary", NUMBERS, scalar=False)
for _fn in (torch.floor_divide, torch.remainder, torch.fmod, torch.pow, torch.atan2, torch.hypot, torch.copysign,
            torch.logaddexp, torch.xlogy, torch.fmax, torch.fmin):
    _binary(_fn.__name__, _fn, "binary", FLOATS, scalar=_fn not in (torch.atan2, torch.hypot, torch.logaddexp,
                                                                     torch.fmax, torch.fmin))
for _fn in (torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor):
    _binary(_fn.__name__, _fn, "binary", INTS + BOOL)
for _fn in (torch.logical_and, torch.logical_or, torch.logical_xor):
    _binary(_fn.__name__, _fn, "comparison", ANY, _boolean, scalar=False)
for _fn in (torch.eq, torch.ne):
    _binary(_fn.__name__, _fn, "comparison", ANY, _boolean, method=_fn.__name__)
for _fn in (torch.lt, torch.le, torch.gt, torch.ge):
    _binary(_fn.__name__, _fn, "comparison", NUMBERS, _boolean, method=_fn.__name__)
for _name, _fn in (("operator.lt", operator.lt), ("operator.gt", operator.gt)):
    _binary(_name, _fn, "comparison", NUMBERS, _boolean)
_binary("isclose", torch.isclose, "comparison", FLOATS, _boolean, scalar=False, same_dtype=True)


@_op("div(rounding_mode=)", "binary", dtypes=FLOATS, cost=2)  # floats only: integers raise on a zero divisor
def _div_rounding(b: Builder, x: Value) -> Value:
    other, meta = b.operand(x.meta, FLOATS)
    mode = b.choice(("floor", "trunc"))
    if b.flag():
        return b.call("div", x, other, rounding_mode=mode, meta=meta, method=True)
    return b.call(torch.div, x, other, rounding_mode=mode, meta=meta)


def _condition(b: Builder, x: Value) -> Value:
    """A bool value that broadcasts to ``x``'s shape: an existing one, or ``x > 0``-like."""
    found = b.candidates(lambda v: v.meta.dtype == torch.bool and v.meta.rank > 0 and broadcastable(v.meta.shape, x.meta.shape)
                         and broadcast(v.meta.shape, x.meta.shape) == x.meta.shape)
    if found and b.flag():
        return found[b.index(len(found))]
    return b.call(torch.gt, x, b.choice((0, 1)) if not x.meta.dtype.is_floating_point else 0.0,
                  meta=_same(x.meta, torch.bool))


@_op("where", "comparison", dtypes=NUMBERS, cost=2)
def _where(b: Builder, x: Value) -> Value:
    cond = _condition(b, x)
    other, meta = b.operand(x.meta, NUMBERS, scalar=False)
    return b.call(torch.where, cond, x, other, meta=meta)


@_op("masked_fill", "indexing", dtypes=NUMBERS, cost=2)
def _masked_fill(b: Builder, x: Value) -> Value:
    cond = _condition(b, x)
    value = b.choice((0.0, -1.0, 2.5)) if x.meta.dtype.is_floating_point else b.choice((0, -1))
    return b.call_either(torch.masked_fill, x, cond, value, meta=x.meta)


@_op("lerp", "ternary", cost=2)
def _lerp(b: Builder, x: Value) -> Value:
    end, meta = b.operand(x.meta, FLOATS, scalar=False, same_dtype=True)
    return b.call_either(torch.lerp, x, end, b.choice((0.5, 0.25)), meta=meta)


def _ternary(name: str, fn: Callable[..., Any]) -> None:
    def emit(b: Builder, x: Value) -> Value:
        t1, m1 = b.operand(x.meta, FLOATS, scalar=False, same_dtype=True)
        t2, m2 = b.operand(m1, FLOATS, scalar=False, same_dtype=True)
        return b.call_either(fn, x, t1, t2, value=b.choice((1.0, 0.5)), meta=m2)

    _register(Op(name, "ternary", emit, cost=3))


_ternary("addcmul", torch.addcmul)
_ternary("addcdiv", torch.addcdiv)


# -- reductions ------------------------------------------------------------------------------------
def _reduced(b: Builder, x: Meta, *, multi: bool, keepdim: bool | None) -> tuple[Any, bool, tuple[int, ...]]:
    """Dims to reduce (an int, or a list with ``multi``), keepdim, and the result shape.
    A reduction of every dim keeps them, so no value has rank 0."""
    rank = x.rank
    first = b.index(rank)
    dims = [first]
    if multi and rank > 1 and b.flag():
        dims.append(b.choice([d for d in range(rank) if d != first]))
    keep = b.flag() if keepdim is None else keepdim
    if len(dims) == rank:
        keep = True
    shape = tuple(1 if d in dims else s for d, s in enumerate(x.shape)) if keep else tuple(
        s for d, s in enumerate(x.shape) if d not in dims)
    written = [d - rank if b.flag() else d for d in dims]
    return (written if multi and len(written) > 1 else written[0]), keep, shape


def _reduction(name: str, fn: Callable[..., Any], dtypes: tuple[torch.dtype, ...],
               out: Callable[[torch.dtype], torch.dtype], *, multi: bool = True) -> None:
    def emit(b: Builder, x: Value) -> Value:
        dims, keep, shape = _reduced(b, x.meta, multi=multi, keepdim=None)
        extra = {}
        if fn in (torch.std, torch.var):  # Bessel's correction needs two values, else NaN and a warning
            extra["correction"] = 1 if x.meta.numel // math.prod(shape) >= 2 and b.flag() else 0
        return b.call_either(fn, x, dims, keepdim=keep, meta=Meta(shape, out(x.meta.dtype)), **extra)

    _register(Op(name, "reduction", emit, dtypes=dtypes))


for _fn in (torch.sum, torch.nansum):
    _reduction(_fn.__name__, _fn, ANY if _fn is torch.sum else FLOATS, accumulated)
_reduction("prod", torch.prod, NUMBERS, accumulated, multi=False)
for _fn in (torch.mean, torch.nanmean, torch.std, torch.var, torch.logsumexp):
    _reduction(_fn.__name__, _fn, FLOATS, _keep)
for _fn in (torch.amax, torch.amin):
    _reduction(_fn.__name__, _fn, NUMBERS, _keep)
for _fn in (torch.all, torch.any):
    _reduction(_fn.__name__, _fn, ANY, _to_bool)
for _fn in (torch.argmax, torch.argmin):
    _reduction(_fn.__name__, _fn, NUMBERS, lambda d: torch.int64, multi=False)


@_op("linalg.vector_norm", "reduction")
def _vector_norm(b: Builder, x: Value) -> Value:
    dims, keep, shape = _reduced(b, x.meta, multi=True, keepdim=None)
    ord_ = b.choice((2, 1, float("inf")))
    return b.call(torch.linalg.vector_norm, x, ord_, dim=dims, keepdim=keep, meta=_same(x.meta, shape=shape))


@_op("count_nonzero", "reduction", dtypes=ANY, ranks=(2, 4))
def _count_nonzero(b: Builder, x: Value) -> Value:
    dim = b.index(x.meta.rank)
    shape = x.meta.shape[:dim] + x.meta.shape[dim + 1:]
    return b.call_either(torch.count_nonzero, x, dim=dim, meta=Meta(shape, torch.int64))


def _pair_reduction(name: str, fn: Callable[..., Any], dtypes: tuple[torch.dtype, ...],
                    second: Callable[[torch.dtype], torch.dtype], *, keepdim: bool = True,
                    extra: Callable[[Builder, Meta, int], tuple[tuple[Any, ...], int | None]] | None = None,
                    family: str = "reduction") -> None:
    """An op returning two tensors (values and indices, or two statistics) read with getitem.

    ``extra(b, meta, dim)`` gives extra positional args after the input and the size the
    reduced dim keeps (None: it is reduced away or to 1)."""
    def emit(b: Builder, x: Value) -> Value:
        dim = b.index(x.meta.rank)
        args, kept = extra(b, x.meta, dim) if extra else ((), None)
        shape = list(x.meta.shape)
        keep = False
        if kept is not None:
            shape[dim] = kept
        else:
            keep = b.flag() if keepdim and x.meta.rank > 1 else keepdim
            if keep or x.meta.rank == 1:
                keep = True
                shape[dim] = 1
            else:
                del shape[dim]
        kwargs: dict[str, Any] = {"keepdim": keep} if keepdim and kept is None else {}
        if fn in (torch.std_mean, torch.var_mean):  # Bessel's correction needs two values
            kwargs["correction"] = 1 if x.meta.shape[dim] >= 2 and b.flag() else 0
        pair = b.call_either(fn, x, *args, dim=dim, meta=x.meta, **kwargs)
        b.values.remove(pair)  # a tuple is not a tensor value; its items are
        metas = (Meta(tuple(shape), floating(x.meta.dtype) if second is _keep and fn in (torch.std_mean, torch.var_mean)
                      else x.meta.dtype), Meta(tuple(shape), second(x.meta.dtype)))
        picks = b.choice(((0,), (1,), (0, 1))) if b.room > 1 else (b.choice((0, 1)),)
        result = None
        for i in picks:
            result = b.item(pair, i, metas[i])
        assert result is not None  # picks is never empty
        return result

    _register(Op(name, family, emit, dtypes=dtypes, cost=2))


def _int64(dtype: torch.dtype) -> torch.dtype:
    return torch.int64


for _fn in (torch.max, torch.min, torch.median):
    _pair_reduction(f"{_fn.__name__}.dim", _fn, NUMBERS, _int64)
_pair_reduction("aminmax", torch.aminmax, NUMBERS, _keep)
for _fn in (torch.std_mean, torch.var_mean):
    _pair_reduction(_fn.__name__, _fn, FLOATS, _keep)
_pair_reduction("kthvalue", torch.kthvalue, NUMBERS, _int64,
                extra=lambda b, m, dim: ((b.integer(1, m.shape[dim]),), None))
def _topk_k(b: Builder, m: Meta, dim: int) -> tuple[tuple[Any, ...], int]:
    k = b.integer(1, m.shape[dim])
    return (k,), k


_pair_reduction("topk", torch.topk, NUMBERS, _int64, keepdim=False, extra=_topk_k)
_pair_reduction("sort", torch.sort, NUMBERS, _int64, keepdim=False, extra=lambda b, m, dim: ((), m.shape[dim]))
_pair_reduction("cummax", torch.cummax, NUMBERS, _int64, keepdim=False, extra=lambda b, m, dim: ((), m.shape[dim]),
                family="scan")
_pair_reduction("cummin", torch.cummin, NUMBERS, _int64, keepdim=False, extra=lambda b, m, dim: ((), m.shape[dim]),
                family="scan")


def _scan(name: str, fn: Callable[..., Any], dtypes: tuple[torch.dtype, ...],
          out: Callable[[torch.dtype], torch.dtype]) -> None:
    def emit(b: Builder, x: Value) -> Value:
        return b.call_either(fn, x, _dim(b, x.meta.rank), meta=_same(x.meta, out(x.meta.dtype)))

    _register(Op(name, "scan", emit, dtypes=dtypes))


_scan("cumsum", torch.cumsum, NUMBERS, accumulated)
_scan("cumprod", torch.cumprod, NUMBERS, accumulated)
_scan("logcumsumexp", torch.logcumsumexp, (torch.float32, torch.float64), _keep)


@_op("argsort", "scan", dtypes=NUMBERS)
def _argsort(b: Builder, x: Value) -> Value:
    return b.call_either(torch.argsort, x, dim=_dim(b, x.meta.rank), stable=True, meta=_same(x.meta, torch.int64))


@_op("diff", "scan", dtypes=NUMBERS, fits=lambda m: any(s >= 2 for s in m.shape),
     example=lambda b, dtype: Meta((b.side(2),), dtype))
def _diff(b: Builder, x: Value) -> Value:
    dim = b.choice([d for d, s in enumerate(x.meta.shape) if s >= 2])
    shape = list(x.meta.shape)
    shape[dim] -= 1
    return b.call_either(torch.diff, x, dim=dim, meta=_same(x.meta, shape=shape))


# -- matrix products ---------------------------------------------------------------------------------
@_op("matmul", "matmul", ranks=(2, 4), cost=2)
def _matmul(b: Builder, x: Value) -> Value:
    *batch, n, k = x.meta.shape
    m = b.side()
    other = _exact(b, Meta((k, m), x.meta.dtype))
    meta = Meta((*batch, n, m), x.meta.dtype)
    if b.flag():
        return b.call(operator.matmul, x, other, meta=meta)
    return b.call_either(torch.matmul, x, other, meta=meta)


@_op("mm", "matmul", ranks=(2, 2), cost=2)
def _mm(b: Builder, x: Value) -> Value:
    n, k = x.meta.shape
    m = b.side()
    return b.call_either(torch.mm, x, _exact(b, Meta((k, m), x.meta.dtype)), meta=Meta((n, m), x.meta.dtype))


@_op("bmm", "matmul", ranks=(3, 3), cost=2)
def _bmm(b: Builder, x: Value) -> Value:
    batch, n, k = x.meta.shape
    m = b.side()
    other = _exact(b, Meta((batch, k, m), x.meta.dtype))
    return b.call_either(torch.bmm, x, other, meta=Meta((batch, n, m), x.meta.dtype))


@_op("baddbmm", "matmul", ranks=(3, 3), cost=3)
def _baddbmm(b: Builder, x: Value) -> Value:
    batch, n, k = x.meta.shape
    m = b.side()
    other = _exact(b, Meta((batch, k, m), x.meta.dtype))
    base = _exact(b, Meta((batch, n, m), x.meta.dtype))
    return b.call(torch.baddbmm, base, x, other, meta=Meta((batch, n, m), x.meta.dtype))


@_op("addmm", "matmul", ranks=(2, 2), cost=3)
def _addmm(b: Builder, x: Value) -> Value:
    n, k = x.meta.shape
    m = b.side()
    bias = _weight(b, (m,), x.meta.dtype)
    return b.call(torch.addmm, bias, x, _exact(b, Meta((k, m), x.meta.dtype)), meta=Meta((n, m), x.meta.dtype))


@_op("F.linear", "matmul", cost=2)
def _linear(b: Builder, x: Value) -> Value:
    k = x.meta.shape[-1]
    m = b.side()
    weight = _weight(b, (m, k), x.meta.dtype)
    bias = _optional_weight(b, (m,), x.meta.dtype)
    return b.call(F.linear, x, weight, bias, meta=_same(x.meta, shape=x.meta.shape[:-1] + (m,)))


@_op("outer", "matmul", ranks=(1, 1), cost=2)
def _outer(b: Builder, x: Value) -> Value:
    other = _exact(b, Meta((b.side(),), x.meta.dtype))
    return b.call_either(torch.outer, x, other, meta=Meta(x.meta.shape + other.meta.shape, x.meta.dtype))


@_op("einsum", "matmul", ranks=(2, 4), cost=2)
def _einsum(b: Builder, x: Value) -> Value:
    *batch, n, k = x.meta.shape
    m = b.side()
    other = _exact(b, Meta((k, m), x.meta.dtype))
    return b.call(torch.einsum, "...ij,jk->...ik", x, other, meta=Meta((*batch, n, m), x.meta.dtype))


@_op("cdist", "matmul", ranks=(2, 3), dtypes=(torch.float32, torch.float64), cost=2)
def _cdist(b: Builder, x: Value) -> Value:
    *batch, n, k = x.meta.shape
    other = _exact(b, Meta((*batch, b.side(), k), x.meta.dtype))
    return b.call(torch.cdist, x, other, meta=Meta((*batch, n, other.meta.shape[-2]), x.meta.dtype))


# -- convolution and pooling ------------------------------------------------------------------------------
def _window(b: Builder, spatial: tuple[int, ...]) -> tuple[int, int, int, int]:
    """kernel, stride, padding, dilation valid for every spatial size."""
    smallest = min(spatial)
    kernel = b.side(1, min(3, smallest))
    padding = b.integer(0, kernel // 2)
    stride = b.side(1, 2)
    dilation = 2 if kernel > 1 and 2 * (kernel - 1) + 1 <= smallest + 2 * padding and b.flag() else 1
    return kernel, stride, padding, dilation


def _conv_out(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _groups(b: Builder, channels: int) -> int:
    divisors = [g for g in range(1, channels + 1) if channels % g == 0]
    return b.choice(divisors)


def _conv(d: int, transposed: bool, module: bool) -> None:
    fn = getattr(F, f"conv_transpose{d}d" if transposed else f"conv{d}d")
    cls = getattr(nn, f"ConvTranspose{d}d" if transposed else f"Conv{d}d")

    def emit(b: Builder, x: Value) -> Value:
        n, c, *spatial = x.meta.shape
        k, s, p, dil = _window(b, tuple(spatial))
        g = _groups(b, c)
        out_channels = g * b.side(1, 2)
        if transposed:
            out_pad = b.integer(0, max(s, dil) - 1)
            p = min(p, dil * (k - 1) // 2)
            out_spatial = [(i - 1) * s - 2 * p + dil * (k - 1) + out_pad + 1 for i in spatial]
            weight_shape = (c, out_channels // g) + (k,) * d
            options: dict[str, Any] = dict(stride=s, padding=p, output_padding=out_pad, groups=g, dilation=dil)
        else:
            out_spatial = [_conv_out(i, k, s, p, dil) for i in spatial]
            weight_shape = (out_channels, c // g) + (k,) * d
            options = dict(stride=s, padding=p, dilation=dil, groups=g)
        meta = Meta((n, out_channels, *out_spatial), x.meta.dtype)
        if module:
            layer = cls(c, out_channels, k, bias=b.flag(), dtype=x.meta.dtype, **options)
            return b.module(layer, x, meta=meta)
        weight = _weight(b, weight_shape, x.meta.dtype)
        bias = _optional_weight(b, (out_channels,), x.meta.dtype)
        return b.call(fn, x, weight, bias, meta=meta, **options)

    kind = "ConvTranspose" if transposed else "Conv"
    name = f"nn.{kind}{d}d" if module else f"F.{fn.__name__}"
    _register(Op(name, "conv", emit, ranks=(d + 2, d + 2), cost=1 if module else 2, module=module))


for _d in (1, 2, 3):
    for _transposed in (False, True):
        for _module in (False, True):
            _conv(_d, _transposed, _module)


def _pool(d: int, kind: str) -> None:
    fn = getattr(F, f"{kind}_pool{d}d")

    def emit(b: Builder, x: Value) -> Value:
        n, c, *spatial = x.meta.shape
        k, s, p, _ = _window(b, tuple(spatial))
        out = [_conv_out(i, k, s, p, 1) for i in spatial]
        return b.call(fn, x, k, s, p, meta=Meta((n, c, *out), x.meta.dtype))

    # avg_pool3d has no bfloat16 kernel on CPU
    dtypes = (torch.float32, torch.float64) if (d, kind) == (3, "avg") else FLOATS
    _register(Op(f"F.{fn.__name__}", "pooling", emit, dtypes=dtypes, ranks=(d + 2, d + 2)))


def _adaptive(d: int, kind: str) -> None:
    fn = getattr(F, f"adaptive_{kind}_pool{d}d")

    def emit(b: Builder, x: Value) -> Value:
        n, c, *spatial = x.meta.shape
        out = tuple(b.side(1, i) for i in spatial)
        return b.call(fn, x, out, meta=Meta((n, c, *out), x.meta.dtype))

    _register(Op(f"F.{fn.__name__}", "pooling", emit, ranks=(d + 2, d + 2)))


for _d in (1, 2, 3):
    for _kind in ("max", "avg"):
        _pool(_d, _kind)
        _adaptive(_d, _kind)


@_op("F.interpolate", "pooling", ranks=(3, 5))
def _interpolate(b: Builder, x: Value) -> Value:
    n, c, *spatial = x.meta.shape
    size = tuple(b.side(1, 2 * i) for i in spatial)
    return b.call(F.interpolate, x, size=size, mode="nearest", meta=Meta((n, c, *size), x.meta.dtype))


@_op("F.pixel_shuffle", "pooling", ranks=(4, 4), fits=lambda m: m.shape[1] % 4 == 0,
     example=lambda b, dtype: Meta((b.side(), 4 * b.side(1, 2), b.side(), b.side()), dtype))
def _pixel_shuffle(b: Builder, x: Value) -> Value:
    n, c, h, w = x.meta.shape
    return b.call(F.pixel_shuffle, x, 2, meta=Meta((n, c // 4, 2 * h, 2 * w), x.meta.dtype))


# -- normalisation ----------------------------------------------------------------------------------------
def _per_channel_ok(m: Meta) -> bool:
    """BatchNorm in train mode needs more than one value per channel."""
    return m.numel // m.shape[1] >= 2


def _stat_example(b: Builder, dtype: torch.dtype, rank: int = 4) -> Meta:
    return Meta((2,) + b.shape(rank - 1), dtype)


@_op("F.batch_norm", "norm", ranks=(2, 5), fits=_per_channel_ok, example=_stat_example, cost=3)
def _batch_norm(b: Builder, x: Value) -> Value:
    c = x.meta.shape[1]
    mean = b.attribute((torch.rand(c) - 0.5).to(x.meta.dtype), "buffer")
    var = b.attribute((torch.rand(c) + 0.5).to(x.meta.dtype), "buffer")
    weight = _optional_weight(b, (c,), x.meta.dtype)
    return b.call(F.batch_norm, x, mean, var, weight, None, False, 0.1, 1e-5, meta=x.meta)


def _batch_norm_module(d: int) -> None:
    cls = getattr(nn, f"BatchNorm{d}d")
    low = {1: 2, 2: 4, 3: 5}[d]

    def emit(b: Builder, x: Value) -> Value:
        layer = cls(x.meta.shape[1], dtype=x.meta.dtype)
        with torch.no_grad():
            layer.running_mean.uniform_(-0.5, 0.5)
            layer.running_var.uniform_(0.5, 2.0)
            layer.weight.uniform_(0.5, 1.5)
            layer.bias.uniform_(-0.3, 0.3)
        return b.module(layer, x, meta=x.meta)

    _register(Op(f"nn.BatchNorm{d}d", "norm", emit, ranks=(low, low + (1 if d == 1 else 0)), fits=_per_channel_ok,
                 example=lambda b, dtype: _stat_example(b, dtype, low), module=True))


for _d in (1, 2, 3):
    _batch_norm_module(_d)


@_op("F.layer_norm", "norm")
def _layer_norm(b: Builder, x: Value) -> Value:
    count = b.integer(1, x.meta.rank)
    shape = x.meta.shape[-count:]
    weight = _optional_weight(b, shape, x.meta.dtype)
    return b.call(F.layer_norm, x, shape, weight, meta=x.meta)


@_op("F.rms_norm", "norm")
def _rms_norm(b: Builder, x: Value) -> Value:
    shape = x.meta.shape[-1:]
    return b.call(F.rms_norm, x, shape, meta=x.meta)


@_op("nn.LayerNorm", "norm", module=True)
def _layer_norm_module(b: Builder, x: Value) -> Value:
    return b.module(nn.LayerNorm(x.meta.shape[-1], dtype=x.meta.dtype), x, meta=x.meta)


def _norm_groups(b: Builder, m: Meta) -> int:
    """Groups dividing the channels with more than one value per group (group_norm checks)."""
    return b.choice([g for g in range(1, m.shape[1] + 1) if m.shape[1] % g == 0 and m.numel // g >= 2])


def _two_values(m: Meta) -> bool:
    return m.numel >= 2


@_op("F.group_norm", "norm", ranks=(2, 5), fits=_two_values, example=_stat_example)
def _group_norm(b: Builder, x: Value) -> Value:
    return b.call(F.group_norm, x, _norm_groups(b, x.meta), meta=x.meta)


@_op("nn.GroupNorm", "norm", ranks=(2, 5), fits=_two_values, example=_stat_example, module=True)
def _group_norm_module(b: Builder, x: Value) -> Value:
    return b.module(nn.GroupNorm(_norm_groups(b, x.meta), x.meta.shape[1], dtype=x.meta.dtype), x, meta=x.meta)


@_op("F.instance_norm", "norm", ranks=(3, 5), fits=lambda m: math.prod(m.shape[2:]) >= 2,
     example=lambda b, dtype: Meta((b.side(), b.side(), b.side(2)), dtype))
def _instance_norm(b: Builder, x: Value) -> Value:
    return b.call(F.instance_norm, x, meta=x.meta)


@_op("F.normalize", "norm")
def _normalize(b: Builder, x: Value) -> Value:
    return b.call(F.normalize, x, dim=_dim(b, x.meta.rank), meta=x.meta)


@_op("F.local_response_norm", "norm", ranks=(3, 4), dtypes=(torch.float32, torch.float64))  # avg_pool3d inside
def _lrn(b: Builder, x: Value) -> Value:
    return b.call(F.local_response_norm, x, b.side(1, 3), meta=x.meta)


# -- layers as modules --------------------------------------------------------------------------------------
@_op("nn.Linear", "matmul", module=True)
def _linear_module(b: Builder, x: Value) -> Value:
    k = x.meta.shape[-1]
    m = b.choice((k, b.side()))
    return b.module(nn.Linear(k, m, bias=b.flag(), dtype=x.meta.dtype), x, meta=_same(x.meta, shape=x.meta.shape[:-1] + (m,)))


def _activation_module(cls: type[nn.Module], *, fresh: bool = True, **kwargs: Any) -> None:
    def emit(b: Builder, x: Value) -> Value:
        return b.module(cls(**kwargs), x, meta=x.meta, fresh=fresh)

    _register(Op(f"nn.{cls.__name__}", "activation", emit, module=True))


for _cls in (nn.ReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Hardswish, nn.LeakyReLU, nn.ELU):
    _activation_module(_cls)
_activation_module(nn.Identity, fresh=False)  # returns its input
_activation_module(nn.Dropout, fresh=False, p=0.25)  # in eval mode, its input
_activation_module(nn.Softmax, dim=-1)


@_op("nn.PReLU", "activation", module=True)
def _prelu_module(b: Builder, x: Value) -> Value:
    return b.module(nn.PReLU(dtype=x.meta.dtype), x, meta=x.meta)


@_op("nn.Flatten", "view", ranks=(2, 4), module=True)
def _flatten_module(b: Builder, x: Value) -> Value:
    shape = x.meta.shape[:1] + (math.prod(x.meta.shape[1:]),)
    return b.module(nn.Flatten(), x, meta=_same(x.meta, shape=shape), fresh=False)  # a view when it can


# -- views and shape changes ------------------------------------------------------------------------------
def _factorized(b: Builder, numel: int) -> tuple[int, ...]:
    """A shape of ``numel`` elements: its prime factors spread over a drawn number of dims."""
    rank = b.integer(1, b.limits.max_rank)
    dims = [1] * rank
    n, p = numel, 2
    while n > 1:
        while n % p == 0:
            dims[b.index(rank)] *= p
            n //= p
        p += 1
    return tuple(dims)


def _with_minus_one(b: Builder, shape: tuple[int, ...]) -> tuple[int, ...]:
    if b.flag():
        i = b.index(len(shape))
        return shape[:i] + (-1,) + shape[i + 1:]
    return shape


@_op("reshape", "view", dtypes=ANY)
def _reshape(b: Builder, x: Value) -> Value:
    shape = _factorized(b, x.meta.numel)
    return b.call_either(torch.reshape, x, _with_minus_one(b, shape), meta=_same(x.meta, shape=shape), fresh=False)


@_op("Tensor.view", "view", dtypes=ANY, cost=2)
def _view(b: Builder, x: Value) -> Value:
    if not x.contiguous:
        x = b.call("contiguous", x, meta=x.meta, method=True, contiguous=True, fresh=False)
    shape = _factorized(b, x.meta.numel)
    return b.call("view", x, *_with_minus_one(b, shape), meta=_same(x.meta, shape=shape), method=True, fresh=False,
                  contiguous=True)


@_op("Tensor.size+reshape", "view", dtypes=ANY, ranks=(2, 4), cost=2)
def _size_reshape(b: Builder, x: Value) -> Value:
    """``x.reshape(x.size(0), -1)``: a shape computed in the graph."""
    size = b.graph.call_method("size", (x.node, 0))
    b.used += 1
    shape = (x.meta.shape[0], math.prod(x.meta.shape[1:]))
    return b.call("reshape", x, size, -1, meta=_same(x.meta, shape=shape), method=True, fresh=False)


@_op("permute", "view", dtypes=ANY, ranks=(2, 4))
def _permute(b: Builder, x: Value) -> Value:
    order = b.permutation(x.meta.rank)
    shape = tuple(x.meta.shape[i] for i in order)
    return b.call_either(torch.permute, x, tuple(order), meta=_same(x.meta, shape=shape), fresh=False)


@_op("transpose", "view", dtypes=ANY, ranks=(2, 4))
def _transpose(b: Builder, x: Value) -> Value:
    d0, d1 = b.index(x.meta.rank), b.index(x.meta.rank)
    shape = list(x.meta.shape)
    shape[d0], shape[d1] = shape[d1], shape[d0]
    return b.call_either(torch.transpose, x, d0, d1, meta=_same(x.meta, shape=shape), fresh=False)


@_op("t", "view", dtypes=ANY, ranks=(1, 2))
def _t(b: Builder, x: Value) -> Value:
    return b.call_either(torch.t, x, meta=_same(x.meta, shape=x.meta.shape[::-1]), fresh=False)


@_op("movedim", "view", dtypes=ANY, ranks=(2, 4))
def _movedim(b: Builder, x: Value) -> Value:
    src, dst = b.index(x.meta.rank), b.index(x.meta.rank)
    shape = list(x.meta.shape)
    shape.insert(dst, shape.pop(src))
    return b.call_either(torch.movedim, x, src, dst, meta=_same(x.meta, shape=shape), fresh=False)


@_op("flatten", "view", dtypes=ANY)
def _flatten(b: Builder, x: Value) -> Value:
    start = b.index(x.meta.rank)
    end = b.integer(start, x.meta.rank - 1)
    shape = x.meta.shape[:start] + (math.prod(x.meta.shape[start:end + 1]),) + x.meta.shape[end + 1:]
    return b.call_either(torch.flatten, x, start, end, meta=_same(x.meta, shape=shape), fresh=False)


@_op("unflatten", "view", dtypes=ANY, grows=1)
def _unflatten(b: Builder, x: Value) -> Value:
    dim = b.index(x.meta.rank)
    size = x.meta.shape[dim]
    first = b.choice([f for f in range(1, size + 1) if size % f == 0])
    shape = x.meta.shape[:dim] + (first, size // first) + x.meta.shape[dim + 1:]
    return b.call_either(torch.unflatten, x, dim, (first, size // first), meta=_same(x.meta, shape=shape), fresh=False)


@_op("squeeze", "view", dtypes=ANY, ranks=(2, 4))
def _squeeze(b: Builder, x: Value) -> Value:
    dim = b.index(x.meta.rank)
    shape = x.meta.shape if x.meta.shape[dim] != 1 else x.meta.shape[:dim] + x.meta.shape[dim + 1:]
    return b.call_either(torch.squeeze, x, dim, meta=_same(x.meta, shape=shape), fresh=False)


@_op("unsqueeze", "view", dtypes=ANY, grows=1)
def _unsqueeze(b: Builder, x: Value) -> Value:
    dim = b.integer(0, x.meta.rank)
    shape = x.meta.shape[:dim] + (1,) + x.meta.shape[dim:]
    return b.call_either(torch.unsqueeze, x, dim, meta=_same(x.meta, shape=shape), fresh=False)


@_op("operator.getitem[None]", "indexing", dtypes=ANY, grows=1)
def _new_axis(b: Builder, x: Value) -> Value:
    return b.call(operator.getitem, x, (slice(None), None), meta=_same(x.meta, shape=x.meta.shape[:1] + (1,) + x.meta.shape[1:]),
                  fresh=False)


@_op("expand", "view", dtypes=ANY, grows=1)
def _expand(b: Builder, x: Value) -> Value:
    shape = tuple(b.side() if s == 1 else s for s in x.meta.shape)
    lead = (b.side(),) if b.flag() else ()
    written = lead + tuple(-1 if s == o and b.flag() else s for s, o in zip(shape, x.meta.shape))
    return b.call("expand", x, *written, meta=_same(x.meta, shape=lead + shape), method=True, fresh=False)


@_op("contiguous", "view", dtypes=ANY)
def _contiguous(b: Builder, x: Value) -> Value:
    return b.call("contiguous", x, meta=x.meta, method=True, fresh=False, contiguous=True)


@_op("clone", "view", dtypes=ANY)
def _clone(b: Builder, x: Value) -> Value:
    return b.call_either(torch.clone, x, meta=x.meta)


@_op("flip", "view", dtypes=ANY)
def _flip(b: Builder, x: Value) -> Value:
    return b.call_either(torch.flip, x, (_dim(b, x.meta.rank),), meta=x.meta)


@_op("roll", "view", dtypes=ANY)
def _roll(b: Builder, x: Value) -> Value:
    return b.call_either(torch.roll, x, b.choice((1, -1, 2)), _dim(b, x.meta.rank), meta=x.meta)


@_op("repeat", "view", dtypes=ANY)
def _repeat(b: Builder, x: Value) -> Value:
    reps = tuple(b.side(1, 2) for _ in x.meta.shape)
    shape = tuple(s * r for s, r in zip(x.meta.shape, reps))
    return b.call("repeat", x, *reps, meta=_same(x.meta, shape=shape), method=True)


@_op("tile", "view", dtypes=ANY)
def _tile(b: Builder, x: Value) -> Value:
    reps = tuple(b.side(1, 2) for _ in x.meta.shape)
    shape = tuple(s * r for s, r in zip(x.meta.shape, reps))
    return b.call_either(torch.tile, x, reps, meta=_same(x.meta, shape=shape))


@_op("narrow", "indexing", dtypes=ANY)
def _narrow(b: Builder, x: Value) -> Value:
    dim = b.index(x.meta.rank)
    size = x.meta.shape[dim]
    start = b.index(size)
    length = b.side(1, size - start)
    shape = list(x.meta.shape)
    shape[dim] = length
    return b.call_either(torch.narrow, x, dim, start, length, meta=_same(x.meta, shape=shape), fresh=False)


@_op("select", "indexing", dtypes=ANY, ranks=(2, 4))
def _select(b: Builder, x: Value) -> Value:
    dim = b.index(x.meta.rank)
    index = b.index(x.meta.shape[dim])
    shape = x.meta.shape[:dim] + x.meta.shape[dim + 1:]
    return b.call_either(torch.select, x, dim, index, meta=_same(x.meta, shape=shape), fresh=False)


@_op("operator.getitem[slices]", "indexing", dtypes=ANY)
def _slices(b: Builder, x: Value) -> Value:
    """``x[a:b:s, ..., i]``: slices and integer indices over the leading dims."""
    index: list[Any] = []
    shape: list[int] = []
    count = b.integer(1, x.meta.rank)
    for size in x.meta.shape[:count]:
        kind = b.choice(("all", "slice", "int") if x.meta.rank - count + len(shape) > 0 or len(index) < count - 1
                        else ("all", "slice"))
        if kind == "all":
            index.append(slice(None))
            shape.append(size)
        elif kind == "slice":
            start = b.index(size)
            stop = b.integer(start + 1, size)
            step = b.side(1, 2)
            index.append(slice(start, stop, step))
            shape.append(len(range(start, stop, step)))
        else:
            index.append(b.index(size) - (size if b.flag() else 0))
    shape.extend(x.meta.shape[count:])
    if not shape:  # every dim indexed away: keep the last as a slice
        index[-1] = slice(None)
        shape = [x.meta.shape[count - 1]]
    return b.call(operator.getitem, x, tuple(index), meta=_same(x.meta, shape=shape), fresh=False)


def _index_tensor(b: Builder, size: int, shape: tuple[int, ...]) -> Value:
    """A constant int64 index tensor (get_attr) with values in ``[0, size)``."""
    return b.attribute(torch.randint(0, size, shape), b.choice(("buffer", "constant")))


@_op("index_select", "indexing", dtypes=ANY, cost=2)
def _index_select(b: Builder, x: Value) -> Value:
    dim = b.index(x.meta.rank)
    count = b.side()
    index = _index_tensor(b, x.meta.shape[dim], (count,))
    shape = list(x.meta.shape)
    shape[dim] = count
    return b.call_either(torch.index_select, x, dim, index, meta=_same(x.meta, shape=shape))


@_op("operator.getitem[tensor]", "indexing", dtypes=ANY, cost=2)
def _advanced_index(b: Builder, x: Value) -> Value:
    count = b.side()
    index = _index_tensor(b, x.meta.shape[0], (count,))
    return b.call(operator.getitem, x, index, meta=_same(x.meta, shape=(count,) + x.meta.shape[1:]))


@_op("gather", "indexing", dtypes=ANY, cost=2)
def _gather(b: Builder, x: Value) -> Value:
    dim = b.index(x.meta.rank)
    shape = tuple(b.side(1, s) if d != dim else b.side() for d, s in enumerate(x.meta.shape))
    index = _index_tensor(b, x.meta.shape[dim], shape)
    return b.call_either(torch.gather, x, dim, index, meta=_same(x.meta, shape=shape))


@_op("tril", "indexing", dtypes=ANY, ranks=(2, 4))
def _tril(b: Builder, x: Value) -> Value:
    return b.call_either(torch.tril, x, b.choice((0, 1, -1)), meta=x.meta)


@_op("triu", "indexing", dtypes=ANY, ranks=(2, 4))
def _triu(b: Builder, x: Value) -> Value:
    return b.call_either(torch.triu, x, b.choice((0, 1, -1)), meta=x.meta)


@_op("diagonal", "indexing", dtypes=ANY, ranks=(2, 4))
def _diagonal(b: Builder, x: Value) -> Value:
    d1 = b.index(x.meta.rank)
    d2 = b.choice([d for d in range(x.meta.rank) if d != d1])
    shape = tuple(s for d, s in enumerate(x.meta.shape) if d not in (d1, d2)) + (min(x.meta.shape[d1], x.meta.shape[d2]),)
    return b.call_either(torch.diagonal, x, 0, d1, d2, meta=_same(x.meta, shape=shape), fresh=False)


# -- joining and splitting ----------------------------------------------------------------------------------
def _siblings(b: Builder, x: Value, shape_for: Callable[[], tuple[int, ...]]) -> list[Value]:
    """One to two more tensors of ``x``'s dtype with shapes from ``shape_for``."""
    return [_exact(b, Meta(shape_for(), x.meta.dtype)) for _ in range(b.side(1, 2))]


@_op("cat", "join", dtypes=ANY, cost=2)
def _cat(b: Builder, x: Value) -> Value:
    dim = b.index(x.meta.rank)

    def shape_for() -> tuple[int, ...]:
        return x.meta.shape[:dim] + (b.side(),) + x.meta.shape[dim + 1:]

    parts = [x, *_siblings(b, x, shape_for)]
    shape = list(x.meta.shape)
    shape[dim] = sum(p.meta.shape[dim] for p in parts)
    fn = b.choice((torch.cat, torch.concat))
    return b.call(fn, [p.node for p in parts], dim - x.meta.rank if b.flag() else dim, meta=_same(x.meta, shape=shape))


@_op("stack", "join", dtypes=ANY, cost=2, grows=1)
def _stack(b: Builder, x: Value) -> Value:
    parts = [x, *_siblings(b, x, lambda: x.meta.shape)]
    dim = b.integer(0, x.meta.rank)
    shape = x.meta.shape[:dim] + (len(parts),) + x.meta.shape[dim:]
    return b.call(torch.stack, [p.node for p in parts], dim, meta=_same(x.meta, shape=shape))


def _pieces(b: Builder, x: Value, node_target: Any, args: tuple[Any, ...], sizes: list[int], dim: int,
            *, squeeze: bool = False) -> Value:
    """A multi-output node and getitems for some of its pieces (at least one)."""
    parts = b.call(node_target, x, *args, meta=x.meta, fresh=False)
    b.values.remove(parts)
    chosen = sorted({b.index(len(sizes)) for _ in range(min(b.side(1, 2), b.room))})
    result = None
    for i in chosen:
        shape = list(x.meta.shape)
        if squeeze:
            del shape[dim]
        else:
            shape[dim] = sizes[i]
        result = b.item(parts, i, _same(x.meta, shape=shape), fresh=False)
    assert result is not None  # chosen is never empty: ops of cost 2 leave room for one getitem
    return result


@_op("split", "join", dtypes=ANY, cost=2)
def _split(b: Builder, x: Value) -> Value:
    dim = b.index(x.meta.rank)
    size = x.meta.shape[dim]
    step = b.side(1, size)
    sizes = [min(step, size - i) for i in range(0, size, step)]
    if b.flag() and len(sizes) > 1:
        return _pieces(b, x, torch.split, (sizes, dim), sizes, dim)
    return _pieces(b, x, torch.split, (step, dim), sizes, dim)


@_op("chunk", "join", dtypes=ANY, cost=2)
def _chunk(b: Builder, x: Value) -> Value:
    dim = b.index(x.meta.rank)
    size = x.meta.shape[dim]
    chunks = b.side(1, size)
    each = -(-size // chunks)
    sizes = [min(each, size - i) for i in range(0, size, each)]
    return _pieces(b, x, torch.chunk, (chunks, dim), sizes, dim)


@_op("unbind", "join", dtypes=ANY, ranks=(2, 4), cost=2)
def _unbind(b: Builder, x: Value) -> Value:
    dim = b.index(x.meta.rank)
    return _pieces(b, x, torch.unbind, (dim,), [1] * x.meta.shape[dim], dim, squeeze=True)


@_op("tensor_split", "join", dtypes=ANY, cost=2)
def _tensor_split(b: Builder, x: Value) -> Value:
    dim = b.index(x.meta.rank)
    size = x.meta.shape[dim]
    n = b.side(1, size)
    sizes = [size // n + (1 if i < size % n else 0) for i in range(n)]
    return _pieces(b, x, torch.tensor_split, (n, dim), sizes, dim)


# -- casts and tensors like x ------------------------------------------------------------------------------
def _cast_targets(b: Builder) -> tuple[torch.dtype, ...]:
    return b.limits.dtypes


@_op("Tensor.to", "cast", dtypes=ANY)
def _to(b: Builder, x: Value) -> Value:
    dtype = b.choice(_cast_targets(b))
    fresh = dtype != x.meta.dtype  # a cast to the dtype it has returns the tensor itself
    if b.flag():
        return b.call("to", x, dtype=dtype, meta=_same(x.meta, dtype), method=True, fresh=fresh)
    return b.call("to", x, dtype, meta=_same(x.meta, dtype), method=True, fresh=fresh)


def _cast_method(name: str, dtype: torch.dtype) -> None:
    def emit(b: Builder, x: Value) -> Value:
        return b.call(name, x, meta=_same(x.meta, dtype), method=True, fresh=dtype != x.meta.dtype)

    _register(Op(f"Tensor.{name}", "cast", emit, dtypes=ANY))


for _name, _dtype in (("float", torch.float32), ("double", torch.float64), ("bfloat16", torch.bfloat16),
                      ("int", torch.int32), ("long", torch.int64), ("bool", torch.bool)):
    _cast_method(_name, _dtype)


@_op("Tensor.type_as", "cast", dtypes=ANY)
def _type_as(b: Builder, x: Value) -> Value:
    others = b.candidates(lambda v: True)
    other = others[b.index(len(others))]
    return b.call("type_as", x, other, meta=_same(x.meta, other.meta.dtype), method=True,
                  fresh=other.meta.dtype != x.meta.dtype)


def _like(name: str, fn: Callable[..., Any], *args: Any) -> None:
    def emit(b: Builder, x: Value) -> Value:
        return b.call(fn, x, *args, meta=x.meta)

    _register(Op(name, "creation", emit, dtypes=ANY))


_like("zeros_like", torch.zeros_like)
_like("ones_like", torch.ones_like)
_like("full_like", torch.full_like, 2)


@_op("Tensor.new_ones", "creation", dtypes=ANY)
def _new_ones(b: Builder, x: Value) -> Value:
    shape = b.shape(b.integer(1, 2))
    return b.call("new_ones", x, shape, meta=_same(x.meta, shape=shape), method=True)


# -- in place ----------------------------------------------------------------------------------------------
def _inplace(name: str, dtypes: tuple[torch.dtype, ...], *args: Any) -> None:
    def emit(b: Builder, x: Value) -> Value:
        value = b.call(name, x, *args, meta=x.meta, method=True)
        value.fresh = True
        return value

    _register(Op(f"Tensor.{name}", "inplace", emit, dtypes=dtypes, inplace=True, cost=2))


_inplace("relu_", NUMBERS)
_inplace("sigmoid_", FLOATS)
_inplace("mul_", NUMBERS, 2)
_inplace("add_", NUMBERS, 1)
_inplace("clamp_", NUMBERS, -1, 1)
_inplace("neg_", NUMBERS)


@_op("F.relu(inplace=True)", "inplace", inplace=True, cost=2)
def _relu_inplace(b: Builder, x: Value) -> Value:
    return b.call(F.relu, x, inplace=True, meta=x.meta)


# -- compositions written out by hand ----------------------------------------------------------------------
# What models spell out instead of calling the op (as corpus/edge_cases.py's HandWrittenActivations and
# TinyDecoderBlock do), and what pattern-matching passes rewrite: under an ATen capture each is a small
# group of ATen ops (``x * torch.sigmoid(x)`` is ``aten.mul(x, aten.sigmoid(x))``, the pattern of a swish ->
# silu rule). Each is one op of the catalogue: its intermediate values stay inside it (no later op reads
# them), so a matcher finds it whole, as in a model's own helper function.
def _inner(b: Builder, value: Value) -> Value:
    """``value``, an intermediate of a composition, taken out of the values later ops may use."""
    b.values.remove(value)
    return value


@_op("hand.swish", "composition", cost=2)
def _hand_swish(b: Builder, x: Value) -> Value:
    """``x * torch.sigmoid(x)`` (or ``torch.sigmoid(x) * x``)."""
    gate = _inner(b, b.call_either(torch.sigmoid, x, meta=x.meta))
    if b.flag():
        return b.call(operator.mul, gate, x, meta=x.meta)
    return b.call(operator.mul, x, gate, meta=x.meta)


@_op("hand.gelu_tanh", "composition", cost=8)
def _hand_gelu_tanh(b: Builder, x: Value) -> Value:
    """GELU by its tanh formula: ``0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 *
    torch.pow(x, 3))))``."""
    half = _inner(b, b.call(operator.mul, 0.5, x, meta=x.meta))
    cube = _inner(b, b.call(torch.pow, x, 3, meta=x.meta))
    scaled = _inner(b, b.call(operator.mul, 0.044715, cube, meta=x.meta))
    shifted = _inner(b, b.call(operator.add, x, scaled, meta=x.meta))
    inner = _inner(b, b.call(operator.mul, math.sqrt(2.0 / math.pi), shifted, meta=x.meta))
    tanh = _inner(b, b.call(torch.tanh, inner, meta=x.meta))
    gate = _inner(b, b.call(operator.add, 1.0, tanh, meta=x.meta))
    return b.call(operator.mul, half, gate, meta=x.meta)


@_op("hand.softmax", "composition", cost=5)
def _hand_softmax(b: Builder, x: Value) -> Value:
    """Softmax spelled out: ``e = torch.exp(x - x.amax(dim, keepdim=True)); e / e.sum(dim, keepdim=True)``."""
    dim = _dim(b, x.meta.rank)
    kept = _same(x.meta, shape=tuple(1 if d == dim % x.meta.rank else s for d, s in enumerate(x.meta.shape)))
    largest = _inner(b, b.call("amax", x, dim=dim, keepdim=True, meta=kept, method=True))
    shifted = _inner(b, b.call(operator.sub, x, largest, meta=x.meta))
    e = _inner(b, b.call(torch.exp, shifted, meta=x.meta))
    total = _inner(b, b.call("sum", e, dim=dim, keepdim=True, meta=kept, method=True))
    return b.call(operator.truediv, e, total, meta=x.meta)


def _last_kept(m: Meta) -> Meta:
    return _same(m, shape=m.shape[:-1] + (1,))


@_op("hand.rms_norm", "composition", cost=5)
def _hand_rms_norm(b: Builder, x: Value) -> Value:
    """RMSNorm written out: ``x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)``, times a weight of the
    last dim's size when there is room."""
    square = _inner(b, b.call("pow", x, 2, meta=x.meta, method=True))
    mean = _inner(b, b.call("mean", square, -1, keepdim=True, meta=_last_kept(x.meta), method=True))
    shifted = _inner(b, b.call(operator.add, mean, b.choice((1e-6, 1e-5)), meta=_last_kept(x.meta)))
    scale = _inner(b, b.call(torch.rsqrt, shifted, meta=_last_kept(x.meta)))
    normed = b.call(operator.mul, x, scale, meta=x.meta)
    if b.room < 2 or not b.flag():
        return normed
    _inner(b, normed)
    weight = _weight(b, x.meta.shape[-1:], x.meta.dtype)  # a get_attr, not among the values
    return b.call(operator.mul, normed, weight, meta=x.meta)


@_op("hand.layer_norm", "composition", cost=6)
def _hand_layer_norm(b: Builder, x: Value) -> Value:
    """A normalisation written out, ``(x - mean) / torch.sqrt(var + eps)`` over the last dim (biased variance,
    as ``F.layer_norm``'s)."""
    mean = _inner(b, b.call("mean", x, -1, keepdim=True, meta=_last_kept(x.meta), method=True))
    centred = _inner(b, b.call(operator.sub, x, mean, meta=x.meta))
    var = _inner(b, b.call("var", x, -1, keepdim=True, correction=0, meta=_last_kept(x.meta), method=True))
    shifted = _inner(b, b.call(operator.add, var, b.choice((1e-5, 1e-6)), meta=_last_kept(x.meta)))
    root = _inner(b, b.call(torch.sqrt, shifted, meta=_last_kept(x.meta)))
    return b.call(operator.truediv, centred, root, meta=x.meta)


BY_NAME: dict[str, Op] = {op.name: op for op in CATALOGUE}


def ops_named(names: Sequence[str] | None, *, allow_modules: bool, allow_inplace: bool) -> list[Op]:
    """The catalogue entries called ``names`` (all when None), less module / in-place ones
    unless allowed. Unknown names raise ``KeyError`` listing the close ones."""
    by_name = BY_NAME
    if names is not None:
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise KeyError(unknown)
        chosen = [by_name[n] for n in dict.fromkeys(names)]
    else:
        chosen = list(CATALOGUE)
    return [op for op in chosen if (allow_modules or not op.module) and (allow_inplace or not op.inplace)]
