"""The ``edge`` and ``edge_pt2e`` captures: ExecuTorch's Edge-dialect program, the graph its passes take.

The model is exported at its example shapes in eval mode (an Edge program is for inference; other batch sizes are
not run: see :func:`for_model`), then, for ``edge_pt2e``, quantized as the ``pt2e``
capture quantizes it (by default with ExecuTorch's ``XNNPACKQuantizer``, symmetric, per-channel weights: the
quantizer ExecuTorch's XNNPACK flow uses; ``--fxverify-quantizer`` names another) and exported again, and lowered
with ``executorch.exir.to_edge``: core ATen operators as Edge ops, ``dim_order`` copies, parameters and buffers
lifted to placeholders named by the program's signature.

A pass is called as ExecuTorch calls it: an ``ExportPass`` / ``PassBase`` instance (or a function over a
``GraphModule``) through ``EdgeProgramManager.transform([pass])``, which runs it on the program's lifted
``graph_module``, rebuilds the signature and runs the Edge verifier (a result the verifier rejects is the
transform raising, with the verifier's message, as in its users' pipelines); a function taking the program
(form ``program``, an ``ExportedProgramPassBase`` too) is called on it. The checks judge the returned
program's ``module()``, which keeps the program in ``meta[PROGRAM]`` (the ``verifier`` and ``runtime`` checks
read it). A copy of the capture's program is handed to the pass: what it edits in place is its own.

>>> Edge().name, Edge(quantizer=DEFAULT_QUANTIZER).name, Edge().traits.has_program
('edge', 'edge_pt2e', True)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import fx, nn

from fxverify.analysis.compare import Tolerance
from fxverify.capture.export import Export
from fxverify.capture.pt2e import converted, stepped_tolerance
from fxverify.core import captures
from fxverify.core.results import Skip, exception_summary
from fxverify.core.transform import CLAIMED_MODIFIED, Transform

DEFAULT_QUANTIZER = "fxverify.capture.edge:xnnpack_quantizer"


def xnnpack_quantizer() -> Any:
    """ExecuTorch's ``XNNPACKQuantizer``, symmetric with per-channel weights: ``edge_pt2e``'s default quantizer."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))


def compile_config() -> Any:
    """The ``EdgeCompileConfig`` the captures lower with and their passes are verified under: ``to_edge``'s default."""
    from executorch.exir import EdgeCompileConfig

    return EdgeCompileConfig()


@dataclasses.dataclass(frozen=True)
class Edge(Export):
    """``torch.export`` of the model in eval mode (for ``edge_pt2e``: PT2E quantization with ``quantizer``, then
    ``torch.export`` again), then ``to_edge``; the transform takes the program's ``module()`` as the checks see
    it, and is called on the program as ``EdgeProgramManager.transform`` calls it."""

    quantizer: str | None = None  # edge_pt2e: the quantizer's spec; None: the float program (edge)
    keeps_program: bool = True  # every pass is run on the program
    reads_settings = True  # the quantizer (edge_pt2e)
    inference_only = True  # an Edge program is for inference

    @property
    def name(self) -> str:
        return "edge" if self.quantizer is None else "edge_pt2e"

    def configured(self, settings: Mapping[str, Any]) -> Edge:
        """``edge_pt2e`` with the run's quantizer (``settings["quantizer"]``) where one is given; ``edge`` as it is."""
        given = settings.get("quantizer")
        return dataclasses.replace(self, quantizer=given) if given and self.quantizer is not None else self

    def for_transform(self, transform: Transform) -> Edge:
        """This capture: it keeps each capture's program, whatever the transform takes."""
        return self

    def program(self, module: nn.Module, *, training: bool, inputs: tuple[Any, ...]) -> torch.export.ExportedProgram:
        """The Edge program of ``module`` in eval mode (``training`` is not read) on ``inputs``."""
        exported = super().program(module, training=False, inputs=inputs)
        if self.quantizer is not None:
            quantized = converted(exported.module(), self.quantizer, inputs)
            exported = torch.export.export(quantized, tuple(inputs), dynamic_shapes=self.dynamic_shapes(inputs),
                                           strict=False)
        try:
            return lowered(exported)
        except Exception as exc:  # ExecuTorch refuses the model (an op outside core ATen, say): nothing to check on
            raise Skip(f"ExecuTorch's to_edge refuses it: {exception_summary(exc)}, before any transform: the pass "
                       "cannot be checked on this model, which says nothing of the pass") from exc

    def apply(self, transform: Transform, gm: fx.GraphModule, *, timeout: float | None) -> tuple[nn.Module, bool]:
        """``transform`` called on (a copy of) the capture's program: form ``program`` with it, any other through
        ``EdgeProgramManager.transform([transform])`` (see the module's docstring). The modified bit a
        ``PassResult`` claims is kept on the result for ``lint``."""
        if transform.form == "program" and not _is_program_pass(transform.fn):
            return super().apply(transform, gm, timeout=timeout)
        claims: dict[str, bool] = {}
        as_edge = dataclasses.replace(transform, fn=functools.partial(transformed, transform.fn, claims), form="program")
        result, in_place = super().apply(as_edge, gm, timeout=timeout)
        if "modified" in claims and isinstance(result, fx.GraphModule):
            result.meta[CLAIMED_MODIFIED] = claims["modified"]
        return result, in_place

    def input_change(self, original: fx.GraphModule, given: fx.GraphModule) -> str | None:
        """None: ExecuTorch's pass manager runs a pass on a shallow copy of the program, so the program given to
        ``EdgeProgramManager.transform`` (or to ``_transform``, which a pass over the program may call) is edited
        wherever a pass edits the graph in place, as ExecuTorch's own passes do; the pass is given a copy of the
        capture's program, and what it edits there is not held against it."""
        return None

    def tolerance(self, original: fx.GraphModule) -> Tolerance | None:
        """For ``edge_pt2e``, what ``pt2e`` allows (:func:`~fxverify.capture.pt2e.stepped_tolerance`); None for the
        float program."""
        return None if self.quantizer is None else stepped_tolerance(original)

    def describe(self) -> str:
        """e.g. ``edge_pt2e (to_edge, fxverify.capture.edge:xnnpack_quantizer, static shapes)``."""
        shapes = super().describe().rpartition(", ")[2]
        return f"{self.name} (to_edge, {f'{self.quantizer}, ' if self.quantizer else ''}{shapes}"


def lowered(exported: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``to_edge(exported)``'s program, under :func:`compile_config`."""
    from executorch.exir import to_edge

    return to_edge(exported, compile_config=compile_config()).exported_program()


def transformed(fn: Callable[..., Any], claims: dict[str, bool],
                program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` after ``EdgeProgramManager(program).transform([fn])``, as ExecuTorch's users run a pass (the
    Edge verifier included); ``claims["modified"]`` set to the modified bit of a ``PassResult`` ``fn`` returns."""
    from executorch.exir import EdgeProgramManager
    from executorch.exir.pass_base import ExportedProgramPassBase
    from torch.fx.passes.infra.pass_base import PassResult

    def recorded(graph_module: fx.GraphModule) -> Any:
        returned = fn(graph_module)
        if isinstance(returned, PassResult):
            claims["modified"] = bool(returned.modified)
        return returned

    recorded.__name__ = getattr(fn, "__name__", type(fn).__name__)  # ExecuTorch's messages name the pass so
    step = fn if isinstance(fn, ExportedProgramPassBase) else recorded
    manager = EdgeProgramManager({"forward": program}, compile_config=compile_config())
    return manager.transform([step]).exported_program()


def _is_program_pass(fn: Any) -> bool:
    """Whether ``fn`` is an ExecuTorch ``ExportedProgramPassBase`` (a pass over the program that
    ``EdgeProgramManager.transform`` runs as it is)."""
    return any(cls.__name__ == "ExportedProgramPassBase" for cls in type(fn).__mro__)


def for_model(facts: captures.ModelFacts) -> Edge:
    """The ``edge`` capture of a model (the registry's factory): at the example shapes, as ExecuTorch's users
    mostly export. ``to_edge`` narrows a dynamic batch (``Dim(min=1, max=8)`` to ``[2, 8]``; to the example's
    own size where the model calls ``chunk``: measured with executorch 1.5.1), so a dynamic one would not hold."""
    return Edge(dynamic_batch=False)


def quantized_for_model(facts: captures.ModelFacts) -> Edge:
    """The ``edge_pt2e`` capture of a model (the registry's factory), with :data:`DEFAULT_QUANTIZER`."""
    return dataclasses.replace(for_model(facts), quantizer=DEFAULT_QUANTIZER)
