"""What the comparison never calls rounding, and what it measures rounding by.

NaN or inf in a result where the original's values are finite is a difference at every tolerance, through
every path of :func:`fxverify.analysis.compare.compare_values`: ``atol``, ``range_tol`` (pattern fuzzing's
``ROUNDING``), the float64 rule (which numerics, the backend check and pattern fuzzing use), the original's
other runs. NaN where the original has NaN is no difference. The float64 rule takes the original's error
against float64 as the largest of its runs, rounded otherwise too (:class:`Rerounded`): one run of an
ill-conditioned value can land far closer to float64 than rounding usually leaves it.
"""

from __future__ import annotations

import torch
from torch import nn

import fxverify
from fxverify.analysis.compare import REROUNDED_RUNS, Rerounded, Tolerance, compare_trees, compare_values
from fxverify.compile.patterns import ROUNDING
from tests import mutations

NAN, INF = float("nan"), float("inf")


def _outputs() -> tuple[torch.Tensor, torch.Tensor]:
    expected = torch.linspace(-3, 3, 256).reshape(16, 16)
    actual = expected.clone()
    actual[2, 5:8] = NAN
    actual[3, 0] = INF
    actual[9, 9] = -INF
    return actual, expected


def test_nan_and_inf_where_the_original_is_finite_are_counted_with_the_first_index():
    actual, expected = _outputs()
    found = compare_trees({"logits": actual}, {"logits": expected})
    assert found is not None and found.path == "output['logits']" and found.index == (2, 5)
    assert found.non_finite == 5
    assert "NaN positions differ: 5 non-finite values (3 NaN, 1 +inf, 1 -inf) where the original's are finite, " \
           "first at index (2, 5)" in found.describe()
    assert "not rounding" in found.describe()


def test_no_tolerance_accepts_them():
    actual, expected = _outputs()
    loose = [Tolerance(atol=1e9), Tolerance(rtol=1e9), Tolerance(range_tol=1e6), ROUNDING]
    for tolerance in loose:
        found = compare_values(actual, expected, path="out", tolerance=tolerance)
        assert found is not None and found.non_finite == 5, tolerance


def test_no_float64_reference_or_other_run_of_the_original_accepts_them():
    """The float64 result agrees (a precondition on the dtype that float64 does not meet) and the original's
    other runs are far off: NaN is still NaN."""
    actual, expected = _outputs()
    asked = []

    def run(name: str, value: torch.Tensor):
        def make(*_):
            asked.append(name)
            return value
        return make

    far = expected + 1e3
    found = compare_values(actual, expected, path="out", tolerance=ROUNDING, fp64=run("fp64", expected.double()),
                           allowance=lambda: 1e6, other=run("other", far), other_actual=run("other_actual", expected),
                           rerounded=run("rerounded", far))
    assert found is not None and found.non_finite == 5
    assert not asked  # decided before any reference is run


def test_nan_where_the_original_has_nan_is_no_difference():
    expected = torch.tensor([[1.0, NAN, 3.0], [INF, 5.0, NAN]])
    assert compare_values(expected.clone(), expected, path="out") is None
    assert compare_trees((expected.clone(),), (expected,), fp64_expected=lambda: (expected.double(),)) is None
    moved = expected.clone()
    moved[0, 0] = 1.5  # the finite values are still compared
    found = compare_values(moved, expected, path="out")
    assert found is not None and found.reason == "values differ" and found.non_finite == 0 and found.index == (0, 0)


def test_a_finite_value_where_the_original_has_nan_is_a_difference_but_no_non_finite_one():
    found = compare_values(torch.tensor([1.0, 2.0]), torch.tensor([1.0, NAN]), path="out", tolerance=Tolerance(atol=1e9))
    assert found is not None and "NaN positions differ" in found.reason and found.non_finite == 0


def test_a_float64_reference_that_overflows_accepts_nothing():
    """Where the float64 reference is not finite (an overflow of float64 alone), the rule compares the other
    values; it once passed any result whose error and the original's were both NaN there."""
    reference = torch.linspace(1, 2, 64, dtype=torch.float64)
    original = reference.float()
    wrong = original * 1.01
    overflowed = reference.clone()
    overflowed[7] = INF
    found = compare_values(wrong, original, path="out", fp64=lambda: overflowed)
    assert found is not None and "rmse(result)=" in found.detail and "nan" not in found.detail


def _ill_conditioned() -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """A value whose float32 error one element dominates (a BatchNorm's running_var over two samples, after a
    train-mode model that amplifies rounding), as efficientvim_m1 gives it: the float64 reference, the original's
    float32 run (1.9e-7 from it: a lucky run) and its runs rounded otherwise (0.5e-6 to 6e-6)."""
    reference = torch.linspace(0.5, 1.8, 320, dtype=torch.float64)
    lucky = reference.clone()
    lucky[319] += 1.9e-7 * 320 ** 0.5
    runs = []
    for error in (1.2e-6, 4.8e-7, 1.9e-6, 2.5e-6, 5.2e-6, 2.3e-6):
        run = reference.clone()
        run[319] -= error * 320 ** 0.5
        runs.append(run.float())
    return reference, lucky.float(), runs


def test_the_originals_error_is_the_largest_of_its_runs_rounded_otherwise():
    reference, original, runs = _ill_conditioned()
    result = reference.clone()
    result[319] -= 2.4e-6 * 320 ** 0.5  # the softmax decomposition's running_var: 12x the original's error
    result = result.float()
    asked = []

    def rerounded(draw: int) -> torch.Tensor:
        asked.append(draw)
        return runs[draw]

    found = compare_values(result, original, path="running_var", fp64=lambda: reference)
    assert found is not None and "3 x rmse(original)=1.93e-07" in found.detail
    assert compare_values(result, original, path="running_var", fp64=lambda: reference, rerounded=rerounded) is None
    assert asked == [0]  # one run rounded otherwise was enough
    asked.clear()
    wrong = (reference * 1.001).float()  # a wrong result is wrong whatever the rounding
    found = compare_values(wrong, original, path="running_var", fp64=lambda: reference, rerounded=rerounded)
    assert found is not None and asked == list(range(REROUNDED_RUNS))
    assert f"5.2e-06 in {REROUNDED_RUNS} runs rounded otherwise" in found.detail
    asked.clear()
    assert compare_values(original, original, path="running_var", fp64=lambda: reference, rerounded=rerounded) is None
    assert not asked  # a passing comparison never runs the original again


def test_a_run_rounded_otherwise_that_overflows_measures_nothing():
    reference, original, runs = _ill_conditioned()
    overflowed = runs[4].clone()
    overflowed[3] = INF
    result = reference.clone()
    result[319] -= 2.4e-6 * 320 ** 0.5
    found = compare_values(result.float(), original, path="running_var", fp64=lambda: reference,
                           rerounded=lambda draw: overflowed)
    assert found is not None and "runs rounded otherwise" not in found.detail


def test_rounded_otherwise_moves_each_value_by_at_most_an_ulp_the_same_way_on_every_machine():
    x = torch.linspace(-4, 4, 4096)
    plain = torch.exp(x)
    with Rerounded(0):
        first = torch.exp(x)
    with Rerounded(0):
        again = torch.exp(x)
    with Rerounded(1):
        other = torch.exp(x)
    assert torch.equal(first, again) and not torch.equal(first, other)
    moved = first != plain
    assert 0.2 < float(moved.float().mean()) < 0.8  # a neighbour, or left where it was
    ulp = torch.nextafter(plain, torch.tensor(INF)) - plain
    assert bool(((first - plain).abs() <= ulp).all())
    with Rerounded(0):
        in_float64 = torch.exp(x.double())
    assert torch.equal(in_float64, torch.exp(x.double()))  # the reference is left alone


def test_rounded_otherwise_leaves_the_models_random_numbers_and_in_place_writes_alone():
    ones = torch.ones(1000)
    torch.manual_seed(3)
    plain = torch.nn.functional.dropout(ones, 0.5)
    torch.manual_seed(3)
    with Rerounded(0):
        moved = torch.nn.functional.dropout(ones, 0.5)
    assert torch.equal(plain == 0, moved == 0)  # the same mask
    with Rerounded(0):
        constants = torch.full((1000,), 1 / 3), torch.rand(1000, generator=torch.Generator().manual_seed(1))
    assert torch.equal(constants[0], torch.full((1000,), 1 / 3))  # factories round nothing
    assert torch.equal(constants[1], torch.rand(1000, generator=torch.Generator().manual_seed(1)))
    bn = nn.BatchNorm1d(4).train()
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), Rerounded(0):
        bn(x)
    assert int(bn.num_batches_tracked) == 1
    torch.testing.assert_close(bn.running_var, 0.9 + 0.1 * x.var(0), rtol=1e-6, atol=1e-6)


def test_numerics_never_calls_nan_in_float32_rounding():
    """A fused softmax that skips the max subtraction overflows in float32 at the large inputs; its fallback makes
    the float64 run agree. The finding counts the NaN, says where and why, and names the node that first has them."""
    result = fxverify.check_numerics(mutations.fused_softmax_without_max, "layer_root_attention")
    assert not result.ok and result.input.startswith("b2-5x8-large")
    assert "80 non-finite values (80 NaN) where the original's are finite, first at index (0, 0, 0)" in result.finding
    assert "appear in float32 only. That is no rounding error" in result.finding
    assert "float32 rounding of the kernels" not in result.finding and "atol=" not in result.finding
    assert result.node.startswith("%matmul_1 ") and "%_fast_softmax" in result.node
