"""Compile backends for the tests of :mod:`fxverify.compile.backend`, written as their authors write them: correct
plain ones, and each buggy backend beside its correct twin, with the aspect meant to catch it. Each is a module
attribute, so a spec names it (``--fxverify-backend tests.compile_backends:identity``).

- :func:`identity` and :func:`returns_forward` run the graph dynamo captured; ``aot_eager``
  (``torch._dynamo.backends.debugging:aot_eager``) and :data:`boxed_aot` go through AOTAutograd.
- :func:`relu_in_place` (caught by ``backend-input-unchanged``) rewrites the GraphModule it is handed, as
  ``compile_fx`` did (pytorch#138980); :func:`relu_on_copy` rewrites a copy.
- :class:`ReshapeAtFirstBatch` (caught by ``backend-recompile``) lowers ``flatten(x, 1)`` to ``reshape(B, -1)``
  with ``B`` the batch size it compiled for, and caches what it compiled by the graph's code, which a
  recompile at another batch size shares; :class:`ReshapeAtRunBatch` reads the batch size when it runs.
- :func:`runs_on_copies` (caught by ``backend-outputs``, on the buffers after the call or the next call's outputs)
  runs the graph on copies of its inputs, losing the updates of the buffers among them; :func:`identity` is its twin.
- :func:`specialize_sizes_in_place` (caught by ``backend-input-unchanged`` and ``backend-dynamic-shapes``) bakes
  the example's sizes into a dynamic graph, in the GraphModule it is handed;
  :func:`specialize_sizes_with_fallback` specialises a copy and runs it at the example's sizes only.
- :data:`lowering_cached_by_shapes` (caught by ``backend-dtypes``) caches what it lowered by the graph's code and
  its inputs' shapes, not dtypes; :data:`lowering_cached_by_shapes_and_dtypes` keys by dtypes too.
- :data:`reusing_output_buffers` (caught by ``backend-dynamic-shapes``, where dynamo reuses a graph at another
  size) hands back its runtime's output buffers, which its next call overwrites; :data:`copying_output_buffers`
  hands back copies.
- :func:`warms_up_on_its_inputs` (caught by ``backend-outputs``, which names the cause, and
  ``backend-input-unchanged``) runs the graph on the example inputs dynamo hands it, the model's own buffers;
  :func:`warms_up_on_clones` runs on clones.
- :data:`inference_linear` lowers ``F.linear`` to a custom kernel without autograd, declared
  ``@fxverify.contract(modes=("eval",))``: the gradient aspects skip; :func:`lower_linear` is the same backend
  undeclared (caught by ``backend-gradients``). :data:`float32_linear` lowers to a float32-only kernel, declared
  ``dtypes=("float32",)``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from functorch.compile import make_boxed_func
from torch import fx
from torch._dynamo.backends.common import aot_autograd
from torch.fx.experimental.symbolic_shapes import optimization_hint

import fxverify


def identity(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
    """The backend users write first, ``lambda gm, example_inputs: gm``: the GraphModule dynamo captured is callable."""
    return gm


def returns_forward(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
    """The simplest correct backend: run the graph dynamo captured."""
    return gm.forward


def _boxed_forward(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
    return make_boxed_func(gm.forward)


boxed_aot = aot_autograd(fw_compiler=_boxed_forward, bw_compiler=_boxed_forward)  # forward and backward graphs


def _relu_to_torch_relu(gm: fx.GraphModule) -> fx.GraphModule:
    for node in gm.graph.find_nodes(op="call_function", target=F.relu):
        node.target, node.kwargs = torch.relu, {}
    gm.recompile()
    return gm


def relu_in_place(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
    """BUGGY: rewrites ``F.relu`` to ``torch.relu`` in the GraphModule dynamo handed it (outputs stay right)."""
    return _relu_to_torch_relu(gm).forward


def relu_on_copy(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
    """The twin: the same rewrite on a copy."""
    return _relu_to_torch_relu(copy.deepcopy(gm)).forward


def _flatten_as_reshape(gm: fx.GraphModule, batch: Callable[[fx.Graph, fx.Node], Any]) -> fx.GraphModule:
    """A copy of ``gm`` with each ``torch.flatten(x, 1)`` written ``x.reshape(batch(graph, x), -1)``."""
    gm = copy.deepcopy(gm)
    for node in gm.graph.find_nodes(op="call_function", target=torch.flatten):
        if node.args[1:] == (1,) and not node.kwargs:
            with gm.graph.inserting_before(node):
                source = node.args[0]
                assert isinstance(source, fx.Node)
                reshaped = gm.graph.call_method("reshape", (source, batch(gm.graph, source), -1))
            node.replace_all_uses_with(reshaped)
            gm.graph.erase_node(node)
    gm.recompile()
    return gm


class ReshapeAtFirstBatch:
    """BUGGY: bakes the batch size of the example input into the reshape and caches by ``gm.code`` only."""

    def __init__(self) -> None:
        self.compiled: dict[str, Callable[..., Any]] = {}

    def __call__(self, gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
        if gm.code not in self.compiled:
            self.compiled[gm.code] = _flatten_as_reshape(
                gm, lambda graph, x: int(x.meta["example_value"].shape[0])).forward
        return self.compiled[gm.code]


class ReshapeAtRunBatch:
    """The twin: the reshape reads ``x.size(0)`` when it runs, so what it caches by ``gm.code`` fits any batch."""

    def __init__(self) -> None:
        self.compiled: dict[str, Callable[..., Any]] = {}

    def __call__(self, gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
        if gm.code not in self.compiled:
            self.compiled[gm.code] = _flatten_as_reshape(
                gm, lambda graph, x: graph.call_method("size", (x, 0))).forward
        return self.compiled[gm.code]


# as users name a backend in a spec: one instance for the whole run (its cache outlives a model)
reshape_at_first_batch = ReshapeAtFirstBatch()
reshape_at_run_batch = ReshapeAtRunBatch()


def runs_on_copies(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
    """BUGGY: runs the graph on copies of the tensors it is given, "so that it never writes into the caller's
    tensors": the in-place updates the graph makes to the buffers among them (a running mean, a call counter, a KV
    cache) land in the copies and are lost."""

    def run(*args: Any) -> Any:
        return gm(*(arg.clone() if isinstance(arg, torch.Tensor) else arg for arg in args))

    return run


def _specialised(gm: fx.GraphModule, example_inputs: list[Any]) -> fx.GraphModule:
    """``gm`` with each size dynamo passes it as a ``SymInt`` replaced by the example's value, read without a guard
    (``optimization_hint``), as a static-shape lowering does."""
    for node, example in zip(gm.graph.find_nodes(op="placeholder"), example_inputs):
        if isinstance(example, torch.SymInt):
            for user in list(node.users):
                user.replace_input_with(node, optimization_hint(example))
    gm.recompile()
    return gm


def specialize_sizes_in_place(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """BUGGY: under ``dynamic=True``, bakes the example's sizes into the GraphModule dynamo handed it, in place, and
    runs it: dynamo reuses the graph at other sizes (another sequence length), where it computes at the example's."""
    return _specialised(gm, example_inputs).forward


def specialize_sizes_with_fallback(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """The twin: specialises a copy, and runs it only where the sizes are the example's (the graph as handed, with
    its symbols, elsewhere)."""
    at = {i: optimization_hint(x) for i, x in enumerate(example_inputs) if isinstance(x, torch.SymInt)}
    fast = _specialised(copy.deepcopy(gm), example_inputs)

    def run(*args: Any) -> Any:
        return (fast if all(args[i] == size for i, size in at.items()) else gm)(*args)

    return run


def _sizes_and(example: Any, *, dtype: bool) -> Any:
    """What a cache key reads of one example input: a tensor's shape (and dtype), a symbolic size's text."""
    if isinstance(example, torch.Tensor):
        return (tuple(example.shape), example.dtype) if dtype else tuple(example.shape)
    return str(example)


class CachedLowering:
    """A backend lowering each graph through AOTAutograd with Inductor's decompositions, which cast to the dtype they
    trace in (a float32 upcast and a cast back around a norm), caching what it lowered so that a graph dynamo hands
    it again (another model instance, a recompile) is not lowered twice. ``dtypes``: whether the cache key holds the
    inputs' dtypes, beside the graph's code, their shapes and grad mode."""

    def __init__(self, *, dtypes: bool) -> None:
        self.dtypes = dtypes
        self.lowered: dict[Any, Callable[..., Any]] = {}

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        from torch._inductor.decomposition import select_decomp_table

        key = (gm.code, tuple(_sizes_and(x, dtype=self.dtypes) for x in example_inputs), torch.is_grad_enabled())
        if key not in self.lowered:
            self.lowered[key] = aot_autograd(fw_compiler=_boxed_forward, decompositions=select_decomp_table())(
                gm, example_inputs)
        return self.lowered[key]


lowering_cached_by_shapes = CachedLowering(dtypes=False)
"""BUGGY: the cache key misses the inputs' dtypes: after a bfloat16 compile of a model, a float32 compile of it at
the same sizes gets the bfloat16 lowering (bfloat16 outputs, or mixed-dtype errors)."""
lowering_cached_by_shapes_and_dtypes = CachedLowering(dtypes=True)
"""The twin: the cache key holds the inputs' dtypes."""


@torch.library.custom_op("fxverify_backends::linear", mutates_args=())
def linear_kernel(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A fused linear kernel, as inference engines ship one: forward only, no autograd formula registered."""
    return F.linear(x, weight, bias)


@torch.library.custom_op("fxverify_backends::linear_fp32", mutates_args=())
def linear_fp32_kernel(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A linear kernel for float32 alone (as an fp32 GEMM library's): other dtypes raise."""
    if x.dtype != torch.float32:
        raise NotImplementedError(f"linear_fp32 takes float32 tensors, got {x.dtype}")
    return F.linear(x, weight, bias)


@linear_kernel.register_fake
@linear_fp32_kernel.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _linear_to(kernel: Callable[..., Any], gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` with each ``F.linear`` (``torch._C._nn.linear`` in dynamo's graphs) calling ``kernel``."""
    gm = copy.deepcopy(gm)
    for node in gm.graph.find_nodes(op="call_function", target=torch._C._nn.linear):
        x, weight, *rest = node.args
        with gm.graph.inserting_before(node):
            fused = gm.graph.call_function(kernel, (x, weight, rest[0] if rest else node.kwargs.get("bias")))
        node.replace_all_uses_with(fused)
        gm.graph.erase_node(node)
    gm.recompile()
    return gm


def lower_linear(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """An inference backend, undeclared: each ``F.linear`` runs :func:`linear_kernel`, which has no autograd
    formula, so backward through what it returns raises."""
    return _linear_to(torch.ops.fxverify_backends.linear.default, gm).forward


inference_linear = fxverify.contract(modes=("eval",))(lower_linear)
""":func:`lower_linear` declared an inference backend: its promise is eager's results under ``torch.no_grad()``."""


@fxverify.contract(modes=("eval",), dtypes=("float32",))
def float32_linear(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """An inference backend for float32 models alone: each ``F.linear`` runs :func:`linear_fp32_kernel`."""
    return _linear_to(torch.ops.fxverify_backends.linear_fp32.default, gm).forward


class OutputBuffers:
    """A runtime that writes each output into a buffer of its own, kept from call to call (as an inference engine's
    request holds its output tensors), and hands back ``copies`` of them or, without, the buffers themselves."""

    def __init__(self, *, copies: bool) -> None:
        self.copies = copies

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        buffers: dict[int, torch.Tensor] = {}

        def run(*args: Any) -> Any:
            outputs = []
            for k, out in enumerate(gm(*args)):
                if isinstance(out, torch.Tensor):
                    buffer = buffers.setdefault(k, torch.empty(0, dtype=out.dtype))
                    buffer.resize_(max(out.numel(), buffer.numel()))
                    out = buffer[:out.numel()].view(out.shape).copy_(out)
                    out = out.clone() if self.copies else out
                outputs.append(out)
            return tuple(outputs)

        return run


reusing_output_buffers = OutputBuffers(copies=False)
copying_output_buffers = OutputBuffers(copies=True)


def _warm_up(gm: fx.GraphModule, example_inputs: list[Any], *, clones: bool) -> None:
    """``gm`` run on ``example_inputs`` (``clones``: on clones of their tensors), each size dynamo passes as a
    ``SymInt`` under ``dynamic=True`` given as its example's value (``optimization_hint``): a run needs numbers."""
    gm(*(x.clone() if clones and isinstance(x, torch.Tensor) else
         optimization_hint(x) if isinstance(x, torch.SymInt) else x for x in example_inputs))


def warms_up_on_its_inputs(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """BUGGY: warms up (as a backend measuring or calibrating what it compiled does) by running the graph on the
    example inputs dynamo hands it, which are the model's own buffers: a buffer the model updates in forward steps
    once more while compiling."""
    _warm_up(gm, example_inputs, clones=False)
    return gm.forward


def warms_up_on_clones(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """The twin: the same warm-up on clones of the example inputs."""
    _warm_up(gm, example_inputs, clones=True)
    return gm.forward
