"""The ``pt2e_prepared`` capture: the prepared PT2E graph, observers in place, the ``GraphModule`` a pass that runs
before calibration takes.

The model is exported as the ``pt2e`` capture exports it, then ``prepare_pt2e`` with the run's quantizer
(:func:`~fxverify.capture.pt2e.quantizer_of`, ``--fxverify-quantizer``, torchao's ``X86InductorQuantizer`` by
default), and nothing more: no calibration, no ``convert_pt2e``. What the graph is (measured with torchao 0.18):
every observed edge reads a ``call_module`` node of an observer (``HistogramObserver``, ``PerChannelMinMaxObserver``,
...: a class named ``...Observer`` or ``...FakeQuantize``) placed by ``prepare_pt2e``; a ``SharedQuantizationSpec``
(XNNPACK's ``cat`` and ``max_pool2d``) is one observer module registered under several names, each name called
at its own node, and an input read by several annotated consumers with equal specs is one observer node those
consumers share; the quantizer's ``node.meta["quantization_annotation"]`` stays on the nodes it annotated; the
observer nodes carry no ``meta['val']``.

Its graphs compute in float (an observer passes its input through, recording its range in its buffers), so
the float checks apply, the float64 run included; its modules do not pickle (the export's guard function), PT2E is
for inference (eval mode whatever is asked), and a dynamic batch is kept where the model is checked at several
batch sizes. The ``observers`` check judges what a pass did to the observers (:mod:`fxverify.analysis.observers`).
Where ``prepare_pt2e`` raises on a model, its items skip, saying so.

>>> capture = Pt2ePrepared()
>>> capture.name, capture.traits.observed, capture.traits.quantized, capture.traits.carries_meta_val
('pt2e_prepared', True, False, False)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import fx, nn

from fxverify.analysis.compare import Tolerance
from fxverify.capture.export import BATCH_RANGE, batch_range
from fxverify.capture.export import for_model as export_for_model
from fxverify.capture.pt2e import Pt2e, prepared_with, with_quantizer
from fxverify.core import captures


def prepared(exported: fx.GraphModule, quantizer: str) -> fx.GraphModule:
    """``exported`` (an ``ep.module()``) prepared with the quantizer ``quantizer`` names: ``prepare_pt2e``, no
    calibration (a :class:`~fxverify.core.results.Skip` where that raises: :func:`~fxverify.capture.pt2e.with_quantizer`)."""
    return with_quantizer(quantizer, "prepare_pt2e", lambda made: prepared_with(made, exported))


@dataclasses.dataclass(frozen=True)
class Pt2ePrepared(Pt2e):
    """``torch.export``, then ``prepare_pt2e`` with ``quantizer``: the graph with its observers, not calibrated."""

    @property
    def name(self) -> str:
        return "pt2e_prepared"

    def capture(self, module: nn.Module, *, training: bool, inputs: tuple[Any, ...] = ()) -> fx.GraphModule:
        """The prepared graph of ``module`` in eval mode (``training`` is not read: PT2E is for inference), with
        its dynamic batch's range recorded for the ``dynamic`` check as the ``export`` capture records it."""
        if not inputs:
            raise ValueError("the pt2e_prepared capture needs example inputs")
        exported = self.program(module, training=False, inputs=inputs).module()
        found = batch_range(exported)  # read before prepare_pt2e, as the export capture reads it
        gm = prepared(exported, self.quantizer)
        if found is not None:
            gm.meta[BATCH_RANGE] = found
        return gm

    def tolerance(self, original: fx.GraphModule) -> Tolerance | None:
        """None: the prepared graph computes in float, its observers passing their inputs through."""
        return None


def for_model(facts: captures.ModelFacts) -> Pt2ePrepared:
    """The ``pt2e_prepared`` capture of a model (the registry's factory): exported as the ``export`` capture
    exports it."""
    return Pt2ePrepared(dynamic_batch=export_for_model(facts).dynamic_batch)
