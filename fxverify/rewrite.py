"""Property-based fuzzing of rewrite rules: ``check_rewrite(pattern, replacement)``
embeds the pattern in random graphs (:func:`fxverify.strategies.graphs_with_pattern`),
applies ``torch.fx.replace_pattern`` (or your own ``rewrite``), and runs the lint,
numerics and determinism checks on each, plus a comparison on drawn inputs with
special values (NaN, +-inf, -0.0, subnormals, huge) and non-contiguous layouts.
A failure is shrunk by Hypothesis and raised as :class:`RewriteFailed`, whose
message carries the check's finding and whose ``case`` prints as runnable Python.

>>> import torch
>>> check_rewrite(lambda x: x + x, lambda x: x * 2, max_examples=3)
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import fx

from fxverify.analysis.compare import Tolerance, compare_trees
from fxverify.checks import REGISTRY
from fxverify.core.contracts import contract
from fxverify.core.results import ERROR, FAILED
from fxverify.core.transform import Transform, as_transform
from fxverify.errors import FxVerifyError, RewriteFailed, TransformFailed
from fxverify.runner import Runner
from fxverify.strategies.patterns import PatternCase, graphs_with_pattern
from fxverify.strategies.tensors import inputs_for

CORE_CHECKS = tuple(spec.name for spec in REGISTRY if spec.on_rewrite_rules)  # lint, determinism, numerics


def replacing(pattern: Callable[..., Any], replacement: Callable[..., Any]) -> Callable[[fx.GraphModule], fx.GraphModule]:
    """The transform ``torch.fx.replace_pattern(gm, pattern, replacement)``, eval-mode contract.

    >>> gm = torch.fx.symbolic_trace(lambda x: (x + x).relu())
    >>> print(replacing(lambda x: x + x, lambda x: x * 2)(gm).code.strip().splitlines()[1].strip())
    mul = x * 2;  x = None
    """

    @contract(modes=("eval",))
    def rewrite(gm: fx.GraphModule) -> fx.GraphModule:
        fx.replace_pattern(gm, pattern, replacement)
        gm.recompile()
        return gm

    rewrite.__name__ = rewrite.__qualname__ = f"replace_pattern[{getattr(pattern, '__name__', 'pattern')}]"
    return rewrite


def check_rewrite(
    pattern: Callable[..., Any],
    replacement: Callable[..., Any] | None = None,
    *,
    rewrite: Callable[[fx.GraphModule], Any] | None = None,
    max_examples: int = 50,
    checks: Sequence[str] = CORE_CHECKS,
    special_values: bool = True,
    non_contiguous: bool = True,
    database: Any = None,
    derandomize: bool = False,
    **strategy_options: Any,
) -> None:
    """Fuzz a rewrite rule over random graphs embedding ``pattern``; raise :class:`RewriteFailed`
    with the shrunk counter-example when a check fails.

    Give ``replacement`` (applied with ``torch.fx.replace_pattern``) or ``rewrite``, a
    transform of your own (``gm -> GraphModule``) meant to rewrite the pattern; outputs
    are compared within its contract tolerance (``@fxverify.contract(rtol=, atol=)``), and
    a rewrite that raises is a :class:`RewriteFailed` too.
    ``strategy_options`` go to :func:`~fxverify.strategies.graphs_with_pattern`
    (``dtypes``, ``ranks``, ``broadcast``, ``max_nodes``, ...); ``database``: a
    Hypothesis example database so a failure replays first next time; ``derandomize``:
    the same examples on every run (for CI)::

        def pattern(x, y):
            return (x + y).sum(-1)

        def replacement(x, y):                # wrong when y broadcasts along the last dim
            return x.sum(-1) + y.sum(-1)

        fxverify.check_rewrite(pattern, replacement)   # raises RewriteFailed, shrunk
    """
    __tracebackhide__ = True
    if (replacement is None) == (rewrite is None):
        raise TypeError("check_rewrite needs exactly one of replacement= (for replace_pattern) or rewrite=")
    transform = as_transform(rewrite or replacing(pattern, replacement))  # type: ignore[arg-type]
    strategy = graphs_with_pattern(pattern, **strategy_options)

    @settings(max_examples=max_examples, deadline=None, database=database, report_multiple_bugs=False,
              derandomize=derandomize,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=strategy, data=st.data())
    def fuzz(case: PatternCase, data: st.DataObject) -> None:
        # the cheap comparison first: most wrong rules fail it, and shrinking then stays fast
        inputs = data.draw(inputs_for(case, special_values=special_values, non_contiguous=non_contiguous),
                           label="inputs")
        compare_on(transform, case, inputs)
        run_case(transform, case, checks)

    fuzz()


def run_case(transform: Transform, case: PatternCase, checks: Sequence[str]) -> None:
    """Run ``checks`` of ``transform`` on ``case``; raise :class:`RewriteFailed` on a failure (and
    :class:`FxVerifyError` when fxverify itself could not complete a check: no verdict on the rule)."""
    verification = Runner(transform, case, timeout=None)
    results = [verification.run(c) for c in checks]
    errors = [r for r in results if r.outcome == ERROR]
    if errors:
        raise FxVerifyError(errors[0].message)
    failed = [r for r in results if r.outcome == FAILED]
    if failed:
        raise RewriteFailed("\n\n".join(r.message for r in failed), case)


def compare_on(transform: Transform, case: PatternCase, drawn: Sequence[torch.Tensor]) -> None:
    """Compare the rewritten module with the original on the drawn inputs and on the inputs
    the numerics check uses (a cheap screen run before the checks, so shrinking stays fast),
    within the transform's contract tolerance; :class:`RewriteFailed` if they differ or
    the rewrite raises."""
    try:
        result, _ = case.capture.apply(transform, copy.deepcopy(case.module), timeout=None)
    except TransformFailed as failed:
        raise RewriteFailed(str(failed), case) from None
    tolerance = Tolerance(transform.contract.rtol, transform.contract.atol, transform.contract.range_tol)
    runs = [("the drawn inputs", drawn)] + [(c.describe(), c.make(case.seed)) for c in case.configs]
    for where, inputs in runs:
        def float64_reference(inputs: Sequence[torch.Tensor] = inputs) -> Any:
            wide = [t.double() if t.is_floating_point() else t for t in inputs]
            with torch.no_grad():
                return copy.deepcopy(case.module).double()(*wide)

        with torch.no_grad():
            expected = case.module(*inputs)
            actual = result(*inputs)
        # judged like the numerics check: a float32 difference within the original's own rounding passes
        found = compare_trees(actual, expected, tolerance=tolerance, fp64_expected=float64_reference)
        if found is not None:
            raise RewriteFailed(f"the rewritten graph differs from the original on {where}: {found.describe()}", case)
