"""Captures: how a model becomes the graph a transform takes.

Everything fxverify does with graphs goes through one small base class, :class:`Capture`
(:mod:`fxverify.capture.base`): capture a model in a mode from example inputs, capture a result's
code again (the ``retrace`` check), apply a transform to a capture the way its users do, put a
module in a mode, convert a module for the float64 and device runs. What its graphs are (they
carry ``meta['val']``, come with a program, have a dynamic batch...) is its ``traits``, from its row
of the capture registry (:mod:`fxverify.core.captures`), which checks read to know whether they
apply. Nothing else in fxverify knows how a graph was made.
:class:`~fxverify.capture.symbolic.SymbolicTrace` (``torch.fx`` symbolic tracing with a plain,
timm's or a custom tracer) is the default; :class:`~fxverify.capture.export.Export` gives
``torch.export`` graphs (``export``, ``export_core``) and :class:`~fxverify.capture.make_fx.MakeFx`
functionalized ``make_fx`` graphs; ``docs/architecture.md`` shows how to add another.

>>> capture = for_entry("plain")
>>> capture.name, capture.traits.recaptures
('symbolic_trace', True)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fxverify.capture.base import Capture
from fxverify.capture.export import Export
from fxverify.capture.make_fx import MakeFx
from fxverify.capture.symbolic import SymbolicTrace

__all__ = ["Capture", "Export", "MakeFx", "SymbolicTrace", "for_entry"]


def for_entry(tracer: str, concrete_args: Mapping[str, Any] | None = None) -> Capture:
    """The capture of a corpus entry: its ``tracer`` (``plain``, ``timm``, ``module:TracerClass``) and
    ``concrete_args``."""
    return SymbolicTrace(tracer, tuple((concrete_args or {}).items()))
