"""The layer-variant corpus (``corpus/layer_variants.py``, ``corpus/layers.toml``): every entry
traces to what it computes in both modes, and each is the configuration its entry says, so a
pass that mishandles that configuration is caught there and nowhere else."""

from __future__ import annotations

import inspect

import pytest
import torch
from fxverify.corpus import layer_variants
from torch import nn

import fxverify
from fxverify.cases import catalogue
from tests import mutations

LAYERS = catalogue.select("layers")


def test_layers_profile_is_well_formed_and_part_of_default():
    assert len(LAYERS) >= 30
    default = {e.name for e in catalogue.select("default")}
    for entry in LAYERS:
        assert entry.name.startswith("layer_") and "layer-variant" in entry.tags and entry.name in default
        assert isinstance(entry.factory, str) and entry.factory.startswith("fxverify.corpus.layer_variants:")
    classes = {name for name, obj in vars(layer_variants).items()
               if inspect.isclass(obj) and issubclass(obj, nn.Module) and obj.__module__ == layer_variants.__name__}
    assert classes == {e.factory.partition(":")[2] for e in LAYERS}
    for name in classes:
        assert len((getattr(layer_variants, name).__doc__ or "").split()) >= 10, f"{name} needs a docstring"


@pytest.mark.parametrize("name", [e.name for e in LAYERS])
def test_traced_equals_eager_in_both_modes_on_every_config(name):
    case = fxverify.load_case(name)
    for training in (False, True):
        for config in case.configs:
            module, gm = case.build(training=training), case.captured(training=training)
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                torch.manual_seed(1)
                eager = module(*config.make(case.seed))
                torch.manual_seed(1)
                traced = gm(*config.make(case.seed))
            torch.testing.assert_close(traced, eager)


def _modules(name: str, kind: type) -> list[nn.Module]:
    return [m for m in fxverify.load_case(name).build().modules() if isinstance(m, kind)]


def test_each_variant_is_the_configuration_it_says():
    bn = nn.modules.batchnorm._BatchNorm
    assert _modules("layer_conv_bn_no_bias", nn.Conv2d)[0].bias is None
    assert not _modules("layer_conv_bn_no_affine", bn)[0].affine
    assert not _modules("layer_conv_bn_batch_stats", bn)[0].track_running_stats
    assert _modules("layer_conv_bn_eps", bn)[0].eps == 1e-3
    assert _modules("layer_conv_bn_depthwise", nn.Conv2d)[0].groups == 4
    assert _modules("layer_conv_bn_same", nn.Conv2d)[0].padding == "same"
    assert _modules("layer_conv_bn_circular", nn.Conv2d)[0].padding_mode == "circular"
    assert isinstance(_modules("layer_conv_transpose_bn", nn.ConvTranspose2d)[0], nn.ConvTranspose2d)
    assert _modules("layer_conv_transpose_bn_grouped", nn.ConvTranspose2d)[0].groups == 2
    tied = fxverify.load_case("layer_tied_projection").build()
    assert tied.out.weight is tied.embed.weight
    relu = fxverify.load_case("layer_shared_activation").captured()
    assert [n.target for n in relu.graph.find_nodes(op="call_module")].count("relu") == 2


def test_a_fold_that_mishandles_affine_free_batchnorm_is_caught_only_by_the_layer_variants():
    fold = mutations.bn_fold_drops_affine_free_bn
    assert fxverify.check_numerics(fold, "edge_conv_bn_head").ok  # every BN of the edge cases is affine
    result = fxverify.check_numerics(fold, "layer_conv_bn_no_affine")
    assert result.outcome == "failed" and "outputs differ" in result.message
    assert "the original's nodes the transform removed before it: %bn" in result.message
