"""The capture registry: every capture's name, where it is made, what it is in one line, and the
traits of its graphs that checks ask about.

Importing this module imports no torch and no capture (the pytest plugin reads the names at
start-up); :func:`for_model` imports a capture's module when a model is first captured with it.
Adding a capture is one :class:`CaptureSpec` row below plus its module in ``fxverify/capture/``
(``docs/architecture.md`` shows a worked example); the Inductor captures' rows are made from the table of
Inductor's hooks (:mod:`fxverify.inductor.hooks`), one row each. Checks state the traits they need
(``CheckSpec.requires``), so no capture names a check and no check tests a capture's name.

>>> capture_names()[:8]
('symbolic_trace', 'export', 'export_core', 'make_fx', 'inductor', 'inductor_post', 'inductor_train', 'inductor_train_post')
>>> capture_names()[8:]  # doctest: +NORMALIZE_WHITESPACE
('inductor_joint', 'inductor_joint_post', 'inductor_train_joint', 'inductor_train_joint_post', 'inductor_pre_grad',
 'inductor_freezing', 'inductor_freezing_post', 'pt2e', 'pt2e_prepared', 'edge', 'edge_pt2e')
>>> spec("make_fx").traits.carries_meta_val, spec("make_fx").traits.has_program
(True, False)
>>> lacking(spec("symbolic_trace").traits, ("has_program",), "symbolic_trace")
'symbolic_trace graphs come with no ExportedProgram (captures whose graphs do: export, export_core, edge, edge_pt2e)'
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from fxverify.inductor import hooks

Opset = Literal["aten", "functional", "core"]
DEFAULT_CAPTURE = "symbolic_trace"  # the capture a run uses unless told otherwise


@dataclasses.dataclass(frozen=True)
class CaptureTraits:
    """What a capture's graphs are, as checks ask it (a check's ``requires`` names these fields).

    ``carries_meta_val``: every node carries ``meta['val']`` (FakeTensors) for the ``meta`` check to judge.
    ``has_program``: the graph comes with an ``ExportedProgram`` (its verifier, ``torch.export.save``,
    exporting the result again, and program-taking transforms).
    ``dynamic_batch``: the batch dimension is captured symbolically, so one graph runs every batch size.
    ``opset``: the operator set its graphs promise (``aten``; ``functional``: also no mutable schema;
    ``core``: also core ATen), or None for torch-level graphs.
    ``recaptures``: a result's generated code can be captured again and compared (``retrace``).
    ``pickles``: its modules pickle and write themselves to a folder, as untouched captures.
    ``moves_device``: ``.to(device)`` moves its graphs (ATen graphs bake ``device=`` into node arguments).
    ``differentiated``: a result's backward is part of what its graphs are for (False for the inference graphs
    Inductor compiles only where no gradient is needed, and for Inductor's training captures, whose backward graph
    is part of the capture: a fused kernel registered without an autograd formula is right there, and autograd
    through a result means nothing).
    ``kept_strides_read``: what reads the graph after a pass trusts the strides in the ``meta['val']`` of nodes
    the pass left alone (ExecuTorch takes dim order from them); False at Inductor's joint hooks, where torch's
    own joint-graph patterns leave such strides stale behind a replacement and recomputes none of them.
    ``quantized``: activations and weights pass through quantize / dequantize pairs (PT2E's converted graphs): no
    float64 run is made of them (the q/dq ops take float32 only) and the ``qdq`` check judges those pairs.
    ``round_trips``: its programs are saved with ``torch.export.save`` and exported again as their users do
    (``serde``, ``reexport``); Edge programs are not: ExecuTorch's next step is ``to_executorch``, and ``to_edge`` of an
    exported Edge module adds a ``_clone_dim_order`` after every view copy.
    ``lowers``: its programs are ExecuTorch Edge programs, which lower to a ``.pte`` that ``executorch.runtime``
    runs (the ``runtime`` check).
    ``observed``: the graph is PT2E's prepared graph, observers in place where the quantizer's annotations asked
    (before calibration): the ``observers`` check judges them.
    """

    carries_meta_val: bool = False
    has_program: bool = False
    dynamic_batch: bool = False
    opset: Opset | None = None
    recaptures: bool = False
    pickles: bool = True
    moves_device: bool = True
    differentiated: bool = True
    kept_strides_read: bool = True
    quantized: bool = False
    round_trips: bool = True
    lowers: bool = False
    observed: bool = False


# what a capture's graphs lack when a trait is false, and what the captures that have it give
_LACKS = {
    "carries_meta_val": ("carry no meta['val']", "do"),
    "has_program": ("come with no ExportedProgram", "do"),
    "dynamic_batch": ("have no dynamic batch dimension", "have one"),
    "opset": ("are torch-level, not ATen-level: they promise no operator set", "are ATen-level"),
    "recaptures": ("are not captured again from a result's code here", "are"),
    "pickles": ("are not pickled or written to a folder where they come from, or lose their form when they are",
                "do"),
    "moves_device": ("bake device= into node arguments: moving one means capturing it on the device, which "
                     "fxverify does not do yet", "move"),
    "differentiated": ("are not differentiated by autograd in torch.compile (an inference graph is compiled only "
                       "where no gradient is needed; a training capture runs its own backward graph, whose "
                       "gradients numerics compares): backward through a result is nothing the pass promises",
                       "are differentiated"),
    "quantized": ("hold no quantize / dequantize pairs", "do"),
    "round_trips": ("are not saved with torch.export.save nor exported again (ExecuTorch's next step is to_executorch)",
                    "are"),
    "lowers": ("are not ExecuTorch Edge programs: they are not lowered to a .pte here", "are"),
    "observed": ("are not PT2E prepared graphs: they hold no observers placed by prepare_pt2e", "are"),
}

# why an instance lacks a trait its registry row has
_NARROWED = {"dynamic_batch": ", which is checked at one batch size (so it is captured with a static one)"}


@dataclasses.dataclass(frozen=True)
class CaptureSpec:
    """Where a capture is made: ``<module>.<factory>(facts)`` with the :class:`ModelFacts` of a model
    (``module`` a full module name, so a capture may live outside fxverify), what it is in one line, and the
    traits of its graphs (a capture instance may narrow them: an export of a model checked at one batch size
    has no dynamic batch). ``by_name``: the factory, a class making the captures of several rows, is called with
    the capture's name instead (``<module>.<factory>(name)``: the Inductor captures)."""

    name: str
    module: str
    factory: str
    summary: str
    traits: CaptureTraits
    by_name: bool = False


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What a capture factory may read of a corpus entry: its ``tracer`` (``plain``, ``timm``,
    ``module:TracerClass``), its ``concrete_args`` and the batch sizes it is checked at (primary first)."""

    tracer: str = "plain"
    concrete_args: tuple[tuple[str, Any], ...] = ()
    batch_sizes: tuple[int, ...] = ()


def _at_hook(row: hooks.HookCapture) -> CaptureSpec:
    """The registry row of an Inductor capture, from its row of the hooks table (:mod:`fxverify.inductor.hooks`).
    Dynamo's graph at the pre-grad hook is torch-level (``PreGrad``); AOTAutograd's graphs at the later hooks carry
    ``meta['val']``, are functional ATen, and are not differentiated by autograd (``Inductor``; ``Freezing`` where the
    compile freezes the model's state, whose graphs do not pickle where they come from); at the joint hooks torch's
    own patterns leave strides stale behind a replacement."""
    if row.hook == hooks.PRE_GRAD:
        return CaptureSpec(row.name, "fxverify.capture.pre_grad", "PreGrad", row.summary,
                           CaptureTraits(pickles=False, moves_device=False), by_name=True)
    module, factory = ("fxverify.capture.freezing", "Freezing") if row.frozen else ("fxverify.capture.inductor", "Inductor")
    return CaptureSpec(row.name, module, factory, row.summary,
                       CaptureTraits(carries_meta_val=True, opset="functional", pickles=not row.frozen,
                                     moves_device=False, differentiated=False,
                                     kept_strides_read=row.hook.stage != "joint"), by_name=True)


REGISTRY: tuple[CaptureSpec, ...] = (
    CaptureSpec(DEFAULT_CAPTURE, "fxverify.capture.symbolic", "for_model",
                "torch.fx symbolic tracing with the entry's tracer",
                CaptureTraits(recaptures=True)),
    CaptureSpec("export", "fxverify.capture.export", "for_model",
                "torch.export.export, training IR: the transform takes ep.module()",
                CaptureTraits(carries_meta_val=True, has_program=True, dynamic_batch=True, opset="aten", pickles=False,
                              moves_device=False)),
    CaptureSpec("export_core", "fxverify.capture.export", "core_for_model", "torch.export, then run_decompositions(): core ATen",
                CaptureTraits(carries_meta_val=True, has_program=True, dynamic_batch=True, opset="core", pickles=False,
                              moves_device=False)),
    CaptureSpec("make_fx", "fxverify.capture.make_fx", "for_model", "make_fx of the functionalized model, static shapes",
                CaptureTraits(carries_meta_val=True, opset="functional", moves_device=False)),
    *(_at_hook(row) for row in hooks.CAPTURES),
    CaptureSpec("pt2e", "fxverify.capture.pt2e", "for_model",
                "torch.export, then PT2E quantization with the run's quantizer (--fxverify-quantizer): prepare_pt2e, "
                "calibration on the example inputs, convert_pt2e; the transform takes the q/dq GraphModule",
                CaptureTraits(dynamic_batch=True, pickles=False, moves_device=False, differentiated=False,
                              quantized=True)),
    CaptureSpec("pt2e_prepared", "fxverify.capture.pt2e_prepared", "for_model",
                "torch.export, then prepare_pt2e with the run's quantizer (--fxverify-quantizer), not calibrated: the "
                "transform takes the GraphModule with its observers, as a pass before calibration does",
                CaptureTraits(dynamic_batch=True, pickles=False, moves_device=False, differentiated=False,
                              observed=True)),
    CaptureSpec("edge", "fxverify.capture.edge", "for_model",
                "torch.export, then ExecuTorch's to_edge: the Edge-dialect program; a pass runs as "
                "EdgeProgramManager.transform runs it, static shapes (needs the edge extra)",
                CaptureTraits(carries_meta_val=True, has_program=True, pickles=False,
                              moves_device=False, differentiated=False, round_trips=False, lowers=True)),
    CaptureSpec("edge_pt2e", "fxverify.capture.edge", "quantized_for_model",
                "torch.export, PT2E quantization with the run's quantizer (ExecuTorch's XNNPACKQuantizer by default), "
                "torch.export again, to_edge: the quantized Edge program, static shapes (needs the edge extra)",
                CaptureTraits(carries_meta_val=True, has_program=True, pickles=False,
                              moves_device=False, differentiated=False, quantized=True, round_trips=False, lowers=True)),
)


def capture_names() -> tuple[str, ...]:
    """The registered captures' names, the default first."""
    return tuple(row.name for row in REGISTRY)


def program_captures() -> tuple[str, ...]:
    """The captures whose graphs come with an ``ExportedProgram`` (where program-taking transforms run)."""
    return tuple(row.name for row in REGISTRY if row.traits.has_program)


def spec(name: str) -> CaptureSpec:
    """The registry row of capture ``name``; KeyError for an unknown name."""
    for row in REGISTRY:
        if row.name == name:
            return row
    raise KeyError(name)


def for_model(name: str, facts: ModelFacts) -> Any:
    """The capture ``name`` of a model with these facts, a :class:`fxverify.capture.Capture` (imports the
    capture's module, and torch; typed ``Any`` here, below the capture layer)."""
    row = spec(name)
    factory = getattr(importlib.import_module(row.module), row.factory)
    return factory(name) if row.by_name else factory(facts)


def lacking(traits: CaptureTraits, requires: Sequence[str], capture: str | None = None) -> str | None:
    """Why graphs with ``traits`` do not give what ``requires`` names (the first trait they lack, and the
    registered captures that have it), or None when they give it all."""
    own = next((row.traits for row in REGISTRY if row.name == capture), None)
    for trait in requires:
        if not getattr(traits, trait):
            lacks, have = _LACKS[trait]
            if own is not None and getattr(own, trait):  # the capture narrowed what its graphs usually have
                return f"{capture} graphs {lacks} for this model{_NARROWED.get(trait, '')}"
            others = [row.name for row in REGISTRY if getattr(row.traits, trait)]
            return (f"{capture or 'these'} graphs {lacks}"
                    + (f" (captures whose graphs {have}: {', '.join(others)})" if others else ""))
    return None


def summaries() -> Mapping[str, str]:
    """Each capture's one-line summary, by name (for ``--help`` and the docs)."""
    return {row.name: row.summary for row in REGISTRY}
