"""Freezing's pattern loop (:data:`~fxverify.inductor.hooks.FREEZING_LOOP`), where Inductor runs every pass registered
with ``register_freezing_graph_pattern``, and the frozen compile's post-grad hooks: reaching them
(:func:`frozen_at_hook`) and what torch does after the loop (:func:`after_loop`).

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

The path runs offline with torch's own functions for every step, under ``V.fake_mode`` and ``enter_freezing`` as
``compile_fx`` sets them (the caller sets ``config.freezing``), with ``pass_patterns[0].apply`` stopping it at the
loop: neither Inductor's own freezing patterns nor what a library registered into them run, the transform takes their
place. To reach a post-grad hook, the whole loop runs (its own patterns and whatever a library registered: torchao's
x86 lowerings make ``onednn.qlinear_pointwise`` calls of prepacked weights) and the loop's tail, ``_freeze``'s
``constant_fold``, ``fx_codegen_and_compile``'s ``view_to_reshape`` and ``fake_tensor_prop``, then
``post_grad_passes(gm, is_inference=True)`` up to the hook.

>>> import torch
>>> from torch._functorch.aot_autograd import aot_function, make_boxed_func
>>> from torch._inductor import config
>>> kept, weight = [], torch.ones(2, 2)
>>> def handed(gm, example_inputs):  # AOTAutograd's inference graph, as it hands it to Inductor
...     kept.append(gm)
...     return make_boxed_func(gm.forward)
>>> with torch.no_grad():
...     _ = aot_function(torch.mm, fw_compiler=handed)(weight, torch.ones(2, 1))
>>> with config.patch(freezing=True):
...     gm, preserved = frozen_at_hook(kept[0], [weight], FREEZING_LOOP)
>>> preserved, [node.op for node in gm.graph.nodes]  # the weight frozen to a constant, the input kept
([1], ['get_attr', 'placeholder', 'call_function', 'output'])
"""

from __future__ import annotations

import types
import unittest.mock
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from fxverify.errors import TransformFailed
from fxverify.inductor.fake_mode import graph_fake_mode
from fxverify.inductor.graph_hooks import at_post_grad_hook
from fxverify.inductor.hooks import FREEZING_LOOP, Hook
from fxverify.inductor.order import ordering_problem
from fxverify.inductor.stops import HookReached, stop_at_hook


def frozen_at_hook(gm: fx.GraphModule, state: Sequence[torch.Tensor], hook: Hook) -> tuple[fx.GraphModule, list[int]]:
    """``gm``, AOTAutograd's inference graph under ``config.freezing`` (its first placeholders the model's parameters
    and buffers ``state``, as it lifts them there), as ``hook`` of a frozen compile receives it: freezing's pattern
    loop (:data:`~fxverify.inductor.hooks.FREEZING_LOOP`) or a post-grad hook; and the indices of the placeholders
    torch kept: the inputs, and the state the graph mutates (the rest it froze to constants). The module's example
    freezes a weight."""
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

    example = [node.meta["val"] for node in gm.graph.find_nodes(op="placeholder")]
    with graph_fake_mode(gm):  # as compile_fx sets it around AOTAutograd
        gm = _recursive_joint_graph_passes(gm, input_device=next(iter(get_inputs_devices(example, gm)), None))
    with graph_fake_mode(gm), enter_freezing():
        if GraphLowering.decide_layout_opt(gm, is_inference=True):
            fake_tensor_prop(gm, example, True)
            convert_conv_weights_to_channels_last(gm)
        view_to_reshape(gm)
        preserved = replace_params_with_constants(gm, list(state), _aot_metadata(gm, len(state)))
        gm.graph = fx_graph_cse(gm.graph)
        gm.recompile()
        kept = [example[i] for i in preserved]
        if hook == FREEZING_LOOP:
            with unittest.mock.patch.object(freezing_patterns.pass_patterns[0], "apply", stop_at_hook):
                try:
                    freezing_patterns.freezing_passes(gm, kept)
                except HookReached:
                    return gm, preserved
            raise AssertionError("Inductor's freezing_passes did not reach its pattern loop")
        freezing_patterns.freezing_passes(gm, kept)
        constant_fold(gm)
    example = [node.meta["val"] for node in gm.graph.find_nodes(op="placeholder")]
    with graph_fake_mode(gm):
        view_to_reshape(gm)
        fake_tensor_prop(gm, example, True)
        return at_post_grad_hook(gm, hook, is_inference=True), preserved


def after_loop(spec: str, gm: fx.GraphModule, example: list[Any]) -> None:
    """What torch 2.14.1 runs on ``gm``, as the transform ``spec`` left it in freezing's pattern loop, up to the
    post-grad passes: the rest of ``freezing_passes`` (``_eliminate_duplicate_packed_nodes`` where mkldnn weight
    packing is on, ``stable_topological_sort``, ``recompile``, ``lint``), ``_freeze``'s ``constant_fold`` and
    ``fx_codegen_and_compile``'s ``view_to_reshape`` and ``fake_tensor_prop`` on the ``example`` inputs (the fake
    inputs AOTAutograd hands the compiler: every ``meta['val']`` computed again); :class:`TransformFailed` where torch
    raises, naming the step.

    >>> gm = fx.symbolic_trace(lambda x: torch.relu(x) + 1)
    >>> relu, add = list(gm.graph.nodes)[1:3]
    >>> relu.args = (add,)
    >>> after_loop("my:pass", gm, [])
    Traceback (most recent call last):
    fxverify.errors.TransformFailed: transform my:pass left the inference graph at freezing_passes' pattern loop ...
    """
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
            raise TransformFailed(f"transform {spec} left the inference graph at {FREEZING_LOOP.name} where "
                                  f"torch.compile would refuse it: torch's {step} after the loop raised on it "
                                  f"({problem})", f"inference graph refused at freezing's pattern loop: {problem}"
                                  ) from error


class _Refused(Exception):
    """A graph ``stable_topological_sort`` cannot order, with what is wrong with it."""


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
