"""Comparing output trees: structure (pytree spec), dtypes, shapes, NaN/inf
positions and values, reporting the first path that differs.

Values pass when allclose at the tolerance; a float32 (or lower) result that
is not is judged against a float64 reference with the rule of
``torch._dynamo.utils.same``: it passes when
``rmse(result, fp64) <= k * rmse(reference, fp64) + tol / 10``, so a rewrite
that is as accurate as the original is never blamed for rounding. The
reference's error is the largest of its run, its run with other kernels and a
few runs of it rounded otherwise (:class:`Rerounded`): one run's error can be
far below what rounding does to the same value (an ill-conditioned value, whose
error one element dominates). NaN or inf where the reference is finite is never
rounding: no tolerance, ``range_tol`` or float64 rule accepts it.

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
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import PyTree

CHUNK = 2**22  # elements compared at a time in the common, all-close case (see _allclose)
REROUNDED_RUNS = 6  # the reference rounded otherwise, asked for one at a time while a leaf fails (see Rerounded)
_NON_FINITE = (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf))

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


ANY_VALUE = Tolerance(atol=math.inf)  # judges no value: only structure, shapes, dtypes and non-finite values appearing


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """The first difference found: where, what, and by how much."""

    path: str
    reason: str
    max_abs: float | None = None
    max_rel: float | None = None
    index: tuple[int, ...] | None = None
    detail: str = ""
    non_finite: int = 0  # values NaN or inf in the result where the reference's are finite: never rounding

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
    rerounded_expected: Callable[[int], Any] | None = None,
    root: str = "output",
) -> Mismatch | None:
    """The first difference between two output trees, or ``None``.

    ``fp64_expected`` lazily gives the float64 reference tree, computed only
    when some float32 leaf fails allclose; ``fp64_allowance`` lazily gives, per
    leaf, the rmse that rounding the result's new parameters alone costs;
    ``other_expected`` lazily gives ``expected`` computed again with other
    kernels, asked for only when a leaf fails the float64 rule, and ``other_actual``
    ``actual`` computed again with those kernels, asked for only when it still fails;
    ``rerounded_expected(i)`` gives ``expected`` computed in the ``i``-th run rounded
    otherwise (:class:`Rerounded`; None where it cannot be had), asked for one run at a
    time while a leaf still fails (see :func:`compare_values`).
    """
    actual_leaves, actual_spec = leaves_with_paths(actual, root)
    expected_leaves, expected_spec = leaves_with_paths(expected, root)
    if actual_spec != expected_spec:
        return Mismatch(root, f"output structure differs: expected {expected_spec}, got {actual_spec}")
    lazy: dict[Any, list[Any]] = {}

    def leaf(key: Any, make: Callable[[], Any], i: int) -> Any:
        if key not in lazy:
            tree = make()
            lazy[key] = [None] * len(expected_leaves) if tree is None else \
                [value for _, value in leaves_with_paths(tree)[0]]
        return lazy[key][i] if i < len(lazy[key]) else None

    def rerounded_leaf(i: int, draw: int) -> Any:
        assert rerounded_expected is not None
        return leaf(("rerounded", draw), functools.partial(rerounded_expected, draw), i)

    def allowance(i: int) -> float:
        assert fp64_allowance is not None
        if "allowance" not in lazy:
            lazy["allowance"] = fp64_allowance()
        return float(lazy["allowance"][i])

    for i, ((path, a), (_, e)) in enumerate(zip(actual_leaves, expected_leaves)):
        found = compare_values(
            a, e, path=path, tolerance=tolerance,
            fp64=functools.partial(leaf, "fp64", fp64_expected, i) if fp64_expected else None,
            allowance=functools.partial(allowance, i) if fp64_allowance else None,
            other=functools.partial(leaf, "other", other_expected, i) if other_expected else None,
            other_actual=functools.partial(leaf, "other_actual", other_actual, i) if other_actual else None,
            rerounded=functools.partial(rerounded_leaf, i) if rerounded_expected else None,
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
    rerounded: Callable[[int], Any] | None = None,
) -> Mismatch | None:
    """Compare two leaves (tensors or plain values). NaN or inf in ``actual`` where ``expected`` is finite
    is a difference whatever the tolerance (a :class:`Mismatch` counting them, ``non_finite``). A float32
    leaf that is not allclose is judged against the float64 reference ``fp64()`` when given: its error may
    be twice the original's own. ``allowance()`` is the rmse that rounding the result's new parameters to the
    result's dtype costs by itself (a fusion computes new weights in float64 and stores them in
    float32), added to the original's error; ``other()`` is the original's leaf computed again with
    other kernels (torch on another number of threads picks other convolution algorithms, whose
    float32 error can be several times larger): the original's error is the larger of the two.
    ``other_actual()`` is the result's leaf computed with those other kernels: which kernels torch
    picks is not the transform's doing, so the result passes when either of its runs is within the
    rule (a wrong result is wrong with every kernel). ``rerounded(i)`` is the original's leaf in its
    ``i``-th run rounded otherwise (:class:`Rerounded`), asked for while the leaf still fails, up to
    :data:`REROUNDED_RUNS`: the original's error is the largest of all its runs.

    >>> nan = torch.tensor([1.0, float("nan")])
    >>> compare_values(nan, torch.tensor([1.0, 2.0]), path="out", tolerance=Tolerance(range_tol=1.0)).non_finite
    1
    >>> compare_values(nan, nan.clone(), path="out") is None  # NaN where the original's is NaN too
    True
    """
    if not isinstance(expected, torch.Tensor) or not isinstance(actual, torch.Tensor):
        # an object without value equality (Dynamo's autocast handle) is its own in each run: only its type says
        opaque = type(actual) is type(expected) and type(expected).__eq__ is object.__eq__
        if isinstance(expected, torch.Tensor) != isinstance(actual, torch.Tensor) or not opaque and actual != expected:
            return Mismatch(path, f"expected {_brief(expected)}, got {_brief(actual)}")
        return None
    if actual.dtype != expected.dtype:
        return Mismatch(path, f"dtype differs: expected {expected.dtype}, got {actual.dtype}")
    if actual.shape != expected.shape:
        return Mismatch(path, f"shape differs: expected {tuple(expected.shape)}, got {tuple(actual.shape)}")
    a, e = (t.to_dense() if t.layout != torch.strided else t for t in (actual.detach().cpu(), expected.detach().cpu()))
    if not e.is_floating_point() and not e.is_complex():
        if torch.equal(a, e):
            return None
        index = _first_index(a != e)
        return Mismatch(path, f"values differ (first at {index}: expected {e[index].item()}, got {a[index].item()})")
    rtol, atol = tolerance.for_dtype(e.dtype)[0], tolerance.atol_for(e)
    if torch.equal(a, e) or _allclose(a, e, rtol, atol):  # the common cases
        return None
    appeared = non_finite_mismatch(a, e, path=path)
    if appeared is not None:
        return appeared
    for name, test in _NON_FINITE:  # the original's NaN or inf, where the result's value is another
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
    if isinstance(reference, torch.Tensor) and reference.shape == e.shape:
        rule = _Float64Rule(a64, e64, reference.detach().cpu().double(), finite, max(rtol, atol),
                            allowance() if allowance is not None else 0.0)
        if rule.judge(other, other_actual, rerounded):
            return None
        tol_text += f"; {rule.describe()}"
    return Mismatch(
        path,
        "values differ",
        max_abs=float(diff.max()),
        max_rel=max_rel,
        index=index,
        detail=tol_text,
    )


def non_finite_mismatch(actual: Any, expected: Any, *, path: str) -> Mismatch | None:
    """The mismatch of NaN or inf in ``actual`` where ``expected`` (a floating tensor of its shape) is finite: how
    many of each, and the first; None where there are none. :func:`compare_values` asks this first, whatever the
    tolerance; a comparison that judges no values (an approximating pass's gradients) asks it alone.

    >>> print(non_finite_mismatch(torch.tensor([1.0, float("inf")]), torch.ones(2), path="grad").reason)
    +inf positions differ: 1 non-finite value (1 +inf) where the original's are finite, first at index (1,) (expected 1, got inf)
    """
    if not (isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor) and expected.is_floating_point()
            and actual.is_floating_point() and actual.shape == expected.shape):
        return None
    a, e = actual.detach().cpu(), expected.detach().cpu()
    appeared = torch.isfinite(e) & ~torch.isfinite(a)
    if not appeared.any():
        return None
    index = _first_index(appeared)
    counts = [(name, int((test(a) & appeared).sum())) for name, test in _NON_FINITE]
    first = next(name for name, test in _NON_FINITE if bool(test(a[index])))
    total = int(appeared.sum())
    return Mismatch(
        path,
        f"{first} positions differ: {total} non-finite value{'s' if total > 1 else ''} "
        f"({', '.join(f'{n} {name}' for name, n in counts if n)}) where the original's are finite, "
        f"first at index {index} (expected {e[index].item():.6g}, got {a[index].item()})",
        index=index,
        detail="not rounding: a value overflowed its dtype, or an op ran outside its domain",
        non_finite=total,
    )


def _allclose(a: torch.Tensor, e: torch.Tensor, rtol: float, atol: float) -> bool:
    """``torch.allclose`` (NaNs equal), a chunk of :data:`CHUNK` elements at a time for large tensors:
    its temporaries are several times the tensor (1.2 GB for the gradient of AlexNet's first linear
    layer in float64)."""
    if a.numel() <= CHUNK or not (a.is_contiguous() and e.is_contiguous()):
        return torch.allclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    return all(torch.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True)
               for x, y in zip(a.view(-1).split(CHUNK), e.view(-1).split(CHUNK), strict=True))


class _Float64Rule:
    """``rmse(result, fp64) <= k * (rmse(original, fp64) + allowance) + tol / 10``, over the values finite in
    the original and in the float64 reference (``k``: 3 below 1000 values, else 2), the original's error the
    largest of its runs and the result's the smallest of its."""

    def __init__(self, a: torch.Tensor, e: torch.Tensor, ref: torch.Tensor, finite: torch.Tensor, tol: float,
                 allowance: float) -> None:
        self.ref, self.mask = ref, finite & torch.isfinite(ref)  # an overflow of float64 alone is no reference
        self.tol, self.allowance = tol, allowance
        self.multiplier = 3.0 if e.numel() < 1000 else 2.0
        self.result = [self.rmse(a)]
        self.original = [self.rmse(e)]
        self.other: float | None = None
        self.rerounded: list[float] = []

    def rmse(self, x: torch.Tensor) -> float:
        """The error of ``x`` against the float64 reference, NaN where no value is to be compared or ``x``
        is not finite there."""
        diff = x[self.mask] - self.ref[self.mask]
        return float(torch.sqrt(torch.mean(torch.square(diff)))) if diff.numel() else math.nan

    @property
    def ok(self) -> bool:
        reference = max(self.original + [e for e in (self.other, *self.rerounded) if e is not None])
        return min(self.result) <= self.multiplier * (reference + self.allowance) + self.tol / 10.0

    def judge(self, other: Callable[[], Any] | None, other_actual: Callable[[], Any] | None,
              rerounded: Callable[[int], Any] | None) -> bool:
        """Whether the result is within the rule, asking for the original's (and the result's) other runs only
        while it is not."""
        if self.ok:
            return True
        alternative = other() if other is not None else None
        if isinstance(alternative, torch.Tensor) and alternative.shape == self.ref.shape:
            self.other = self._finite_error(alternative)
            again = other_actual() if not self.ok and other_actual is not None else None
            if isinstance(again, torch.Tensor) and again.shape == self.ref.shape:
                error = self._finite_error(again)
                self.result.append(math.inf if error is None else error)
        for draw in range(REROUNDED_RUNS if rerounded is not None else 0):
            if self.ok:
                break
            assert rerounded is not None
            value = rerounded(draw)
            if isinstance(value, torch.Tensor) and value.shape == self.ref.shape:
                error = self._finite_error(value)
                if error is not None:
                    self.rerounded.append(error)
        return self.ok

    def _finite_error(self, x: torch.Tensor) -> float | None:
        """``x``'s error, None where it is not finite (a run that overflowed is no measure of rounding)."""
        error = self.rmse(x.detach().cpu().double())
        return error if math.isfinite(error) else None

    def describe(self) -> str:
        own = f"rmse(original)={self.original[0]:.3g}"
        parts = [own] + ([f"{self.other:.3g} with other kernels"] if self.other is not None else []) + \
            ([f"{max(self.rerounded):.3g} in {len(self.rerounded)} runs rounded otherwise"] if self.rerounded else [])
        text = f"max({', '.join(parts)})" if len(parts) > 1 else own
        if self.allowance:
            text = f"({text} + {self.allowance:.3g} for rounding the new parameters)"
        text = (f"vs float64 reference: rmse(result)={self.result[0]:.3g} > {self.multiplier:g} x {text} + "
                f"{self.tol / 10:.2g}")
        if len(self.result) > 1:
            text += f" (and with other kernels, rmse(result)={self.result[1]:.3g})"
        return text


class Rerounded(TorchDispatchMode):
    """Torch with every op's floating result below float64 rounded otherwise: moved at random by up to half
    its dtype's epsilon, relative, and rounded back, so each value stays or moves to a neighbour, as another
    correct kernel may round it (Monte Carlo arithmetic's random rounding). Run ``i`` draws its moves from a
    generator seeded ``i``, the same on every machine; the RNG of the model itself is left alone (dropout
    draws the same masks). Ops without floating inputs (factories: constants, random numbers), mutating and
    aliasing ops (``add_``, views) and values not strided (mkldnn, sparse) are left as they are.

    >>> with Rerounded(0):
    ...     y = torch.full((1000,), 3.0) / 7
    >>> ulps = (y.double() - 3 / 7).abs() / torch.finfo(torch.float32).eps
    >>> bool(ulps.max() < 1), bool((y != torch.full((1000,), 3.0) / 7).any())
    (True, True)
    """

    def __init__(self, draw: int) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(draw)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        schema = func._schema
        if schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
            return out
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if not any(t.is_floating_point() for t in tensors):  # a factory (a constant, random numbers): nothing rounded
            return out
        inputs = {t.untyped_storage().data_ptr() for t in tensors if t.layout == torch.strided}
        return pytree.tree_map(functools.partial(self._moved, inputs), out)

    def _moved(self, inputs: set[int], value: Any) -> Any:
        if (not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.element_size() >= 8
                or value.layout != torch.strided or value.numel() == 0 or value.untyped_storage().data_ptr() in inputs):
            return value
        moves = torch.rand(value.shape, generator=self.generator, dtype=torch.float64).mul_(2).sub_(1)
        scale = torch.finfo(value.dtype).eps / 2
        return value.double().mul_(moves.to(value.device).mul_(scale).add_(1)).to(value.dtype)


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
