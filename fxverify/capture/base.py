"""The base every capture subclasses: two members to write (``name`` and ``capture``), the rest with
defaults that suit a capture of torch-level, static graphs, overridden where a capture differs.

A capture is registered with one row of :data:`fxverify.core.captures.REGISTRY` naming its
module and factory; its ``traits`` come from that row unless the capture narrows them.

>>> import dataclasses
>>> from torch import fx, nn
>>> @dataclasses.dataclass(frozen=True)
... class Traced(Capture):
...     name = "symbolic_trace"  # a registered name: its traits come from the registry
...     def capture(self, module, *, training, inputs=()):
...         return fx.symbolic_trace(module.train(training))
>>> capture = Traced()
>>> capture.traits.recaptures, capture.accepts([(2, 3)], [(2, 3)]), capture.describe()
(True, True, 'symbolic_trace')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import torch
from torch import fx, nn

from fxverify.analysis.compare import Tolerance
from fxverify.capture.copies import converted_copy
from fxverify.core import captures
from fxverify.core.transform import Transform

ModuleT = TypeVar("ModuleT", bound=nn.Module)


def interpreted(self: fx.GraphModule, *args: Any) -> Any:
    """A ``GraphModule``'s ``forward`` that runs its graph with ``torch.fx.Interpreter`` instead of its generated code
    (where that code cannot run: a capture's module class sets it as its ``forward``)."""
    return fx.Interpreter(self).run(*args)


class Capture:
    """How a model becomes a graph a transform takes (``name`` shows in messages, reports and item ids)."""

    bakes_dtypes = False
    """Whether its graphs bake dtypes into node arguments: a float64 original is then the model as captured
    in float64 (:meth:`in_dtype`, or captured again) and a float64 result the transform applied to it,
    never a converted result."""

    keeps_captures = False
    """Whether capturing costs so much more than copying that a subject keeps one capture per mode and dtype
    and copies it for each use."""

    switches_mode = True
    """Whether ``.train()`` / ``.eval()`` of a captured module is checked (numerics' switched runs)."""

    inference_only = False
    """Whether it captures every model in eval mode, whatever mode is asked (a graph for inference: a quantized or
    an Edge program): no check runs the transform on a train-mode capture, which would be the same graph."""

    repro_given: tuple[str, str] | None = None
    """For a capture that the minimiser uses to capture each candidate again (its transform needs what the
    capture gives, e.g. ``meta['val']``): how a repro script makes the graph the transform is given from
    the minimised module, ``(import line, expression)`` over ``Repro(saved)`` and ``saved["inputs"]``;
    None: candidates are symbolic traces."""

    @property
    def name(self) -> str:
        raise NotImplementedError(f"{type(self).__name__} must say its name")

    @property
    def traits(self) -> captures.CaptureTraits:
        """What its graphs are, as checks ask it: the registry row's traits (a capture may narrow them)."""
        try:
            return captures.spec(self.name).traits
        except KeyError:
            raise NotImplementedError(f"{type(self).__name__} ({self.name}) is not registered in "
                                      "fxverify.core.captures.REGISTRY: register it, or define its traits") from None

    def capture(self, module: nn.Module, *, training: bool, inputs: tuple[Any, ...] = ()) -> fx.GraphModule:
        """A fresh graph of ``module`` in the given mode (``inputs``: example inputs, for captures that run it)."""
        raise NotImplementedError(f"{type(self).__name__} must define capture()")

    reads_settings = False
    """Whether :meth:`configured` reads the run's settings (a process capturing the model again is then sent the
    configured capture, not its name)."""

    def configured(self, settings: Mapping[str, Any]) -> Capture:
        """This capture with what it reads of the run's ``settings`` (``quantizer``: the ``pt2e`` capture's,
        ``--fxverify-quantizer``; None where not given); itself (the default) where it reads none."""
        return self

    def for_transform(self, transform: Transform) -> Capture:
        """This capture set up for ``transform`` (an export keeps its program for a transform that takes one)."""
        return self

    def at_example_shapes(self) -> Capture:
        """This capture without dynamic dimensions (itself where it has none): for a stage that runs the
        example inputs only."""
        return self

    def in_dtype(self, gm: fx.GraphModule, dtype: torch.dtype) -> fx.GraphModule | None:
        """``gm``, a fresh capture of a model, as capturing the model in ``dtype`` gives it, made without
        capturing again (a converted copy); None (the default) where only capturing the model again gives that."""
        return None

    def tolerance(self, original: fx.GraphModule) -> Tolerance | None:
        """How far a result may move the outputs of ``original`` (a fresh capture) beyond the dtype's rounding, as
        its graphs compute (a quantized graph: in quantization steps); None (the default): nothing more."""
        return None

    def recapture(self, gm: fx.GraphModule) -> fx.Graph:
        """The graph of ``gm``'s own code captured again (compared with ``gm.graph`` by checks that need the
        ``recaptures`` trait)."""
        raise NotImplementedError(f"{self.name} graphs are not captured again from their code")

    def reexport(self, module: nn.Module, inputs: tuple[Any, ...]) -> fx.GraphModule:
        """``module`` (a captured graph or a result) captured again from ``inputs`` as a model is, where its
        users do that (captures with the ``has_program`` trait)."""
        raise NotImplementedError(f"{self.name} graphs are not exported again")

    def apply(self, transform: Transform, gm: fx.GraphModule, *, timeout: float | None) -> tuple[nn.Module, bool]:
        """``transform`` called on ``gm`` as its users call it; ``(result, in_place)``."""
        return transform.apply(gm, timeout=timeout)

    def fired_in(self, result: nn.Module) -> tuple[str, ...] | None:
        """Which of its graphs the transform changed, for a capture of several graphs a pass runs on one by one
        (``inference``; ``forward``, ``backward``), which the summary's ``changed`` column shows; None (the
        default): one graph."""
        return None

    def input_change(self, original: fx.GraphModule, given: fx.GraphModule) -> str | None:
        """What a transform of form ``program`` that returned another program changed in the program it was
        given, compared with the capture ``original``; None (the default: the subject's snapshot of the
        module it was given covers the rest)."""
        return None

    def set_mode(self, module: ModuleT, training: bool) -> ModuleT:
        """``module`` put in train or eval mode where its capture allows it; ``module`` returned."""
        return module.train(training)

    def convert(self, module: ModuleT, *, dtype: torch.dtype | None = None, device: str | None = None) -> ModuleT:
        """A copy of ``module`` in ``dtype`` and / or on ``device`` (the float64, meta and CUDA runs);
        :class:`~fxverify.errors.CopyFailed` when the module cannot be copied."""
        return converted_copy(module, dtype=dtype, device=device)

    def accepts(self, shapes: Sequence[tuple[int, ...]], captured: Sequence[tuple[int, ...]]) -> bool:
        """Whether a graph captured from inputs of ``captured`` shapes runs on inputs of ``shapes`` (the input
        configurations it is checked at); by default, inputs of the captured shapes only."""
        return [tuple(s) for s in shapes] == [tuple(c) for c in captured]

    def describe(self) -> str:
        """One line for failure messages, e.g. ``symbolic_trace (tracer timm)``."""
        return self.name
