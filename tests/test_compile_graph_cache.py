"""The FX graph cache check of a CustomGraphPass (fxverify.compile.graph_cache): each buggy uuid() of
tests/compile_cache_passes.py caught by the aspect meant for it, its correct twin passing every aspect; on a model
the passes do not change, the stale aspect says it proved nothing."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch
from torch._inductor import config as inductor_config

from fxverify.checks import PASS_SET, names
from fxverify.compile.graph_cache import (
    BYPASS,
    DEFAULT_MODEL,
    STALE,
    UUID,
    ReluMulAdd,
    check_graph_cache,
    describe_state,
    differing_state,
    inductor_key,
    load_model,
    load_passes,
    same_key_pairs,
)
from fxverify.core.results import FAILED, PASSED, SKIPPED
from fxverify.errors import CorpusError, TransformLoadError
from tests.compile_cache_passes import (
    MLP,
    FileHashFloor,
    KeyedFloor,
    LabelledFloor,
    MatmulPrecision,
    floor_relu,
    keyed_matmuls,
    stale_matmuls,
)

SPEC = "tests.compile_cache_passes:"


def by_aspect(passes, **kwargs):
    results = check_graph_cache(passes, **kwargs)
    assert [r.check for r in results] == list(names(PASS_SET))
    return {r.check: r for r in results}


def test_the_state_uuid_misses_is_named_from_the_instances():
    difference = differing_state(FileHashFloor(0.0), FileHashFloor(0.5))
    assert difference == {"floor": (0.0, 0.5)}
    assert describe_state(difference) == "`floor` differs (0.0, 0.5)"
    assert differing_state(KeyedFloor(0.5), KeyedFloor(0.5)) == {}


def test_inductor_keys_a_hash_object_by_its_name_only():
    # why HasherFloor's instances collide instead of bypassing the cache: the fallback of Inductor's cache pickler
    assert inductor_key(hashlib.sha256(b"0.0")) == inductor_key(hashlib.sha256(b"0.5"))
    assert inductor_key(b"0.0") != inductor_key(b"0.5")


def test_passes_that_cannot_be_checked_are_refused_with_the_reason():
    with pytest.raises(TransformLoadError, match="holds 1 instance"):
        check_graph_cache([FileHashFloor(0.0)])
    with pytest.raises(TransformLoadError, match="not a torch._inductor.custom_graph_pass.CustomGraphPass"):
        check_graph_cache([FileHashFloor(0.0), floor_relu])
    with pytest.raises(TransformLoadError, match=r"\[0\] is a float, not a torch._inductor"):
        load_passes(SPEC + "FLOORS")
    with pytest.raises(TransformLoadError, match="calling it raised TypeError.*give a sequence of two or more"):
        load_passes(SPEC + "floor_relu")


def test_instances_keyed_alike_whose_state_differs_are_found_without_compiling():
    assert same_key_pairs(stale_matmuls()) == [(0, 1, {"dtype": (torch.bfloat16, torch.float16)})]
    assert same_key_pairs(keyed_matmuls()) == []
    assert same_key_pairs([MatmulPrecision(torch.float16)] * 2) == []  # the same state: nothing to serve wrongly
    three = [FileHashFloor(0.0), KeyedFloor(0.5), FileHashFloor(0.5)]  # keys: file, (file, 0.5), file
    assert same_key_pairs(three) == [(0, 2, {"floor": (0.0, 0.5)})]


def test_a_model_is_named_by_a_corpus_entry_or_a_factory_of_either_form():
    pair, own = load_model(SPEC + "mlp"), load_model(SPEC + "MLP")  # (module, inputs), and a class with example_inputs
    assert isinstance(pair.module, MLP) and isinstance(own.module, MLP) and pair.spec == SPEC + "mlp"
    assert torch.equal(pair.module.up.weight, own.module.up.weight)  # the factory runs with the RNG seeded
    assert [tuple(x.shape) for x in pair.inputs] == [(4, 16)] and torch.equal(pair.inputs[0], own.inputs[0])
    entry = load_model("edge_tiny_decoder_block")
    assert isinstance(entry.module, torch.nn.Module) and entry.inputs and entry.name == "edge_tiny_decoder_block"
    default = load_model(DEFAULT_MODEL)
    assert isinstance(default.module, ReluMulAdd) and tuple(default.inputs[0].shape) == (8, 16)


@pytest.mark.parametrize(("spec", "error", "says"), [
    ("edge_tiny_decoder", CorpusError, "no corpus entry named 'edge_tiny_decoder'; did you mean edge_tiny_decoder_block"),
    ("tests.nowhere:mlp", TransformLoadError, "cannot import module 'tests.nowhere'"),
    (SPEC + "FLOORS", TransformLoadError, "gives (0.0, 0.5): give 'package.module:factory'"),
    (SPEC + "floor_relu", TransformLoadError, "building it raised TypeError: floor_relu() missing"),
])
def test_a_model_that_does_not_load_says_what_to_give(spec, error, says):
    with pytest.raises(error) as raised:
        load_model(spec)
    assert says in str(raised.value) and ("returns (module, inputs)" in str(raised.value) or "tests.nowhere" in spec)


@pytest.mark.slow
def test_uuid_missing_constructor_state_serves_a_stale_entry():
    hook_before, cache_dir = inductor_config.post_grad_custom_post_pass, os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    results = by_aspect(SPEC + "stale_floors")
    stale = results[STALE]
    assert stale.outcome is FAILED
    assert "FileHashFloor.uuid() is equal for instances whose `floor` differs (0.0, 0.5)" in stale.message
    assert "return (get_hash_for_files((__file__,)), self.floor)" in stale.message
    assert "clamp_min" in stale.node and "0.0)" in stale.node and "0.5)" in stale.node
    assert stale.where.startswith("output")
    assert [c.get("fxgraph_cache_hit") for c in stale.details["compiles"]] == [None, 1, None]
    assert results[UUID].outcome is PASSED and results[BYPASS].outcome is PASSED  # stable and cached: only stale
    assert ("WARNING: passes[0] and passes[1] get the same cache key from uuid() while their `floor` differs (0.0, 0.5)"
            in results[UUID].message)  # said before compiling; the stale aspect's compiles prove that it matters
    assert inductor_config.post_grad_custom_post_pass is hook_before  # the config and cache folder left as they were
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == cache_dir


@pytest.mark.slow
def test_the_twin_with_its_state_in_uuid_passes_every_aspect():
    results = by_aspect(SPEC + "keyed_floors")
    assert {r.outcome for r in results.values()} == {PASSED}, "\n".join(r.message for r in results.values())
    assert [c.get("fxgraph_cache_miss") for c in results[STALE].details["compiles"]] == [1, 1, None]


@pytest.mark.slow
def test_uuid_none_gets_the_bypass_report_and_no_alarm():
    results = by_aspect(SPEC + "NO_UUID_FLOORS")
    assert {r.outcome for r in results.values()} == {SKIPPED}
    assert "uuid() returns None" in results[UUID].message
    bypass = results[BYPASS]
    assert bypass.details["fxgraph_cache_bypass"] == 2
    assert "fxgraph_cache_bypass=2" in bypass.message and "Unsupported post grad custom pass" in bypass.message


@pytest.mark.slow
def test_an_unpicklable_uuid_is_reported_and_its_collision_caught():
    results = by_aspect(SPEC + "HASHER_FLOORS")
    uuid = results[UUID]
    assert uuid.outcome is FAILED
    assert "returns a HASH" in uuid.message and "does not pickle" in uuid.message
    assert "2 of the 2 instances get the same key" in uuid.message
    assert results[STALE].outcome is FAILED and "`floor` differs" in results[STALE].message


@pytest.mark.slow
def test_a_uuid_that_changes_with_the_hash_seed_fails_and_stays_fresh():
    results = by_aspect(SPEC + "unstable_floors")
    assert results[UUID].outcome is FAILED and "PYTHONHASHSEED=0" in results[UUID].message
    assert results[STALE].outcome is PASSED  # floor is in its uuid: no entry goes stale


@pytest.mark.slow
def test_objects_are_checked_in_another_hook_and_told_how_to_check_stability():
    # a module with example_inputs() needs no inputs=; the matmul precision missing from uuid() serves a stale graph
    results = by_aspect(stale_matmuls(), hook="joint_custom_pre_pass", model=MLP())
    assert results[UUID].outcome is SKIPPED and "give 'package.module:NAME'" in results[UUID].message
    assert "WARNING: passes[0] and passes[1] get the same cache key" in results[UUID].message
    stale = results[STALE]
    assert stale.outcome is FAILED and "joint_custom_pre_pass" in stale.message and stale.model == "MLP"
    assert ("MatmulPrecision.uuid() is equal for instances whose `dtype` differs (torch.bfloat16, torch.float16)"
            in stale.message)
    assert "torch.bfloat16) kwargs={}  (served, as passes[0] left it)" in stale.node


@pytest.mark.slow
@pytest.mark.parametrize("passes", [stale_matmuls, keyed_matmuls])
def test_on_a_model_the_passes_do_not_change_the_stale_aspect_proves_nothing(passes):
    stale = by_aspect(passes())[STALE]  # relu(x) * 2 + x: no matmul to run in another precision
    assert stale.outcome is SKIPPED, stale.message
    assert ("proved nothing: none of the 2 instances changed the graph of relu_mul_add (it calls aten.add.Tensor, "
            "aten.mul.Tensor, aten.relu.default)") in stale.message
    untold = "Whether passes[0] and passes[1], which get the same cache key from uuid() while their `dtype` differs"
    assert (untold in stale.message) is (passes is stale_matmuls)


@pytest.mark.slow
def test_state_left_out_of_uuid_that_changes_nothing_is_no_failure():
    results = by_aspect([LabelledFloor(0.5, "first"), LabelledFloor(0.5, "second")])
    assert FAILED not in {r.outcome for r in results.values()}
    assert "WARNING: passes[0] and passes[1] get the same cache key" in results[UUID].message
    stale = results[STALE]
    assert stale.outcome is SKIPPED and ("proved nothing for passes[0] and passes[1]: they get the same cache key from "
                                         "uuid() while their `label` differs ('first', 'second'), and leave the same "
                                         "graph on relu_mul_add") in stale.message


class RaisingFloor(KeyedFloor):
    """Breaks the compile for a positive floor."""

    def __call__(self, graph):
        if self.floor:
            raise ValueError("no floor above 0")
        super().__call__(graph)


def does_not_run(x):
    raise ValueError("this model fails before any pass")


@pytest.mark.slow
def test_a_compile_that_raises_is_blamed_on_the_pass_only_when_the_model_compiles_without_it():
    broken = by_aspect([RaisingFloor(0.0), RaisingFloor(0.5)])[STALE]
    assert broken.outcome is FAILED and "passes[1] raised" in broken.message and "no floor above 0" in broken.message
    model = by_aspect([KeyedFloor(0.0), KeyedFloor(0.5)], model=does_not_run, inputs=(torch.ones(2),))[STALE]
    assert model.outcome is SKIPPED and "does not compile without the pass either" in model.message
