"""What a quantizer's parameters cut off of the values they quantize: each observer of a PT2E prepared graph is run
on the calibration inputs, the values it sees recorded, and its parameters (``calculate_qparams()``, what
``convert_pt2e`` writes into the quantize it becomes) applied to them: a value whose quantized integer lies beyond
``[quant_min, quant_max]`` by more than one step is clipped (:func:`clipping`).

Rounding moves a value by half a step at most; only clipping moves it further. An observer that calibrates on the
values (min / max, a moving average) clips none of what it saw; a histogram observer clips the outliers it chose to
(a few percent: measured in docs/quantization.md); fixed parameters (a ``FixedQParamsQuantizationSpec``: sigmoid's
``[0, 1)``) or a derived one clip whatever falls outside the range they were written for.

>>> import torch
>>> from torch import fx, nn
>>> from torchao.quantization.pt2e.observer import FixedQParamsObserver, MinMaxObserver
>>> root, g = nn.Module(), fx.Graph()
>>> root.fitted = MinMaxObserver(dtype=torch.uint8)
>>> root.fixed = FixedQParamsObserver(scale=1 / 256, zero_point=0, dtype=torch.quint8, quant_min=0, quant_max=255)
>>> x = g.placeholder("x")
>>> _ = g.output(g.call_module("fixed", (g.call_function(torch.tanh, (g.call_module("fitted", (x,)),)),)))
>>> prepared = fx.GraphModule(root, g)
>>> fitted, fixed = clipping(prepared, (torch.linspace(-3, 3, 101),))
>>> fitted.fraction, fixed.describe()  # doctest: +NORMALIZE_WHITESPACE
(0.0, '%fixed (FixedQParamsObserver fixed) on %tanh: 50% of the 101 values it quantizes lie outside [0, 0.996]
  (scale 0.00390625, zero point 0, range [0, 255]), by up to 255 steps; they span [-0.995, 0.995]')
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import fx

from fxverify.analysis.module_state import resolve
from fxverify.analysis.observers import is_observer, observed_source

PER_CHANNEL = (torch.per_channel_affine, torch.per_channel_symmetric, torch.per_channel_affine_float_qparams)


@dataclasses.dataclass(frozen=True)
class Clipping:
    """What the observer ``target`` (called by node ``node``, of class ``kind``, observing the value of node
    ``source``) clips: ``fraction`` of the ``count`` values it saw, by up to ``steps`` quantization steps; ``seen``
    the values' span, ``covered`` what its parameters represent, ``parameters`` their text."""

    node: str
    target: str
    kind: str
    source: str
    count: int
    fraction: float
    steps: float
    seen: tuple[float, float]
    covered: tuple[float, float]
    parameters: str

    def describe(self) -> str:
        return (f"%{self.node} ({self.kind} {self.target}) on %{self.source}: {self.fraction:.0%} of the {self.count} "
                f"values it quantizes lie outside [{self.covered[0]:.3g}, {self.covered[1]:.3g}] ({self.parameters}), "
                f"by up to {self.steps:.0f} steps; they span [{self.seen[0]:.3g}, {self.seen[1]:.3g}]")


def observed_values(prepared: fx.GraphModule, inputs: tuple[Any, ...]) -> dict[str, list[torch.Tensor]]:
    """The values each observer module of ``prepared`` (by target) sees when ``prepared`` runs once on ``inputs``:
    that run is a calibration, and leaves the observers calibrated."""
    seen: dict[str, list[torch.Tensor]] = {}
    handles = []
    for node in prepared.graph.nodes:
        if is_observer(prepared, node) and str(node.target) not in seen:
            values = seen.setdefault(str(node.target), [])
            handles.append(resolve(prepared, str(node.target)).register_forward_pre_hook(
                lambda _module, args, values=values: values.append(args[0].detach().clone())))
    try:
        with torch.no_grad():
            prepared(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def clipping(prepared: fx.GraphModule, inputs: tuple[Any, ...]) -> list[Clipping]:
    """Each observer of ``prepared`` (a ``prepare_pt2e`` result, calibrated here by one run on ``inputs``) that
    quantizes to integers, with what its parameters clip of the values it saw, in graph order. Observers that
    quantize nothing to integers (a ``PlaceholderObserver``: dynamic quantization, float16) or saw nothing are left
    out."""
    seen = observed_values(prepared, inputs)
    found = []
    for node in prepared.graph.nodes:
        values = seen.pop(str(node.target), None) if is_observer(prepared, node) else None
        floating = [value.double() for value in values or () if value.is_floating_point()]
        observer = resolve(prepared, str(node.target)) if floating else None
        measured = _clipped(observer, floating) if observer is not None else None
        if measured is not None:
            found.append(Clipping(node.name, str(node.target), type(observer).__name__,
                                  observed_source(prepared, node), **measured))
    return found


def _clipped(observer: Any, values: list[torch.Tensor]) -> dict[str, Any] | None:
    """What ``observer``'s parameters clip of ``values`` (float64); None where it has no integer parameters to
    apply."""
    dtype = getattr(observer, "dtype", None)
    if getattr(observer, "is_dynamic", False) or not isinstance(dtype, torch.dtype) or dtype.is_floating_point:
        return None
    try:
        scale, zero_point = (torch.as_tensor(p, dtype=torch.float64).reshape(-1) for p in observer.calculate_qparams())
        qmin, qmax = int(observer.quant_min), int(observer.quant_max)
    except Exception:  # an observer without parameters or a range of its own to give
        return None
    axis = getattr(observer, "ch_axis", None) if getattr(observer, "qscheme", None) in PER_CHANNEL else None
    beyond = []
    for value in values:
        shape = [1] * value.dim()
        if axis is not None and value.dim() and value.shape[axis] == scale.numel():
            shape[axis] = -1
        elif scale.numel() > 1:
            return None  # parameters per channel that do not fit the value: nothing sound to apply
        s, z = scale.reshape(shape), zero_point.reshape(shape)
        quantized = torch.round(value / s) + z
        beyond.append(((qmin - quantized).clamp(min=0) + (quantized - qmax).clamp(min=0)).flatten())
    joined, steps = torch.cat([value.flatten() for value in values]), torch.cat(beyond)
    if not joined.numel():
        return None
    shown = (f"scale {scale[0].item():.6g}, zero point {int(zero_point[0])}" if scale.numel() == 1
             else f"{scale.numel()} scales along dimension {axis}")
    return {"count": joined.numel(), "fraction": (steps > 1).double().mean().item(), "steps": steps.max().item(),
            "seen": (joined.min().item(), joined.max().item()),
            "covered": (((qmin - zero_point) * scale).min().item(), ((qmax - zero_point) * scale).max().item()),
            "parameters": f"{shown}, range [{qmin}, {qmax}]"}
