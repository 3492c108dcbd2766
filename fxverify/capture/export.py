"""The ``export`` and ``export_core`` captures: ATen-level graphs from ``torch.export``.

``export`` is ``torch.export.export(model, inputs)`` (the training IR, ``strict=False``);
``export_core`` is that program's ``run_decompositions()`` (core ATen, functional). The graph a
transform takes is the program's ``module()``: a ``GraphModule`` whose parameters and buffers are
``get_attr`` nodes and whose every node carries ``meta['val']`` (a FakeTensor), the form PT2E
quantization (``prepare_pt2e``) and most GraphModule-level ATen passes take.

A transform that takes the program itself (form ``program``: ``ExportedProgram -> ExportedProgram``)
or its lifted ``graph_module`` (form ``lifted``, called through ``ep._transform_do_not_use`` as
torch's own passes are) gets a copy of the program; the module the checks judge is then the
returned program's ``module()``, which keeps that program in ``meta[PROGRAM]`` for the ``verifier``
check.

Where the model is checked at more than one batch size, dimension 0 of every input is exported as
one dynamic ``Dim("batch", min=1, max=MAX_BATCH)`` (from an input with a batch of 2 or more, so that
it is not specialised to 1); the ``dynamic`` check then checks the result at other sizes.

What does not carry over from symbolic tracing, and skips saying why: ATen nodes bake ``dtype=``
and ``device=`` into their arguments, so a float64 copy is what exporting the float64 model gives
(:meth:`Export.in_dtype`: a retyped copy where no node bakes a floating dtype, else the float64 model
exported again) and running a program on CUDA means exporting it there (the ``cuda`` check skips;
``devices`` checks what ``.to(device)`` leaves behind and the meta run); an
exported module's mode is fixed when it is exported (``ep.module().train()`` raises); it does not
pickle nor write itself to a folder even untouched (``serde`` saves a returned program instead);
the ``reexport`` check exports a result again where ``retrace`` would trace it.

>>> capture = Export(core=True, dynamic_batch=False)
>>> capture.name, capture.traits.opset, capture.traits.pickles, capture.traits.dynamic_batch
('export_core', 'core', False, False)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import sympy
import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from fxverify.analysis.graph_text import canonical_text
from fxverify.analysis.module_state import first_line_difference, tensors_equal
from fxverify.capture.base import Capture
from fxverify.capture.copies import retyped_copy
from fxverify.core import captures
from fxverify.core.contracts import PROGRAM_FORMS
from fxverify.core.transform import Transform

ModuleT = TypeVar("ModuleT", bound=nn.Module)

MAX_BATCH = 8  # the dynamic batch's upper bound: the ``dynamic`` check runs the result there
BATCH_RANGE = "fxverify_batch_range"  # gm.meta key: the dynamic batch's range as exported, before any pass
PROGRAM = "fxverify_program"  # gm.meta key: the ExportedProgram a module is the module() of (copied with it)



@dataclasses.dataclass(frozen=True)
class Export(Capture):
    """``torch.export.export`` of the model (``core``: then ``run_decompositions()``), with dimension 0
    of every input dynamic in ``[1, MAX_BATCH]`` when ``dynamic_batch``; the transform takes
    ``ep.module()``."""

    core: bool = False
    dynamic_batch: bool = True
    keeps_program: bool = False  # the capture carries its program in meta[PROGRAM] (for program / lifted forms)
    bakes_dtypes = True  # a float64 copy is the model as exported in float64 (in_dtype)
    switches_mode = False  # ep.module().train() raises: the mode is fixed when exporting
    keeps_captures = True  # an export costs 20-60 symbolic traces: one per mode and dtype, copied for each use

    @property
    def name(self) -> str:
        return "export_core" if self.core else "export"

    @property
    def traits(self) -> captures.CaptureTraits:
        """The registry's traits of ``export`` / ``export_core``, without a dynamic batch where the model is
        checked at one batch size (so it is exported with a static one)."""
        return dataclasses.replace(captures.spec(self.name).traits, dynamic_batch=self.dynamic_batch)

    def for_transform(self, transform: Transform) -> Export:
        """This capture, keeping each capture's program for a transform of form ``program`` or ``lifted``
        (a program in meta doubles what every copy of a capture costs)."""
        return dataclasses.replace(self, keeps_program=transform.form in PROGRAM_FORMS)

    def at_example_shapes(self) -> Export:
        """This capture with a static batch, which exports in about half the time of a dynamic one."""
        return dataclasses.replace(self, dynamic_batch=False)

    def program(self, module: nn.Module, *, training: bool, inputs: tuple[Any, ...]) -> torch.export.ExportedProgram:
        """The exported program of ``module`` in the given mode on ``inputs`` (decomposed for ``export_core``)."""
        self.set_mode(module, training)
        program = torch.export.export(module, tuple(inputs), dynamic_shapes=self.dynamic_shapes(inputs), strict=False)
        return program.run_decompositions() if self.core else program

    def dynamic_shapes(self, inputs: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """``torch.export``'s ``dynamic_shapes`` for ``inputs``: dimension 0 of each tensor one ``Dim("batch")``
        where the batch is dynamic, else None."""
        if not self.dynamic_batch or not inputs:
            return None
        batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
        return tuple({0: batch} if isinstance(t, torch.Tensor) and t.dim() else None for t in inputs)

    def in_dtype(self, gm: fx.GraphModule, dtype: torch.dtype) -> fx.GraphModule | None:
        """``gm`` (a fresh capture) retyped to ``dtype`` (:func:`~fxverify.capture.copies.retyped_copy`),
        or None where the model must be exported again in ``dtype``: a node bakes a floating dtype into its
        arguments or reads a floating tensor constant, or the capture keeps its program (whose own graph
        would need retyping too). A retyped export has the code, ``meta['val']`` and float64 outputs of the
        float64 model exported again, at a fraction of the cost (docs/performance.md)."""
        if self.keeps_program:
            return None
        copied, _ = retyped_copy(gm, dtype)
        return copied

    def capture(self, module: nn.Module, *, training: bool, inputs: tuple[Any, ...] = ()) -> fx.GraphModule:
        """``ep.module()`` of ``module`` exported in the given mode on ``inputs`` (the example inputs:
        their batch must be 2 or more when the batch is dynamic)."""
        if not inputs:
            raise ValueError(f"the {self.name} capture needs example inputs")
        program = self.program(module, training=training, inputs=inputs)
        gm = program.module()
        if self.keeps_program:
            gm.meta[PROGRAM] = program  # a copy of gm copies it, sharing the copy's tensors
        found = batch_range(gm)
        if found is not None:  # read now: a pass may specialise the symbol in the ShapeEnv its copies share
            gm.meta[BATCH_RANGE] = found
        return gm

    def reexport(self, module: nn.Module, inputs: tuple[Any, ...]) -> fx.GraphModule:
        """``module`` (a captured graph, or a transform's result) exported again as this capture exports a
        model, in the mode it is in, and decomposed again for ``export_core``: the program's ``module()``."""
        return self.program(module, training=module.training, inputs=inputs).module()

    def apply(self, transform: Transform, gm: fx.GraphModule, *, timeout: float | None) -> tuple[nn.Module, bool]:
        """``transform(gm)`` on the program's module, as PT2E-style passes are called; for a transform of
        form ``program`` or ``lifted``, on the program ``gm`` is the module of (see the module's docstring)."""
        if transform.form not in PROGRAM_FORMS:
            return transform.apply(gm, timeout=timeout)
        if PROGRAM not in gm.meta:
            raise ValueError(f"a transform of form {transform.form} needs the capture's program: capture with "
                             "Export.for_transform(transform)")
        program = named_as_exported(gm.meta[PROGRAM])
        if transform.form == "lifted":
            transform = dataclasses.replace(transform, fn=functools.partial(_transform_lifted, transform.fn),
                                            form="program")
        returned, in_place = transform.apply(program, timeout=timeout)
        result = returned.module()
        result.meta[PROGRAM] = returned
        return result, in_place

    def input_change(self, original: fx.GraphModule, given: fx.GraphModule) -> str | None:
        """What a transform of form ``program`` that returned another program changed in the one it was given
        (``given``'s ``meta[PROGRAM]``): its graph, signature or tensors, against the capture's own program
        (``original``'s), or None. The subject asks only for form ``program``: a ``lifted`` pass is run through
        ``_transform_do_not_use``, which changes the program it is called on (measured), as it does for
        its users."""
        before, after = program_of(original), program_of(given)
        if before is None or after is None:
            return None
        if canonical_text(before.graph) != canonical_text(after.graph):
            return "the program's graph changed: " + first_line_difference(canonical_text(before.graph),
                                                                           canonical_text(after.graph))
        if str(before.graph_signature) != str(after.graph_signature):
            return "the program's graph signature changed: " + first_line_difference(
                str(before.graph_signature), str(after.graph_signature))
        now = {**after.state_dict, **after.constants}
        for name, tensor in {**before.state_dict, **before.constants}.items():
            if not isinstance(now.get(name), torch.Tensor) or not isinstance(tensor, torch.Tensor) or \
                    not tensors_equal(tensor, now[name]):
                return f"the program's tensor {name!r} changed"
        return None

    def set_mode(self, module: ModuleT, training: bool) -> ModuleT:
        """``module`` as it is: an exported module's mode is fixed when it is exported (its ``train()``
        raises); a module a transform built anew is put in the mode."""
        if not _is_exported(module):
            module.train(training)
        return module

    def accepts(self, shapes: Sequence[tuple[int, ...]], captured: Sequence[tuple[int, ...]]) -> bool:
        """Inputs of the exported shapes, but for a dynamic batch in ``[1, MAX_BATCH]``."""
        if len(shapes) != len(captured):
            return False
        for shape, exported in zip(shapes, captured, strict=True):
            if not self.dynamic_batch or not shape or len(shape) != len(exported):
                if tuple(shape) != tuple(exported):
                    return False
            elif tuple(shape[1:]) != tuple(exported[1:]) or not 1 <= shape[0] <= MAX_BATCH:
                return False
        return True

    def describe(self) -> str:
        """e.g. ``export_core (torch.export, run_decompositions, dynamic batch 1..8)``."""
        how = "torch.export, run_decompositions" if self.core else "torch.export, training IR"
        return f"{self.name} ({how}, {f'dynamic batch 1..{MAX_BATCH}' if self.dynamic_batch else 'static shapes'})"


def program_of(module: nn.Module) -> torch.export.ExportedProgram | None:
    """The program ``module`` is the ``module()`` of, where the capture keeps it (``meta[PROGRAM]``: a
    capture for a transform of form ``program`` or ``lifted``, and the result of one), or None."""
    found = module.meta.get(PROGRAM) if isinstance(module, fx.GraphModule) else None
    return found if isinstance(found, torch.export.ExportedProgram) else None


def _transform_lifted(fn: Callable[..., Any], program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``fn`` run on ``program.graph_module`` the way torch's own passes are run on a program (it
    changes ``program`` too, as that method does)."""
    from torch.fx.passes.infra.pass_manager import pass_result_wrapper

    return program._transform_do_not_use(pass_result_wrapper(fn))


def named_as_exported(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` with its placeholders and outputs named as its signature names them, as exported.

    ``copy.deepcopy`` of a program renames nodes whose names are Python builtins (``input`` becomes
    ``input_1``, measured on torch 2.14.1), so that an untouched copy of ``nn.Sequential``'s program
    fails ``validate()``; the pass is given a copy that validates as the original does.
    """
    renamed = False
    for _, nodes, named in signature_nodes(program):
        for node, spec in zip(nodes, named, strict=False):
            name = getattr(spec.arg, "name", None)
            if isinstance(name, str) and node.name != name:
                node.name = name  # the signature's name: the copy's namespace still avoids a clash in code
                renamed = True
    if renamed:
        program.graph_module.recompile()
    return program


def signature_nodes(program: torch.export.ExportedProgram) -> tuple[tuple[str, list[fx.Node], list[Any]], ...]:
    """``("input", placeholders, input_specs)`` and ``("output", output nodes, output_specs)`` of
    ``program``: the nodes its signature names, by position."""
    graph = program.graph_module.graph
    outputs = [a for a in pytree.tree_leaves(graph.output_node().args) if isinstance(a, fx.Node)]
    specs = program.graph_signature
    return (("input", graph.find_nodes(op="placeholder"), list(specs.input_specs)),
            ("output", outputs, list(specs.output_specs)))


def _is_exported(module: nn.Module) -> bool:
    """Whether ``module`` is an ``ep.module()`` (its ``train`` replaced by one that raises)."""
    return getattr(getattr(module, "train", None), "__func__", None) is not type(module).train


def signature_text(module: fx.GraphModule) -> str | None:
    """What an exported module promises beyond its code: the program's graph signature (where the capture
    keeps the program, :func:`program_of`) or the module's input and output
    pytree specs, and the ranges of the symbolic sizes of its inputs; None for a graph with no
    pytree specs (not an ``ep.module()``).

    >>> import torch
    >>> ep = torch.export.export(nn.ReLU(), (torch.ones(2, 3),), dynamic_shapes=({0: torch.export.Dim("b", max=8)},))
    >>> text = signature_text(ep.module())
    >>> text.startswith("inputs: TreeSpec(tuple"), text.splitlines()[-1]  # doctest: +ELLIPSIS
    (True, 'range constraints: s... in [2, 8]')
    """
    program = program_of(module)
    if program is not None:
        lines = [f"signature:\n{str(program.graph_signature).strip()}"]
    elif hasattr(module, "_in_spec"):
        lines = [f"inputs: {module._in_spec}", f"outputs: {getattr(module, '_out_spec', None)}"]
    else:
        return None
    ranges = [f"{symbol} in [{lower}, {upper}]" for symbol, (lower, upper) in symbol_ranges(module).items()]
    lines.append(f"range constraints: {'; '.join(ranges) or 'none (static shapes)'}")
    return "\n".join(lines)


def symbol_ranges(gm: fx.GraphModule) -> dict[str, tuple[Any, Any]]:
    """The range of each symbolic size of ``gm``'s inputs as its ShapeEnv records it now, by symbol name in
    order (``int_oo`` for no upper bound); a symbol specialised to a constant (``Eq(s77, 2)``) is no
    longer among them, one a guard narrowed (``s77 <= 4``) is, narrowed."""
    found: dict[str, tuple[Any, Any]] = {}
    for node in gm.graph.find_nodes(op="placeholder"):
        for value in pytree.tree_leaves(node.meta.get("val")):
            for size in value.shape if isinstance(value, torch.Tensor) else (value,):
                ranged = _symbol_range(size)
                if ranged is not None:
                    found[ranged[0]] = ranged[1:]
    return dict(sorted(found.items()))


def _symbol_range(size: Any) -> tuple[str, Any, Any] | None:
    """``(symbol, lower, upper)`` for a size that is one symbol of its ShapeEnv, else None (an int, an
    expression, a symbol specialised to a constant)."""
    symbolic = size.node if isinstance(size, torch.SymInt) else None
    if symbolic is None or symbolic.shape_env is None or not isinstance(symbolic.expr, sympy.Symbol):
        return None
    bounds = symbolic.shape_env.var_to_range[symbolic.expr]
    return str(symbolic.expr), bounds.lower, bounds.upper


def batch_range(gm: fx.GraphModule) -> tuple[int, int] | None:
    """The range of the first input's dynamic dimension 0 as ``gm``'s ShapeEnv records it (torch.export
    assumes a dynamic size is neither 0 nor 1: a ``Dim(min=1)`` is recorded from 2), or None when
    it is static."""
    for node in gm.graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        ranged = _symbol_range(val.shape[0]) if isinstance(val, torch.Tensor) and val.dim() else None
        if ranged is not None:
            return int(ranged[1]), int(ranged[2])
    return None


def for_model(facts: captures.ModelFacts) -> Export:
    """The ``export`` capture of a model (the registry's factory): a dynamic batch where it is checked at
    several batch sizes, from a primary batch of 2 or more (so the batch is not specialised to 1)."""
    sizes = facts.batch_sizes
    return Export(dynamic_batch=len(set(sizes)) > 1 and sizes[0] >= 2)


def core_for_model(facts: captures.ModelFacts) -> Export:
    """The ``export_core`` capture of a model (the registry's factory): as :func:`for_model`, decomposed."""
    return dataclasses.replace(for_model(facts), core=True)
