"""Tracers used to capture corpus models: plain ``torch.fx.Tracer``, timm's, or a
``torch.fx.Tracer`` subclass named ``"module:Class"`` (custom leaf modules).

timm registers modules and functions that must stay opaque to FX
(``timm.layers.get_notrace_modules()`` / ``get_notrace_functions()``); the
``timm`` tracer keeps them as leaves, as timm's own feature extraction does.
"""

from __future__ import annotations

import builtins
import functools
import importlib
from typing import Any

from torch import fx, nn


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


def trace(module: nn.Module, kind: str = "plain", concrete_args: dict[str, Any] | None = None) -> fx.GraphModule:
    """Trace ``module`` with the tracer ``kind`` into a ``GraphModule``.

    >>> trace(nn.Sequential(nn.Linear(2, 2))).graph.find_nodes(op="call_module")[0].target
    '0'
    """
    forget_unpatchable_wraps()
    graph = tracer_class(kind)().trace(module, concrete_args=concrete_args or None)
    name = module.__class__.__name__ if isinstance(module, nn.Module) else module.__name__
    return fx.GraphModule(module, graph, class_name=name)



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
    from torch.fx import _symbolic_trace

    registry = _symbolic_trace._wrapped_fns_to_patch
    for key, frame_dict in list(registry.items()):
        name = key[1]
        if name not in frame_dict and not hasattr(builtins, name):
            del registry[key]
