"""The ``inductor_freezing`` capture: the inference graph where Inductor's freezing runs its pattern passes
(``torch._inductor.fx_passes.freezing_patterns.freezing_passes``, its ``for pattern in pass_patterns`` loop), the
hook of every pass registered with ``register_freezing_graph_pattern``: torchao's x86 quantization lowerings
(quantized conv/linear weight prepacking and post-op fusions), Inductor's mkldnn weight packing and its
concat-linear (``addmm_patterns_init``) patterns; and ``inductor_freezing_post``, the same compile further on, at
``post_grad_custom_post_pass`` (where torchao's ``register_quantized_concat_linear_cpu_pass`` installs its quantized
concat-linear fusion).

``torch.compile`` with ``config.freezing=True`` compiles a model run under ``torch.no_grad()`` through
``compile_fx.fw_compiler_freezing``; the capture runs that path offline (from Dynamo's graph after Inductor's pre-grad
passes, :func:`~fxverify.capture.pre_grad.as_aot_receives`, AOTAutograd's inference graph with Inductor's
decompositions as the other inference Inductor captures, :func:`~fxverify.capture.aot_inference.aot_inference_graph`,
then torch's own steps up to the hook: :func:`~fxverify.inductor.freezing.frozen_at_hook`). At the loop, neither
Inductor's own freezing patterns nor what a library registered into them run: the transform takes their place. At the
post hook they all ran, and its lowering patterns left Inductor lowering nodes (the ``qlinear`` calls torchao's
concat-linear fusion matches): the graph keeps them, and runs them eagerly
(:func:`~fxverify.capture.lowerings.runnable`). While torch's passes and the transform run the graph
is as torch hands it: the preserved (mutated) parameters and buffers placeholders before the inputs, the output a
flat tuple. The captured ``GraphModule`` takes the model's inputs and returns its outputs: the frozen constants
are its own buffers (parameters where torch registers a ``Parameter``), as ``replace_node_with_constant`` leaves
them, and each preserved parameter or buffer a ``get_attr`` of the model's own tensor under its own name.

:meth:`Freezing.apply` runs the transform on the graph, called as the loop calls a pass (on the graph alone) or as
``post_grad_passes`` calls the post pass, then carries it on as torch does after the hook
(:func:`~fxverify.inductor.after.carried_on`); where torch raises there, the transform fails, saying that
``torch.compile`` would refuse its graph.

>>> capture = Freezing()
>>> capture.name, capture.traits.opset, capture.traits.differentiated
('inductor_freezing', 'functional', False)
>>> Freezing("inductor_freezing_post").at.hook.name
'post_grad_custom_post_pass'
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch
from torch import fx, nn

from fxverify.analysis.graph_text import canonical_text
from fxverify.analysis.module_state import resolve
from fxverify.capture.aot_inference import HandedReturn, aot_inference_graph
from fxverify.capture.at_hooks import AtHook
from fxverify.capture.inductor import FIRED, check_placement, fired_in
from fxverify.capture.lifted_buffers import LIFTED, state_as_attributes, state_as_placeholders
from fxverify.capture.lowerings import runnable
from fxverify.capture.pre_grad import as_aot_receives
from fxverify.core.graph_passes import at_joint_hook
from fxverify.core.transform import Transform
from fxverify.errors import TransformFailed
from fxverify.inductor.after import before_pass, carried_on
from fxverify.inductor.fake_mode import fake_mode_of, graph_fake_mode
from fxverify.inductor.freezing import frozen_at_hook
from fxverify.inductor.hooks import FREEZING_LOOP, Hook


@dataclasses.dataclass(frozen=True)
class Freezing(AtHook):
    """The inference graph at Inductor's freezing pattern loop (``config.freezing=True``), made offline;
    ``inductor_freezing_post``: the same compile's graph at ``post_grad_custom_post_pass``."""

    name: str = "inductor_freezing"
    stages = ("freezing", "post_grad")
    freezes = True
    bakes_dtypes = True  # ATen nodes bake dtype=: a float64 copy is the float64 model captured again
    switches_mode = False  # the mode is traced in
    keeps_captures = True  # a capture costs tens of symbolic traces and constant folding

    def capture(self, module: nn.Module, *, training: bool, inputs: tuple[Any, ...] = ()) -> fx.GraphModule:
        """A fresh graph of ``module`` in the given mode, compiled under ``torch.no_grad()`` on ``inputs`` (freezing
        compiles inference graphs only; a model in train mode is frozen too), as the loop (``inductor_freezing_post``:
        the post hook) receives it."""
        from torch._inductor import config, lowering  # noqa: F401  Inductor's decompositions read its lowering
        from torch._inductor.decomposition import select_decomp_table

        if not inputs:
            raise ValueError(f"the {self.name} capture needs example inputs")
        with config.patch(fallback_random=True, freezing=True), torch.no_grad():
            handed = as_aot_receives(module, inputs, training=training)  # after Inductor's pre-grad passes
            gm = aot_inference_graph(handed, inputs, select_decomp_table(), state_first=True)  # under freezing
            returned = HandedReturn.of(gm)
            gm = _frozen(gm, handed, self.at.hook)
        returned.restore(gm)  # torch's steps made the graph anew
        return _registered_as(runnable(state_as_attributes(gm, handed)), gm)

    def apply(self, transform: Transform, gm: fx.GraphModule, *, timeout: float | None) -> tuple[nn.Module, bool]:
        """``transform`` run on the graph as the loop runs a pass (at the post hook, as ``post_grad_passes`` calls
        it), then carried on as torch carries it on after the hook (:func:`~fxverify.inductor.after.carried_on`); its
        lowering nodes run eagerly too; where it changed the graph is recorded (``inference``: :func:`fired_in`)."""
        from torch._inductor import config
        from torch._inductor.freezing_utils import enter_freezing

        given = _registered_as(state_as_placeholders(gm), gm)  # preserved state as placeholders, as torch has them
        hook = self.at.hook
        loop = hook == FREEZING_LOOP
        returned = HandedReturn.of(given)
        before = canonical_text(given.graph)
        kept = before_pass(hook, given)
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
            carried_on(transform.spec, result, hook, kept)
            if not loop:
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
        return self.at.hook.name if self.at.hook == FREEZING_LOOP else f"the frozen compile's {self.at.hook.name}"


def _frozen(gm: fx.GraphModule, module: nn.Module, hook: Hook) -> fx.GraphModule:
    """``gm`` (an :func:`aot_inference_graph` of ``module``) as ``hook`` of a frozen compile receives it
    (:func:`~fxverify.inductor.freezing.frozen_at_hook`), ``gm.meta[LIFTED]`` naming the placeholders torch kept."""
    _drop_unread_state(gm)
    lifted = gm.meta[LIFTED]
    state = [resolve(module, name) for _, name in lifted if name is not None]
    gm, preserved = frozen_at_hook(gm, state, hook)
    gm.meta[LIFTED] = tuple(lifted[i] for i in preserved)
    return gm


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
