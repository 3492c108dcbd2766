"""Hypothesis strategies for tensors: ``tensors()`` for one, ``inputs_for()`` for the
inputs of a drawn graph. Values come from a drawn seed (cheap, and shrinking the
seed to 0 gives simple values); special values (NaN, +-inf, -0.0, subnormals,
large magnitudes) are written at drawn positions and non-contiguous layouts
(transposed, strided, storage offset, expanded with a 0 stride) are drawn only on request.

>>> from hypothesis import given
>>> @given(tensors(shape=(2, 3), dtype=torch.float64, special_values=True))
... def test_finite_or_special(t):
...     assert t.shape == (2, 3) and t.dtype == torch.float64
>>> test_finite_or_special()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from fxverify.cases.catalogue import InputSpec
from fxverify.strategies.meta import ANY, DTYPE_NAMES
from fxverify.strategies.source import tensor_source

SPECIAL_VALUES = ("nan", "inf", "-inf", "-0.0", "subnormal", "large")
LAYOUTS = ("contiguous", "transposed", "strided", "offset", "expanded")
MAX_SPECIAL = 4


def special_value(kind: str, dtype: torch.dtype) -> float:
    """The float that ``kind`` (one of :data:`SPECIAL_VALUES`) stands for in ``dtype``.

    >>> special_value("subnormal", torch.float32) < torch.finfo(torch.float32).tiny
    True
    """
    info = torch.finfo(dtype)
    return {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "-0.0": -0.0,
            "subnormal": info.tiny / 4, "large": info.max / 8}[kind]


def _dtype(dtype: Any) -> torch.dtype:
    names = {name: d for d, name in DTYPE_NAMES.items()}
    resolved = names.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if resolved not in ANY:
        raise InvalidArgument(f"dtype={dtype!r} is not supported; choose from {', '.join(names)}")
    return resolved


def _shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, int):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise InvalidArgument(f"shape must be a tuple of non-negative ints, e.g. (2, 3), but got shape={shape!r}")
    return tuple(shape)


def tensors(
    *,
    shape: tuple[int, ...] | int,
    dtype: torch.dtype | str = torch.float32,
    low: float | None = None,
    high: float | None = None,
    special_values: bool = False,
    non_contiguous: bool = False,
) -> st.SearchStrategy[torch.Tensor]:
    """Tensors of ``shape`` and ``dtype`` with values in ``[low, high)`` (default
    ``[-3, 3)`` for floats, ``[-4, 5)`` for integers).

    ``special_values``: up to four elements replaced by NaN, +-inf, -0.0, a subnormal or
    a huge value (floating dtypes); ``non_contiguous``: the tensor may be transposed,
    strided or offset into its storage (same values), or expanded: a stride-0 view of its
    first slice along a dim of size > 1, whose values then repeat along that dim::

        @given(tensors(shape=(4, 4), special_values=True, non_contiguous=True))
        def test_relu_rewrite(x): ...

    Shrinks towards seed-0 values, no special values and the contiguous layout.
    """
    chosen = _dtype(dtype)
    size = _shape(shape)
    for name, flag in (("special_values", special_values), ("non_contiguous", non_contiguous)):
        if not isinstance(flag, bool):
            raise InvalidArgument(f"Expected a bool for {name}, but got {name}={flag!r}")
    return _tensors(size, chosen, low, high, special_values, non_contiguous).map(lambda pair: pair[0])


@st.composite
def _tensors(draw: Any, shape: tuple[int, ...], dtype: torch.dtype, low: float | None, high: float | None,
             special: bool, non_contiguous: bool) -> tuple[torch.Tensor, str]:
    seed = draw(st.integers(0, 2**16 - 1))
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        values = torch.rand(shape, generator=generator) > 0.5
    elif dtype.is_floating_point:
        lo, hi = (-3.0 if low is None else low), (3.0 if high is None else high)
        values = (torch.rand(shape, generator=generator, dtype=torch.float64) * (hi - lo) + lo).to(dtype)
    else:
        lo, hi = int(-4 if low is None else low), int(5 if high is None else high)
        values = torch.randint(lo, hi, shape, generator=generator, dtype=dtype)
    if special and dtype.is_floating_point and values.numel():
        flat = values.view(-1)
        for _ in range(draw(st.integers(0, min(MAX_SPECIAL, flat.numel())))):
            position = draw(st.integers(0, flat.numel() - 1))
            flat[position] = special_value(draw(st.sampled_from(SPECIAL_VALUES)), dtype)
    layout = draw(st.sampled_from(_layouts(shape))) if non_contiguous else "contiguous"
    return in_layout(values, layout), layout


def _layouts(shape: tuple[int, ...]) -> tuple[str, ...]:
    possible = ["contiguous", "strided", "offset"]
    if len(shape) >= 2:
        possible.insert(1, "transposed")
    if any(size > 1 for size in shape):
        possible.append("expanded")
    return tuple(possible)


def in_layout(values: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values in another memory layout (see :data:`LAYOUTS`); except "expanded":
    the first slice along the first dim of size > 1, expanded over that dim (stride 0).

    >>> x = in_layout(torch.arange(6.).reshape(2, 3), "transposed")
    >>> x.is_contiguous(), x.tolist()
    (False, [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])
    >>> x = in_layout(torch.arange(6.).reshape(2, 3), "expanded")
    >>> x.stride(), x.tolist()
    ((0, 1), [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]])
    """
    if layout == "contiguous":
        return values.clone()
    if layout == "transposed":
        return values.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "strided":
        shape = values.shape[:-1] + (2 * values.shape[-1],) if values.dim() else (2,)
        base = torch.zeros(shape, dtype=values.dtype)
        view = base[..., ::2] if values.dim() else base[0]
        view.copy_(values)
        return view
    if layout == "offset":
        base = torch.zeros(values.numel() + 1, dtype=values.dtype)
        base[1:].copy_(values.reshape(-1))
        return base[1:].view(values.shape)
    if layout == "expanded":
        wide = [d for d, size in enumerate(values.shape) if size > 1]
        if not wide:
            raise ValueError(f"the expanded layout needs a dim of size > 1, got shape {tuple(values.shape)}")
        return values.narrow(wide[0], 0, 1).clone().expand(values.shape)
    raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")


class Inputs(tuple):
    """The drawn inputs of a graph; its repr is Python code that rebuilds them exactly,
    layout included."""

    layouts: tuple[str, ...] = ()

    def __repr__(self) -> str:
        parts = []
        for tensor, layout in zip(self, self.layouts):
            code = tensor_source(tensor.contiguous())
            if layout != "contiguous":
                code = f"fxverify.strategies.in_layout({code}, {layout!r})"
            parts.append(code)
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # Hypothesis prints examples with this
        printer.text(repr(self))


def inputs_for(
    case: Any,
    *,
    special_values: bool = False,
    non_contiguous: bool = False,
) -> st.SearchStrategy[Inputs]:
    """Inputs for a drawn graph (a :class:`GraphCase`) or for a sequence of
    :class:`fxverify.InputSpec`: one :func:`tensors` per placeholder::

        @given(st.data())
        def test_pass(data):
            case = data.draw(graph_modules())
            x = data.draw(inputs_for(case, special_values=True))

    Shrinks like :func:`tensors`, input by input.
    """
    specs: Sequence[InputSpec] = getattr(case, "inputs", case)
    if not all(isinstance(s, InputSpec) for s in specs):
        raise InvalidArgument(f"inputs_for expects a GraphCase or a sequence of InputSpec, got {case!r}")
    parts = tuple(_tensors(tuple(s.shape), _dtype(s.dtype), s.low, s.high, special_values, non_contiguous)
                  for s in specs)
    return _inputs(parts)


@st.composite
def _inputs(draw: Any, parts: tuple[st.SearchStrategy[tuple[torch.Tensor, str]], ...]) -> Inputs:
    drawn = [draw(part) for part in parts]
    inputs = Inputs(t for t, _ in drawn)
    inputs.layouts = tuple(layout for _, layout in drawn)
    return inputs
