"""Common ``torch.nn`` layers in the configurations FX passes mishandle.

A pass written against the model it was developed on meets the defaults: a conv
with a bias, a BatchNorm with affine parameters and running statistics, groups=1.
The modules here put one layer, or a conv followed by a norm, in each of the other
configurations (bias off, ``affine=False``, ``track_running_stats=False``, depthwise
and grouped, dilated, ``padding="same"``, padding modes, 1d / 3d / transposed, a norm
before the conv, a conv with two readers, shared and tied modules, layers as direct
attributes of the root as in attention's ``self.q`` / ``self.k`` / ``self.v``, in-place
ops, integer division). Each builds and runs in milliseconds; ``layers.toml`` lists
them (profile ``layers``, part of ``default`` and ``full``).

torch's own module test database (``torch.testing._internal.common_modules.module_db``)
was considered as the source: it is private API, needs torch's test-only dependencies
(``expecttest``) to import, and changes with every release, so the variants are written
out here instead.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

_CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
_TRANSPOSED = {1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}
_BN = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
CHANNELS = 4


class ConvNorm(nn.Module):
    """``conv -> BatchNorm -> activation`` in one configuration: the shape of every conv/BN fold,
    with whatever the fold might assume away (a bias, affine parameters, running statistics,
    groups=1, the conv coming first)."""

    def __init__(self, dim: int = 2, *, bias: bool = True, affine: bool = True, track_running_stats: bool = True,
                 groups: int = 1, dilation: int = 1, padding: Any = 1, padding_mode: str = "zeros",
                 transposed: bool = False, norm_first: bool = False, eps: float = 1e-5,
                 activation: str = "relu") -> None:
        super().__init__()
        conv = (_TRANSPOSED if transposed else _CONV)[dim]
        extra = {} if transposed else {"padding_mode": padding_mode}
        self.norm_first = norm_first
        self.conv = conv(CHANNELS, CHANNELS, 3, padding=padding, dilation=dilation, groups=groups, bias=bias, **extra)
        self.bn = _BN[dim](CHANNELS, eps=eps, affine=affine, track_running_stats=track_running_stats)
        self.act = {"relu": nn.ReLU(), "relu_inplace": nn.ReLU(inplace=True), "none": nn.Identity()}[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(self.bn(x)) if self.norm_first else self.bn(self.conv(x))
        return self.act(x)


class ConvTwoReaders(nn.Module):
    """A conv whose output a BatchNorm and a skip connection both read: folding the BN into the
    conv changes what the skip connection sees."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1)
        self.bn = nn.BatchNorm2d(CHANNELS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return F.relu(self.bn(y)) + y


class SharedConv(nn.Module):
    """One conv module called twice, each call followed by its own BatchNorm: folding either BN
    into the shared conv's weights changes the other call too."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1)
        self.bn_a = nn.BatchNorm2d(CHANNELS)
        self.bn_b = nn.BatchNorm2d(CHANNELS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn_a(self.conv(x)) + self.bn_b(self.conv(x.flip(-1)))


class SharedActivation(nn.Module):
    """One ``nn.ReLU`` module called twice, as torchvision's BasicBlock does: after the first conv and
    after the residual add. A pass that packs a conv with its activation into one module leaves the
    ReLU reachable under two paths."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1)
        self.conv2 = nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.conv2(self.relu(self.conv1(x))) + x)


class LinearNorm(nn.Module):
    """``Linear -> BatchNorm1d`` (or LayerNorm), with or without a bias and affine parameters."""

    def __init__(self, *, bias: bool = True, affine: bool = True, norm: str = "batch") -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8, bias=bias)
        self.norm = nn.BatchNorm1d(8, affine=affine) if norm == "batch" else nn.LayerNorm(8, elementwise_affine=affine)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.fc(x))


class RootAttention(nn.Module):
    """Self-attention with ``self.q``, ``self.k``, ``self.v`` and ``self.proj`` as direct attributes
    of the root (no submodule path to split on), scaled by a Python float, softmax, an optional
    bias-free projection."""

    def __init__(self, dim: int = 8, *, bias: bool = True) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(dim, dim, bias=bias) for _ in range(3))
        self.proj = nn.Linear(dim, dim, bias=bias)
        self.scale = dim ** -0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attn = (self.q(x) @ self.k(x).transpose(-2, -1)) * self.scale
        return self.proj(attn.softmax(dim=-1) @ self.v(x))


class TiedProjection(nn.Module):
    """An embedding and an output projection sharing one weight (``self.out.weight = self.embed.weight``)."""

    def __init__(self, vocab: int = 16, dim: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, vocab, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.mix(self.embed(tokens))))


class InplaceChain(nn.Module):
    """In-place ops in every spelling: ``nn.ReLU(inplace=True)``, ``F.relu_``, ``x.add_``,
    ``operator.imul`` (``x *= 2``), ``F.hardtanh(inplace=True)``, with a clone before the writes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(CHANNELS, CHANNELS, 1)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.conv(x))
        z = y.clone()
        F.relu_(z.sub_(0.5))
        z *= 2
        return F.hardtanh(z, -1.0, 1.0, inplace=True) + y


class IntegerDivision(nn.Module):
    """Integer and rounding division: ``//``, ``torch.div(rounding_mode="trunc")`` and ``"floor"``,
    ``%`` and ``torch.remainder`` on int64 inputs, whose results differ for negative numbers."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x // 3, torch.div(x, 3, rounding_mode="trunc"), torch.div(x, -3, rounding_mode="floor"),
                x % 3, torch.remainder(x, -3))


class Activations(nn.Module):
    """Activations with parameters a pass must keep: ``PReLU(num_parameters)``, ``LeakyReLU(0.2)``,
    ``Hardtanh(-2, 2)``, tanh-approximated ``GELU``, ``ELU(0.5)``, ``Softplus(beta=2, threshold=5)``."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([
            nn.PReLU(CHANNELS), nn.LeakyReLU(0.2), nn.Hardtanh(-2.0, 2.0), nn.GELU(approximate="tanh"),
            nn.ELU(0.5), nn.Softplus(beta=2.0, threshold=5.0),
        ])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([layer(x) for layer in self.layers])


class Norms(nn.Module):
    """LayerNorm, GroupNorm and InstanceNorm without affine parameters, and an InstanceNorm that
    tracks running statistics (used in eval mode, unlike the default)."""

    def __init__(self, *, affine: bool = False) -> None:
        super().__init__()
        self.layer = nn.LayerNorm([CHANNELS, 8, 8], elementwise_affine=affine)
        self.group = nn.GroupNorm(2, CHANNELS, affine=affine)
        self.instance = nn.InstanceNorm2d(CHANNELS, affine=affine, track_running_stats=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x) + self.group(x) + self.instance(x)


class Pooling(nn.Module):
    """Pooling off the defaults, with padding: ``ceil_mode=True`` (a last, partial window on odd sizes)
    and ``count_include_pad=False`` (padding left out of the average)."""

    def __init__(self) -> None:
        super().__init__()
        self.max = nn.MaxPool2d(3, stride=2, padding=1, dilation=1, ceil_mode=True)
        self.avg = nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.max(x) + self.avg(x)


class Dropouts(nn.Module):
    """Dropout in the module forms a removal pass must handle: ``nn.Dropout``, ``nn.Dropout2d``
    (whole channels) and ``nn.AlphaDropout`` (which also rescales and shifts in training)."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.3)
        self.drop2d = nn.Dropout2d(0.2)
        self.alpha = nn.AlphaDropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha(self.drop2d(self.drop(x)))
