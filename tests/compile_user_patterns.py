"""Inductor pattern-matcher passes written the way their real authors write them (vLLM's fusion passes and fused
kernels as custom ops, serving libraries' attention rewrites on transposed head views), each correct pass beside a
buggy twin, for the verdicts of pattern fuzzing (issue 41; ``tests/test_compile_patterns.py``).

Each docstring states the pass's completeness promise, which its contract declares
(``rewrites_spellings``, ``dtypes``) and pattern fuzzing holds it to; each twin says what it gets wrong.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._inductor.fx_passes.post_grad import view_to_reshape
from torch._inductor.pattern_matcher import Match, PatternMatcherPass, fwd_only, register_replacement

import fxverify

DTYPES = (torch.float32, torch.bfloat16)  # the model dtypes the passes below are for, as their contracts say


def _inputs(dtype: torch.dtype, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=generator).to(dtype) for shape in shapes]


# -- vLLM's SiLU-and-mul: a fused kernel as a custom op (no autograd), for one dtype of both operands ---------------

@torch.library.custom_op("fxverify_user::silu_and_mul", mutates_args=())
def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The fused kernel: ``silu(gate) * up`` computed in float32 and written in the gate's dtype (its precondition:
    one dtype for both operands, as vLLM's ``silu_and_mul`` takes one activation tensor)."""
    return (F.silu(gate.float()) * up.float()).to(gate.dtype)


@silu_and_mul.register_fake
def _(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(gate)


def _gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def _up_gate(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return up * F.silu(gate)


def _fused(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.ops.fxverify_user.silu_and_mul(gate, up)


def _one_dtype(match: Match) -> bool:
    """The kernel's precondition: the gate and the up projection in one dtype."""
    return bool(match.kwargs["gate"].meta["val"].dtype == match.kwargs["up"].meta["val"].dtype)


def _any_dtypes(match: Match) -> bool:
    return True


def _register_silu_and_mul(pass_dict: PatternMatcherPass, searches: tuple, guarded: bool) -> None:
    for dtype in DTYPES:  # a pattern traced in float32 misses bfloat16 graphs (its silu is computed in float32 there)
        for search in searches:
            register_replacement(search, _fused, _inputs(dtype, (4, 16), (4, 16)), fwd_only, pass_dict,
                                 extra_check=_one_dtype if guarded else _any_dtypes)


@fxverify.contract(rewrites_spellings=("operand_orders",), dtypes=("float32", "bfloat16"))
def silu_and_mul_fusion(pass_dict: PatternMatcherPass) -> None:
    """Promises both operand orders of the gate product (``silu(gate) * up`` and ``up * silu(gate)``), in float32 and
    bfloat16; fused only where both operands share a dtype (the kernel's precondition)."""
    _register_silu_and_mul(pass_dict, (_gate_up, _up_gate), guarded=True)


@fxverify.contract(rewrites_spellings=("operand_orders",), dtypes=("float32", "bfloat16"))
def silu_and_mul_one_order(pass_dict: PatternMatcherPass) -> None:
    """The same promise, one order registered: ``up * silu(gate)`` is never fused."""
    _register_silu_and_mul(pass_dict, (_gate_up,), guarded=True)


@fxverify.contract(rewrites_spellings=("operand_orders",), dtypes=("float32", "bfloat16"))
def silu_and_mul_unguarded(pass_dict: PatternMatcherPass) -> None:
    """The same promise, no dtype guard: a bfloat16 gate times a float32 up projection is fused into the kernel,
    which writes bfloat16 where the program computes float32."""
    _register_silu_and_mul(pass_dict, (_gate_up, _up_gate), guarded=False)


# -- vLLM's RMSNorm: upcast, normalise, cast back, scale; a pattern per dtype and per spelling of the square --------

EPS = 1e-6


@torch.library.custom_op("fxverify_user::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The fused kernel (vLLM's ``rms_norm``), computing in float32."""
    normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight


@rms_norm.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x)


def _square_by_mul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``RMSNorm.forward_native`` with the square written ``x * x``."""
    upcast = x.to(torch.float32)
    normed = upcast * torch.rsqrt((upcast * upcast).mean(-1, keepdim=True) + EPS)
    return normed.to(x.dtype) * weight


@fxverify.also_spelled(square=lambda x, weight: _rms_norm_native(x, weight, torch.square), mul=_square_by_mul)
def _rms_norm_pow(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``RMSNorm.forward_native`` as vLLM writes it (the square as ``pow``)."""
    return _rms_norm_native(x, weight, lambda upcast: upcast.pow(2))


def _rms_norm_native(x: torch.Tensor, weight: torch.Tensor, square: object) -> torch.Tensor:
    upcast = x.to(torch.float32)
    normed = upcast * torch.rsqrt(square(upcast).mean(-1, keepdim=True) + EPS)  # type: ignore[operator]
    return normed.to(x.dtype) * weight


def _rms_norm_fused(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.fxverify_user.rms_norm(x, weight, EPS)


def _register_rms_norm(pass_dict: PatternMatcherPass, dtypes: tuple[torch.dtype, ...]) -> None:
    for dtype in dtypes:
        for search in (_rms_norm_pow, _square_by_mul):  # x.square() traces to pow: two patterns cover three spellings
            register_replacement(search, _rms_norm_fused, _inputs(dtype, (4, 16), (16,)), fwd_only, pass_dict)


@fxverify.contract(rewrites_spellings=("declared",), dtypes=("float32", "bfloat16"))
def rms_norm_fusion(pass_dict: PatternMatcherPass) -> None:
    """Promises the ``pow``, ``square`` and ``x * x`` spellings of the square (declared with ``also_spelled``), in
    float32 and bfloat16 models: a pattern per spelling, each traced in each dtype (in bfloat16 the upcast is a
    node of the graph; in float32 it is no node at all)."""
    _register_rms_norm(pass_dict, DTYPES)


@fxverify.contract(rewrites_spellings=("declared",), dtypes=("float32", "bfloat16"))
def rms_norm_float32_traced(pass_dict: PatternMatcherPass) -> None:
    """The same promise, its patterns traced in float32 only: a bfloat16 model's RMSNorm (whose upcast the float32
    trace lacks) is never fused."""
    _register_rms_norm(pass_dict, (torch.float32,))


# -- Linear + GELU, every one on (B, T, C): GELU's inner products are no spelling anyone writes ---------------------

@torch.library.custom_op("fxverify_user::linear_gelu", mutates_args=())
def linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A fused GEMM with a GELU epilogue (the erf GELU)."""
    return F.gelu(F.linear(x, weight, bias))


@linear_gelu.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("fxverify_user::linear_gelu_tanh", mutates_args=())
def linear_gelu_tanh(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A fused GEMM whose epilogue is the tanh approximation of GELU."""
    return F.gelu(F.linear(x, weight, bias), approximate="tanh")


@linear_gelu_tanh.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.linear(x, weight, bias))


@fxverify.contract(rewrites_spellings=("sizes", "operand_orders"))
def linear_gelu_fusion(pass_dict: PatternMatcherPass) -> None:
    """Promises every Linear+GELU on (B, T, C), at any sizes, in each operand order a user writes (GELU's
    decomposition multiplies ``0.5 * x`` in one order only: that is no spelling)."""
    register_replacement(_linear_gelu, lambda x, weight, bias: torch.ops.fxverify_user.linear_gelu(x, weight, bias),
                         _inputs(torch.float32, (2, 3, 8), (5, 8), (5,)), fwd_only, pass_dict)


@fxverify.contract(rewrites_spellings=("sizes", "operand_orders"))
def linear_gelu_tanh_kernel(pass_dict: PatternMatcherPass) -> None:
    """The same promise, fused into a kernel whose GELU is the tanh approximation: off by up to 1e-3."""
    register_replacement(_linear_gelu,
                         lambda x, weight, bias: torch.ops.fxverify_user.linear_gelu_tanh(x, weight, bias),
                         _inputs(torch.float32, (2, 3, 8), (5, 8), (5,)), fwd_only, pass_dict)


# -- attention on transposed head views, as serving libraries and Inductor's _sfdp patterns register it -----------

BATCH, TIME, HEADS, HEAD_DIM = 2, 8, 4, 16
SCALE = 0.25  # a magic value: scalar_workaround makes the scale an argument of the match


def _head_views(*layouts: tuple[int, ...]) -> list[torch.Tensor]:
    """Projections (batch, time, heads * head_dim) viewed as heads and permuted: ``(0, 2, 1, 3)`` gives q, k and v as
    ``x.view(b, t, h, d).transpose(1, 2)``; ``(0, 2, 3, 1)`` a key stored transposed, (batch, heads, head_dim, time)."""
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(BATCH, TIME, HEADS * HEAD_DIM, generator=generator).view(BATCH, TIME, HEADS, HEAD_DIM)
            .permute(*layout) for layout in layouts]


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.matmul(torch.matmul(q, k.transpose(-2, -1)).mul(scale).softmax(dim=-1), v)


def _attention_kt(q: torch.Tensor, kt: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention on a key stored transposed (batch, heads, head_dim, time)."""
    return torch.matmul(torch.matmul(q, kt).mul(scale).softmax(dim=-1), v)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, scale=scale)


def _sdpa_kt(q: torch.Tensor, kt: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, kt.transpose(-2, -1), v, scale=scale)


def _sdpa_either_key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """One replacement for both keys, telling a key stored transposed by its last size (head_dim is q's)."""
    if k.shape[-1] != q.shape[-1]:
        k = k.transpose(-2, -1)
    return F.scaled_dot_product_attention(q, k, v, scale=scale)


def _register_attention(pass_dict: PatternMatcherPass, replacements: tuple) -> None:
    heads, stored_transposed = (0, 2, 1, 3), (0, 2, 3, 1)
    register_replacement(_attention, replacements[0], _head_views(heads, heads, heads), fwd_only, pass_dict,
                         scalar_workaround={"scale": SCALE})
    register_replacement(_attention_kt, replacements[1], _head_views(heads, stored_transposed, heads), fwd_only,
                         pass_dict, scalar_workaround={"scale": SCALE})


def attention_fusion(pass_dict: PatternMatcherPass) -> None:
    """Attention to SDPA on transposed head views, the key given as (batch, heads, time, head_dim) or stored
    transposed; promises no spelling (its bfloat16 programs, whose softmax upcasts, stay warnings)."""
    _register_attention(pass_dict, (_sdpa, _sdpa_kt))


def attention_key_by_size(pass_dict: PatternMatcherPass) -> None:
    """The twin: one replacement for both key layouts, telling them apart by sizes; a key stored transposed is
    fused untransposed when head_dim equals the sequence length."""
    _register_attention(pass_dict, (_sdpa_either_key, _sdpa_either_key))


# -- a pattern for post_grad_custom_post_pass: there, Inductor has turned every aten.view into aten.reshape ---------

def _tokens_silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The gate product on (batch, time, hidden) activations flattened into tokens, as a GEMM epilogue sees them."""
    return F.silu(gate.view(-1, gate.shape[-1])) * up.view(-1, up.shape[-1])


def _tokens_fused(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.ops.fxverify_user.silu_and_mul(gate, up).view(-1, gate.shape[-1])


def fwd_as_post_grad(fn: object, args: list[object], **kwargs: object) -> torch.fx.GraphModule:
    """``fwd_only``, then the ``view_to_reshape`` Inductor runs before its post-grad passes: a pattern traced as the
    post-grad hooks receive graphs."""
    graph = fwd_only(fn, args, **kwargs)  # type: ignore[arg-type]
    view_to_reshape(graph)
    return graph


@fxverify.contract(captures=("inductor_post",))
def tokens_silu_mul_view(pass_dict: PatternMatcherPass) -> None:
    """Registered for ``post_grad_custom_post_pass`` and traced with ``fwd_only``: its pattern holds ``aten.view``,
    which that hook never sees (Inductor's ``view_to_reshape`` ran before), so it never fires there."""
    register_replacement(_tokens_silu_mul, _tokens_fused, _inputs(torch.float32, (2, 3, 16), (2, 3, 16)), fwd_only,
                         pass_dict, extra_check=_one_dtype)


@fxverify.contract(captures=("inductor_post",))
def tokens_silu_mul_reshape(pass_dict: PatternMatcherPass) -> None:
    """The twin: the same pattern traced as the post-grad hooks receive graphs (``aten.reshape``)."""
    register_replacement(_tokens_silu_mul, _tokens_fused, _inputs(torch.float32, (2, 3, 16), (2, 3, 16)),
                         fwd_as_post_grad, pass_dict, extra_check=_one_dtype)
