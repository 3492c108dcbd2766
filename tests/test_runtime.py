"""The runtime check: Edge programs lowered to an ExecuTorch .pte with XNNPACK, loaded and run by executorch.runtime.

Passes written as ExecuTorch's authors write them (``ExportPass`` subclasses): one that edits a ``_clone_dim_order``
node's ``dim_order`` argument in ``call()`` and leaves its ``meta['val']`` behind, which only the runtime sees
(XNNPACK's delegate refuses the tensor at ``execute()``), beside its twin doing the same in ``call_operator``, where
ExportPass recomputes the node's meta."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fxverify
from fxverify.api import Verification

pytest.importorskip("executorch")

from executorch.exir.pass_base import ExportPass, PassResult


class ContiguousDimOrderInCall(ExportPass):
    """Makes every dim-order copy contiguous by editing its ``dim_order`` argument in place: the node's
    ``meta['val']`` keeps the channels-last strides it had, which memory planning and XNNPACK trust."""

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        for node in graph_module.graph.nodes:
            if node.op == "call_function" and "dim_order" in node.kwargs:
                node.kwargs = {**node.kwargs, "dim_order": list(range(len(node.kwargs["dim_order"])))}
        graph_module.recompile()
        return PassResult(graph_module, True)


class ContiguousDimOrder(ExportPass):
    """The same rewrite in ``call_operator``: ExportPass runs the op again on fake tensors, so its meta follows."""

    def call_operator(self, op, args, kwargs, meta):  # type: ignore[no-untyped-def]
        if "dim_order" in kwargs:
            kwargs = {**kwargs, "dim_order": list(range(len(kwargs["dim_order"])))}
        return super().call_operator(op, args, kwargs, meta)


def runtime(transform, case, capture):  # type: ignore[no-untyped-def]
    case = fxverify.load_case(case) if isinstance(case, str) else case
    return Verification(transform, case, capture=case.capture_named(capture)).run("runtime")


@pytest.mark.parametrize("model,capture", [("edge_conv_bn_head", "edge"), ("layer_conv_bn", "edge_pt2e")])
def test_identity_passes(model, capture):
    result = runtime(fxverify.examples.identity, model, capture)
    assert result.outcome == "passed", result.message
    assert result.details["delegated"] == {"original": 1, "result": 1}


def test_stale_dim_order_fails_at_execute_beside_its_twin():
    broken = runtime(ContiguousDimOrderInCall(), "edge_channels_last_clone", "edge")
    assert broken.outcome == "failed", broken.message
    assert "execute raised" in broken.message and "dim_order" in broken.message
    assert broken.details["stage"] == "execute"
    fixed = runtime(ContiguousDimOrder(), "edge_channels_last_clone", "edge")
    assert fixed.outcome == "passed", fixed.message


class Cumulative(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=1).flip(0)


def test_portable_ops_only():
    """A program XNNPACK takes no part of runs on the portable kernels, and is judged alike."""
    case = fxverify.case_from_module("cumulative", Cumulative, [(2, 5)])
    result = runtime(fxverify.examples.identity, case, "edge")
    assert result.outcome == "passed", result.message
    assert result.details["delegated"] == {"original": 0, "result": 0}


@pytest.mark.slow
def test_mutated_buffers_start_at_zero():
    """A buffer the program mutates starts at zero in the .pte (not at the value calibration left)."""
    result = runtime(fxverify.examples.identity, "edge_counter_buffer", "edge_pt2e")
    assert result.outcome == "passed", result.message


def test_not_collected_without_edge():
    result = Verification(fxverify.examples.identity, "edge_conv_bn_head").run("runtime")
    assert result.outcome == "skipped" and "not ExecuTorch Edge programs" in result.message
