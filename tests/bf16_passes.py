"""Passes that are right in float32 and wrong only in bfloat16, with their twins, for the ``_bf16`` corpus
entries (``tests/test_bf16.py``): an RMSNorm fusion as Inductor's post-grad passes are written
(``register_replacement`` into a ``PatternMatcherPass``), whose replacement computes in float32 as Llama's
RMSNorm does. In a float32 or float64 model the upcast changes nothing; in a bfloat16 one the unguarded pass
returns float32 where the original returned bfloat16.

    pytest --fxverify tests.bf16_passes:RMS_NORM_IN_FLOAT32 --fxverify-capture inductor \\
        --fxverify-corpus edge_tiny_decoder_block,edge_tiny_decoder_block_bf16
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import fx
from torch._inductor.pattern_matcher import Match, PatternMatcherPass, fwd_only, register_replacement

import fxverify

EPS = 1e-6  # TinyDecoderBlock's


def untouched(gm: fx.GraphModule) -> fx.GraphModule:
    """Returns the module it is given: every check passes it on every entry and capture."""
    return gm


def _rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The search function: ``TinyDecoderBlock.rms_norm``."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight


def _in_float32(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """BUG (no dtype guard): the norm computed in x's opmath dtype (float32 for bfloat16, as Llama's RMSNorm
    upcasts), the result not cast back to ``x``'s dtype. A no-op in float32 and float64; in bfloat16 every
    later op gets a float32 input."""
    opmath = torch.promote_types(x.dtype, torch.float32)
    upcast = x.to(opmath)
    return upcast * torch.rsqrt(upcast.pow(2).mean(-1, keepdim=True) + EPS) * weight.to(opmath)


def _in_float32_cast_back(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The twin: the same float32 computation, cast back to ``x``'s dtype."""
    return _in_float32(x, weight).to(x.dtype)


def _full_precision_input(match: Match) -> bool:
    """The dtype guard: fire only where the normalised input is float32 or float64 (its own opmath dtype)."""
    return match.kwargs["x"].meta["val"].dtype in (torch.float32, torch.float64)


def _rms_norm_pass(replacement: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                   extra_check: Callable[[Match], bool] = lambda match: True) -> PatternMatcherPass:
    """A ``PatternMatcherPass`` rewriting :func:`_rms_norm` to ``replacement`` where ``extra_check`` holds."""
    patterns = PatternMatcherPass(pass_name=replacement.__name__.strip("_"))
    example = [torch.randn(4, 8), torch.randn(8)]
    register_replacement(_rms_norm, replacement, example, fwd_only, patterns, extra_check=extra_check)
    return patterns


RMS_NORM_IN_FLOAT32 = _rms_norm_pass(_in_float32)  # wrong in bfloat16 only
RMS_NORM_GUARDED = _rms_norm_pass(_in_float32, extra_check=_full_precision_input)  # the same, fired in float32 and float64 only
RMS_NORM_CAST_BACK = _rms_norm_pass(_in_float32_cast_back)  # right in every dtype


@fxverify.contract(dtypes=("float32",))
def float32_only(gm: fx.GraphModule) -> fx.GraphModule:
    """A pass declared for float32 models only (as torch's optimize_for_inference, which asserts it)."""
    assert all(p.dtype == torch.float32 for p in gm.parameters()), "this pass is only for torch.float modules"
    return gm
