"""The ``make_fx`` capture: functionalized ATen graphs from ``torch.fx.experimental.proxy_tensor``.

``make_fx(torch.func.functionalize(model), tracing_mode="fake")(*inputs)`` on the example inputs: a
``GraphModule`` of ATen operators whose parameters and buffers are ``get_attr`` constants and
whose every node carries ``meta['val']`` (a FakeTensor), the graphs AOTAutograd-style and
Inductor-style passes take. Shapes are static (``fake``, not ``symbolic``, tracing), so the
``dynamic`` check skips. Unlike ``torch.export``, torch verifies nothing about these graphs (only
``graph.lint()``): a node without ``meta['val']`` or a torch-level function passes silently, which
``meta`` and ``opset`` report. Functionalization removes mutations of the inputs, not of the
model's own buffers: a ``BatchNorm`` in train mode still updates its running statistics in place.

>>> capture = MakeFx()
>>> capture.name, capture.traits.opset, capture.traits.dynamic_batch
('make_fx', 'functional', False)
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import torch
from torch import fx, nn

from fxverify.capture.base import Capture
from fxverify.capture.lifted_buffers import lifted_make_fx, refuses_buffer_update, writes_attributes
from fxverify.core import captures

ModuleT = TypeVar("ModuleT", bound=nn.Module)



@dataclasses.dataclass(frozen=True)
class MakeFx(Capture):
    """``make_fx`` of the functionalized model in the given mode, on the example inputs, static shapes."""

    name = "make_fx"
    repro_given = ("from torch.fx.experimental.proxy_tensor import make_fx",
                   'make_fx(torch.func.functionalize(Repro(saved)), tracing_mode="fake", _allow_non_fake_inputs=True)'
                   '(*_clone(saved["inputs"]))')
    bakes_dtypes = True  # ATen nodes bake dtype=: a float64 copy is the float64 model traced again
    switches_mode = False  # the mode is traced in (batch_norm's training flag is an argument)
    keeps_captures = True

    def capture(self, module: nn.Module, *, training: bool, inputs: tuple[Any, ...] = ()) -> fx.GraphModule:
        """A fresh functionalized ATen graph of ``module`` in the given mode, traced on ``inputs``."""
        from torch.fx.experimental.proxy_tensor import make_fx

        if not inputs:
            raise ValueError("the make_fx capture needs example inputs")
        module.train(training)
        saved = _buffer_values(module)  # a buffer updated by constants alone is updated while tracing
        traced = make_fx(torch.func.functionalize(module), tracing_mode="fake", _allow_non_fake_inputs=True)
        try:
            gm: fx.GraphModule = traced(*inputs)
        except RuntimeError as error:
            if not refuses_buffer_update(error):
                raise
        else:
            if not writes_attributes(gm):
                return gm  # forward updates no buffer: the plain functionalized graph
        _restore_buffers(module, saved)
        return lifted_make_fx(module, inputs)  # the buffers lifted, their updates written back with copy_

    # in_dtype: None (the default): make_fx keeps parameters as plain tensor attributes, which a converted
    # copy leaves in float32 where the model in ``dtype`` has them in ``dtype``; the model is traced again.
    # accepts: the traced shapes only (the default); the mode is traced in, set_mode only sets the flag.

    def describe(self) -> str:
        return "make_fx (functionalized, tracing_mode='fake', static shapes)"


def for_model(facts: captures.ModelFacts) -> MakeFx:
    """The ``make_fx`` capture of a model (the registry's factory): static shapes, whatever the batch sizes."""
    return MakeFx()


def _buffer_values(module: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of each buffer's value, to undo what a first trace of a model updating them did."""
    return {name: buffer.detach().clone() for name, buffer in module.named_buffers()}


def _restore_buffers(module: nn.Module, saved: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, buffer in module.named_buffers():
            if name in saved and not torch.equal(buffer, saved[name]):
                buffer.copy_(saved[name])
