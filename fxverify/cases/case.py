"""A model case: a corpus entry made concrete. It builds fresh, seeded instances
with randomised state, traces them, and makes their inputs.

This is what the ``fx_model`` fixture yields and what every check takes::

    case = fxverify.load_case("resnet18")
    gm = case.captured()                  # a fresh GraphModule, eval mode
    x, = case.configs[0].make()        # its primary inputs
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx, nn

from fxverify.capture import Capture, for_entry
from fxverify.cases import catalogue
from fxverify.cases.catalogue import CorpusEntry, InputSpec
from fxverify.cases.inputs import InputConfig, input_configs
from fxverify.cases.state import randomize_state
from fxverify.core.captures import DEFAULT_CAPTURE, ModelFacts, capture_names, for_model
from fxverify.errors import CorpusError


class ModelCase:
    """A corpus entry with the means to build, trace and feed it.

    Every call to :meth:`build` or :meth:`captured` returns a new instance (some
    timm models cache Proxies inside a module traced twice), built from the
    same seed so all instances hold identical parameters.
    """

    def __init__(self, entry: CorpusEntry, seed: int = 0) -> None:
        self.entry = entry
        self.seed = seed

    @property
    def name(self) -> str:
        return self.entry.name

    def __repr__(self) -> str:
        return f"ModelCase({self.name!r})"

    @functools.cached_property
    def configs(self) -> list[InputConfig]:
        """Input configurations, the primary one first."""
        e = self.entry
        return input_configs(e.inputs, e.batch_sizes, e.spatial_sizes, dtype=e.dtype)

    @functools.cached_property
    def capture(self) -> Capture:
        """How this model becomes a graph (see :mod:`fxverify.capture`)."""
        return for_entry(self.entry.tracer, self.entry.concrete_args)

    def capture_named(self, name: str) -> Capture:
        """The capture called ``name`` (``symbolic_trace``: the entry's own; ``export``, ``export_core``:
        with a dynamic batch where the entry is checked at several batch sizes).

        >>> load_case("resnet18").capture_named("export").describe()
        'export (torch.export, training IR, dynamic batch 1..8)'
        """
        if name == DEFAULT_CAPTURE:
            return self.capture
        if name not in capture_names():
            raise CorpusError(f"unknown capture {name!r}; known captures: {', '.join(capture_names())}")
        return for_model(name, self.facts)

    @property
    def facts(self) -> ModelFacts:
        """What a capture's factory reads of this model (see :mod:`fxverify.core.captures`)."""
        return ModelFacts(self.entry.tracer, tuple(self.entry.concrete_args.items()),
                          tuple(config.specs[0].shape[0] for config in self.configs))

    def build(self, *, training: bool = False) -> nn.Module:
        """A fresh instance with random init and randomised state, in the given mode and the entry's dtype
        (its floating parameters and buffers cast after randomising, so a float32 and a bfloat16 entry of
        one model hold the same values up to rounding)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            module = factory_of(self.entry)()
        randomize_state(module, self.seed)
        if self.entry.dtype is not None:
            module = module.to(getattr(torch, self.entry.dtype))
        return module.train(training)

    def captured(self, *, training: bool = False, capture: Capture | None = None,
                 dtype: torch.dtype | None = None) -> fx.GraphModule:
        """A fresh ``GraphModule`` of a fresh instance, captured in the given mode (by the entry's
        own capture unless another is given) from the primary inputs; with ``dtype``, of the instance
        with its floating tensors and inputs in ``dtype``."""
        module = self.build(training=training)
        _check_concrete_args(self.entry, module)
        if dtype is not None:
            module = module.to(dtype)
        inputs = self.configs[0].make(self.seed, dtype=dtype)
        return (capture or self.capture).capture(module, training=training, inputs=inputs)

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        """The primary configuration's inputs."""
        return self.configs[0].make(self.seed)


def load_case(name: str, seed: int = 0) -> ModelCase:
    """The case for corpus entry ``name``.

    >>> load_case("resnet18").configs[0].name
    'b2-3x64x64'
    """
    return ModelCase(catalogue.find(name), seed)


def case_from_module(
    name: str,
    factory: Callable[[], nn.Module],
    inputs: Sequence[tuple[int, ...] | InputSpec],
    **entry_fields: Any,
) -> ModelCase:
    """A case for your own model, without registering it in the corpus.

    >>> case = case_from_module("mlp", lambda: nn.Sequential(nn.Linear(4, 4), nn.ReLU()), [(2, 4)])
    >>> case.example_inputs()[0].shape
    torch.Size([2, 4])
    """
    specs = tuple(s if isinstance(s, InputSpec) else InputSpec(tuple(s)) for s in inputs)
    return ModelCase(CorpusEntry(name=name, source="user", factory=factory, inputs=specs, **entry_fields))


def _check_concrete_args(entry: CorpusEntry, module: nn.Module) -> None:
    """Each concrete arg must be a ``forward`` parameter whose default it equals: the
    checks call the traced module with the tensor inputs alone."""
    parameters = inspect.signature(module.forward).parameters
    for name, value in entry.concrete_args.items():
        parameter = parameters.get(name)
        if parameter is None:
            raise CorpusError(
                f"corpus entry {entry.name!r}: concrete_args names {name!r}, but forward() takes {list(parameters)}"
            )
        if parameter.default is inspect.Parameter.empty or parameter.default != value:
            default = "no default" if parameter.default is inspect.Parameter.empty else f"default {parameter.default!r}"
            raise CorpusError(
                f"corpus entry {entry.name!r}: concrete_args sets {name}={value!r}, but forward() has {default}; "
                "the traced module is called with the tensor inputs alone, so specialise an argument to its default"
            )


def factory_of(entry: CorpusEntry) -> Callable[[], nn.Module]:
    """A callable building ``entry``'s model with random init (no seeding, no state randomisation).

    >>> factory_of(catalogue.find("edge_conv_bn_head"))().__class__.__name__
    'ConvBnHead'
    """
    if callable(entry.factory):
        return lambda: entry.factory(**entry.kwargs)  # type: ignore[misc,operator]
    if isinstance(entry.factory, str):
        module_name, _, attr = entry.factory.partition(":")
        fn: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            fn = getattr(fn, part)
        return lambda: fn(**entry.kwargs)
    if entry.source == "torchvision":
        import torchvision

        extra = {"weights_backbone": None} if "weights_backbone" in _tv_params(entry.name) else {}
        return lambda: torchvision.models.get_model(entry.name, weights=None, **extra, **entry.kwargs)
    if entry.source == "timm":
        import timm

        return lambda: timm.create_model(entry.name, pretrained=False, **entry.kwargs)
    raise AssertionError(f"corpus entry {entry.name!r} has no factory")  # prevented by CorpusEntry


def _tv_params(name: str) -> set[str]:
    import torchvision

    return set(inspect.signature(torchvision.models.get_model_builder(name)).parameters)
