"""``pre_grad_custom_pass``, the hook Inductor calls on Dynamo's torch-level graph, before AOTAutograd: reaching it
(:func:`at_pre_grad_hook`) and what torch does after it (:func:`after_pre_grad`).

``torch.compile`` hands Inductor Dynamo's graph: ``compile_fx`` runs ``run_pre_grad_passes``
(``_recursive_pre_grad_passes``, then ``fx_passes/pre_grad.py:pre_grad_passes``: Inductor's own pre-grad passes, then
the custom pass, then ``stable_topological_sort``, ``quant_lift_up`` and ``lint``) and AOTAutograd differentiates
what they made. The hook is reached on that very path, offline: ``torch.compile(model, backend=...)`` with a backend
that calls Inductor's ``compile_fx`` as the ``inductor`` backend does, with a ``pre_grad_custom_pass`` that stops it
where the hook is called (``pre_grad_pass_timing="early"``: before AOTAutograd's cache lookup; the graph is the same
at either timing), so no AOTAutograd tracing and no code generation run. Whatever Inductor's config says
(``use_pre_grad_passes``, ``pattern_matcher``, ``pre_grad_fusion_options``, ``freezing``) applies as it would; a
config that never calls the hook is an error.

>>> import torch
>>> handed = at_pre_grad_hook(torch.nn.Linear(3, 2), (torch.ones(1, 3),))
>>> [node.op for node in handed.gm.graph.nodes], len(handed.example_inputs)
(['placeholder', 'placeholder', 'placeholder', 'call_function', 'output'], 3)
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
from torch import fx, nn

from fxverify.errors import TransformFailed
from fxverify.inductor.hooks import PRE_GRAD
from fxverify.inductor.stops import HookReached


@dataclasses.dataclass
class Handed:
    """What the hook received: the ``GraphModule`` whose graph it was given, the example inputs Dynamo gave the
    backend (the model's inputs, parameters and buffers, one per placeholder), the tensors the graph returned on
    them, and what the model returned."""

    gm: fx.GraphModule
    example_inputs: tuple[Any, ...]
    returned: tuple[Any, ...] = ()
    model_output: Any = None


def at_pre_grad_hook(module: nn.Module, inputs: tuple[Any, ...]) -> Handed:
    """``module`` compiled by ``torch.compile`` with Inductor's ``compile_fx`` stopped where it calls
    ``pre_grad_custom_pass``, run once on ``inputs`` (Dynamo's graph run as it is, its buffer updates undone):
    what the hook received (the module's example). Dynamo's caches are reset before and after. Raises where Dynamo
    splits the model into several graphs, or hands Inductor none."""
    handed: list[Handed] = []

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        found = Handed(_graph_at_hook(gm, example_inputs), tuple(example_inputs))
        handed.append(found)
        found.gm.recompile()

        def run(*args: Any) -> Any:
            found.returned = tuple(found.gm(*args))
            return found.returned
        return run

    with _dynamo_reset(), _state_kept(module):
        output = torch.compile(module, backend=backend, dynamic=False)(*inputs)
    if not handed:
        raise RuntimeError("Dynamo handed Inductor no graph for this model (nothing to compile, or it skipped the "
                           f"frame): {PRE_GRAD.name} is never called")
    if len(handed) > 1:
        raise NotImplementedError(
            f"Dynamo splits this model into {len(handed)} graphs (graph breaks: {_breaks(module, inputs)}): "
            f"{PRE_GRAD.name} runs on each, and no one graph computes the model, which the checks need. Check a model "
            "torch.compile(fullgraph=True) takes")
    handed[0].model_output = output
    return handed[0]


def _breaks(module: nn.Module, inputs: tuple[Any, ...]) -> str:
    """Where and why Dynamo breaks ``module``'s graph on ``inputs`` (``torch._dynamo.explain``, which runs it)."""
    with _dynamo_reset(), _state_kept(module):
        explained = torch._dynamo.explain(module)(*inputs)
    found = []
    for broken in explained.break_reasons:
        frame = broken.user_stack[-1] if broken.user_stack else None
        found.append(f"{broken.reason}" + (f" at {frame.filename}:{frame.lineno}" if frame is not None else ""))
    return "; ".join(dict.fromkeys(found)) or "Dynamo gives no reason"


def _graph_at_hook(gm: fx.GraphModule, example_inputs: list[Any]) -> fx.GraphModule:
    """The ``GraphModule`` whose graph Inductor's ``pre_grad_custom_pass`` receives when ``compile_fx(gm,
    example_inputs)`` runs (as the ``inductor`` backend calls it), the hook stopping it there."""
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx

    reached: list[fx.Graph] = []

    def stop(graph: fx.Graph) -> None:
        reached.append(graph)
        raise HookReached

    try:
        with config.patch({PRE_GRAD.name: stop, "pre_grad_pass_timing": "early"}):
            compile_fx(gm, example_inputs)
    except HookReached:
        pass
    if not reached:
        raise RuntimeError(f"Inductor never called {PRE_GRAD.name} (config.use_pre_grad_passes is "
                           f"{config.use_pre_grad_passes}): there is no graph at that hook to capture")
    graph = reached[0]
    owner = graph.owning_module
    if any(isinstance(sub, fx.GraphModule) and sub.graph is graph for sub in gm.modules() if sub is not gm):
        raise NotImplementedError(f"Dynamo's graph holds subgraphs (higher-order operators), on which Inductor calls "
                                  f"{PRE_GRAD.name} first: capturing them is not built")
    assert isinstance(owner, fx.GraphModule), "the hook's graph belongs to a GraphModule"
    return owner


@contextlib.contextmanager
def _dynamo_reset() -> Iterator[None]:
    """Dynamo's caches reset before (a compiled model recompiles, with automatic dynamic shapes, and gives up after
    the recompile limit) and after (they would hold the model)."""
    torch._dynamo.reset()
    try:
        yield
    finally:
        torch._dynamo.reset()


@contextlib.contextmanager
def _state_kept(module: nn.Module) -> Iterator[None]:
    """The module's buffers, and the global random state, as they were before the block ran the model once."""
    saved = {name: buffer.detach().clone() for name, buffer in module.named_buffers()}
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        with torch.no_grad():
            for name, buffer in module.named_buffers():
                if name in saved and not torch.equal(buffer, saved[name]):
                    buffer.copy_(saved[name])


def after_pre_grad_passes(gm: fx.GraphModule) -> None:
    """What ``pre_grad_passes`` runs on the graph after the hook but ``recompile()``: ``stable_topological_sort``,
    ``quant_lift_up`` and ``graph.lint()``; torch's own error where it refuses the graph.

    >>> gm = fx.symbolic_trace(torch.nn.ReLU())
    >>> after_pre_grad_passes(gm); [node.op for node in gm.graph.nodes]
    ['placeholder', 'call_function', 'output']
    """
    from torch._inductor.fx_passes.quantization import quant_lift_up
    from torch._inductor.pattern_matcher import stable_topological_sort

    stable_topological_sort(gm.graph)
    quant_lift_up(gm)
    gm.graph.lint()


def after_pre_grad(spec: str, gm: fx.GraphModule) -> None:
    """What ``pre_grad_passes`` does to the graph the transform ``spec`` left at the hook: :func:`after_pre_grad_passes`
    and ``recompile()``; TransformFailed where torch refuses the graph (a cycle, a node reading an erased one), as
    ``torch.compile`` fails there, or where it no longer returns a tuple, which AOTAutograd refuses.

    >>> gm = fx.symbolic_trace(torch.nn.ReLU())
    >>> after_pre_grad("my:pass", gm)
    Traceback (most recent call last):
    fxverify.errors.TransformFailed: transform my:pass made the graph return a Node, not the tuple Dynamo's graph ...
    """
    try:
        after_pre_grad_passes(gm)
    except (AssertionError, RuntimeError) as error:
        raise TransformFailed(f"transform {spec} left the graph malformed, as torch.compile would refuse "
                              f"it after {PRE_GRAD.name}: {error}", f"malformed graph: {error}") from error
    returned = gm.graph.output_node().args[0]
    if not isinstance(returned, (tuple, list)):
        raise TransformFailed(f"transform {spec} made the graph return a {type(returned).__name__}, not the "
                              "tuple Dynamo's graph returns: AOTAutograd refuses it (RuntimeError: Graph output must "
                              "be a (), in create_functional_call), so torch.compile fails",
                              "graph output no tuple")
    gm.recompile()
