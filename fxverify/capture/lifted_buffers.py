"""``make_fx`` of a model whose forward updates its buffers: the buffers lifted to graph inputs, the
updates written back, as AOTAutograd traces such a model.

``make_fx(torch.func.functionalize(model))`` functionalizes the graph's inputs only: the model's
parameters and buffers are plain tensors to it. An in-place update of a buffer by a value computed
from the input (``self.ema.mul_(0.9).add_(x.mean())``, ``self.cache[:2] += ...``,
``self.k_cache[self.pos] = k``) then fails inside torch ("mutating a non-functional tensor with a
functional tensor is not allowed"), and one by constants alone (a counter's ``add_(1)``, BatchNorm's
``num_batches_tracked``) stays an in-place node on a constant, run once on the real buffer while
tracing. :func:`lifted_make_fx` traces ``torch.func.functional_call`` of the model with every parameter
and buffer a graph input, so functionalization turns each update into functional ATen and writes the
new value back into its input with ``aten.copy_`` at the end of the graph; the inputs are then
replaced by ``get_attr`` nodes of the module's own parameters and buffers, under their own names.
The ``GraphModule`` it gives back takes the model's inputs and returns its outputs, and each call
updates its buffers in place as the model does, as ``torch.export``'s ``ep.module()`` does.

>>> class Ema(torch.nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.register_buffer("ema", torch.zeros(3))
...     def forward(self, x):
...         self.ema.mul_(0.9).add_(x.mean(0))
...         return x * 2
>>> gm = lifted_make_fx(Ema(), (torch.ones(2, 3),))
>>> [(n.op, str(n.target)) for n in gm.graph.nodes if n.op != "call_function" or "copy_" in str(n.target)]
[('placeholder', 'arg0_1'), ('get_attr', 'ema'), ('call_function', 'aten.copy_.default'), ('output', 'output')]
>>> out = gm(torch.ones(2, 3)); gm.ema
tensor([1., 1., 1.])
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import fx, nn

from fxverify.analysis.localise import written_arguments
from fxverify.analysis.module_state import resolve

__all__ = ["LIFTED", "REFUSED", "attach", "lifted_graph", "lifted_make_fx", "read_state_as_attributes",
           "refuses_buffer_update", "state_as_attributes", "state_as_placeholders", "writes_attributes", "write_backs"]

LIFTED = "fxverify_lifted_state"  # gm.meta key: (placeholder name, the parameter or buffer it holds or None) each
# what torch's functionalization raises where a model updates a buffer from a traced value
REFUSED = "mutating a non-functional tensor with a functional tensor is not allowed"


def refuses_buffer_update(error: BaseException) -> bool:
    """Whether ``error`` is functionalization refusing a buffer of the model updated from a traced value."""
    return isinstance(error, RuntimeError) and REFUSED in str(error)


def writes_attributes(gm: fx.GraphModule) -> bool:
    """Whether ``gm``'s graph writes a ``get_attr`` tensor (a parameter, buffer or constant) in place:
    an ATen operator whose schema writes an argument that is a ``get_attr`` node or a view of one.

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> writes_attributes(make_fx(torch.nn.BatchNorm1d(2).train())(torch.ones(3, 2)))
    True
    >>> writes_attributes(make_fx(torch.nn.BatchNorm1d(2).eval())(torch.ones(3, 2)))
    False
    """
    return any(isinstance(value, fx.Node) and _viewed_attribute(value)
               for node in gm.graph.nodes for value in written_arguments(node))


def _viewed_attribute(node: fx.Node) -> bool:
    """Whether ``node`` is a ``get_attr`` or a chain of views of one (``slice``, ``select``, ``view``)."""
    while node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        arguments = node.target._schema.arguments
        first = node.args[0] if node.args else None
        if not arguments or arguments[0].alias_info is None or not isinstance(first, fx.Node):
            return False
        node = first
    return node.op == "get_attr"


def write_backs(gm: fx.GraphModule) -> list[fx.Node]:
    """The ``aten.copy_`` nodes of ``gm`` that write a ``get_attr`` tensor (the lifted updates)."""
    return [node for node in gm.graph.nodes if node.op == "call_function" and node.target is torch.ops.aten.copy_.default
            and isinstance(node.args[0], fx.Node) and node.args[0].op == "get_attr"]


def lifted_make_fx(module: nn.Module, inputs: tuple[Any, ...],
                   decompositions: Mapping[Any, Callable[..., Any]] | None = None) -> fx.GraphModule:
    """``make_fx`` (functionalized, ``tracing_mode='fake'``, with ``decompositions``) of ``module`` in its
    current mode on ``inputs``, its parameters and buffers lifted to graph inputs while tracing and read back
    as ``get_attr`` nodes of the module's own tensors (shared, as a plain ``make_fx`` shares them), their
    updates written back with ``aten.copy_`` at the end of the graph. Traces in fake mode: the
    module's tensors are not changed."""
    return state_as_attributes(lifted_graph(module, inputs, decompositions), module)


def lifted_graph(module: nn.Module, inputs: tuple[Any, ...],
                 decompositions: Mapping[Any, Callable[..., Any]] | None = None) -> fx.GraphModule:
    """:func:`lifted_make_fx`'s trace before the state is read back: every parameter and buffer of ``module`` a
    placeholder after the inputs, its updates written back with ``aten.copy_``. ``gm.meta[LIFTED]`` names the
    state each placeholder holds (:func:`state_as_attributes`, :func:`state_as_placeholders`).

    >>> gm = lifted_graph(torch.nn.Linear(3, 2), (torch.ones(1, 3),))
    >>> gm.meta[LIFTED]
    (('arg0_1', None), ('arg1_1', 'weight'), ('arg2_1', 'bias'))
    """
    from torch.fx.experimental.proxy_tensor import make_fx

    state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    names, count = list(state), len(inputs)

    def lifted(*flat: Any) -> Any:
        given, tensors = flat[:count], flat[count:]
        return torch.func.functional_call(module, dict(zip(names, tensors, strict=True)), tuple(given))

    traced = make_fx(torch.func.functionalize(lifted), decomposition_table=decompositions, tracing_mode="fake",
                     _allow_non_fake_inputs=True)
    flat = (*inputs, *state.values())
    gm: fx.GraphModule = traced(*flat)
    placeholders = [node.name for node in gm.graph.find_nodes(op="placeholder")]
    if len(placeholders) != count + len(names):  # an input that is not one tensor: not built
        raise NotImplementedError(f"lifting the buffers of a model traced from {len(placeholders) - len(names)} "
                                  f"graph inputs for {count} inputs is not built")
    held = [*[None] * count, *names]
    gm.meta[LIFTED] = tuple(zip(placeholders, held, strict=True))
    return gm


def state_as_attributes(gm: fx.GraphModule, owner: nn.Module) -> fx.GraphModule:
    """A new ``GraphModule`` of ``gm`` (a :func:`lifted_graph`) that takes only the model's inputs: each lifted
    parameter and buffer read by a ``get_attr`` of ``owner``'s own tensor under its own name (after the inputs, in
    the order lifted), registered as ``owner`` holds it; ``gm``'s other attributes and meta kept."""
    lifted = dict(gm.meta[LIFTED])
    graph, env = fx.Graph(), dict[fx.Node, fx.Node]()
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    for node in placeholders:
        if lifted.get(node.name) is None:
            env[node] = graph.node_copy(node, env.__getitem__)
    for node in placeholders:
        name = lifted.get(node.name)
        if name is not None:
            env[node] = graph.get_attr(name)
            env[node].meta = dict(node.meta)
    state = {name: resolve(owner, name) for name in lifted.values() if name is not None}
    result = _rebuilt(gm, graph, env, state)
    _attach_state(result, owner, state)
    return result


def read_state_as_attributes(gm: fx.GraphModule, owner: nn.Module) -> None:
    """``gm`` (a :func:`lifted_graph`) changed in place into what :func:`state_as_attributes` makes of it, for
    whatever holds ``gm`` itself."""
    gm.graph = state_as_attributes(gm, owner).graph
    _attach_state(gm, owner, {name: resolve(owner, name) for _, name in gm.meta[LIFTED] if name})
    gm.recompile()


def _attach_state(gm: fx.GraphModule, owner: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    for name, tensor in state.items():  # registered as owner holds them: parameters, persistent buffers or not
        attach(gm, owner, name, tensor, parameter=isinstance(tensor, nn.Parameter))


def state_as_placeholders(gm: fx.GraphModule) -> fx.GraphModule:
    """A new ``GraphModule`` of ``gm`` (made by :func:`state_as_attributes`) whose lifted parameters and buffers are
    placeholders again, in the order they were lifted: the form Inductor's passes receive them in.

    >>> linear = torch.nn.Linear(3, 2)
    >>> gm = state_as_attributes(lifted_graph(linear, (torch.ones(1, 3),)), linear)
    >>> [n.op for n in gm.graph.nodes][:3], [n.op for n in state_as_placeholders(gm).graph.nodes][:3]
    (['placeholder', 'get_attr', 'get_attr'], ['placeholder', 'placeholder', 'placeholder'])
    """
    graph, env = fx.Graph(), dict[fx.Node, fx.Node]()
    reads = collections.defaultdict(list)
    for node in gm.graph.find_nodes(op="get_attr"):
        reads[node.target].append(node)
    inputs = iter(gm.graph.find_nodes(op="placeholder"))
    for placeholder, name in gm.meta[LIFTED]:
        if name is None:
            node = next(inputs)
            env[node] = graph.node_copy(node, env.__getitem__)
            continue
        new = graph.placeholder(placeholder)
        new.meta = dict(reads[name][0].meta) if reads[name] else {}
        env.update(dict.fromkeys(reads[name], new))
    return _rebuilt(gm, graph, env)


def _rebuilt(gm: fx.GraphModule, graph: fx.Graph, env: dict[fx.Node, fx.Node],
             held: Mapping[str, torch.Tensor] | None = None) -> fx.GraphModule:
    """A ``GraphModule`` over ``graph``, whose first nodes ``env`` maps, with ``gm``'s other nodes copied after them
    in order; what its nodes read is ``held``'s where it has it, else ``gm``'s; its meta, mode and generated code's
    return (``gm``'s code generator) ``gm``'s."""
    graph.set_codegen(gm.graph._codegen)
    for node in gm.graph.nodes:
        if node not in env:
            env[node] = graph.node_copy(node, env.__getitem__)
    held = held or {}
    read = {node.target for node in graph.nodes if node.op in ("get_attr", "call_module")}
    result = fx.GraphModule({target: held[target] if target in held else resolve(gm, target)
                             for target in read}, graph)
    result.meta.update(gm.meta)
    return result.train(gm.training)


def attach(gm: fx.GraphModule, module: nn.Module, name: str, tensor: torch.Tensor, *, parameter: bool) -> None:
    """``tensor`` registered on ``gm`` under ``name`` (a dotted path: empty submodules made on the way), as
    a parameter or a buffer, persistent where ``module`` has it so."""
    *path, field = name.split(".")
    owner: nn.Module = gm
    original: nn.Module = module
    for part in path:
        original = getattr(original, part)
        if part not in owner._modules:
            if hasattr(owner, part):
                raise NotImplementedError(f"the model's {name!r} clashes with the GraphModule's attribute {part!r}")
            owner.add_module(part, nn.Module())
        child = owner._modules[part]
        assert child is not None
        owner = child
    if hasattr(owner, field) and field not in owner._parameters and field not in owner._buffers:
        raise NotImplementedError(f"the model's {name!r} clashes with the GraphModule's attribute {field!r}")
    if parameter:
        assert isinstance(tensor, nn.Parameter)
        owner.register_parameter(field, tensor)
    else:
        owner.register_buffer(field, tensor, persistent=field not in original._non_persistent_buffers_set)
