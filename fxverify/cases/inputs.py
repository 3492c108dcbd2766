"""Input configurations: the batch sizes, spatial sizes and magnitudes a model
is checked at, and the tensors for each, reproducible from a seed.

>>> from fxverify.cases.catalogue import InputSpec
>>> [c.name for c in input_configs((InputSpec((2, 3, 8, 8)),), (1, 2), ((8, 8), (12, 12)))]
['b2-3x8x8', 'b1-3x8x8', 'b2-3x12x12', 'b2-3x8x8-large']
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence

import torch

from fxverify.cases.catalogue import InputSpec

LARGE_SCALE = 1e3


@dataclasses.dataclass(frozen=True)
class InputConfig:
    """One set of inputs: specs with their concrete shapes and a value scale."""

    name: str
    specs: tuple[InputSpec, ...]
    scale: float = 1.0

    def make(
        self,
        seed: int = 0,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str = "cpu",
    ) -> tuple[torch.Tensor, ...]:
        """The input tensors. Same seed, same values; ``dtype`` recasts floating inputs
        after drawing them, so float32 and float64 inputs hold the same numbers; each in its spec's
        memory format (the same values as contiguous ones, in other strides), on every device."""
        gen_seed = seed ^ zlib.crc32(self.name.encode())
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(gen_seed)  # the CPU generator only: fork_rng restores just that one
            tensors = []
            for spec in self.specs:
                spec_dtype = getattr(torch, spec.dtype)
                low, high = spec.low, spec.high
                if spec_dtype.is_floating_point:
                    low = -3.0 if low is None else low
                    high = 3.0 if high is None else high
                t = torch.testing.make_tensor(spec.shape, dtype=spec_dtype, device="cpu", low=low, high=high)
                if t.is_floating_point():
                    if _unbounded_floating(spec):
                        t = t * self.scale
                    if dtype is not None:
                        t = t.to(dtype)
                if spec.memory_format != "contiguous_format":
                    t = t.contiguous(memory_format=getattr(torch, spec.memory_format))
                tensors.append(t.to(device))  # preserve_format: the strides go along
        return tuple(tensors)

    def describe(self) -> str:
        """e.g. ``b2-3x64x64 (x0: 2x3x64x64 float32)``, ``(x0: 2x3x64x64 float32 channels_last)``."""
        shapes = ", ".join(
            f"x{i}: {'x'.join(map(str, s.shape))} {s.dtype}"
            + ("" if s.memory_format == "contiguous_format" else f" {s.memory_format}")
            for i, s in enumerate(self.specs)
        )
        scale = f", values x{self.scale:g}" if self.scale != 1.0 else ""
        return f"{self.name} ({shapes}{scale})"


def input_configs(
    specs: Sequence[InputSpec],
    batch_sizes: Sequence[int],
    spatial_sizes: Sequence[Sequence[int]] = (),
    *,
    dtype: str | None = None,
) -> list[InputConfig]:
    """The configurations a model is checked at: the primary one first, then other
    batch sizes, other spatial sizes of the first input, and a large-magnitude set (each floating
    input without declared ``low``/``high`` scaled; none where every one declares them);
    with ``dtype`` (the model's), every floating input in that dtype. Each input keeps its memory format
    in every configuration.

    >>> input_configs((InputSpec((2, 4)), InputSpec((2,), "int64", 0, 3)), (2,), dtype="bfloat16")[0].describe()
    'b2-4 (x0: 2x4 bfloat16, x1: 2 int64)'
    >>> [c.name for c in input_configs((InputSpec((2, 4), low=-3, high=3),), (2,))]  # a declared domain: no large set
    ['b2-4']
    """
    primary = tuple(specs) if dtype is None else tuple(_in_dtype(s, dtype) for s in specs)
    configs = [_config(primary)]
    for batch in batch_sizes:
        if batch != primary[0].shape[0]:
            configs.append(_config(tuple(_with_batch(s, batch) for s in primary)))
    first = primary[0]
    for spatial in spatial_sizes:
        spatial = tuple(spatial)
        if spatial != first.shape[-len(spatial):]:
            changed = dataclasses.replace(first, shape=first.shape[: -len(spatial)] + spatial)
            configs.append(_config((changed,) + primary[1:]))
    if any(_unbounded_floating(s) for s in primary):
        configs.append(InputConfig(f"{configs[0].name}-large", primary, LARGE_SCALE))
    return configs


def _unbounded_floating(spec: InputSpec) -> bool:
    """Whether ``spec`` is a floating input without declared bounds: one the large-magnitude set scales (bounds
    declare the model's domain, such as the range a quantized model was calibrated on, which it stays in)."""
    return getattr(torch, spec.dtype).is_floating_point and spec.low is None and spec.high is None


def with_batch(config: InputConfig, batch: int) -> InputConfig:
    """``config`` with every input's batch (dimension 0) set to ``batch``, named as its batch configuration
    would be.

    >>> with_batch(InputConfig("b2-3x8", (InputSpec((2, 3, 8)),)), 5).name
    'b5-3x8'
    """
    return _config(tuple(_with_batch(s, batch) for s in config.specs))


def with_size(config: InputConfig, size: int, new: int, *, only: tuple[int, int] | None = None) -> InputConfig:
    """``config`` with each dimension past the batch (dimension 0) that is ``size`` long, in every input, made
    ``new`` long (dimensions of one size usually stand for one quantity: a sequence length an input shares with
    its mask); with ``only=(input, dimension)``, that dimension alone. Named as its batch configuration would be,
    after the first input's shape, then each other input whose shape changed.

    >>> config = InputConfig("b2-6x16", (InputSpec((2, 6, 16)), InputSpec((2, 6), "bool")))
    >>> with_size(config, 6, 9).describe()
    'b2-9x16+x1-2x9 (x0: 2x9x16 float32, x1: 2x9 bool)'
    >>> with_size(config, 6, 9, only=(0, 1)).name
    'b2-9x16'
    """
    specs = []
    for i, spec in enumerate(config.specs):
        shape = tuple(new if d > 0 and n == size and only in (None, (i, d)) else n for d, n in enumerate(spec.shape))
        specs.append(dataclasses.replace(spec, shape=shape))
    changed = [f"+x{i}-{'x'.join(map(str, s.shape))}" for i, (s, was) in enumerate(zip(specs, config.specs))
               if i > 0 and s.shape != was.shape]
    first = _config(tuple(specs))
    return InputConfig(first.name + "".join(changed), first.specs, config.scale)


def _in_dtype(spec: InputSpec, dtype: str) -> InputSpec:
    """``spec`` in the model's ``dtype`` when it is a floating input."""
    floating = getattr(torch, spec.dtype).is_floating_point
    return dataclasses.replace(spec, dtype=dtype) if floating and spec.dtype != dtype else spec


def _with_batch(spec: InputSpec, batch: int) -> InputSpec:
    return dataclasses.replace(spec, shape=(batch,) + spec.shape[1:])


def _config(specs: tuple[InputSpec, ...]) -> InputConfig:
    first = specs[0].shape
    return InputConfig(f"b{first[0]}-{'x'.join(map(str, first[1:]))}", specs)
