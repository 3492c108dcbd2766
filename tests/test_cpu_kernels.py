"""fxverify.analysis.cpu_kernels: the probe of a saturating int8 GEMM, measured with oneDNN capped below VNNI in a
fresh process, and the one line a finding gets where a graph calls that GEMM on such a machine."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import fx

from fxverify.analysis import cpu_kernels

pytestmark = pytest.mark.cpu_kernels


def _probe_in_a_process(**env: str) -> str:
    """What ``int8_gemm_saturates()`` and ``cpu_capability()`` say in a fresh process with ``env`` added."""
    code = "from fxverify.analysis import cpu_kernels as k; print(k.int8_gemm_saturates(), k.cpu_capability())"
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_probe_finds_the_int8_gemm_saturating_with_onednn_capped_at_avx2() -> None:
    # AVX2 is below every VNNI level of oneDNN's ISA ladder: the 16-bit pair sums on any x86 CPU
    saturates, capability = _probe_in_a_process(ONEDNN_MAX_CPU_ISA="AVX2").split(" ", 1)
    assert saturates == "True" and "ONEDNN_MAX_CPU_ISA=AVX2" in capability, capability


def _int8_linear_graph() -> fx.Graph:
    graph = fx.Graph()
    x, w = graph.placeholder("x"), graph.placeholder("w")
    out = graph.call_function(torch.ops.onednn.qlinear_pointwise.default,
                              (x, 1.0, 0, w, None, None, None, 1.0, 0, torch.float32, "none", [], ""))
    graph.output(out)
    return graph


def test_the_note_names_the_capability_and_reduce_range_only_for_a_graph_calling_the_int8_gemm(
        monkeypatch: pytest.MonkeyPatch) -> None:
    plain = fx.symbolic_trace(torch.nn.Linear(2, 2)).graph
    monkeypatch.setattr(cpu_kernels, "int8_gemm_saturates", lambda: True)
    note = cpu_kernels.int8_saturation_note(plain, _int8_linear_graph())
    assert note is not None and cpu_kernels.cpu_capability() in note and "reduce_range=True" in note
    assert cpu_kernels.int8_saturation_note(plain) is None
    monkeypatch.setattr(cpu_kernels, "int8_gemm_saturates", lambda: False)
    assert cpu_kernels.int8_saturation_note(_int8_linear_graph()) is None
