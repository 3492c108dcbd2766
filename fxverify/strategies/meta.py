"""What the graph builder knows about a value before running anything: its shape
and dtype (``Meta``), and the dtype rules of torch's type promotion it relies on.

>>> promote(Meta((2, 3), torch.int64), Meta((3,), torch.float32))
torch.float32
>>> broadcast((2, 1, 4), (3, 1))
(2, 3, 4)
"""

from __future__ import annotations

import dataclasses
import math

import torch

FLOATS: tuple[torch.dtype, ...] = (torch.float32, torch.float64, torch.bfloat16)
INTS: tuple[torch.dtype, ...] = (torch.int32, torch.int64)
BOOL: tuple[torch.dtype, ...] = (torch.bool,)
NUMBERS = FLOATS + INTS
ANY = NUMBERS + BOOL
DTYPE_NAMES = {d: str(d).removeprefix("torch.") for d in ANY}


@dataclasses.dataclass(frozen=True)
class Meta:
    """A value's predicted shape and dtype."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def __str__(self) -> str:
        return f"{DTYPE_NAMES.get(self.dtype, self.dtype)}[{', '.join(map(str, self.shape))}]"


def broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The broadcast shape, as ``torch.broadcast_shapes`` gives it; ValueError when the shapes
    do not broadcast. Plain Python: torch's imports sympy at its first call (~0.4 s) and
    costs ~30 us a call, which the builder pays for every candidate operand.

    >>> broadcast((4, 1), (3,)), broadcast((), (2,))
    ((4, 3), (2,))
    >>> broadcast((2, 3), (4,))
    Traceback (most recent call last):
    ValueError: shapes ((2, 3), (4,)) do not broadcast: sizes [3, 4] meet in one dim
    """
    rank = max(map(len, shapes), default=0)
    result = []
    for sizes in zip(*((1,) * (rank - len(shape)) + tuple(shape) for shape in shapes)):
        wide = {size for size in sizes if size != 1}
        if len(wide) > 1:
            raise ValueError(f"shapes {shapes} do not broadcast: sizes {sorted(wide)} meet in one dim")
        result.append(wide.pop() if wide else 1)
    return tuple(result)


def broadcastable(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether two shapes broadcast together.

    >>> broadcastable((2, 3), (4, 1)), broadcastable((2, 3), (1, 3))
    (False, True)
    """
    return all(x == y or x == 1 or y == 1 for x, y in zip(reversed(a), reversed(b)))


def promote(*metas: Meta) -> torch.dtype:
    """The result dtype of an elementwise op on tensors that all have dimensions."""
    dtype = metas[0].dtype
    for meta in metas[1:]:
        dtype = torch.promote_types(dtype, meta.dtype)
    return dtype


def with_scalar(dtype: torch.dtype, scalar: bool | int | float) -> torch.dtype:
    """The result dtype of ``tensor op scalar``: a scalar of a higher category than the
    tensor (float over int, int over bool) gives that category's default dtype."""
    if isinstance(scalar, bool) or dtype.is_floating_point:
        return dtype
    if isinstance(scalar, float):
        return torch.get_default_dtype()
    return torch.int64 if dtype == torch.bool else dtype


def floating(dtype: torch.dtype) -> torch.dtype:
    """The dtype of a floating-point function of a ``dtype`` tensor (integers and bool promote)."""
    return dtype if dtype.is_floating_point else torch.get_default_dtype()


def accumulated(dtype: torch.dtype) -> torch.dtype:
    """The dtype of ``sum`` / ``prod`` / ``cumsum``: integers and bool accumulate in int64."""
    return dtype if dtype.is_floating_point else torch.int64
