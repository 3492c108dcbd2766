"""The ``symbolic_trace`` capture: ``torch.fx.Tracer`` graphs, traced with a plain tracer, timm's,
or a ``torch.fx.Tracer`` subclass named ``"module:Class"`` (custom leaf modules).

timm registers modules and functions that must stay opaque to FX
(``timm.layers.get_notrace_modules()`` / ``get_notrace_functions()``); the
``timm`` tracer keeps them as leaves, as timm's own feature extraction does.

>>> capture = SymbolicTrace("plain")
>>> gm = capture.capture(nn.Sequential(nn.Linear(2, 2)), training=False)
>>> gm.graph.find_nodes(op="call_module")[0].target, capture.name
('0', 'symbolic_trace')
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import importlib
from collections.abc import Sequence
from typing import Any, TypeVar

import torch
from torch import fx, nn
from torch.fx import _symbolic_trace

from fxverify.capture.base import Capture
from fxverify.capture.copies import converted_copy
from fxverify.core import captures
from fxverify.core.transform import Transform

ModuleT = TypeVar("ModuleT", bound=nn.Module)



@dataclasses.dataclass(frozen=True)
class SymbolicTrace(Capture):
    """``torch.fx`` symbolic tracing with the tracer ``tracer`` (``"plain"``, ``"timm"`` or
    ``"module:TracerClass"``) and the model's ``concrete_args`` (specialised arguments, as
    ``(name, value)`` pairs). Transforms following the torch.fx docs' ``transform(m, tracer_class)``
    convention get the tracer class as their second argument."""

    tracer: str = "plain"
    concrete_args: tuple[tuple[str, Any], ...] = ()
    name = captures.DEFAULT_CAPTURE

    @property
    def traits(self) -> captures.CaptureTraits:
        """The registry's ``symbolic_trace`` traits (also for a subclass under another name)."""
        return captures.spec(captures.DEFAULT_CAPTURE).traits

    @property
    def tracer_class(self) -> type[fx.Tracer]:
        return tracer_class(self.tracer)

    def capture(self, module: nn.Module, *, training: bool, inputs: tuple[Any, ...] = ()) -> fx.GraphModule:
        """``module`` put in the given mode and traced into a fresh ``GraphModule`` (what tracing runs
        through, ``if self.training:``, follows the mode); symbolic tracing needs no ``inputs``."""
        if isinstance(module, nn.Module):
            module.train(training)
        forget_unpatchable_wraps()
        graph = self.tracer_class().trace(module, concrete_args=dict(self.concrete_args) or None)
        name = module.__class__.__name__ if isinstance(module, nn.Module) else module.__name__
        return fx.GraphModule(module, graph, class_name=name).train(training)

    def recapture(self, gm: fx.GraphModule) -> fx.Graph:
        """The graph of ``gm``'s generated code traced again, the modules it calls kept leaves (so the
        code is what is compared, not the tracer's leaf policy; the concrete args are not passed again:
        the code already holds their specialisation)."""
        called = {str(n.target) for n in gm.graph.find_nodes(op="call_module")}
        base = self.tracer_class

        class KeepCalledModules(base):  # type: ignore[misc,valid-type]
            def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
                return qualname in called or super().is_leaf_module(m, qualname)

        forget_unpatchable_wraps()
        try:
            return KeepCalledModules().trace(gm)
        finally:
            forget_unpatchable_wraps()

    def apply(self, transform: Transform, gm: fx.GraphModule, *, timeout: float | None) -> tuple[nn.Module, bool]:
        """``transform`` called on ``gm`` as its users call it: ``(result, in_place)``."""
        try:
            return transform.apply(gm, *([self.tracer_class] if transform.takes_tracer_class else []), timeout=timeout)
        finally:
            forget_unpatchable_wraps()  # a transform that re-traces may have left a registration behind

    def in_dtype(self, gm: fx.GraphModule, dtype: torch.dtype) -> fx.GraphModule:
        """A converted copy: a symbolic trace is the model's code, whatever its dtype."""
        return converted_copy(gm, dtype=dtype)

    def accepts(self, shapes: Sequence[tuple[int, ...]], captured: Sequence[tuple[int, ...]]) -> bool:
        """Always: a symbolic trace is shape-agnostic as far as its capture goes."""
        return True

    def describe(self) -> str:
        """e.g. ``symbolic_trace (tracer timm)``."""
        return f"{self.name} (tracer {self.tracer})"


def for_model(facts: captures.ModelFacts) -> SymbolicTrace:
    """The ``symbolic_trace`` capture of a model: its tracer and concrete args (the registry's factory)."""
    return SymbolicTrace(facts.tracer, facts.concrete_args)


@functools.cache
def tracer_class(kind: str) -> type[fx.Tracer]:
    """The tracer class for ``kind`` ("plain", "timm" or "module:TracerClass").

    >>> tracer_class("plain") is fx.Tracer
    True
    """
    if kind == "plain":
        return fx.Tracer
    if kind == "timm":
        import timm.layers

        leaves = tuple(timm.layers.get_notrace_modules())
        functions = tuple(timm.layers.get_notrace_functions())

        class TimmTracer(fx.Tracer):
            """Keeps timm's registered no-trace modules and functions opaque."""

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs.setdefault("autowrap_functions", functions)
                super().__init__(*args, **kwargs)

            def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
                return isinstance(m, leaves) or super().is_leaf_module(m, qualname)

        return TimmTracer
    module_name, sep, attr = kind.partition(":")
    if sep:
        cls = getattr(importlib.import_module(module_name), attr, None)
        if isinstance(cls, type) and issubclass(cls, fx.Tracer):
            return cls
        raise ValueError(f"tracer {kind!r} is not a torch.fx.Tracer subclass")
    raise ValueError(f"unknown tracer {kind!r}; expected 'plain', 'timm' or 'module:TracerClass'")


def forget_unpatchable_wraps() -> None:
    """Drop ``torch.fx.wrap`` registrations that would make every later trace raise ``KeyError``.

    Retracing a GraphModule that was traced with a ``None`` concrete arg (as
    torch's ``fuse`` and ``remove_dropout`` do) runs its generated
    ``wrap("torch.fx._symbolic_trace._assert_is_none")``, which registers a
    dotted name that no module's globals hold; from then on torch's tracer fails
    on every trace in the process (torch 2.14). One model must not break the
    models checked after it, so fxverify forgets such registrations before each
    trace and after each transform.
    """
    registry = _symbolic_trace._wrapped_fns_to_patch
    for key, frame_dict in list(registry.items()):
        name = key[1]
        if name not in frame_dict and not hasattr(builtins, name):
            del registry[key]

