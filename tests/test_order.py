"""The order items run in: what failed last time first, then the cheap edge-case modules, then the
other models cheapest first; the same in every xdist worker, and the summary in catalogue order."""

from __future__ import annotations

import re

import pytest

from fxverify.cases.catalogue import CorpusEntry, InputSpec, select, shard
from fxverify.plugin.order import History, TransformHistory

# a pass that breaks only models with a BatchNorm: edge_conv_bn_head, not edge_nested_outputs
FAILS_ON_BATCHNORM = """
from torch import nn

def fails_on_batchnorm(gm):
    if any(isinstance(m, nn.BatchNorm2d) for m in gm.modules()):
        raise ValueError("BatchNorm is not supported")
    return gm
"""
CORPUS = "--fxverify-corpus=edge_conv_bn_head,edge_nested_outputs,resnet18"


def _entry(name: str, source: str = "timm", shape: tuple[int, ...] = (2, 3, 64, 64)) -> CorpusEntry:
    return CorpusEntry(name, source=source, factory="torch.nn:Identity", inputs=(InputSpec(shape),))


def test_failed_first_then_edge_cases_then_the_cheapest_known_then_by_input_size():
    zoo = [_entry("big", shape=(2, 3, 224, 224)), _entry("slow"), _entry("fast"), _entry("broken"), _entry("new")]
    edge = _entry("edge", source="edge", shape=(2, 8))
    history = History({"p:t": TransformHistory(failed=[("broken", "lint")], seconds={"slow": 30.0, "fast": 3.0})})
    order = [e.name for e in history.ordered("p:t", [*zoo, edge])]
    assert order == ["broken", "edge", "fast", "slow", "new", "big"]
    assert [e.name for e in history.ordered("other:t", [*zoo, edge])] == ["edge", "slow", "fast", "broken", "new", "big"]
    assert history.ordered_checks("p:t", "broken", ("lint", "numerics", "golden")) == ["lint", "numerics", "golden"]
    assert history.ordered_checks("p:t", "broken", ("numerics", "lint")) == ["lint", "numerics"]


def test_a_run_forgets_failures_it_saw_pass_and_keeps_those_it_did_not_run():
    history = History({"p:t": TransformHistory(failed=[("a", "lint"), ("b", "lint")], seconds={"a": 1.0})})
    history.record("p:t", [("a", "lint", False), ("c", "numerics", True)], {"a": 2.0, "c": 5.0})
    assert history.transforms["p:t"] == TransformHistory(failed=[("b", "lint"), ("c", "numerics")],
                                                         seconds={"a": 2.0, "c": 5.0})
    assert History.from_cache(history.to_cache()) == history
    assert History.from_cache({"p:t": {"failed": 3}}) == History() and History.from_cache(None) == History()


def test_ordering_after_sharding_keeps_the_shards_an_exact_partition():
    entries = select("default")
    history = History({"p:t": TransformHistory(seconds={e.name: float(len(e.name)) for e in entries})})
    shards = [history.ordered("p:t", shard(entries, i, 3)) for i in (1, 2, 3)]
    names = [e.name for part in shards for e in part]
    assert sorted(names) == sorted(e.name for e in entries) and len(names) == len(set(names))


def _collected_models(result: pytest.RunResult) -> list[str]:
    models = [m.group(1) for line in result.outlines if (m := re.search(r"fxverify\[(\w+)-\w+\]", line))]
    return list(dict.fromkeys(models))


def test_the_run_learns_what_failed_and_every_xdist_worker_collects_the_same_order(pytester):
    pytester.makepyfile(passes=FAILS_ON_BATCHNORM)
    args = ["--fxverify", "passes.py:fails_on_batchnorm", CORPUS, "--fxverify-checks=lint,purity"]
    first = pytester.runpytest(*args, "--collect-only", "-q")
    assert _collected_models(first) == ["edge_nested_outputs", "edge_conv_bn_head", "resnet18"]  # edge cases first
    catalogue = pytester.runpytest(*args, "--collect-only", "-q", "--fxverify-order=catalogue")
    assert _collected_models(catalogue) == ["resnet18", "edge_conv_bn_head", "edge_nested_outputs"]

    ran = pytester.runpytest(*args, "--fxverify-exclude=resnet18")
    ran.assert_outcomes(passed=2, failed=2)
    rows = [line.split()[0] for line in ran.outlines if line.startswith(("edge_", "resnet"))]
    assert rows == ["edge_conv_bn_head", "edge_nested_outputs"]  # the summary keeps the catalogue's order

    again = pytester.runpytest(*args, "--collect-only", "-q")
    assert _collected_models(again) == ["edge_conv_bn_head", "edge_nested_outputs", "resnet18"]  # failed first
    workers = pytester.runpytest(*args, "--fxverify-exclude=resnet18", "-n", "2", "-x")
    assert "Different tests were collected" not in "\n".join(workers.outlines + workers.errlines)
    assert workers.parseoutcomes()["failed"] == 1  # -x: the failure comes first and stops the run
    workers.stdout.fnmatch_lines(["FAILED *fxverify[[]edge_conv_bn_head-lint[]]*", "*stopping after 1 failures*"])
    cleared = pytester.runpytest(*args, "--collect-only", "-q", "--cache-clear")
    assert _collected_models(cleared)[0] == "edge_nested_outputs"


def test_a_bad_order_is_a_usage_error(pytester):
    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", "fxverify.examples:identity",
                                "--fxverify-order=random")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--fxverify-order (ini fxverify_order) must be one of fast, catalogue, got 'random'*"])
