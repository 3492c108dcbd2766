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
>>> capture.name, capture.opset, capture.skips("dynamic") is not None
('make_fx', 'functional', True)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, TypeVar

import torch
from torch import fx, nn

from fxverify.capture.copies import converted_copy, not_moved
from fxverify.capture.lifted_buffers import lifted_make_fx, refuses_buffer_update, writes_attributes
from fxverify.core.transform import Transform

ModuleT = TypeVar("ModuleT", bound=nn.Module)

_SKIPS = {
    "dynamic": "make_fx graphs are traced with static shapes here (tracing_mode='fake')",
    "retrace": "re-capturing a make_fx graph's code is not built",
    "verifier": "make_fx graphs come with no ExportedProgram and no signature to verify (meta and opset check "
                "the rules of torch's Verifier that apply to their nodes)",
    "serde": "make_fx graphs come with no ExportedProgram to save (pickle and to_folder save them)",
    "reexport": "re-exporting is checked on the export captures",
    "cuda": not_moved("make_fx"),
}


@dataclasses.dataclass(frozen=True)
class MakeFx:
    """``make_fx`` of the functionalized model in the given mode, on the example inputs, static shapes."""

    name = "make_fx"
    opset = "functional"
    bakes_dtypes = True  # ATen nodes bake dtype=: a float64 copy is the float64 model traced again
    switches_mode = False  # the mode is traced in (batch_norm's training flag is an argument)
    keeps_captures = True

    def for_transform(self, transform: Transform) -> MakeFx:
        """This capture: it needs nothing of the transform."""
        return self

    def at_example_shapes(self) -> MakeFx:
        """This capture: its graphs have no dynamic dimension."""
        return self

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

    def in_dtype(self, gm: fx.GraphModule, dtype: torch.dtype) -> None:
        """None: make_fx keeps parameters as plain tensor attributes, which a converted copy leaves in
        float32 where the model in ``dtype`` has them in ``dtype``; the model is traced again."""
        return None

    def recapture(self, gm: fx.GraphModule) -> fx.Graph:
        raise NotImplementedError(_SKIPS["retrace"])  # skipped: see skips()

    def reexport(self, module: nn.Module, inputs: tuple[Any, ...]) -> fx.GraphModule:
        raise NotImplementedError(_SKIPS["reexport"])  # skipped: see skips()

    def apply(self, transform: Transform, gm: fx.GraphModule, *, timeout: float | None) -> tuple[nn.Module, bool]:
        """``transform(gm)``."""
        return transform.apply(gm, timeout=timeout)

    def input_change(self, original: fx.GraphModule, given: fx.GraphModule) -> None:
        """None: a make_fx graph is given as it is (the subject's snapshot of the module covers it)."""
        return None

    def set_mode(self, module: ModuleT, training: bool) -> ModuleT:
        """``module`` in the mode (the graph's own behaviour was fixed when it was traced)."""
        return module.train(training)

    def convert(self, module: ModuleT, *, dtype: torch.dtype | None = None, device: str | None = None) -> ModuleT:
        """See :func:`~fxverify.capture.copies.converted_copy`."""
        return converted_copy(module, dtype=dtype, device=device)

    def accepts(self, shapes: Sequence[tuple[int, ...]], captured: Sequence[tuple[int, ...]]) -> bool:
        """Inputs of the traced shapes only."""
        return [tuple(s) for s in shapes] == [tuple(c) for c in captured]

    def skips(self, check: str) -> str | None:
        """Why ``check`` does not apply to make_fx graphs, or None."""
        return _SKIPS.get(check)

    def describe(self) -> str:
        return "make_fx (functionalized, tracing_mode='fake', static shapes)"


def _buffer_values(module: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of each buffer's value, to undo what a first trace of a model updating them did."""
    return {name: buffer.detach().clone() for name, buffer in module.named_buffers()}


def _restore_buffers(module: nn.Module, saved: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, buffer in module.named_buffers():
            if name in saved and not torch.equal(buffer, saved[name]):
                buffer.copy_(saved[name])
