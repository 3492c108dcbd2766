"""Captures: how a model becomes the graph a transform takes.

Everything fxverify does with graphs goes through one small protocol, :class:`Capture`:
capture a model in a mode from example inputs, capture a result's code again (the ``retrace``
check), apply a transform to a capture the way its users do, put a module in a mode, convert a
module for the float64 and device runs, and say which checks do not apply to its graphs. Nothing
else in fxverify knows how a graph was made. :class:`~fxverify.capture.symbolic.SymbolicTrace`
(``torch.fx`` symbolic tracing with a plain, timm's or a custom tracer) is the default;
:class:`~fxverify.capture.export.Export` gives ``torch.export`` graphs (``export``,
``export_core``) and :class:`~fxverify.capture.make_fx.MakeFx` functionalized ``make_fx`` graphs;
``docs/architecture.md`` shows how to add another.

>>> capture = for_entry("plain")
>>> capture.name, capture.skips("retrace")
('symbolic_trace', None)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar

import torch
from torch import fx, nn

from fxverify.capture.export import Export
from fxverify.capture.make_fx import MakeFx
from fxverify.capture.symbolic import SymbolicTrace, symbolic
from fxverify.core.transform import Transform

__all__ = ["Capture", "Export", "MakeFx", "SymbolicTrace", "for_entry"]

ModuleT = TypeVar("ModuleT", bound=nn.Module)


class Capture(Protocol):
    """How a model becomes a graph a transform takes (``name`` shows in messages and reports)."""

    @property
    def name(self) -> str: ...

    @property
    def opset(self) -> str | None:
        """The operator set its graphs promise (the ``opset`` check): ``aten`` (ATen operators),
        ``functional`` (also no mutable schema), ``core`` (also core ATen), or None (torch-level)."""
        ...

    @property
    def bakes_dtypes(self) -> bool:
        """Whether its graphs bake dtypes into node arguments: a float64 original is then the model as
        captured in float64 (:meth:`in_dtype`, or captured again) and a float64 result the transform
        applied to it, never a converted result."""
        ...

    @property
    def keeps_captures(self) -> bool:
        """Whether capturing costs so much more than copying that a subject keeps one capture per mode
        and dtype and copies it for each use."""
        ...

    @property
    def switches_mode(self) -> bool:
        """Whether ``.train()`` / ``.eval()`` of a captured module is checked (numerics' switched runs)."""
        ...

    def for_transform(self, transform: Transform) -> Capture:
        """This capture set up for ``transform`` (an export keeps its program for a transform that takes one)."""
        ...

    def at_example_shapes(self) -> Capture:
        """This capture without dynamic dimensions (itself where it has none): for a stage that runs the
        example inputs only (a static export costs about half a dynamic one)."""
        ...

    def in_dtype(self, gm: fx.GraphModule, dtype: torch.dtype) -> fx.GraphModule | None:
        """``gm``, a fresh capture of a model, as capturing the model in ``dtype`` gives it, made without
        capturing again (a converted copy); None where only capturing the model again gives that."""
        ...

    def capture(self, module: nn.Module, *, training: bool, inputs: tuple[Any, ...] = ()) -> fx.GraphModule:
        """A fresh graph of ``module`` in the given mode (``inputs``: example inputs, for captures that run it)."""
        ...

    def recapture(self, gm: fx.GraphModule) -> fx.Graph:
        """The graph of ``gm``'s own code captured again (compared with ``gm.graph`` by ``retrace``)."""
        ...

    def reexport(self, module: nn.Module, inputs: tuple[Any, ...]) -> fx.GraphModule:
        """``module`` (a captured graph or a result) captured again from ``inputs`` as a model is, where
        its users do that (``reexport``: a PT2E or ExecuTorch flow exports the transformed module)."""
        ...

    def apply(self, transform: Transform, gm: fx.GraphModule, *, timeout: float | None) -> tuple[nn.Module, bool]:
        """``transform`` called on ``gm`` as its users call it; ``(result, in_place)``."""
        ...

    def input_change(self, original: fx.GraphModule, given: fx.GraphModule) -> str | None:
        """What a transform of form ``program`` that returned another program changed in the program it was
        given (an export capture's, kept in ``given``), compared with the capture ``original``; None."""
        ...

    def set_mode(self, module: ModuleT, training: bool) -> ModuleT:
        """``module`` put in train or eval mode where its capture allows it; ``module`` returned."""
        ...

    def convert(self, module: ModuleT, *, dtype: torch.dtype | None = None, device: str | None = None) -> ModuleT:
        """A copy of ``module`` in ``dtype`` and / or on ``device`` (the float64, meta and CUDA runs);
        :class:`~fxverify.errors.CopyFailed` when the module cannot be copied."""
        ...

    def accepts(self, shapes: Sequence[tuple[int, ...]], captured: Sequence[tuple[int, ...]]) -> bool:
        """Whether a graph captured from inputs of ``captured`` shapes runs on inputs of ``shapes``
        (the input configurations it is checked at)."""
        ...

    def skips(self, check: str) -> str | None:
        """Why ``check`` does not apply to this capture's graphs (it is then skipped, saying so), or None."""
        ...

    def describe(self) -> str:
        """One line for failure messages, e.g. ``symbolic_trace (tracer timm)``."""
        ...


def for_entry(tracer: str, concrete_args: Mapping[str, Any] | None = None) -> Capture:
    """The capture of a corpus entry: its ``tracer`` (``plain``, ``timm``, ``module:TracerClass``) and
    ``concrete_args``."""
    return symbolic(tracer, concrete_args)

