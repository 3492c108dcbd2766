"""What torch does to the graph a custom pass leaves at any hook, before anything reads it again: one entry for
every capture (:func:`carried_on`), given what torch made of the graph before the pass ran (:func:`before_pass`).

>>> import torch
>>> from torch import fx
>>> from fxverify.inductor.hooks import POST_GRAD_POST
>>> gm = fx.symbolic_trace(lambda x: torch.relu(x) + 1)
>>> kept = before_pass(POST_GRAD_POST, gm)
>>> carried_on("my:pass", gm, POST_GRAD_POST, kept)  # nothing to repair (no meta['val'] to compute again)
"""

from __future__ import annotations

from typing import Any

from torch import fx

from fxverify.inductor.freezing import after_loop
from fxverify.inductor.graph_hooks import after_graph_hook, fake_tensor_updater
from fxverify.inductor.hooks import Hook
from fxverify.inductor.pre_grad import after_pre_grad


def before_pass(hook: Hook, gm: fx.GraphModule) -> Any:
    """What torch makes of ``gm``, the graph ``hook`` receives, before it calls the pass, which :func:`carried_on`
    reads: at a post-grad hook Inductor's ``FakeTensorUpdater``
    (:func:`~fxverify.inductor.graph_hooks.fake_tensor_updater`), in freezing's loop the fake inputs AOTAutograd hands
    the compiler (each placeholder's ``meta['val']``), None elsewhere (the module's example makes one)."""
    if hook.stage == "post_grad":
        return fake_tensor_updater(gm)
    if hook.stage == "freezing":
        return [node.meta["val"] for node in gm.graph.find_nodes(op="placeholder")]
    return None


def carried_on(spec: str, result: fx.GraphModule, hook: Hook, before: Any, *, graph: str = "inference") -> None:
    """``result``, the ``graph`` graph as the transform ``spec`` left it at ``hook``, carried on as torch carries it on
    (``before``: what :func:`before_pass` gave for the graph the transform was given): after the pre-grad hook
    :func:`~fxverify.inductor.pre_grad.after_pre_grad`, after freezing's loop
    :func:`~fxverify.inductor.freezing.after_loop`, after a joint-graph or post-grad hook
    :func:`~fxverify.inductor.graph_hooks.after_graph_hook`. :class:`~fxverify.errors.TransformFailed` where torch
    would refuse the graph (the module's example carries a graph on)."""
    if hook.stage == "pre_grad":
        after_pre_grad(spec, result)
    elif hook.stage == "freezing":
        after_loop(spec, result, before)
    else:
        after_graph_hook(spec, result, hook, before, graph=graph)
