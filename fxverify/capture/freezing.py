"""The ``inductor_freezing`` capture: the inference graph where Inductor's freezing runs its pattern passes
(``torch._inductor.fx_passes.freezing_patterns.freezing_passes``, its ``for pattern in pass_patterns`` loop), the
hook of every pass registered with ``register_freezing_graph_pattern``: torchao's x86 quantization lowerings
(quantized conv/linear weight prepacking and post-op fusions), Inductor's mkldnn weight packing and its
concat-linear (``addmm_patterns_init``) patterns.

``torch.compile`` with ``config.freezing=True`` compiles a model run under ``torch.no_grad()`` through
``compile_fx.fw_compiler_freezing`` (torch 2.14.1): on AOTAutograd's inference graph (parameters and buffers
lifted to placeholders before the inputs) it runs ``_recursive_joint_graph_passes``; where
``GraphLowering.decide_layout_opt`` says so, ``fake_tensor_prop`` and ``convert_conv_weights_to_channels_last``;
then ``freezing._freeze``: ``view_to_reshape``, ``replace_params_with_constants`` (each parameter and buffer the
graph does not mutate, and whose alias it does not return, becomes a ``get_attr`` constant ``_frozen_param<i>``
holding the model's own tensor; mutated ones stay placeholders), ``fx_graph_cse``, and ``freezing_passes``:
``fake_tensor_prop``, up to four rounds of ``constant_fold`` and ``binary_folding_pass``, ``constant_fold``,
``fake_tensor_prop``, then **the loop** (the hook), then ``_eliminate_duplicate_packed_nodes`` (mkldnn),
``stable_topological_sort``, ``recompile`` and ``lint``; ``_freeze`` then runs ``constant_fold`` (which folds the
weight-prepack calls a pattern inserts into packed constants), and ``fx_codegen_and_compile`` ``view_to_reshape``
and ``fake_tensor_prop`` before the post-grad passes.

The capture runs that path offline (from Dynamo's graph after Inductor's pre-grad passes,
:func:`~fxverify.capture.pre_grad.as_aot_receives`, AOTAutograd's inference graph with Inductor's decompositions as
the other inference Inductor captures, :func:`~fxverify.capture.aot_inference.aot_inference_graph`; torch's own
functions for every step, under
``V.fake_mode``, ``config.freezing`` and ``enter_freezing`` as ``compile_fx`` sets them), with
``pass_patterns[0].apply`` stopping it at the loop: neither Inductor's own freezing patterns nor what a library
registered into them run, the transform takes their place. While torch's passes and the transform run the graph
is as torch hands it: the preserved (mutated) parameters and buffers placeholders before the inputs, the output a
flat tuple. The captured ``GraphModule`` takes the model's inputs and returns its outputs: the frozen constants
are its own buffers (parameters where torch registers a ``Parameter``), as ``replace_node_with_constant`` leaves
them, and each preserved parameter or buffer a ``get_attr`` of the model's own tensor under its own name.

:meth:`Freezing.apply` runs the transform on the graph, called as the loop calls a pass (on the graph alone), then
what torch runs after the loop (:func:`after_loop`); where torch raises there, the transform fails, saying that
``torch.compile`` would refuse its graph.

``inductor_freezing_post`` (``position="post"``, :func:`at_post_hook`) is the same compile further on, at
``post_grad_custom_post_pass`` (where torchao's ``register_quantized_concat_linear_cpu_pass`` installs its quantized
concat-linear fusion): that graph, then torch's whole pattern loop (its own patterns and whatever a library
registered: torchao's x86 lowerings make ``onednn.qlinear_pointwise`` calls of prepacked weights) and the loop's tail,
``_freeze``'s ``constant_fold``, ``fx_codegen_and_compile``'s ``view_to_reshape`` and ``fake_tensor_prop``, then
``post_grad_passes(gm, is_inference=True)`` stopped at the post hook (its lowering patterns leave Inductor lowering
nodes, the ``qlinear`` calls torchao's concat-linear fusion matches: the graph keeps them, and runs them eagerly,
:func:`~fxverify.capture.lowerings.runnable`). The transform is called with the graph, then carried on as after the
``inductor_post`` hook (:func:`~fxverify.capture.inductor.carried_on`).

>>> capture = Freezing()
>>> capture.name, capture.traits.opset, capture.traits.differentiated
('inductor_freezing', 'functional', False)
>>> Freezing(position="post").name
'inductor_freezing_post'
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
import unittest.mock
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from fxverify.analysis.graph_text import canonical_text
from fxverify.analysis.module_state import resolve
from fxverify.capture.aot_inference import HandedReturn, aot_inference_graph
from fxverify.capture.base import Capture
from fxverify.capture.hook_stops import HookReached, stop_at_hook
from fxverify.capture.inductor import (
    FIRED,
    at_custom_pass,
    carried_on,
    check_placement,
    fake_mode_of,
    fired_in,
    graph_fake_mode,
    ordering_problem,
)
from fxverify.capture.lifted_buffers import LIFTED, state_as_attributes, state_as_placeholders
from fxverify.capture.lowerings import runnable
from fxverify.capture.pre_grad import as_aot_receives
from fxverify.core import captures
from fxverify.core.graph_passes import at_joint_hook
from fxverify.core.transform import Transform
from fxverify.errors import TransformFailed

HOOK = "freezing_passes' pattern loop"  # for pattern in freezing_patterns.pass_patterns: pattern.apply(gm.graph)


@dataclasses.dataclass(frozen=True)
class Freezing(Capture):
    """The inference graph at Inductor's freezing pattern loop (``config.freezing=True``), made offline;
    ``position="post"``: the same compile's graph at ``post_grad_custom_post_pass``."""

    position: str = "loop"  # "loop": freezing's pattern loop; "post": the frozen compile's post_grad_custom_post_pass
    bakes_dtypes = True  # ATen nodes bake dtype=: a float64 copy is the float64 model captured again
    switches_mode = False  # the mode is traced in
    keeps_captures = True  # a capture costs tens of symbolic traces and constant folding

    @property
    def name(self) -> str:
        return "inductor_freezing" + ("_post" if self.position == "post" else "")

    def capture(self, module: nn.Module, *, training: bool, inputs: tuple[Any, ...] = ()) -> fx.GraphModule:
        """A fresh graph of ``module`` in the given mode, compiled under ``torch.no_grad()`` on ``inputs`` (freezing
        compiles inference graphs only; a model in train mode is frozen too), as the loop (``position="post"``: the post
        hook) receives it."""
        from torch._inductor import config, lowering  # noqa: F401  Inductor's decompositions read its lowering
        from torch._inductor.decomposition import select_decomp_table

        if not inputs:
            raise ValueError(f"the {self.name} capture needs example inputs")
        with config.patch(fallback_random=True, freezing=True), torch.no_grad():
            handed = as_aot_receives(module, inputs, training=training)  # after Inductor's pre-grad passes
            gm = aot_inference_graph(handed, inputs, select_decomp_table(), state_first=True)  # under freezing
            returned = HandedReturn.of(gm)
            gm = at_loop(gm, handed) if self.position == "loop" else at_post_hook(gm, handed)
        returned.restore(gm)  # torch's steps made the graph anew
        return _registered_as(runnable(state_as_attributes(gm, handed)), gm)

    def apply(self, transform: Transform, gm: fx.GraphModule, *, timeout: float | None) -> tuple[nn.Module, bool]:
        """``transform`` run on the graph as the loop runs a pass, then what torch runs after the loop
        (:func:`after_loop`); at the post hook, called as ``post_grad_passes`` calls it, then carried on as torch
        carries it on (:func:`~fxverify.capture.inductor.carried_on`); its lowering nodes run eagerly too; where
        it changed the graph is recorded (``inference``: :func:`fired_in`)."""
        from torch._inductor import config
        from torch._inductor.freezing_utils import enter_freezing
        from torch._inductor.fx_utils import FakeTensorUpdater

        given = _registered_as(state_as_placeholders(gm), gm)  # preserved state as placeholders, as torch has them
        loop = self.position == "loop"
        returned = HandedReturn.of(given)
        before = canonical_text(given.graph)
        example = [node.meta["val"] for node in given.graph.find_nodes(op="placeholder")]  # AOTAutograd's inputs
        updater = None if loop else FakeTensorUpdater(given)  # post_grad_passes makes it before its custom passes
        told = at_joint_hook() if loop else contextlib.nullcontext()  # the loop calls pattern.apply(graph): the
        # graph alone; post_grad_passes calls the post pass with the graph and, if inference-aware, is_inference
        with config.patch(fallback_random=True, freezing=True), torch.no_grad(), \
                enter_freezing() if loop else contextlib.nullcontext(), graph_fake_mode(given), told:
            result, in_place = transform.apply(given, timeout=timeout)
            if not isinstance(result, fx.GraphModule):
                raise TransformFailed(f"transform {transform.spec} returned a {type(result).__name__}: the "
                                      f"passes at {self._hook()} change the graph they are given")
            fired = ("inference",) if canonical_text(result.graph) != before else ()
            given_changed = result is not given and canonical_text(given.graph) != before
            if result is not given:
                result.meta[LIFTED] = given.meta[LIFTED]
            if loop:
                after_loop(transform, result, example)
            else:
                carried_on(transform, result, graph="inference", hook="post_grad", position="post",
                           updater=updater)
                _constants_faked(result)  # what runnable traces a lowering handler on
        returned.restore(result)
        if given_changed:  # it changed the graph it was given, too
            returned.restore(given)
            gm.graph = state_as_attributes(given, gm).graph
            gm.recompile()
        result = _registered_as(runnable(state_as_attributes(result, gm)), result)
        result.meta[FIRED] = fired
        check_placement(transform, fired)
        return result, in_place

    def fired_in(self, result: nn.Module) -> tuple[str, ...] | None:
        return fired_in(result)

    def describe(self) -> str:
        return f"{self.name} (the inference graph at {self._hook()}, config.freezing=True; static shapes)"

    def _hook(self) -> str:
        return HOOK if self.position == "loop" else "the frozen compile's post_grad_custom_post_pass"


def for_model(facts: captures.ModelFacts) -> Freezing:
    """The ``inductor_freezing`` capture of a model (the registry's factory): static shapes."""
    return Freezing()


def post_for_model(facts: captures.ModelFacts) -> Freezing:
    """The ``inductor_freezing_post`` capture of a model (the registry's factory): static shapes."""
    return Freezing(position="post")


def at_loop(gm: fx.GraphModule, module: nn.Module, *, through: bool = False) -> fx.GraphModule:
    """``gm`` (an :func:`aot_inference_graph` of ``module``) as freezing's pattern loop receives it: torch's
    steps from ``fw_compiler_freezing`` up to the loop, the unmutated parameters and buffers frozen to constants,
    ``gm.meta[LIFTED]`` naming the placeholders left; ``through``: as ``_freeze`` returns it, the whole of
    ``freezing_passes`` (the loop runs every registered pattern) and ``_freeze``'s ``constant_fold`` run."""
    from torch._functorch.compile_utils import fx_graph_cse
    from torch._inductor.compile_fx import _recursive_joint_graph_passes, fake_tensor_prop, get_inputs_devices
    from torch._inductor.freezing import (
        constant_fold,
        convert_conv_weights_to_channels_last,
        replace_params_with_constants,
    )
    from torch._inductor.freezing_utils import enter_freezing
    from torch._inductor.fx_passes import freezing_patterns
    from torch._inductor.fx_passes.post_grad import view_to_reshape
    from torch._inductor.graph import GraphLowering

    _drop_unread_state(gm)
    lifted = gm.meta[LIFTED]
    state = [name for _, name in lifted if name is not None]
    example = [node.meta["val"] for node in gm.graph.find_nodes(op="placeholder")]
    with graph_fake_mode(gm):  # as compile_fx sets it around AOTAutograd
        gm = _recursive_joint_graph_passes(gm, input_device=next(iter(get_inputs_devices(example, gm)), None))
    gm.meta[LIFTED] = lifted
    with graph_fake_mode(gm), enter_freezing():
        if GraphLowering.decide_layout_opt(gm, is_inference=True):
            fake_tensor_prop(gm, example, True)
            convert_conv_weights_to_channels_last(gm)
        view_to_reshape(gm)
        tensors = [resolve(module, name) for name in state]
        preserved = replace_params_with_constants(gm, tensors, _aot_metadata(gm, len(state)))
        gm.meta[LIFTED] = tuple(lifted[i] for i in preserved)
        gm.graph = fx_graph_cse(gm.graph)
        gm.recompile()
        if through:
            freezing_patterns.freezing_passes(gm, [example[i] for i in preserved])
            constant_fold(gm)
            return gm
        with unittest.mock.patch.object(freezing_patterns.pass_patterns[0], "apply", stop_at_hook):
            try:
                freezing_patterns.freezing_passes(gm, [example[i] for i in preserved])
            except HookReached:
                return gm
    raise AssertionError("Inductor's freezing_passes did not reach its pattern loop")


def at_post_hook(gm: fx.GraphModule, module: nn.Module) -> fx.GraphModule:
    """``gm`` (an :func:`aot_inference_graph` of ``module``) as the frozen compile's ``post_grad_custom_post_pass``
    receives it: ``_freeze``'s graph (:func:`at_loop` ``through``), then ``fx_codegen_and_compile``'s ``view_to_reshape``
    and ``fake_tensor_prop`` on AOTAutograd's inputs left, and ``post_grad_passes(gm, is_inference=True)`` up to the
    post hook (:func:`~fxverify.capture.inductor.at_custom_pass`)."""
    from torch._inductor.compile_fx import fake_tensor_prop
    from torch._inductor.fx_passes.post_grad import view_to_reshape

    gm = at_loop(gm, module, through=True)
    example = [node.meta["val"] for node in gm.graph.find_nodes(op="placeholder")]
    with graph_fake_mode(gm):
        view_to_reshape(gm)
        fake_tensor_prop(gm, example, True)
        return at_custom_pass(gm, is_inference=True, position="post")


def after_loop(transform: Transform, gm: fx.GraphModule, example: list[Any]) -> None:
    """What torch 2.14.1 runs on ``gm`` after freezing's pattern loop, up to the post-grad passes: the rest of
    ``freezing_passes`` (``_eliminate_duplicate_packed_nodes`` where mkldnn weight packing is on,
    ``stable_topological_sort``, ``recompile``, ``lint``), ``_freeze``'s ``constant_fold`` and
    ``fx_codegen_and_compile``'s ``view_to_reshape`` and ``fake_tensor_prop`` on the ``example`` inputs (the fake
    inputs AOTAutograd hands the compiler: every ``meta['val']`` computed again); :class:`TransformFailed` where torch
    raises, naming the step."""
    from torch._inductor import config
    from torch._inductor.compile_fx import fake_tensor_prop
    from torch._inductor.freezing import constant_fold
    from torch._inductor.fx_passes.post_grad import view_to_reshape
    from torch._inductor.pattern_matcher import stable_topological_sort

    def packed(graph_module: fx.GraphModule) -> None:
        if torch._C._has_mkldnn and config.cpp.weight_prepack and config.layout_optimization:
            from torch._inductor.fx_passes.mkldnn_fusion import _eliminate_duplicate_packed_nodes

            _eliminate_duplicate_packed_nodes(graph_module)

    def ordered(graph_module: fx.GraphModule) -> None:
        try:
            stable_topological_sort(graph_module.graph)
        except AssertionError:
            raise _Refused(ordering_problem(graph_module.graph) or "no topological order") from None

    def propagated(graph_module: fx.GraphModule) -> None:
        fake_tensor_prop(graph_module, example, True)

    steps = (("_eliminate_duplicate_packed_nodes", packed), ("stable_topological_sort", ordered),
             ("recompile", fx.GraphModule.recompile), ("lint", lambda graph_module: graph_module.graph.lint()),
             ("_freeze's constant_fold", constant_fold), ("view_to_reshape", view_to_reshape),
             ("fake_tensor_prop", propagated))
    for step, run in steps:
        try:
            run(gm)
        except Exception as error:  # whatever torch's step raises on the graph the transform left
            summary = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            problem = summary if isinstance(error, _Refused) else f"{type(error).__name__}: {summary}"
            raise TransformFailed(f"transform {transform.spec} left the inference graph at {HOOK} where torch.compile "
                                  f"would refuse it: torch's {step} after the loop raised on it ({problem})",
                                  f"inference graph refused at freezing's pattern loop: {problem}") from error


class _Refused(Exception):
    """A graph ``stable_topological_sort`` cannot order, with what is wrong with it."""


def _drop_unread_state(gm: fx.GraphModule) -> None:
    """The placeholders of ``gm`` (an :func:`aot_inference_graph`) holding a parameter or buffer the graph never
    reads erased: Dynamo lifts only the state the model's forward reads (an eval-mode BatchNorm's ``num_batches_tracked``
    is not), so AOTAutograd's graph has no placeholder for it and torch numbers its frozen constants without it."""
    lifted = []
    for node, (placeholder, name) in zip(gm.graph.find_nodes(op="placeholder"), gm.meta[LIFTED], strict=True):
        if name is not None and not node.users:
            gm.graph.erase_node(node)
        else:
            lifted.append((placeholder, name))
    gm.meta[LIFTED] = tuple(lifted)
    gm.recompile()


def _aot_metadata(gm: fx.GraphModule, state: int) -> Any:
    """What ``replace_params_with_constants`` reads of AOTAutograd's ``ViewAndMutationMeta`` for ``gm``: which of its
    first ``state`` placeholders (the lifted parameters and buffers) the graph mutates (a write-back ``copy_`` into
    it: ``MUTATED_IN_GRAPH``, as ``keep_inference_input_mutations`` keeps it) and which an output aliases (the output
    is one or a view of one: its ``meta['val']`` shares its storage)."""
    from torch._functorch.aot_autograd import MutationType
    from torch.multiprocessing.reductions import StorageWeakRef

    placeholders = gm.graph.find_nodes(op="placeholder")[:state]
    written = {node.args[0] for node in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.copy_.default)}
    storages = {StorageWeakRef(node.meta["val"].untyped_storage()): index for index, node in enumerate(placeholders)
                if isinstance(node.meta.get("val"), torch.Tensor)}
    outputs = [value for value in pytree.tree_leaves(gm.graph.output_node().args[0]) if isinstance(value, fx.Node)]
    bases = [storages.get(StorageWeakRef(out.meta["val"].untyped_storage())) if isinstance(out.meta.get("val"),
             torch.Tensor) else None for out in outputs]
    return types.SimpleNamespace(
        input_info=[types.SimpleNamespace(mutation_type=MutationType.MUTATED_IN_GRAPH if node in written
                                          else MutationType.NOT_MUTATED) for node in placeholders],
        output_info=[types.SimpleNamespace(base_idx=base) for base in bases], static_input_indices=[])


def _registered_as(gm: fx.GraphModule, source: fx.GraphModule) -> fx.GraphModule:
    """``gm`` with each tensor attribute it reads that ``source`` holds (a frozen constant) registered as torch's
    ``replace_node_with_constant`` registers it on ``source``: a buffer, or a parameter where it is a ``Parameter``;
    ``gm`` returned."""
    for node in gm.graph.find_nodes(op="get_attr"):
        name = str(node.target)
        if "." in name or name in gm._parameters or name in gm._buffers or not hasattr(source, name):
            continue
        tensor = getattr(source, name)
        if not isinstance(tensor, torch.Tensor):
            continue
        delattr(gm, name)
        if isinstance(tensor, nn.Parameter):
            gm.register_parameter(name, tensor)
        else:
            gm.register_buffer(name, tensor)
    if hasattr(source, "_frozen_param_count"):
        gm._frozen_param_count = source._frozen_param_count  # torch numbers its next constant from it
    _copies_share_packed(gm)
    return gm


def _constants_faked(gm: fx.GraphModule) -> None:
    """Each ``get_attr`` of a tensor that has no ``meta['val']`` (a constant a post-grad pass added: torchao's
    concat-linear fusion registers its concatenated weights so; Inductor's lowering reads the tensor itself, never
    that meta) given its FakeTensor, which :func:`~fxverify.capture.lowerings.runnable` traces a lowering on."""
    fake_mode = fake_mode_of(gm)
    for node in gm.graph.find_nodes(op="get_attr"):
        tensor = getattr(gm, str(node.target), None)
        if fake_mode is not None and "val" not in node.meta and isinstance(tensor, torch.Tensor):
            node.meta["val"] = fake_mode.from_tensor(tensor, static_shapes=True)


def _copies_share_packed(gm: fx.GraphModule) -> None:
    """``copy.deepcopy(gm)`` (and of its copies) sharing ``gm``'s mkldnn tensors (the weights ``_freeze``'s
    ``constant_fold`` packed with ``onednn.qlinear_prepack`` / ``mkldnn._reorder_*``), which ``Tensor.__deepcopy__``
    refuses (an ``OpaqueTensorImpl`` has no storage): frozen constants nobody writes, read by every copy as the
    compiled model reads them. Set on ``gm``'s own class (``fx.GraphModule`` makes one for each instance) and on each
    copy's."""
    cls = type(gm)
    if "__deepcopy__" in vars(cls) or not _packed(gm):
        return
    copy_graph_module = fx.GraphModule.__deepcopy__

    def deepcopy_sharing_packed(self: fx.GraphModule, memo: dict[int, Any]) -> fx.GraphModule:
        memo.update({id(tensor): tensor for tensor in _packed(self)})
        copied = copy_graph_module(self, memo)
        _copies_share_packed(copied)
        return copied

    cls.__deepcopy__ = deepcopy_sharing_packed  # type: ignore[method-assign]


def _packed(gm: fx.GraphModule) -> list[torch.Tensor]:
    """The mkldnn tensors ``gm`` holds itself: its buffers, parameters and plain tensor attributes."""
    held = (*gm._buffers.values(), *gm._parameters.values(), *vars(gm).values())
    return [tensor for tensor in held if isinstance(tensor, torch.Tensor) and tensor.is_mkldnn]
