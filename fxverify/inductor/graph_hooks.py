"""The joint-graph and post-grad hooks (:data:`~fxverify.inductor.hooks.GRAPH_HOOKS`), which Inductor calls on
AOTAutograd's graphs: reaching one from the graph AOTAutograd hands Inductor (:func:`graph_at_hook`, what the
captures and pattern fuzzing both run), and what torch does to the graph a pass leaves there
(:func:`after_graph_hook`).

A compile runs ``joint_graph_passes`` on AOTAutograd's graph (``joint_custom_pre_pass`` after
``canonicalize_aten_ir_passes``, ``joint_custom_post_pass`` after Inductor's own joint-graph pattern passes), then,
once partitioned, ``view_to_reshape`` and ``post_grad_passes`` (``post_grad_custom_pre_pass`` after dead-code
elimination and ``reorder_for_locality``, ``post_grad_custom_post_pass`` after Inductor's own post-grad pattern
passes). Each hook is reached by running them with a stand-in pass that stops them there
(:func:`~fxverify.inductor.stops.stopped_at`): no code generation.

>>> import torch
>>> from torch import fx
>>> from fxverify.inductor.hooks import JOINT_POST
>>> gm = fx.symbolic_trace(lambda x: torch.relu(x) + 1)
>>> relu, add = list(gm.graph.nodes)[1:3]
>>> add.append(relu)                     # now %add reads %relu before it is defined
>>> after_graph_hook("my:pass", gm, JOINT_POST, None, graph="inference")
>>> [node.name for node in gm.graph.nodes]
['x', 'relu', 'add', 'output']
"""

from __future__ import annotations

from typing import Any

from torch import fx

from fxverify.errors import TransformFailed
from fxverify.inductor.fake_mode import fake_mode_of, graph_fake_mode
from fxverify.inductor.hooks import JOINT_PRE, Hook
from fxverify.inductor.order import ordering_problem
from fxverify.inductor.stops import stopped_at


def graph_at_hook(gm: fx.GraphModule, hook: Hook, *, is_inference: bool = True) -> fx.GraphModule:
    """``gm`` (AOTAutograd's graph as it hands it to Inductor, every node's ``meta['val']`` from one fake mode) as
    ``hook`` receives it: at a joint hook, ``joint_graph_passes`` up to it, sorted as torch sorts it after the hook
    (:func:`sorted_as_after_the_hook`); at a post-grad hook, the whole of ``joint_graph_passes``, then
    :func:`at_post_grad_hook` (``is_inference``: what ``post_grad_passes`` is told). Changed in place and returned.
    ``compile_fx`` runs the joint-graph passes in the graph's fake mode: a caller sets it
    (:func:`~fxverify.inductor.fake_mode.graph_fake_mode`), as the captures do.

    >>> import torch
    >>> from torch._inductor.pattern_matcher import fwd_only
    >>> from torch._subclasses.fake_tensor import FakeTensorMode
    >>> from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    >>> from fxverify.inductor.hooks import POST_GRAD_POST
    >>> x = torch.randn(3, 4)
    >>> graph = fwd_only(lambda x: x.view(2, 6) * 2, [x])
    >>> _ = FakeTensorProp(graph, FakeTensorMode(allow_non_fake_inputs=True)).propagate(x)
    >>> [str(node.target) for node in graph_at_hook(graph, POST_GRAD_POST).graph.nodes if node.op == "call_function"]
    ['aten.reshape.default', 'aten.mul.Tensor']
    """
    from torch._inductor import lowering  # noqa: F401  Inductor's decompositions read its lowering
    from torch._inductor.fx_passes.joint_graph import joint_graph_passes

    if hook.stage == "joint":
        stopped_at(hook, lambda: joint_graph_passes(gm))
        sorted_as_after_the_hook(gm)
        return gm
    return at_post_grad_hook(joint_graph_passes(gm), hook, is_inference=is_inference)


def at_post_grad_hook(gm: fx.GraphModule, hook: Hook, *, is_inference: bool) -> fx.GraphModule:
    """``gm``, a graph the joint-graph passes ran on (partitioned, or frozen), as the post-grad ``hook`` receives it:
    ``view_to_reshape``, then ``post_grad_passes(gm, is_inference)`` up to that hook, which stops it; changed in
    place and returned (``graph_at_hook``'s example runs it)."""
    from torch._inductor.fx_passes.post_grad import post_grad_passes, view_to_reshape

    view_to_reshape(gm)
    with graph_fake_mode(gm):
        stopped_at(hook, lambda: post_grad_passes(gm, is_inference))
    gm.recompile()
    return gm


def sorted_as_after_the_hook(gm: fx.GraphModule) -> None:
    """``gm`` where a joint hook stopped Inductor's passes, sorted as torch sorts it right after the hook
    (``stable_topological_sort``), then recompiled. Inductor's own pattern replacements (its attention fusion,
    before ``joint_custom_post_pass``) can leave nodes out of order, and torch hands the pass the graph so; a capture
    is also the model's reference, run by every check, so the pass receives it in the order torch gives it after the
    hook (unchanged where it was in order already).

    >>> import torch
    >>> gm = fx.symbolic_trace(lambda x: torch.relu(x) + 1)
    >>> sorted_as_after_the_hook(gm); gm(torch.ones(1))
    tensor([2.])
    """
    from torch._inductor.pattern_matcher import stable_topological_sort

    stable_topological_sort(gm.graph)
    gm.recompile()


def fake_tensor_updater(gm: fx.GraphModule) -> Any:
    """Inductor's ``FakeTensorUpdater`` of ``gm``, made before a post-grad custom pass runs, as ``post_grad_passes``
    makes it (it remembers each node's target and arguments: :func:`after_graph_hook` computes again the
    ``meta['val']`` of those a pass changed).

    >>> import torch
    >>> type(fake_tensor_updater(fx.symbolic_trace(torch.nn.ReLU()))).__name__
    'FakeTensorUpdater'
    """
    from torch._inductor.fx_utils import FakeTensorUpdater

    return FakeTensorUpdater(gm)


def after_graph_hook(spec: str, result: fx.GraphModule, hook: Hook, updater: Any, *, graph: str) -> None:
    """``result``, the ``graph`` graph as the transform ``spec`` left it at ``hook``, repaired as torch repairs it
    before anything reads it again; :class:`TransformFailed` (the transform's fault) where torch cannot, saying that
    ``torch.compile`` would refuse it there. As torch 2.14.1 does:

    - ``joint_graph_passes`` (``fx_passes/joint_graph.py``), once a custom pass ran: ``stable_topological_sort(
      graph.graph); graph.graph.lint(); graph.recompile()``. After the *pre* hook, ``constant_fold_uniform_value``
      (an ``fx.Interpreter``, ``config.joint_graph_constant_folding``) runs first: a graph out of order fails there;
    - ``post_grad_passes`` (``fx_passes/post_grad.py``): ``FakeTensorUpdater(gm)`` made before the custom pre pass
      (``updater``, made by :func:`fake_tensor_updater` before the transform ran), then after the custom post pass
      ``stable_topological_sort(gm.graph)`` and ``fake_tensor_updater.incremental_update()``: the ``meta['val']``
      of each node the pass added or changed (and of its users, while they change) is computed again; a node whose
      target and arguments it left alone keeps its ``meta['val']``, stale or not.

    ``stable_topological_sort`` raises where no order exists: a cycle, or a node reading one the pass erased (the
    module's example sorts a graph a pass left out of order).
    """
    from torch._inductor.pattern_matcher import stable_topological_sort

    if hook == JOINT_PRE:
        problem = ordering_problem(result.graph)
        if problem is not None:
            raise _refused(spec, graph, hook, problem, "joint_graph_passes runs constant_fold_uniform_value, an "
                           "fx.Interpreter, on the graph after this hook and before its stable_topological_sort")
    try:
        stable_topological_sort(result.graph)
    except AssertionError:
        problem = ordering_problem(result.graph) or "no topological order"
        raise _refused(spec, graph, hook, problem, "stable_topological_sort, which torch runs after the hook, "
                       "asserts 'topological sort did not consume all nodes'") from None
    if hook.stage == "joint":
        try:
            result.graph.lint()
        except RuntimeError as error:
            raise _refused(spec, graph, hook, str(error).splitlines()[0],
                           "joint_graph_passes lints the graph after its stable_topological_sort") from None
    elif updater is not None:
        _update_fake_tensors(spec, result, updater, graph, hook)
    result.recompile()


def _update_fake_tensors(spec: str, result: fx.GraphModule, updater: Any, graph: str, hook: Hook) -> None:
    """``updater.incremental_update()`` on ``result`` in the fake mode of its ``meta['val']``, as ``post_grad_passes``
    runs it; :class:`TransformFailed` where it raises (a new node's target has no FakeTensor implementation...)."""
    from torch._inductor.virtualized import V

    fake_mode = fake_mode_of(result)
    if fake_mode is None:
        return
    updater.gm = result  # the graph a pass returning another GraphModule made: each of its nodes is new to it
    try:
        with V.set_fake_mode(fake_mode):
            updater.incremental_update()
    except Exception as error:  # whatever a node's FakeTensor computation raises
        summary = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        lowering = "_inductor_lowering_function" in summary  # torch cannot compute a lowering node's FakeTensor
        advice = ((", except a lowering node's (the call of an Inductor lowering handler, which takes Inductor IR): "
                   "it must keep the meta['val'] it had, and its inputs theirs. A pass that rebuilds or copies the "
                   "graph (fx.Transformer, a graph copy) drops that meta: copy each node's meta along, or change the "
                   "graph in place") if lowering else
                  "; give each new node's target a FakeTensor implementation (torch.library.register_fake for a "
                  "custom op)")
        raise _refused(spec, graph, hook, f"Inductor's FakeTensorUpdater raised {type(error).__name__}: {summary}",
                       "post_grad_passes computes the FakeTensor of each node the pass added or changed "
                       f"(FakeTensorUpdater.incremental_update){advice}") from error


def _refused(spec: str, graph: str, hook: Hook, problem: str, why: str) -> TransformFailed:
    return TransformFailed(f"transform {spec} left the {graph} graph at {hook.name} where torch.compile would "
                           f"refuse it: {problem}; {why}", f"{graph} graph refused at {hook.name}: {problem}")
