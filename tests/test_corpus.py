"""The corpus: the default zoo's contents, selection, sharding, expected
failures that stay honest, and users' own models (Python API and pytest hook)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from fnmatch import fnmatch
from pathlib import Path

import pytest
import torch
from torch import nn

import fxverify
from fxverify.cases import catalogue
from fxverify.core.results import FAILED, XFAILED
from fxverify.errors import CorpusError

MUTATIONS = Path(__file__).with_name("mutations.py")
IDENTITY = f"{MUTATIONS}:transformer_identity"


def names(entries):
    return [e.name for e in entries]


def test_default_zoo_is_the_surveyed_58_models_plus_edge_cases():
    default = catalogue.select("default")
    zoo = Counter(e.source for e in default)
    assert zoo["torchvision"] == 26 and zoo["timm"] == 32
    assert sum(e.tracer == "timm" for e in default) == 8
    assert catalogue.find("hiera_tiny_224").concrete_args == {"mask": None}
    assert {e.name for e in catalogue.select("edge")} <= {e.name for e in default}
    assert len(catalogue.select("smoke")) <= 8
    assert all(e.source in ("torchvision", "timm") for e in catalogue.select("full") if e.source != "edge")
    assert set(names(default)) - set(names(catalogue.select("edge"))) <= set(names(catalogue.select("full")))


def test_selection_by_profile_glob_exclude_and_tags():
    assert names(catalogue.select("resnet18,test_resne*")) == ["resnet18", "test_resnet"]
    default = names(catalogue.select("default"))
    no_tests = names(catalogue.select("default", exclude="test_*,edge"))
    assert no_tests and not any(n.startswith(("test_", "edge_")) for n in no_tests)
    assert set(default) - set(no_tests) == {n for n in default if n.startswith(("test_", "edge_"))}
    attention = catalogue.select("default", tags="attention,dict-output")
    assert {"swin_t", "lraspp_mobilenet_v3_large"} <= set(names(attention))
    assert all({"attention", "dict-output"} & set(e.tags) for e in attention)
    assert "resnet18" not in names(attention)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"selection": "resnet81"}, "*matches no profile, model name or glob*resnet18*"),
        ({"selection": "default", "exclude": "mobilenet_v9"}, "*corpus exclusion 'mobilenet_v9'*"),
        ({"selection": "default", "tags": "atention"}, "*no corpus entry has the tag 'atention'*attention*"),
        ({"selection": " , "}, "*empty corpus selection*"),
    ],
)
def test_bad_selections_name_the_problem_and_close_matches(kwargs, message):
    with pytest.raises(CorpusError) as info:
        catalogue.select(kwargs.pop("selection"), **kwargs)
    assert fnmatch(str(info.value), message), str(info.value)


def test_a_model_dtype_casts_parameters_buffers_and_floating_inputs_and_the_reference_stays_float64():
    """A bfloat16 entry holds its float32 twin's values rounded to bfloat16, and its float64 reference the
    bfloat16 values exactly: the reference of a bfloat16 model is that model, not its float32 twin."""
    twin, case = fxverify.load_case("edge_tiny_decoder_block"), fxverify.load_case("edge_tiny_decoder_block_bf16")
    module, reference = case.build(), case.captured(dtype=torch.float64)
    assert {t.dtype for t in [*module.parameters(), *module.buffers()]} == {torch.bfloat16}  # inv_freq too
    for name, value in twin.build().state_dict().items():
        assert torch.equal(module.state_dict()[name], value.to(torch.bfloat16)), name
        assert torch.equal(reference.state_dict()[name], value.to(torch.bfloat16).double()), name
    for config in case.configs:
        (x,) = config.make(case.seed)
        assert x.dtype == torch.bfloat16 and "bfloat16" in config.describe()
        assert torch.equal(config.make(case.seed, dtype=torch.float64)[0], x.double())
    assert module(*case.example_inputs()).dtype == torch.bfloat16
    (tokens,) = fxverify.load_case("edge_tied_embedding_head_bf16").example_inputs()
    assert tokens.dtype == torch.int64  # integer inputs keep their dtype
    assert names(catalogue.select("edge", tags="bf16")) == ["edge_tiny_decoder_block_bf16",
                                                             "edge_tied_embedding_head_bf16"]


def test_an_unknown_model_dtype_is_a_corpus_error_naming_the_entry_and_the_accepted_dtypes():
    data = {"name": "my_half_net", "source": "user", "factory": "torch.nn:Identity", "inputs": [{"shape": [2, 3]}],
            "dtype": "float16"}
    with pytest.raises(CorpusError, match=r"corpus entry 'my_half_net': dtype .* must be one of \('float32', "
                                          r"'bfloat16'\), got dtype='float16'"):
        catalogue.CorpusEntry.from_data(data)


@pytest.mark.parametrize("profile", ["default", "full"])
def test_shards_partition_the_selection_exactly(profile):
    entries = catalogue.select(profile)
    shards = [names(catalogue.choose(profile, shard_spec=f"{i}/4")) for i in range(1, 5)]
    flat = [n for s in shards for n in s]
    assert sorted(flat) == sorted(names(entries))  # every entry once: no gap, no overlap
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    assert shards[1] == names(catalogue.choose(profile, shard_spec="2/4"))  # stable


@pytest.mark.parametrize("text", ["0/4", "5/4", "1-4", "a/b", "3"])
def test_bad_shard_specs_are_rejected(text):
    with pytest.raises(CorpusError, match="shard must be I/N"):
        catalogue.parse_shard(text)


class DataDependent(nn.Module):
    def forward(self, x):
        return x if x.sum() > 0 else -x


def test_expected_failure_that_still_fails_is_xfailed_with_the_error():
    case = fxverify.case_from_module("dd", DataDependent, [(2, 3)], xfail="data-dependent control flow")
    result = fxverify.check_lint(fxverify.examples.identity, case)
    assert result.outcome == XFAILED and result.ok
    assert "data-dependent control flow" in result.message and "TraceError" in result.message


def test_expected_failure_that_now_works_is_reported_as_a_failure():
    case = fxverify.case_from_module("fine", lambda: nn.Linear(3, 3), [(2, 3)], xfail="used to fail")
    result = fxverify.check_lint(fxverify.examples.identity, case)
    assert result.outcome == FAILED
    assert "now captures and runs with torch" in result.message and "remove `xfail`" in result.message


def test_register_model_adds_a_user_entry_to_selections(monkeypatch):
    monkeypatch.setattr(catalogue, "_registered", {})
    entry = fxverify.CorpusEntry(name="my_mlp", source="user", factory="torch.nn:Linear",
                                 kwargs={"in_features": 4, "out_features": 2},
                                 inputs=(fxverify.InputSpec((2, 4)),), tags=("production",))
    fxverify.register_model(entry)
    assert names(catalogue.select("default", tags="production")) == ["my_mlp"]
    assert fxverify.load_case("my_mlp").captured()(torch.ones(2, 4)).shape == (2, 2)
    with pytest.raises(CorpusError, match="already exists"):
        fxverify.register_model(fxverify.CorpusEntry(name="resnet18", source="user", factory="torch.nn:Identity",
                                                     inputs=(fxverify.InputSpec((1, 1)),)))


USER_MODELS = """
    import fxverify

    def pytest_fxverify_models(config):
        spec = fxverify.InputSpec((2, 4))
        return [
            fxverify.CorpusEntry(name="prod_mlp", source="user", factory="prod_models:Mlp", inputs=(spec,),
                                 tags=("production",)),
            fxverify.CorpusEntry(name="prod_branchy", source="user", factory="prod_models:Branchy",
                                 inputs=(spec,), xfail="data-dependent branch"),
            fxverify.CorpusEntry(name="prod_fixed", source="user", factory="prod_models:Mlp", inputs=(spec,),
                                 xfail="stale: used to fail"),
        ]
"""
PROD_MODELS = """
    import torch
    from torch import nn

    class Mlp(nn.Sequential):
        def __init__(self):
            super().__init__(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))

    class Branchy(nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x
"""


@pytest.mark.slow
def test_user_models_from_the_conftest_hook_are_verified(pytester, monkeypatch):
    pytester.makeconftest(USER_MODELS)
    pytester.makepyfile(prod_models=PROD_MODELS)
    monkeypatch.setenv("PYTHONPATH", str(pytester.path))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--fxverify", IDENTITY,
                                           "--fxverify-corpus=prod_*", "--fxverify-checks=lint,determinism,numerics")
    result.stdout.fnmatch_lines([
        "*corpus entry 'prod_fixed' is listed as an expected failure under symbolic_trace (stale: used to fail), "
        "but it now captures*",
        "prod_mlp * pass * pass * pass *",
        "prod_branchy * xfail * xfail * xfail *",
        "prod_fixed * FAIL * FAIL * FAIL *",
    ])
    result.assert_outcomes(passed=3, xfailed=3, failed=3)


def test_exclude_tags_and_shard_options_select_items(pytester):
    def collected(*args: str) -> set[str]:
        result = pytester.runpytest("-p", "no:cacheprovider", "--collect-only", "-q", "--fxverify", IDENTITY,
                                    "--fxverify-checks=lint", *args)
        assert result.ret == 0, result.stdout.str()
        return {line.split("fxverify[")[1].split("-lint")[0] for line in result.stdout.lines if "fxverify[" in line}

    smoke = collected("--fxverify-corpus=smoke")
    assert smoke == set(names(catalogue.select("smoke")))
    assert collected("--fxverify-corpus=smoke", "--fxverify-exclude=test_*") == {n for n in smoke if not n.startswith("test_")}
    assert collected("--fxverify-corpus=smoke", "--fxverify-tags=dict-output") == {
        e.name for e in catalogue.select("smoke") if "dict-output" in e.tags
    } >= {"lraspp_mobilenet_v3_large"}
    assert collected("--fxverify-corpus=smoke", "-k", "attention and layernorm") == {"test_vit"}
    halves = [collected("--fxverify-corpus=smoke", f"--fxverify-shard={i}/2") for i in (1, 2)]
    assert halves[0] | halves[1] == smoke and not halves[0] & halves[1]
    pytester.makeini("[pytest]\nfxverify_corpus = smoke\nfxverify_exclude = edge_*\nfxverify_shard = 1/1\n")
    assert collected() == {n for n in smoke if not n.startswith("edge_")}
    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", IDENTITY, "--fxverify-shard=3/2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bad corpus selection (--fxverify-corpus 'smoke'*--fxverify-shard '3/2')*"
                                 "shard must be I/N with 1 <= I <= N*"])


class OptionalMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

    def forward(self, x, mask=None):
        y = self.bn(self.conv(x))
        return y if mask is None else y * mask


def test_a_none_concrete_arg_retraced_by_the_transform_does_not_break_later_traces():
    # torch's fuse retraces the GraphModule; its `_assert_is_none` wrap would then
    # make every later trace in the process raise KeyError (torch 2.14)
    case = fxverify.case_from_module("optional_mask", OptionalMask, [(2, 3, 8, 8)], concrete_args={"mask": None})
    assert fxverify.check_numerics(fxverify.examples.fuse_conv_bn, case).outcome == "passed"
    assert fxverify.load_case("edge_conv_bn_head").captured()(torch.ones(1, 3, 8, 8)).shape == (1, 10)


def test_a_concrete_arg_other_than_the_default_is_a_clear_corpus_error():
    case = fxverify.case_from_module("bad_ca", OptionalMask, [(2, 3, 8, 8)], concrete_args={"mask": 1.0})
    with pytest.raises(CorpusError, match="concrete_args sets mask=1.0, but forward.. has default None"):
        case.captured()
    typo = fxverify.case_from_module("typo_ca", OptionalMask, [(2, 3, 8, 8)], concrete_args={"masks": None})
    with pytest.raises(CorpusError, match="concrete_args names 'masks', but forward.. takes .'x', 'mask'."):
        typo.captured()


def test_full_zoo_entries_with_large_images_are_in_the_large_input_profile_as_the_generator_puts_them():
    from fxverify.corpus import generate_full

    full = [e for e in catalogue.select("full") if "full" in e.profiles and e.source in ("torchvision", "timm")]
    large = set(names(catalogue.select("large_input")))
    assert 100 < len(large) < len(full) / 4  # the few at their own size, not the zoo
    for entry in full:
        shape = entry.inputs[0].shape
        assert (entry.name in large) == (len(shape) >= 4 and shape[-1] * shape[-2] > 224 * 224), entry.name
        if "default" not in entry.profiles:  # generated entries: the generator's rule gives the file's profiles
            assert generate_full.sized(dataclasses.replace(entry, profiles=("full",))).profiles == entry.profiles
