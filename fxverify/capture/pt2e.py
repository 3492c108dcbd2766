"""The ``pt2e`` capture: the converted PT2E graph, the ``GraphModule`` a pass over a quantized model takes.

The model is exported as the ``export`` capture exports it (``torch.export``, its training IR; a dynamic batch
where it is checked at several batch sizes), then quantized as its users quantize it: ``prepare_pt2e`` with
the run's quantizer (:func:`quantizer_of`: ``--fxverify-quantizer module:factory``, by default torchao's
``X86InductorQuantizer`` with its default config), calibrated on the example inputs (the entry's input domain),
and ``convert_pt2e``: activations and weights pass through ``quantized_decomposed`` quantize / dequantize pairs,
the form ExecuTorch's and torchao's q/dq passes take.

What differs from the float captures, and how the checks meet it: the q/dq ops take float32 only, so no
float64 run is made of these graphs (numerics compares the result with the graph before the pass in float32,
within a tolerance counted in the graph's quantization steps: :meth:`Pt2e.tolerance`); the q/dq nodes carry no
``meta['val']`` (no ``meta`` check); PT2E quantization is for inference, so the graph is captured in eval
mode whatever mode is asked; the ``qdq`` check judges the quantize / dequantize nodes
(:mod:`fxverify.analysis.qdq`). Where the quantizer's flow raises on a model, its items skip, saying so: no
graph to check a pass on, and nothing about the pass.

A quantizer under test (a ``Quantizer`` named as the transform: form ``quantizer``) is given the exported float
graph instead, carrying the inputs to calibrate on, and applied by :func:`quantized`: its flow raising is the
transform raising.

>>> Pt2e().name, Pt2e().traits.quantized
('pt2e', True)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, cast

import torch
from torch import fx, nn

from fxverify.analysis.compare import Tolerance
from fxverify.analysis.qdq import quantization_step
from fxverify.capture.export import Export
from fxverify.capture.export import for_model as export_for_model
from fxverify.core import captures
from fxverify.core.results import Skip, exception_summary
from fxverify.core.transform import Transform, load_object
from fxverify.errors import TransformLoadError

DEFAULT_QUANTIZER = "fxverify.capture.pt2e:x86_quantizer"
CALIBRATION = "fxverify_calibration_inputs"  # meta key: the inputs a quantizer under test is calibrated on
STEPS = 2.0  # a pass over a q/dq graph may move an output by this many of its coarsest quantization steps


def quantized(quantizer: Any, inputs: tuple[Any, ...], exported: fx.GraphModule) -> fx.GraphModule:
    """``exported`` (an ``ep.module()``, changed in place as ``prepare_pt2e`` changes it) quantized with ``quantizer``
    (a PT2E ``Quantizer``) as its users quantize: ``prepare_pt2e``, one calibration call on ``inputs`` (the entry's
    own, in its domain), ``convert_pt2e``. How a quantizer under test is applied (form ``quantizer``)."""
    return calibrated_and_converted(prepared_with(quantizer, exported), inputs)


def prepared_with(quantizer: Any, exported: fx.GraphModule) -> fx.GraphModule:
    """``prepare_pt2e(exported, quantizer)``: the float graph ``quantizer`` quantizes (its ``transform_for_annotation``
    run, conv-BN folded, observers placed where it annotated), before calibration."""
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    return prepare_pt2e(exported, quantizer)


def calibrated_and_converted(prepared: fx.GraphModule, inputs: tuple[Any, ...]) -> fx.GraphModule:
    """``prepared`` (a ``prepare_pt2e`` result, changed: give it a copy to keep it) calibrated by one call on
    ``inputs`` and ``convert_pt2e``'d, as its users finish the flow."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    with torch.no_grad():
        prepared(*inputs)  # calibration, on the entry's own inputs
    return convert_pt2e(prepared)


def converted(exported: fx.GraphModule, quantizer: str, inputs: tuple[Any, ...]) -> fx.GraphModule:
    """:func:`quantized` with the quantizer ``quantizer`` names (:func:`with_quantizer`)."""
    return with_quantizer(quantizer, "prepare_pt2e, calibration or convert_pt2e",
                          lambda made: quantized(made, inputs, exported))


def with_quantizer(quantizer: str, steps: str, flow: Callable[[Any], fx.GraphModule]) -> fx.GraphModule:
    """``flow`` (the PT2E ``steps`` it runs, named) given a fresh quantizer from ``quantizer``
    (:func:`quantizer_of`). Where it raises, :class:`~fxverify.core.results.Skip`: no graph for a pass to be checked
    on, which says nothing of the pass."""
    made = quantizer_of(quantizer)
    try:
        return flow(made)
    except Exception as exc:  # the quantizer's flow refuses the model
        raise Skip(f"quantizing it with {quantizer} raised {exception_summary(exc)} ({steps}), before any transform: "
                   "the pass cannot be checked on this model, which says nothing of the pass; a quantizer's own "
                   "defects are listed in docs/bugs-found.md") from exc


def stepped_tolerance(original: fx.GraphModule) -> Tolerance | None:
    """What a pass may move the outputs of ``original``, a quantized graph, by: :data:`STEPS` of its coarsest
    activation's quantization step (an absolute tolerance), or None where it quantizes no activation."""
    step = quantization_step(original)
    return None if step is None else Tolerance(atol=STEPS * step)


def x86_quantizer() -> Any:
    """torchao's ``X86InductorQuantizer`` with its default config (static, per-channel weights): the default."""
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as x86

    return x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config())


def quantizer_of(spec: str) -> Any:
    """A fresh quantizer from ``spec`` (``'package.module:factory'``, a function of no arguments returning a
    ``Quantizer``); :class:`~fxverify.errors.TransformLoadError` saying what to give otherwise."""
    factory = load_object(spec, "quantizer")
    made = factory() if callable(factory) else factory
    if not hasattr(made, "annotate"):
        raise TransformLoadError(f"quantizer spec {spec!r} gives a {type(made).__name__}, not a PT2E Quantizer: give "
                                 "'package.module:factory' naming a function of no arguments that returns one "
                                 "(torchao.quantization.pt2e.quantizer.Quantizer)")
    return made


@dataclasses.dataclass(frozen=True)
class Pt2e(Export):
    """``torch.export``, ``prepare_pt2e`` with ``quantizer``, calibration on the example inputs, ``convert_pt2e``."""

    quantizer: str = DEFAULT_QUANTIZER
    quantizer_under_test: bool = False  # the transform is a Quantizer: the graph is the float export it quantizes
    keeps_captures = True  # an export and a calibration: one per mode, copied for each use
    reads_settings = True  # the quantizer
    inference_only = True  # PT2E quantization is for inference

    @property
    def name(self) -> str:
        return "pt2e"

    def configured(self, settings: Mapping[str, Any]) -> Pt2e:
        """This capture with the run's quantizer (``settings["quantizer"]``) where one is given."""
        given = settings.get("quantizer")
        return dataclasses.replace(self, quantizer=given) if given else self

    def for_transform(self, transform: Transform) -> Pt2e:
        """This capture for ``transform``: for a quantizer under test (form ``quantizer``), the float graph it
        quantizes."""
        return dataclasses.replace(cast(Pt2e, super().for_transform(transform)),
                                   quantizer_under_test=transform.form == "quantizer")

    def capture(self, module: nn.Module, *, training: bool, inputs: tuple[Any, ...] = ()) -> fx.GraphModule:
        """The converted graph of ``module`` in eval mode (PT2E quantization is for inference; ``training`` is
        not read), calibrated on ``inputs``; for a quantizer under test, the exported float graph, carrying
        ``inputs`` to calibrate on."""
        if not inputs:
            raise ValueError("the pt2e capture needs example inputs")
        exported = self.program(module, training=False, inputs=inputs).module()
        if self.quantizer_under_test:
            exported.meta[CALIBRATION] = inputs
            return exported
        return converted(exported, self.quantizer, inputs)

    def apply(self, transform: Transform, gm: fx.GraphModule, *, timeout: float | None) -> tuple[nn.Module, bool]:
        """A pass as the ``export`` capture applies it; a quantizer (form ``quantizer``) through :func:`quantized`,
        calibrated on the inputs ``gm`` carries: its flow raising is the transform raising."""
        if transform.form != "quantizer":
            return super().apply(transform, gm, timeout=timeout)
        if CALIBRATION not in gm.meta:
            raise ValueError("a quantizer under test needs the float graph: capture with Pt2e.for_transform(transform)")
        flow = functools.partial(quantized, transform.fn, gm.meta[CALIBRATION])
        return dataclasses.replace(transform, fn=flow).apply(gm, timeout=timeout)

    def float_export(self) -> Export:
        """The ``export`` capture of the float graph this capture quantizes (the graph a quantizer under test is
        given), with the same dynamic batch."""
        return Export(dynamic_batch=self.dynamic_batch)

    def tolerance(self, original: fx.GraphModule) -> Tolerance | None:
        """:func:`stepped_tolerance` of ``original`` (None for the float graph a quantizer under test is given)."""
        return stepped_tolerance(original)

    def describe(self) -> str:
        """e.g. ``pt2e (fxverify.capture.pt2e:x86_quantizer, dynamic batch 1..8)``; ``pt2e (the quantizer under
        test, ...)`` where the transform is the quantizer."""
        quantizer = "the quantizer under test" if self.quantizer_under_test else self.quantizer
        return f"{self.name} ({quantizer}, {super().describe().partition(', ')[2]}"


def for_model(facts: captures.ModelFacts) -> Pt2e:
    """The ``pt2e`` capture of a model (the registry's factory): exported as the ``export`` capture exports it."""
    return Pt2e(dynamic_batch=export_for_model(facts).dynamic_batch)
