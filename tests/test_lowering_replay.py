"""Inductor's lowering-pattern nodes (fxverify/capture/lowerings.py): a rewrite by Inductor's own post-grad
``pass_patterns`` that leaves a lowering handler in the graph is judged on the ATen ops the handler computes
(``splitwithsizes_cat_replace`` returns its input), or skipped saying why where the handler builds Inductor IR
(``cat_slice_cat``); before, every check failed both (17 false failures on these two models)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import fxverify
from fxverify.capture.lowerings import lowering_nodes, replay
from fxverify.cases.case import ModelCase
from fxverify.core.results import Skip

POST_GRAD_PATTERNS = "tests.inductor_passes:inductor_post_grad_patterns"


class SplitCat(nn.Module):
    """cat(split_with_sizes(x)) back together: post_grad.splitwithsizes_cat_replace, a lowering returning its input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat(torch.split(x, [2, 6], dim=1), dim=1) * 2


class CatSliceCat(nn.Module):
    """cat([x, y]) then cat([that, that[:, :4]]): post_grad.cat_slice_cat, whose handler reads V.graph."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        c = torch.cat([x, y], 1)
        return torch.cat([c, c[:, :4]], 1) * 2


def _lowered(module: nn.Module, *inputs: torch.Tensor) -> torch.fx.GraphModule:
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.fx_passes import post_grad
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(module, select_decomp_table(), tracing_mode="fake")(*inputs)
    post_grad.lazy_init()
    for patterns in post_grad.pass_patterns:
        patterns.apply(gm.graph)
    gm.recompile()
    return gm


def test_a_lowering_returning_its_input_is_replaced_by_that_input() -> None:
    x = torch.randn(2, 8)
    gm = _lowered(SplitCat(), x)
    assert [node.name for node in lowering_nodes(gm.graph)] == ["splitwithsizes_cat_replace"]
    replay(gm)
    assert lowering_nodes(gm.graph) == []
    assert [node.target for node in gm.graph.nodes if node.op == "call_function"] == [torch.ops.aten.mul.Tensor]
    torch.testing.assert_close(gm(x), SplitCat()(x))


def test_a_lowering_building_inductor_ir_is_a_skip_naming_it() -> None:
    gm = _lowered(CatSliceCat(), torch.randn(2, 8), torch.randn(2, 8))
    with pytest.raises(Skip, match=r"post_grad\.cat_slice_cat .*does not trace into ATen ops"):
        replay(gm)


def _case(name: str, factory: str, *shapes: tuple[int, ...]) -> ModelCase:
    return ModelCase(fxverify.CorpusEntry(name=name, source="user", factory=f"tests.test_lowering_replay:{factory}",
                                          inputs=tuple(fxverify.InputSpec(shape) for shape in shapes)))


@pytest.mark.slow
def test_inductors_post_grad_patterns_pass_where_they_lower_and_skip_where_no_check_can_judge() -> None:
    case = _case("split_cat", "SplitCat", (2, 8))
    results = fxverify.Verification(POST_GRAD_PATTERNS, case, capture=case.capture_named("inductor")).run_all()
    assert not [r for r in results if r.outcome.value in ("failed", "error")], [r.message for r in results if not r.ok]
    assert {r.check for r in results if r.outcome.value == "passed"} >= {"numerics", "lint", "opset"}

    case = _case("cat_slice_cat", "CatSliceCat", (2, 8), (2, 8))
    results = fxverify.Verification(POST_GRAD_PATTERNS, case, capture=case.capture_named("inductor")).run_all()
    assert {r.outcome.value for r in results} == {"skipped"}
    assert "cat_slice_cat" in next(r.message for r in results if r.check == "numerics")


@pytest.mark.slow
def test_the_plugin_reports_a_lowering_no_check_can_judge_as_skips(pytester, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parent.parent))  # tests.* for the factory
    pytester.makeconftest("""
        import fxverify

        def pytest_fxverify_models(config):
            return [fxverify.CorpusEntry(name="cat_slice_cat", source="user",
                                         factory="tests.test_lowering_replay:CatSliceCat",
                                         inputs=(fxverify.InputSpec((2, 8)), fxverify.InputSpec((2, 8))))]
    """)
    run = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--fxverify", POST_GRAD_PATTERNS,
                                        "--fxverify-corpus=cat_slice_cat", "--fxverify-capture=inductor")
    outcomes = run.parseoutcomes()
    assert outcomes.get("skipped", 0) > 0 and not {"failed", "error", "errors", "passed"} & set(outcomes), outcomes
