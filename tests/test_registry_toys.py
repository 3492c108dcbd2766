"""A check added as docs/architecture.md says: its module (this one, for the test), one registry row and one
row of the options table. It keeps state per subject in the subject's stash and reads its own option; nothing
else in fxverify is edited, and it runs through the API and the plugin."""

from __future__ import annotations

from typing import Any

import fxverify
from fxverify import checks
from fxverify.checks import CheckSpec, option
from fxverify.core.results import Finding
from fxverify.core.stash import StashKey
from fxverify.engine.subject import Subject
from fxverify.plugin import options

RUNS: StashKey[list[int]] = StashKey("toy runs")


def check(subject: Subject) -> dict[str, Any]:
    """Counts its runs on the subject in the stash; fails where the graph has fewer nodes than its option asks."""
    runs = subject.stash.get(RUNS, list)
    runs.append(len(runs) + 1)
    nodes = len(subject.applied().result.graph.nodes)
    least = int(option(subject.settings, "toy_least_nodes"))  # text from the command line
    if nodes < least:
        raise Finding(f"the result has {nodes} nodes, fewer than --fxverify-toy-least-nodes {least}")
    return {"runs": list(runs), "nodes": nodes}


ROW = CheckSpec("toy", __name__, "check", "the result has at least as many nodes as asked",
                options=(("toy_least_nodes", 1),))
OPTION = options.Option("fxverify_toy_least_nodes", "N", "1", "the toy check's least number of nodes")


def test_a_check_with_its_own_state_and_option_added_with_two_rows_and_its_module(monkeypatch, pytester):
    monkeypatch.setattr(checks, "REGISTRY", (*checks.REGISTRY, ROW))
    monkeypatch.setattr(options, "OPTIONS", (*options.OPTIONS, OPTION))
    verification = fxverify.Verification(fxverify.examples.identity, "edge_conv_bn_head")
    first, again = verification.run("toy"), verification.run("toy")
    assert first.ok and again.details["runs"] == [1, 2]  # its state, kept on the subject between runs
    strict = fxverify.Verification(fxverify.examples.identity, "edge_conv_bn_head", options={"toy_least_nodes": 10**6})
    assert strict.run("toy").outcome == "failed"

    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", "fxverify.examples:identity",
                                "--fxverify-corpus", "edge_conv_bn_head", "--fxverify-checks", "lint,toy",
                                "--fxverify-toy-least-nodes", "1000000")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*fxverify toy check failed*", "*fewer than --fxverify-toy-least-nodes 1000000*"])
