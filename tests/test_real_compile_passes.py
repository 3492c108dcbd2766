"""benchmarks/real_compile_passes.py's plumbing (its passes load, each names captures that exist, its user models
come through the conftest it writes), and the false alarm it showed fixed: a model whose graph depends on the
process (torchao's calibrated scales, computed on another number of threads in the digest server) failed
determinism under every transform, the identity included."""

from __future__ import annotations

import importlib
import importlib.util

import pytest
import torch
from torch import fx, nn

import fxverify
from benchmarks import real_compile_passes as bench
from fxverify.cases.case import ModelCase, load_case
from fxverify.core.captures import capture_names

_SEEDED = float(hash("fxverify determinism") % 1000003)  # differs between processes of different PYTHONHASHSEED


class ProcessDependent(nn.Module):
    """A model whose graph holds a constant computed from a string hash: another graph in another process."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + _SEEDED


def test_each_pass_loads_and_names_captures_that_exist() -> None:
    names = [real.name for real in bench.PASSES]
    assert len(names) == len(set(names)) and len(names) >= 12
    assert {real.library for real in bench.PASSES} >= {"inductor", "torchao"}
    for real in bench.PASSES:
        assert real.kind in ("graph", "patterns", "backend"), real
        assert set(real.captures) <= set(capture_names()), real
        assert bool(real.captures) == (real.kind == "graph"), real
        if not real.available():
            continue
        module, _, name = real.spec.partition(":")
        if real.kind == "graph":
            assert fxverify.contract_of(getattr(importlib.import_module(module), name)) is not None
        else:
            assert importlib.util.find_spec(module) is not None


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")
@pytest.mark.parametrize("op", ["qscaled_dot_product", "da8w4_linear_cpu"])
def test_the_torchao_fusions_left_out_have_no_cpu_kernel_in_the_pinned_torchao(op: str) -> None:
    """Why the benchmark leaves out torchao's int8 SDPA fusion (it lowers to ``qscaled_dot_product``) and its DA8W4
    concat-linear fusion (it fuses ``da8w4_linear_cpu`` calls, and returns at once where that has no CPU kernel):
    the op runs on no CPU in the pinned torchao. A torchao that has the kernel fails this test: add the pass with
    torchao's own models (``ao_mha``; its test_da8w4_cpu.py model)."""
    import torchao

    if torchao.__version__.split("+")[0] != "0.18.0":
        pytest.skip(f"checked for the pinned torchao 0.18.0, this is {torchao.__version__}")
    assert "CPU" not in torch._C._dispatch_dump(f"torchao::{op}")


def test_unknown_pass_names_are_a_usage_error(capsys, monkeypatch) -> None:
    monkeypatch.setattr("sys.argv", ["real_compile_passes.py", "--only", "remove_noop_ops,no_such_pass"])
    with pytest.raises(SystemExit):
        bench.main()
    assert "no_such_pass" in capsys.readouterr().err


def test_the_scratch_conftest_adds_the_libraries_models_as_user_models() -> None:
    namespace: dict = {}
    exec(bench.CONFTEST, namespace)  # what the benchmark writes into its scratch directory
    entries = namespace["pytest_fxverify_models"](None)
    assert [e.name for e in entries] == [*bench.AO_MODELS, *bench.LOWERING_MODELS]
    assert all(e.source == "user" and {"torchao", "inductor"} & set(e.tags) for e in entries)
    assert all(name in bench.PASSES[0].args("smoke")[2] for name in [*bench.LOWERING_MODELS])


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")
def test_torchao_models_are_quantized_as_its_tests_quantize_them() -> None:
    graph = bench.ao_model("ao_qconv_add").graph
    targets = [node.target for node in graph.nodes]
    assert targets.count(torch.ops.aten.conv2d.default) == 4
    assert torch.ops.quantized_decomposed.quantize_per_tensor.default in targets


@pytest.mark.slow  # starts the digest server, a process importing torch
def test_a_model_that_differs_in_another_process_is_not_the_transforms_nondeterminism() -> None:
    case = ModelCase(fxverify.CorpusEntry(name="process_dependent", source="user",
                                          factory="tests.test_real_compile_passes:ProcessDependent",
                                          inputs=(fxverify.InputSpec((2, 3)),)))
    [result] = fxverify.verify(fxverify.examples.identity, case, checks=["determinism"])
    assert result.ok, result.message
    assert result.details["cross_process"].startswith("not compared: the model is another graph in the other process")


def exported_linear() -> nn.Module:
    """A model built through ``torch.export`` (as torchao's PT2E flow builds its quantized models): dynamo makes
    a graph while the factory runs, before any backend compiles it."""
    exported = torch.export.export(nn.Linear(3, 3), (torch.randn(2, 3),), strict=True).module()
    return fx.GraphModule(exported, exported.graph)  # export's module refuses .train()


def test_graphs_dynamo_made_while_building_the_model_are_no_graph_break() -> None:
    case = ModelCase(fxverify.CorpusEntry(name="exported_linear", source="user",
                                          factory="tests.test_real_compile_passes:exported_linear",
                                          inputs=(fxverify.InputSpec((2, 3)),)))
    [result] = fxverify.check_backend("torch._dynamo.backends.debugging:aot_eager", case,
                                      aspects=["backend-graph-breaks"])
    assert result.outcome.value == "skipped" and "in one graph" in result.message, result.message


@pytest.mark.slow
def test_a_post_grad_pass_sees_the_fake_mode_torch_compile_sets() -> None:
    """Inductor's reinplace_inplaceable_ops reads V.fake_mode, which compile_fx sets around post_grad_passes: under
    the inductor capture it failed edge_inplace_ops, edge_slice_assignment and edge_buffer_written_through_view
    ('NullHandler' object does not support the context manager protocol) where torch.compile runs it."""
    from torch._inductor import config
    from torch._inductor.virtualized import V
    from torch._subclasses.fake_tensor import FakeTensorMode

    seen: list[object] = []

    def record(graph: fx.Graph) -> None:
        seen.append(V.fake_mode)

    from torch._functorch import config as functorch_config

    torch._dynamo.reset()
    with config.patch(post_grad_custom_pre_pass=record, fx_graph_cache=False), \
            functorch_config.patch(enable_autograd_cache=False):  # compiled afresh, so the hook runs
        torch.compile(lambda x: x.add_(1) * 2)(torch.randn(3))
    assert seen and isinstance(seen[0], FakeTensorMode)  # what torch.compile hands the hook

    spec = next(real.spec for real in bench.PASSES if real.name == "reinplace")
    verification = fxverify.Verification(spec, "edge_inplace_ops", capture=load_case("edge_inplace_ops").capture_named(
        "inductor"))
    result = verification.run("numerics")
    assert result.ok, result.message


@pytest.mark.slow  # Inductor's lazy_init traces its replacement patterns
@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")
def test_each_freezing_pass_holds_the_patterns_its_library_registered_in_the_loops_order() -> None:
    from torch._inductor.fx_passes import freezing_patterns
    from torch._inductor.pattern_matcher import ReplacementPatternEntry

    def entries(passes: tuple) -> list:
        return [entry for patterns in passes for found in patterns.patterns.values() for entry in found]

    torchao_passes = bench.freezing_pattern_passes("torchao")  # registers torchao's, up to pass_patterns[5]
    torch_passes = bench.freezing_pattern_passes("torch")
    assert len(torch_passes) == len(torchao_passes) == len(freezing_patterns.pass_patterns)
    assert {bench._registrant(entry) for entry in entries(torch_passes)} == {"torch"}
    assert {bench._registrant(entry) for entry in entries(torchao_passes)} == {"torchao"}
    registered = entries(tuple(freezing_patterns.pass_patterns))
    assert len(entries(torch_passes)) + len(entries(torchao_passes)) == len(registered)
    concat = entries(bench.freezing_pattern_passes("torch", replacements=True)[:1])
    assert len(concat) == 4 and all(isinstance(entry, ReplacementPatternEntry) for entry in concat)
