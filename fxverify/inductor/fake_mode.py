"""The fake mode Inductor's passes run in: ``compile_fx`` sets ``V.fake_mode`` around AOTAutograd, so around the
joint-graph and post-grad passes and every hook's pass, to the FakeTensorMode of the graph's ``meta['val']``.

>>> import torch
>>> from torch import fx
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> traced = make_fx(torch.relu, tracing_mode="fake")(torch.ones(2))
>>> fake_mode_of(fx.symbolic_trace(torch.nn.ReLU())) is None, type(fake_mode_of(traced)).__name__
(True, 'FakeTensorMode')
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from torch import fx

if TYPE_CHECKING:
    from torch._subclasses.fake_tensor import FakeTensorMode


def graph_fake_mode(gm: fx.GraphModule) -> contextlib.AbstractContextManager[Any]:
    """``V.fake_mode`` set to the FakeTensorMode of ``gm``'s ``meta['val']``, as ``compile_fx`` sets it around
    AOTAutograd, so around Inductor's joint-graph and post-grad passes and every hook's pass (a pattern's
    ``replace_by_example`` traces its replacement in it: ``torch.scalar_tensor`` in ``mul_softmax_pattern`` makes a
    FakeTensor there, a real tensor otherwise); nothing where ``gm`` has none.

    >>> import torch
    >>> with graph_fake_mode(fx.symbolic_trace(torch.nn.ReLU())):  # no meta['val']: V.fake_mode left as it is
    ...     pass
    """
    from torch._inductor.virtualized import V

    fake_mode = fake_mode_of(gm)
    return contextlib.nullcontext() if fake_mode is None else V.set_fake_mode(fake_mode)


def fake_mode_of(gm: fx.GraphModule) -> FakeTensorMode | None:
    """The FakeTensorMode of the FakeTensors in ``gm``'s ``meta['val']``, None where it holds none (the module's
    example shows both)."""
    from torch._guards import detect_fake_mode

    return detect_fake_mode([node.meta.get("val") for node in gm.graph.nodes])
