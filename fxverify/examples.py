"""Example transforms shipped with fxverify, used by README's quick start.

``fuse_conv_bn`` folds BatchNorm into the preceding convolution with torch's
own ``torch.fx.experimental.optimization.fuse``: an inference-only pass that
rewrites parameters, so it declares that contract.

>>> import fxverify
>>> fxverify.contract_of(fuse_conv_bn).modes
('eval',)
"""

from __future__ import annotations

from torch import fx, nn

from fxverify.contracts import contract


@contract(modes=("eval",), changes_parameters=True)
def fuse_conv_bn(gm: fx.GraphModule) -> nn.Module:
    """Fold eval-mode BatchNorm into the preceding Conv (torch's ``fuse``)."""
    from torch.fx.experimental.optimization import fuse

    return fuse(gm, no_trace=True)  # gm is already traced, maybe with a custom tracer: do not retrace


def identity(gm: fx.GraphModule) -> fx.GraphModule:
    """Rebuild the module through ``torch.fx.Transformer``: changes nothing."""
    return fx.Transformer(gm).transform()
