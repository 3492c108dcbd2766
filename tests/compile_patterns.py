"""Inductor pattern-matcher passes as users write them: re-creations of the bug classes of issue 34, each
beside a correct twin, and correct passes that must give no failure (``tests/test_compile_patterns.py``).

Each is a function registering its replacements into the ``PatternMatcherPass`` it is given, the form
``fxverify.check_patterns`` and ``--fxverify-patterns`` take.
"""

from __future__ import annotations

import torch
from torch._inductor.fx_passes import post_grad
from torch._inductor.pattern_matcher import PatternMatcherPass, fwd_only, joint_fwd_bwd, register_replacement

import fxverify
from fxverify.compile.pattern_sources import PatternExample


def _inputs(*shapes: tuple[int, ...]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=generator) for shape in shapes]


# -- unsound on coinciding sizes: the replacement finds the channel dimension by its size ------------------

def _channels_last_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.matmul(x.transpose(1, 2), w)  # x: (batch, channels, time), w: (channels, out)


def channel_dim_by_size(pass_dict: PatternMatcherPass) -> None:
    """Right while no other dimension of x has the channel count: ``index`` finds the first one."""

    def replacement(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        channel = list(x.shape).index(w.shape[0])
        return torch.matmul(x.movedim(channel, -1), w)

    register_replacement(_channels_last_matmul, replacement, _inputs((2, 8, 5), (8, 3)), fwd_only, pass_dict)


def channel_dim_fixed(pass_dict: PatternMatcherPass) -> None:
    """The twin: the channel dimension is the one the search function transposes."""

    def replacement(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x.movedim(1, -1), w)

    register_replacement(_channels_last_matmul, replacement, _inputs((2, 8, 5), (8, 3)), fwd_only, pass_dict)


# -- a missing dtype guard: a fused kernel (CUDA only, with a fake kernel) that computes in x's dtype ------

@torch.library.custom_op("fxverify_tests::fused_rms_norm", mutates_args=(), device_types="cuda")
def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A fused RMSNorm kernel in x's dtype (as vLLM's): right when weight has x's dtype."""
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * weight.to(x.dtype)


@fused_rms_norm.register_fake
def _(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight


def _fused(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.fxverify_tests.fused_rms_norm(x, weight)


def rms_norm_unguarded(pass_dict: PatternMatcherPass) -> None:
    """vLLM issue 48324 on a CPU: a bfloat16 activation with a float32 weight is fused into a bfloat16 kernel."""
    register_replacement(_rms_norm, _fused, _inputs((4, 8), (8,)), fwd_only, pass_dict)


def _same_dtype(match: object) -> bool:
    values = [match.kwargs[name].meta["val"] for name in ("x", "weight")]  # type: ignore[attr-defined]
    return values[0].dtype == values[1].dtype


def rms_norm_guarded(pass_dict: PatternMatcherPass) -> None:
    """The twin: fused only where x and the weight share a dtype (vLLM's fix, PR 48330)."""
    register_replacement(_rms_norm, _fused, _inputs((4, 8), (8,)), fwd_only, pass_dict, extra_check=_same_dtype)


# -- a dropped constant: patterns registered per slope, one replacement for both --------------------------

def _leaky(slope: float):  # type: ignore[no-untyped-def]
    def leaky_relu(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.leaky_relu(x, slope)

    return leaky_relu


def leaky_relu_slope_dropped(pass_dict: PatternMatcherPass) -> None:
    """vLLM issue 50773's class: a pattern per value of a constant, a replacement that ignores it."""
    for slope in (0.01, 0.2):
        register_replacement(_leaky(slope), _leaky(0.01), _inputs((4, 8)), fwd_only, pass_dict)


def leaky_relu_slope_kept(pass_dict: PatternMatcherPass) -> None:
    """The twin: each slope's replacement keeps it."""
    for slope in (0.01, 0.2):
        register_replacement(_leaky(slope), _leaky(slope), _inputs((4, 8)), fwd_only, pass_dict)


# -- never fires on an equivalent spelling: one operand order of a commutative op -------------------------

def _silu(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(x)


@fxverify.contract(rewrites_spellings=("operand_orders",))
def silu_one_order(pass_dict: PatternMatcherPass) -> None:
    """Promises both operand orders, registers ``x * sigmoid(x)`` only: ``sigmoid(x) * x`` is left alone."""
    register_replacement(lambda x: x * torch.sigmoid(x), _silu, _inputs((4, 8)), fwd_only, pass_dict)


@fxverify.contract(rewrites_spellings=("operand_orders",))
def silu_both_orders(pass_dict: PatternMatcherPass) -> None:
    """The twin: both operand orders registered."""
    register_replacement(lambda x: x * torch.sigmoid(x), _silu, _inputs((4, 8)), fwd_only, pass_dict)
    register_replacement(lambda x: torch.sigmoid(x) * x, _silu, _inputs((4, 8)), fwd_only, pass_dict)


# -- never fires on a spelling its author declared: a custom op beside its native implementation ---------

@torch.library.custom_op("fxverify_tests::silu", mutates_args=())
def silu_op(x: torch.Tensor) -> torch.Tensor:
    """A custom silu kernel (as serving engines ship one beside the native ops)."""
    return torch.nn.functional.silu(x)


@silu_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("fxverify_tests::silu_out", mutates_args=("out",))
def silu_out(out: torch.Tensor, x: torch.Tensor) -> None:
    """The same kernel writing into a buffer it is given (a mutable op)."""
    out.copy_(torch.nn.functional.silu(x))


@silu_out.register_fake
def _(out: torch.Tensor, x: torch.Tensor) -> None:
    return None


def _silu_into_buffer(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    torch.ops.fxverify_tests.silu_out(out, x)
    return out


@fxverify.also_spelled(custom_op=lambda x: torch.ops.fxverify_tests.silu(x))
def _silu_spelled_out(x: torch.Tensor) -> torch.Tensor:
    return x / (1.0 + torch.exp(-x))


@fxverify.contract(rewrites_spellings=("declared",))
def silu_native_only(pass_dict: PatternMatcherPass) -> None:
    """Promises its declared spellings, registers the native spelling only: the custom op is left alone."""
    register_replacement(_silu_spelled_out, _silu, _inputs((4, 8)), fwd_only, pass_dict)


@fxverify.contract(rewrites_spellings=("declared",))
def silu_native_and_custom_op(pass_dict: PatternMatcherPass) -> None:
    """The twin: the custom op registered too."""
    register_replacement(_silu_spelled_out, _silu, _inputs((4, 8)), fwd_only, pass_dict)
    register_replacement(lambda x: torch.ops.fxverify_tests.silu(x), _silu, _inputs((4, 8)), fwd_only, pass_dict)


@fxverify.also_spelled(mutable=_silu_into_buffer)
def _silu_auto_functionalized(x: torch.Tensor) -> torch.Tensor:
    """The mutable op as Inductor's post-grad passes meet it (``auto_functionalized_v2``), as vLLM writes its
    patterns."""
    from torch._higher_order_ops.auto_functionalize import auto_functionalized_v2

    out = torch.empty_like(x)
    return auto_functionalized_v2(torch.ops.fxverify_tests.silu_out.default, x=x, _out_base_index=0,
                                  _all_bases=[out])[1]


def silu_out_to_native(pass_dict: PatternMatcherPass) -> None:
    """A pattern on the functionalized mutable op: fires on a program calling ``silu_out`` as users write it."""
    register_replacement(_silu_auto_functionalized, _silu, _inputs((4, 8)), fwd_only, pass_dict)


# -- a multi-output replacement inserted out of topological order (pytorch issues 148751, 162019) ---------

def _scaled(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    product = x * y
    return product.relu(), product * z


def scaled_two_outputs(pass_dict: PatternMatcherPass) -> None:
    """A multi-output pattern: torch inserts its replacement before an input defined after the match's start."""

    def replacement(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        product = torch.mul(x, y)
        return torch.relu(product), torch.mul(product, z)

    register_replacement(_scaled, replacement, _inputs((4, 8), (4, 8), (4, 8)), fwd_only, pass_dict)


def scaled_one_output_each(pass_dict: PatternMatcherPass) -> None:
    """The twin: the same rewrite as single-output patterns."""
    register_replacement(lambda x, y: (x * y).relu(), lambda x, y: torch.relu(torch.mul(x, y)),
                         _inputs((4, 8), (4, 8)), fwd_only, pass_dict)


# -- a training pattern whose replacement is right forward and wrong backward ---------------------------

def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


def _trainable(*shapes: tuple[int, ...]) -> list[torch.Tensor]:
    return [t.requires_grad_() for t in _inputs(*shapes)]


def gelu_detached_backward(pass_dict: PatternMatcherPass) -> None:
    """A joint_fwd_bwd pattern whose replacement computes the forward from ``x.detach()`` in the tanh: the
    same outputs, a gradient missing most of its terms (fuzzing the inference graph cannot see it)."""

    def replacement(x: torch.Tensor) -> torch.Tensor:
        inner = x.detach()
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (inner + 0.044715 * inner * inner * inner)))

    register_replacement(_gelu_tanh, replacement, _trainable((4, 8)), joint_fwd_bwd, pass_dict)


def gelu_fused(pass_dict: PatternMatcherPass) -> None:
    """The twin: the fused op, whose backward is the derivative."""
    register_replacement(_gelu_tanh, lambda x: torch.nn.functional.gelu(x, approximate="tanh"), _trainable((4, 8)),
                         joint_fwd_bwd, pass_dict)


# -- correct passes ------------------------------------------------------------------------------------

def double_to_scale(pass_dict: PatternMatcherPass) -> None:
    """``x + x -> 2 * x``."""
    register_replacement(lambda x: x + x, lambda x: x * 2, _inputs((4, 8)), fwd_only, pass_dict)


def _addmm_pass() -> PatternMatcherPass:
    """Inductor's own post-grad ``addmm`` fusion (``register_graph_pattern``, handler ``addmm``), alone."""
    matcher = PatternMatcherPass(pass_name="addmm")
    for key, entries in post_grad.pass_patterns[2].patterns.items():
        matcher.patterns[key].extend(e for e in entries if getattr(e, "handler", None) is post_grad.addmm)
    return matcher


ADDMM = _addmm_pass()  # a transform as it is (form graph), under the inductor captures
INDUCTOR_ADDMM = [PatternExample("addmm", lambda inp, a, b: a @ b + inp, tuple(_inputs((4,), (3, 5), (5, 4))),
                                 fwd_only, {}, ADDMM)]
