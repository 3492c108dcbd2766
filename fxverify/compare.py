"""Comparing output trees: structure (pytree spec), dtypes, shapes, NaN/inf
positions and values, reporting the first path that differs.

Values pass when allclose at the tolerance; a float32 (or lower) result that
is not is judged against a float64 reference with the rule of
``torch._dynamo.utils.same``: it passes when
``rmse(result, fp64) <= k * rmse(reference, fp64) + tol / 10``, so a rewrite
that is as accurate as the original is never blamed for rounding.

>>> import torch
>>> compare_trees({"out": torch.ones(2)}, {"out": torch.ones(2)}) is None
True
>>> print(compare_trees((torch.zeros(2),), (torch.ones(2),)).describe())
output[0]: values differ: max abs err 1 at index (0,), max rel err 1 (rtol=1.3e-06, atol=1e-05)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

# The defaults of torch.testing.assert_close, by dtype.
_DEFAULT_TOLERANCES = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Extra looseness over the dtype defaults (a contract's or an entry's)."""

    rtol: float | None = None
    atol: float | None = None

    def for_dtype(self, dtype: torch.dtype) -> tuple[float, float]:
        rtol, atol = _DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))
        return max(rtol, self.rtol or 0.0), max(atol, self.atol or 0.0)

    def loosest(self, other: Tolerance) -> Tolerance:
        def pick(a: float | None, b: float | None) -> float | None:
            return None if a is None and b is None else max(a or 0.0, b or 0.0)

        return Tolerance(pick(self.rtol, other.rtol), pick(self.atol, other.atol))


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """The first difference found: where, what, and by how much."""

    path: str
    reason: str
    max_abs: float | None = None
    max_rel: float | None = None
    index: tuple[int, ...] | None = None
    detail: str = ""

    def describe(self) -> str:
        text = f"{self.path}: {self.reason}"
        if self.max_abs is not None:
            text += f": max abs err {self.max_abs:.3g}"
            if self.index is not None:
                text += f" at index {self.index}"
            if self.max_rel is not None:
                text += f", max rel err {self.max_rel:.3g}"
        if self.detail:
            text += f" ({self.detail})"
        return text


def leaves_with_paths(tree: Any, root: str = "output") -> tuple[list[tuple[str, Any]], Any]:
    """Flatten ``tree`` into ``(path, leaf)`` pairs and its pytree spec."""
    flat, spec = pytree.tree_flatten_with_path(tree)
    return [(root + pytree.keystr(path), leaf) for path, leaf in flat], spec


def compare_trees(
    actual: Any,
    expected: Any,
    *,
    tolerance: Tolerance = Tolerance(),
    fp64_expected: Callable[[], Any] | None = None,
    root: str = "output",
) -> Mismatch | None:
    """The first difference between two output trees, or ``None``.

    ``fp64_expected`` lazily gives the float64 reference tree, computed only
    when some float32 leaf fails allclose.
    """
    actual_leaves, actual_spec = leaves_with_paths(actual, root)
    expected_leaves, expected_spec = leaves_with_paths(expected, root)
    if actual_spec != expected_spec:
        return Mismatch(root, f"output structure differs: expected {expected_spec}, got {actual_spec}")
    fp64_leaves: list[Any] | None = None
    for i, ((path, a), (_, e)) in enumerate(zip(actual_leaves, expected_leaves)):
        def fp64_leaf(i: int = i) -> Any:
            nonlocal fp64_leaves
            if fp64_expected is None:
                return None
            if fp64_leaves is None:
                fp64_leaves = [leaf for _, leaf in leaves_with_paths(fp64_expected())[0]]
            return fp64_leaves[i]

        found = compare_values(a, e, path=path, tolerance=tolerance, fp64=fp64_leaf)
        if found is not None:
            return found
    return None


def compare_values(
    actual: Any,
    expected: Any,
    *,
    path: str,
    tolerance: Tolerance = Tolerance(),
    fp64: Callable[[], Any] | None = None,
) -> Mismatch | None:
    """Compare two leaves (tensors or plain values)."""
    if not isinstance(expected, torch.Tensor) or not isinstance(actual, torch.Tensor):
        if isinstance(expected, torch.Tensor) != isinstance(actual, torch.Tensor) or actual != expected:
            return Mismatch(path, f"expected {_brief(expected)}, got {_brief(actual)}")
        return None
    if actual.dtype != expected.dtype:
        return Mismatch(path, f"dtype differs: expected {expected.dtype}, got {actual.dtype}")
    if actual.shape != expected.shape:
        return Mismatch(path, f"shape differs: expected {tuple(expected.shape)}, got {tuple(actual.shape)}")
    a, e = actual.detach().cpu(), expected.detach().cpu()
    if not e.is_floating_point() and not e.is_complex():
        if torch.equal(a, e):
            return None
        index = _first_index(a != e)
        return Mismatch(path, f"values differ (first at {index}: expected {e[index].item()}, got {a[index].item()})")
    rtol, atol = tolerance.for_dtype(e.dtype)
    if torch.equal(a, e) or torch.allclose(a, e, rtol=rtol, atol=atol, equal_nan=True):  # the common cases
        return None
    for name, test in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
        a_mask, e_mask = test(a), test(e)
        if not torch.equal(a_mask, e_mask):
            index = _first_index(a_mask != e_mask)
            return Mismatch(
                path,
                f"{name} positions differ (first at {index}: expected {e[index].item()}, got {a[index].item()}; "
                f"{int(e_mask.sum())} {name} expected, {int(a_mask.sum())} got)",
            )
    finite = torch.isfinite(e)
    a64, e64 = a.double(), e.double()
    if torch.allclose(a64[finite], e64[finite], rtol=rtol, atol=atol):
        return None
    diff = torch.where(finite, (a64 - e64).abs(), torch.zeros_like(a64))
    index = _first_index(diff == diff.max())
    nonzero = finite & (e64 != 0)  # a relative error against an expected zero means nothing
    max_rel = float((diff[nonzero] / e64[nonzero].abs()).max()) if nonzero.any() else None
    tol_text = f"rtol={rtol:.2g}, atol={atol:.2g}"
    reference = fp64() if fp64 is not None and e.dtype != torch.float64 else None
    if isinstance(reference, torch.Tensor):
        ref64 = reference.detach().cpu().double()
        ok, rule = _fp64_rule(a64, e64, ref64, finite, rtol, atol)
        if ok:
            return None
        tol_text += f"; {rule}"
    return Mismatch(
        path,
        "values differ",
        max_abs=float(diff.max()),
        max_rel=max_rel,
        index=index,
        detail=tol_text,
    )


def _fp64_rule(
    a: torch.Tensor, e: torch.Tensor, ref: torch.Tensor, finite: torch.Tensor, rtol: float, atol: float
) -> tuple[bool, str]:
    def rmse(x: torch.Tensor) -> float:
        return float(torch.sqrt(torch.mean(torch.square(x[finite] - ref[finite]))))

    res_err, ref_err = rmse(a), rmse(e)
    multiplier = 3.0 if e.numel() < 1000 else 2.0
    tol = max(rtol, atol)
    ok = res_err <= multiplier * ref_err + tol / 10.0 or (math.isnan(res_err) and math.isnan(ref_err))
    return ok, (
        f"vs float64 reference: rmse(result)={res_err:.3g} > {multiplier:g} x rmse(original)={ref_err:.3g} + {tol / 10:.2g}"
    )


def _first_index(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in mask.nonzero()[0]) if mask.ndim else ()


def _brief(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor {tuple(value.shape)} {value.dtype}"
    text = repr(value)
    return text if len(text) < 60 else text[:57] + "..."
