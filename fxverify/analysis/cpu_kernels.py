"""What this CPU's kernels compute that another x86 CPU's do not, measured here, for a verdict to name.

oneDNN's int8 GEMM (behind ``onednn::qlinear_pointwise`` and ``onednn::qconv_pointwise``, the ops torchao's and
Inductor's x86 quantization lowerings call) multiplies uint8 activations by int8 weights. With VNNI (``vpdpbusd``)
or AMX it accumulates every product in 32 bits; without them (an AVX2 CPU, an AVX-512 one without VNNI, or oneDNN
capped by ``ONEDNN_MAX_CPU_ISA=AVX2``) it adds pairs of products in 16-bit saturating arithmetic
(``vpmaddubsw``), and a pair above 32767 (two activations near 255 times weights near 127) is clipped. A program
quantized with full-range activations (``X86InductorQuantizer``'s default config) then computes something else
than its own q/dq program on such a CPU, and the same on a CPU with VNNI: the verdict depends on the machine.
``reduce_range=True`` (activations in 0..127) keeps every pair in range on every CPU.

:func:`int8_gemm_saturates` measures it on this machine: one GEMM whose exact result needs 32-bit
accumulation. :func:`int8_saturation_note` says it in a finding on a graph that calls those kernels.

>>> isinstance(int8_gemm_saturates(), bool)
True
>>> runs_onednn_int8(torch.fx.symbolic_trace(torch.nn.Linear(2, 2)).graph)
False
"""

from __future__ import annotations

import functools
import os

import torch
from torch import fx

INT8_KERNELS = ("qlinear", "qconv")  # oneDNN's int8 GEMM ops (onednn::qlinear_pointwise ...) and their lowerings
ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")  # caps


@functools.cache
def int8_gemm_saturates() -> bool:
    """Whether oneDNN's u8 x s8 GEMM on this machine (its CPU, and ``ONEDNN_MAX_CPU_ISA``) clips pairs of products
    to 16 bits: a row of 255s times a row of 127s, whose exact sum needs 32 bits. False where the kernel is absent
    (a torch without oneDNN runs no such program)."""
    k = 8
    try:
        packed = torch.ops.onednn.qlinear_prepack(torch.full((1, k), 127, dtype=torch.int8), [1, k])
        out = torch.ops.onednn.qlinear_pointwise(torch.full((1, k), 255, dtype=torch.uint8), 1.0, 0, packed,
                                                 torch.ones(1), torch.zeros(1, dtype=torch.long), None, 1.0, 0,
                                                 torch.float32, "none", [], "")
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return float(out.flatten()[0]) < k * 255 * 127


def runs_onednn_int8(graph: fx.Graph) -> bool:
    """Whether ``graph`` calls oneDNN's int8 GEMM: an ``onednn::qlinear*`` / ``qconv*`` op, or an Inductor lowering
    handler of that name (the x86 quantization lowerings' ``qlinear``, ``qconv``)."""
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        if isinstance(target, torch._ops.OpOverload) and target.namespace == "onednn":
            name = target._opname
        elif getattr(target, "_inductor_lowering_function", False):
            name = getattr(target, "__name__", "")
        else:
            continue
        if name.startswith(INT8_KERNELS):
            return True
    return False


def cpu_capability() -> str:
    """This machine's kernels in words: ATen's CPU capability and the variables capping it or oneDNN's.

    >>> cpu_capability().startswith("CPU capability ")
    True
    """
    caps = [f"{name}={os.environ[name]}" for name in ISA_VARIABLES if os.environ.get(name)]
    return f"CPU capability {torch.backends.cpu.get_cpu_capability()}" + (f" ({', '.join(caps)})" if caps else "")


def int8_saturation_note(*graphs: fx.Graph) -> str | None:
    """One line for a finding of outputs that differ where one of ``graphs`` calls oneDNN's int8 GEMM and this
    machine's clips (see the module's docstring): the capability, the cause and the fix; None otherwise."""
    if not int8_gemm_saturates() or not any(runs_onednn_int8(graph) for graph in graphs):
        return None
    return (f"on this machine ({cpu_capability()}, no VNNI in oneDNN's int8 GEMM) the int8 GEMM the graph calls adds "
            "pairs of uint8 x int8 products in 16-bit saturating arithmetic, which full-range activations (0..255) "
            "overflow: the program can compute otherwise here than on a CPU with VNNI or AMX, whatever the pass does. "
            "Judge the pass on a CPU with VNNI or AMX, or quantize with reduce_range=True "
            "(get_default_x86_inductor_quantization_config(reduce_range=True): activations in 0..127, whose pairs "
            "never overflow)")
