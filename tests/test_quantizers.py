"""A PT2E quantizer under test as the transform (form ``quantizer``, under the ``pt2e`` capture): fxverify quantizes
the float exported model with it as its users do (prepare, calibrate, convert), and each buggy quantizer of
:mod:`tests.quantizers` fails first through the check meant for its class, its correct twin through none. Needs
torchao (the ``compile`` extra)."""

from __future__ import annotations

import pytest

import fxverify
from fxverify.core.contracts import QUANTIZING
from fxverify.core.results import FAILED
from fxverify.core.transform import Transform
from fxverify.errors import TransformLoadError

pytest.importorskip("torchao", reason="a quantizer under test is run through torchao's prepare_pt2e / convert_pt2e")

from tests import quantizers  # imports torchao: after the importorskip


def verification(transform, model: str) -> fxverify.Verification:
    case = fxverify.load_case(model)
    return fxverify.Verification(transform, case, capture=case.capture_named("pt2e"))


TWINS = [  # buggy quantizer, its correct twin, the model, the check that must fail first, words of its finding
    (quantizers.ConvLinearQuantizerInputChannels, quantizers.ConvLinearQuantizer, "layer_conv_bn", "qdq",
     "axis 1 where %conv2d (conv2d.default) has its output channels on dimension 0 of its weight"),
    (quantizers.ConvLinearQuantizerInputChannels, quantizers.ConvLinearQuantizer, "edge_linear_bn", "qdq",
     "has its output channels on dimension 0 of its weight"),
    (quantizers.DeadCodeQuantizer, quantizers.ConvLinearQuantizer, "edge_final_buffer_copy", "stateful",
     "unchanged in the result since it was made"),
    (quantizers.LayerNormDecomposingQuantizerUnbiased, quantizers.LayerNormDecomposingQuantizer,
     "layer_linear_layernorm", "numerics", "the quantizer's float graph (prepare_pt2e with it, before calibration) "
                                           "computes other numbers than the float model it was given"),
    (quantizers.TanhQuantizerSigmoidRange, quantizers.TanhQuantizer, "edge_tied_weights", "numerics",
     "(FixedQParamsObserver activation_post_process_3) on %tanh: 75% of the 32 values it quantizes lie outside "
     "[0, 0.996] (scale 0.00390625, zero point -128, range [-128, 127])"),
]


@pytest.mark.parametrize(("buggy", "twin", "model", "check", "words"), TWINS,
                         ids=[f"{t[0].__name__}-{t[2]}" for t in TWINS])
def test_a_buggy_quantizer_fails_first_through_its_check_and_its_twin_through_none(buggy, twin, model, check, words):
    failed = [r for r in verification(buggy, model).run_all() if not r.ok]
    assert failed and failed[0].check == check and failed[0].outcome is FAILED, [(r.check, r.finding) for r in failed]
    assert words in failed[0].finding
    results = verification(twin, model).run_all()
    assert [r.message for r in results if not r.ok] == []
    assert next(r for r in results if r.check == "qdq").details["qdq_nodes"] > 0  # it did quantize


def test_a_quantizers_finding_gives_advice_in_its_terms():
    finding = verification(quantizers.ConvLinearQuantizerInputChannels, "layer_conv_bn").run("qdq").finding
    assert finding.startswith("the quantizer made 1 problem(s)")
    assert "give a weight's per-channel QuantizationSpec (and its observer) ch_axis" in finding


def test_numerics_holds_the_float_graph_and_the_parameters_to_the_float_model_not_the_outputs():
    result = verification(quantizers.ConvLinearQuantizer, "layer_conv_bn").run("numerics")
    assert result.ok and result.details["values"].startswith("not compared")
    assert result.details["float_graph"]["float64"] == "compared"
    assert result.details["observers_judged"] == 3  # the conv's input, weight (per channel) and output


def test_prepare_pt2es_own_fold_is_not_blamed_on_the_quantizer():
    # prepare_pt2e folds the BatchNorm into a conv a skip connection also reads (docs/bugs-found.md row 43): the
    # float graph differs with any quantizer, so what this one changes is not judged there
    result = verification(quantizers.ConvLinearQuantizer, "layer_conv_two_readers").run("numerics")
    assert result.ok and result.details["float_graph"].startswith("not judged: prepare_pt2e changes this model's")


def test_clipping_applies_per_channel_parameters_along_their_axis():
    import torch
    from torch import fx, nn
    from torchao.quantization.pt2e import PerChannelMinMaxObserver

    from fxverify.analysis.clipping import clipping

    root, graph = nn.Module(), fx.Graph()
    root.obs = PerChannelMinMaxObserver(ch_axis=1, dtype=torch.int8, qscheme=torch.per_channel_symmetric)
    graph.output(graph.call_module("obs", (graph.placeholder("w"),)))
    prepared = fx.GraphModule(root, graph)
    weight = torch.randn(3, 4) * torch.tensor([1.0, 10.0, 100.0, 1000.0])  # each column its own range
    [fitted] = clipping(prepared, (weight,))  # one scale for all columns would clip the 1000s or zero the 1s
    assert (fitted.fraction, fitted.parameters) == (0.0, "4 scales along dimension 1, range [-128, 127]")
    assert fitted.covered[1] == pytest.approx(weight.abs().max().item(), rel=0.01)


def test_what_prepare_pt2e_does_to_the_model_it_consumes_is_not_the_quantizers():
    result = verification(quantizers.RebuildingQuantizer, "layer_conv_bn").run("purity")  # the fold edits its input
    assert result.ok, result.finding


def test_a_quantizer_class_is_made_with_no_arguments_and_judged_eval_only_in_float32():
    loaded = Transform.load("tests.quantizers:ConvLinearQuantizer")
    assert (loaded.form, loaded.contract, type(loaded.fn)) == ("quantizer", QUANTIZING, quantizers.ConvLinearQuantizer)
    assert loaded.reloadable
    with pytest.raises(TransformLoadError, match="name an instance instead"):
        Transform.load("tests.quantizers:NeedsBackend")


def test_a_quantizer_runs_under_the_pt2e_capture_only():
    reason = Transform.from_callable(quantizers.ConvLinearQuantizer()).skips_capture("export")
    assert reason is not None and "--fxverify-capture pt2e" in reason
    case = fxverify.load_case("layer_conv_bn")
    skipped = fxverify.Verification(quantizers.ConvLinearQuantizer, case, capture=case.capture_named("export")).run("lint")
    assert skipped.outcome.name == "SKIPPED" and "PT2E Quantizer" in skipped.message


def test_a_factory_given_as_the_transform_is_told_to_name_the_quantizer():
    with pytest.raises(TransformLoadError, match=r"name the Quantizer itself \(its class or an instance\)"):
        Transform.load("tests.quantizers:conv_linear_quantizer")


def test_the_public_check_functions_take_the_capture_by_name():
    failed = fxverify.check_qdq(quantizers.ConvLinearQuantizerInputChannels, "layer_conv_bn", capture="pt2e")
    assert failed.outcome is FAILED and "axis 1 where %conv2d" in failed.finding
    with pytest.raises(fxverify.CheckFailed, match="the quantizer made 1 problem"):
        fxverify.assert_qdq(quantizers.ConvLinearQuantizerInputChannels, "layer_conv_bn", capture="pt2e")
    assert fxverify.check_qdq(quantizers.ConvLinearQuantizer, "layer_conv_bn", capture="pt2e").ok
