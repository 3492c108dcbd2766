"""The cross-process digest server: one process for many models, prints kept
off the protocol, and a dead or stuck server reported, not hung on."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from fxverify.cases.case import load_case
from fxverify.checks import _digest_server as crossprocess
from fxverify.checks._digest_server import CrossProcessDigests
from fxverify.checks.determinism import digest
from fxverify.core.transform import Transform

MODELS = ["edge_conv_bn_head", "edge_nested_outputs"]


def transform_file(tmp_path: Path, body: str) -> Transform:
    path = tmp_path / "server_transform.py"
    path.write_text(textwrap.dedent(body))
    return Transform.load(f"{path}:fn")


def test_one_server_answers_every_model_and_the_transforms_prints_stay_out(tmp_path):
    pids = tmp_path / "pids.txt"
    transform = transform_file(tmp_path, f"""
        import os
        def fn(gm):
            print("a transform that prints", ["not", "json"])
            with open({str(pids)!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")
            return gm
    """)
    digests = CrossProcessDigests(transform, [load_case(name) for name in MODELS], timeout=60)
    try:
        for name in MODELS:
            digests.request(name)  # both sent ahead; answers collected below
        for name in MODELS:
            case = load_case(name)
            here, _ = case.capture.apply(transform, case.captured(), timeout=None)
            assert digests(name) == digest(here)
    finally:
        digests.close()
    server_runs = [pid for pid in pids.read_text().split() if pid != str(os.getpid())]
    assert len(server_runs) == 2 and len(set(server_runs)) == 1, server_runs  # one server did both


def test_a_server_that_dies_is_reported_with_its_error(tmp_path, monkeypatch):
    transform = transform_file(tmp_path, """
        import os
        if os.environ.get("FXVERIFY_TEST_BREAK_SERVER"):
            raise ImportError("only importable in the parent")
        def fn(gm):
            return gm
    """)
    monkeypatch.setenv("FXVERIFY_TEST_BREAK_SERVER", "1")  # after the parent loaded it
    digests = CrossProcessDigests(transform, [load_case(MODELS[0])], timeout=60)
    try:
        answer = digests(MODELS[0])
    finally:
        digests.close()
    assert answer.startswith("error: the cross-process server exited 1")
    assert "only importable in the parent" in answer


@pytest.mark.slow
def test_a_stuck_server_times_out_and_the_next_request_gets_a_fresh_one(tmp_path, monkeypatch):
    transform = transform_file(tmp_path, """
        import os, time
        if os.environ.get("FXVERIFY_TEST_SLOW_SERVER"):
            time.sleep(60)
        def fn(gm):
            return gm
    """)
    monkeypatch.setattr(crossprocess, "SERVER_START_SECONDS", 1.0)
    digests = CrossProcessDigests(transform, [load_case(name) for name in MODELS], timeout=1)
    try:
        monkeypatch.setenv("FXVERIFY_TEST_SLOW_SERVER", "1")
        assert digests(MODELS[0]) == "error: the cross-process run timed out"
        monkeypatch.delenv("FXVERIFY_TEST_SLOW_SERVER")
        monkeypatch.setattr(crossprocess, "SERVER_START_SECONDS", 120.0)
        assert len(digests(MODELS[1])) == 16  # a digest, from a new server
    finally:
        digests.close()


def test_a_model_the_runner_was_not_given_is_an_error():
    digests = CrossProcessDigests(Transform.load("fxverify.examples:identity"), [], timeout=10)
    assert digests("resnet18") == "error: resnet18 is not among the models this runner was given"


def test_the_plugin_starts_a_server_only_for_selected_determinism_items(pytester, tmp_path):
    pids = tmp_path / "pids.txt"
    transform = tmp_path / "pid_transform.py"
    transform.write_text(textwrap.dedent(f"""
        import os
        def fn(gm):
            with open({str(pids)!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")
            return gm
    """))
    args = ["-p", "no:cacheprovider", "--fxverify", f"{transform}:fn", f"--fxverify-corpus={MODELS[0]}"]

    def other_processes() -> set[str]:
        return {pid for pid in pids.read_text().split() if pid != str(os.getpid())}

    assert pytester.runpytest(*args, "-k", "not determinism").ret == 0
    assert other_processes() == set()  # no server: no determinism item was selected
    pytester.runpytest(*args, "-k", "determinism").assert_outcomes(passed=1)
    assert len(other_processes()) == 1  # the server transformed the model once


def test_a_calibrating_transforms_floats_are_blanked_its_node_order_is_not():
    """A quantizer under test computes its scales from activations: their last digits follow the thread count (the
    server runs on one thread), so its digests compare with floating-point literals blanked."""
    import torch
    from torch import fx, nn

    def scaled(scale: float, swapped: bool = False) -> fx.GraphModule:
        graph = fx.Graph()
        x, y = graph.placeholder("x"), graph.placeholder("y")
        first, second = (y, x) if swapped else (x, y)
        graph.output(graph.call_function(torch.add, (graph.call_function(torch.mul, (first, scale)), second)))
        return fx.GraphModule(nn.Module(), graph)

    ulp_apart = scaled(0.02209177426993847), scaled(0.02209177240729332)
    assert digest(ulp_apart[0]) != digest(ulp_apart[1])
    assert digest(ulp_apart[0], calibrated=True) == digest(ulp_apart[1], calibrated=True)
    assert digest(scaled(0.5), calibrated=True) != digest(scaled(0.5, swapped=True), calibrated=True)
