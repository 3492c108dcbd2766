"""Model state randomisation: freshly initialised models hide whole classes of bugs.

A BatchNorm fold that ignores ``running_mean`` is exact when the mean is 0; a
bug in a residual branch vanishes behind a layer-scale gamma of 1e-6. So before
any transform runs, BatchNorm statistics and affine parameters, and every
parameter initialised to a constant (zero biases, classifier heads, gammas),
get non-trivial random values.
"""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def randomize_state(module: nn.Module, seed: int = 0) -> nn.Module:
    """Give ``module`` non-trivial statistics and parameters, in place; returns it.

    >>> bn = randomize_state(nn.BatchNorm2d(4))
    >>> bool((bn.running_mean != 0).all() and (bn.running_var != 1).all())
    True
    """
    gen = torch.Generator().manual_seed(seed)

    def uniform(t: torch.Tensor, low: float, high: float) -> torch.Tensor:
        return (torch.rand(t.shape, generator=gen, dtype=torch.float64) * (high - low) + low).to(t.dtype)

    for sub in module.modules():
        if isinstance(sub, nn.modules.batchnorm._BatchNorm) and sub.track_running_stats:
            if sub.running_mean is not None:
                sub.running_mean.copy_(uniform(sub.running_mean, -0.5, 0.5))
            if sub.running_var is not None:
                sub.running_var.copy_(uniform(sub.running_var, 0.5, 2.0))
            if sub.affine:
                sub.weight.copy_(uniform(sub.weight, 0.5, 1.5))
                sub.bias.copy_(uniform(sub.bias, -0.3, 0.3))
    for param in module.parameters():
        if not param.is_floating_point() or param.numel() == 0:
            continue
        first = param.reshape(-1)[0]
        if bool((param == first).all()):
            value = float(first)
            magnitude = max(abs(value), 0.1)
            if value > 0:
                param.copy_(uniform(param, 0.5 * magnitude, 1.5 * magnitude))
            elif value < 0:
                param.copy_(uniform(param, -1.5 * magnitude, -0.5 * magnitude))
            else:
                param.copy_(uniform(param, -magnitude, magnitude))
    return module
