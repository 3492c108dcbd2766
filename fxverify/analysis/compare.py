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
import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._pytree import PyTree

CHUNK = 2**22  # elements compared at a time in the common, all-close case (see _allclose)

# The defaults of torch.testing.assert_close, by dtype.
_DEFAULT_TOLERANCES = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Extra looseness over the dtype defaults (a contract's or an entry's). ``range_tol``
    accepts absolute differences up to that fraction of each expected value's scale, the
    larger of its range (``max - min``) and its largest magnitude: a tolerance relative to
    the output, as a quantizing pass needs ("within 1e-3 of the output range").

    >>> Tolerance(range_tol=1e-3).atol_for(torch.tensor([0.0, 2000.0])), Tolerance(range_tol=1e-3).atol_for(torch.tensor(-50.0))
    (2.0, 0.05)
    """

    rtol: float | None = None
    atol: float | None = None
    range_tol: float | None = None

    def for_dtype(self, dtype: torch.dtype) -> tuple[float, float]:
        rtol, atol = _DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))
        return max(rtol, self.rtol or 0.0), max(atol, self.atol or 0.0)

    def at_least(self, dtype: torch.dtype) -> Tolerance:
        """These tolerances, no tighter than ``dtype``'s defaults (a float64 run whose new parameters
        carry float32 rounding is judged at float32's).

        >>> Tolerance(atol=1e-3).at_least(torch.float32)
        Tolerance(rtol=1.3e-06, atol=0.001, range_tol=None)
        """
        return Tolerance(*self.for_dtype(dtype), self.range_tol)

    def atol_for(self, expected: torch.Tensor) -> float:
        """The absolute tolerance for ``expected``: the dtype's (or the declared one), or
        ``range_tol`` of its finite values' range when that is larger."""
        atol = self.for_dtype(expected.dtype)[1]
        if not self.range_tol:
            return atol
        finite = expected[torch.isfinite(expected)] if expected.is_floating_point() else expected
        if finite.numel():
            low, high = float(finite.min()), float(finite.max())
            atol = max(atol, self.range_tol * max(high - low, abs(low), abs(high)))
        return atol

    def loosest(self, other: Tolerance) -> Tolerance:
        def pick(a: float | None, b: float | None) -> float | None:
            return None if a is None and b is None else max(a or 0.0, b or 0.0)

        return Tolerance(pick(self.rtol, other.rtol), pick(self.atol, other.atol),
                         pick(self.range_tol, other.range_tol))


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
    actual: PyTree,
    expected: PyTree,
    *,
    tolerance: Tolerance = Tolerance(),
    fp64_expected: Callable[[], Any] | None = None,
    fp64_allowance: Callable[[], list[float]] | None = None,
    other_expected: Callable[[], Any] | None = None,
    other_actual: Callable[[], Any] | None = None,
    root: str = "output",
) -> Mismatch | None:
    """The first difference between two output trees, or ``None``.

    ``fp64_expected`` lazily gives the float64 reference tree, computed only
    when some float32 leaf fails allclose; ``fp64_allowance`` lazily gives, per
    leaf, the rmse that rounding the result's new parameters alone costs;
    ``other_expected`` lazily gives ``expected`` computed again with other
    kernels, asked for only when a leaf fails the float64 rule, and ``other_actual``
    ``actual`` computed again with those kernels, asked for only when it still fails (see
    :func:`compare_values`).
    """
    actual_leaves, actual_spec = leaves_with_paths(actual, root)
    expected_leaves, expected_spec = leaves_with_paths(expected, root)
    if actual_spec != expected_spec:
        return Mismatch(root, f"output structure differs: expected {expected_spec}, got {actual_spec}")
    lazy: dict[str, list[Any]] = {}

    def leaf(name: str, make: Callable[[], list[Any]] | None, i: int) -> Any:
        if make is None:
            return None
        if name not in lazy:
            lazy[name] = make()
        return lazy[name][i]

    def fp64_leaves() -> list[Any]:
        assert fp64_expected is not None
        return [value for _, value in leaves_with_paths(fp64_expected())[0]]

    def other_leaves() -> list[Any]:
        assert other_expected is not None
        return [value for _, value in leaves_with_paths(other_expected())[0]]

    def other_actual_leaves() -> list[Any]:
        assert other_actual is not None
        return [value for _, value in leaves_with_paths(other_actual())[0]]

    for i, ((path, a), (_, e)) in enumerate(zip(actual_leaves, expected_leaves)):
        found = compare_values(
            a, e, path=path, tolerance=tolerance,
            fp64=functools.partial(leaf, "fp64", fp64_leaves if fp64_expected else None, i),
            allowance=functools.partial(leaf, "allowance", fp64_allowance, i) if fp64_allowance else None,
            other=functools.partial(leaf, "other", other_leaves, i) if other_expected else None,
            other_actual=functools.partial(leaf, "other_actual", other_actual_leaves, i) if other_actual else None,
        )
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
    allowance: Callable[[], float] | None = None,
    other: Callable[[], Any] | None = None,
    other_actual: Callable[[], Any] | None = None,
) -> Mismatch | None:
    """Compare two leaves (tensors or plain values). A float32 leaf that is not allclose is
    judged against the float64 reference ``fp64()`` when given: its error may be twice the
    original's own. ``allowance()`` is the rmse that rounding the result's new parameters to the
    result's dtype costs by itself (a fusion computes new weights in float64 and stores them in
    float32), added to the original's error; ``other()`` is the original's leaf computed again with
    other kernels (torch on another number of threads picks other convolution algorithms, whose
    float32 error can be several times larger): the original's error is the larger of the two.
    ``other_actual()`` is the result's leaf computed with those other kernels: which kernels torch
    picks is not the transform's doing, so the result passes when either of its runs is within the
    rule (a wrong result is wrong with every kernel)."""
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
    rtol, atol = tolerance.for_dtype(e.dtype)[0], tolerance.atol_for(e)
    if torch.equal(a, e) or _allclose(a, e, rtol, atol):  # the common cases
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
        spare = allowance() if allowance is not None else 0.0
        ok, rule = _fp64_rule(a64, e64, ref64, finite, rtol, atol, spare)
        alternative = other() if not ok and other is not None else None
        if isinstance(alternative, torch.Tensor) and alternative.shape == e.shape:
            alternative = alternative.detach().cpu().double()
            ok, rule = _fp64_rule(a64, e64, ref64, finite, rtol, atol, spare, alternative)
            again = other_actual() if not ok and other_actual is not None else None
            if isinstance(again, torch.Tensor) and again.shape == a.shape:
                ok, also = _fp64_rule(again.detach().cpu().double(), e64, ref64, finite, rtol, atol, spare,
                                      alternative)
                rule += f" (and with other kernels, {also.partition('vs float64 reference: ')[2]})"
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


def _allclose(a: torch.Tensor, e: torch.Tensor, rtol: float, atol: float) -> bool:
    """``torch.allclose`` (NaNs equal), a chunk of :data:`CHUNK` elements at a time for large tensors:
    its temporaries are several times the tensor (1.2 GB for the gradient of AlexNet's first linear
    layer in float64)."""
    if a.numel() <= CHUNK or not (a.is_contiguous() and e.is_contiguous()):
        return torch.allclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    return all(torch.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True)
               for x, y in zip(a.view(-1).split(CHUNK), e.view(-1).split(CHUNK), strict=True))


def _fp64_rule(
    a: torch.Tensor, e: torch.Tensor, ref: torch.Tensor, finite: torch.Tensor, rtol: float, atol: float,
    allowance: float = 0.0, other: torch.Tensor | None = None,
) -> tuple[bool, str]:
    def rmse(x: torch.Tensor) -> float:
        return float(torch.sqrt(torch.mean(torch.square(x[finite] - ref[finite]))))

    res_err, own_err = rmse(a), rmse(e)
    other_err = rmse(other) if other is not None else None
    ref_err = own_err if other_err is None else max(own_err, other_err)
    multiplier = 3.0 if e.numel() < 1000 else 2.0
    tol = max(rtol, atol)
    ok = (res_err <= multiplier * (ref_err + allowance) + tol / 10.0
          or (math.isnan(res_err) and math.isnan(ref_err)))
    own = f"rmse(original)={ref_err:.3g}"
    if other_err is not None:
        own = f"max(rmse(original)={own_err:.3g}, {other_err:.3g} with other kernels)"
    if allowance:
        own = f"({own} + {allowance:.3g} for rounding the new parameters)"
    return ok, f"vs float64 reference: rmse(result)={res_err:.3g} > {multiplier:g} x {own} + {tol / 10:.2g}"


def rmse_per_leaf(actual: Any, expected: Any) -> list[float]:
    """The root-mean-square difference of each floating leaf of two trees of the same structure
    (0 for other leaves and where the structure differs).

    >>> rmse_per_leaf((torch.zeros(4), 1), (torch.ones(4), 1))
    [1.0, 0.0]
    """
    a_leaves, a_spec = leaves_with_paths(actual)
    e_leaves, e_spec = leaves_with_paths(expected)
    if a_spec != e_spec:
        return [0.0] * len(e_leaves)
    found = []
    for (_, a), (_, e) in zip(a_leaves, e_leaves):
        if isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor) and e.is_floating_point() and a.shape == e.shape:
            diff = (a.detach().double() - e.detach().double())[torch.isfinite(e)]
            found.append(float(diff.square().mean().sqrt()) if diff.numel() else 0.0)
        else:
            found.append(0.0)
    return found


def _first_index(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in mask.nonzero()[0]) if mask.ndim else ()


def _brief(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor {tuple(value.shape)} {value.dtype}"
    text = repr(value)
    return text if len(text) < 60 else text[:57] + "..."
