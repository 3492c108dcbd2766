"""Example transforms shipped with fxverify, used by README's quick start.

``fuse_conv_bn`` folds BatchNorm into the preceding convolution with torch's
own ``torch.fx.experimental.optimization.fuse``: an inference-only pass that
rewrites parameters, so it declares that contract.

>>> import fxverify
>>> fxverify.contract_of(fuse_conv_bn).modes
('eval',)
"""

from __future__ import annotations

from typing import Any

from torch import fx, nn

from fxverify.core.contracts import contract


@contract(modes=("eval",), changes_parameters=True)
def fuse_conv_bn(gm: fx.GraphModule) -> nn.Module:
    """Fold eval-mode BatchNorm into the preceding Conv (torch's ``fuse``)."""
    from torch.fx.experimental.optimization import fuse

    return fuse(gm, no_trace=True)  # gm is already traced, maybe with a custom tracer: do not retrace


def identity(gm: fx.GraphModule) -> fx.GraphModule:
    """Rebuild the module through ``torch.fx.Transformer``, each node keeping its ``meta`` (the Transformer drops
    ``meta['val']``, which ATen graphs carry and ExecuTorch's verifier requires) and the module its ``gm.meta`` (where
    ``prepare_pt2e`` records what ``convert_pt2e`` asserts): changes nothing."""
    result = KeepWrappedTransformer(gm).transform()
    for before, after in zip(gm.graph.nodes, result.graph.nodes, strict=True):
        after.meta = {**before.meta, **after.meta}
    result.meta = {**gm.meta, **result.meta}
    return result


class KeepWrappedTransformer(fx.Transformer):
    """A ``torch.fx.Transformer`` that keeps calls of ``torch.fx.wrap``-ed functions wrapped.

    torch's Transformer drops ``node.meta["is_wrapped"]``, the mark that makes the
    generated code re-register the function with ``torch.fx.wrap``: its result then
    cannot be re-traced or unpickled (the ``retrace`` and ``pickle`` checks catch
    that). Subclass this instead of ``fx.Transformer`` to keep the mark.
    """

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        if n.meta.get("is_wrapped") and isinstance(value, fx.Proxy):
            value.node.meta["is_wrapped"] = True
        return value
