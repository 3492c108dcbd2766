"""The ``inductor_pre_grad`` capture: the graph Inductor's ``pre_grad_custom_pass`` receives, where libraries
install torch-level passes (torchao's RoPE and attention fusions are ``CustomGraphPass`` objects there): Dynamo's
torch-level graph, before AOTAutograd, as ``torch.compile`` hands it to the hook
(:func:`~fxverify.inductor.pre_grad.at_pre_grad_hook`: a real compile stopped there, without AOTAutograd tracing or
code generation).

Dynamo (2.14.1, nn modules always inlined) makes every parameter and buffer the graph reads a graph input, in the
order it first read it, beside the model's inputs; the graph returns a flat tuple of tensors. The ``GraphModule``
the checks receive takes the model's inputs and returns its outputs: each parameter and buffer placeholder becomes a
``get_attr`` of the module's own tensor under its own name (the node keeps Dynamo's name and meta, so the graph
is the hook's graph but for those lines), the model's inputs are placeholders in the model's order, and the output
node is Dynamo's tuple, which the generated code turns into what the model returns (``_ModelReturn``). Buffers the
model updates in forward are updated in place, as Dynamo's graph updates them.

The mode is traced in (``batch_norm``'s and ``dropout``'s ``training`` arguments); a model in eval mode is captured
under ``torch.no_grad()``, as inference is compiled, a model in train mode with gradients on. A model Dynamo splits
into several graphs (a graph break) has no one graph that computes it: capturing it raises, naming the breaks.
Nodes carry Dynamo's ``meta['example_value']``, not ``meta['val']``, and shapes are static (``dynamic=False``).

:meth:`PreGrad.apply` runs a pass as the hook runs it (a ``CustomGraphPass`` on ``gm.graph``), then what
``pre_grad_passes`` does after the hook (:func:`~fxverify.inductor.pre_grad.after_pre_grad`:
``stable_topological_sort``, as a pass may leave nodes out of order, ``quant_lift_up``, and ``graph.lint()``, whose
refusal fails the transform as it fails ``torch.compile``; so does an output that is no longer a tuple, which
AOTAutograd refuses). The module runs its
generated code, or its graph with ``torch.fx.Interpreter`` where a pass made code Python cannot compile, as
AOTAutograd runs Dynamo's graph (:class:`PreGradModule`).

>>> capture = PreGrad()
>>> capture.name, capture.traits.opset, capture.traits.carries_meta_val, capture.traits.differentiated
('inductor_pre_grad', None, False, True)
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
from collections.abc import Iterator
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from fxverify.analysis.module_state import resolve
from fxverify.capture.at_hooks import AtHook
from fxverify.capture.base import interpreted
from fxverify.capture.lifted_buffers import attach
from fxverify.core.transform import Transform
from fxverify.inductor.after import before_pass, carried_on
from fxverify.inductor.pre_grad import Handed, after_pre_grad_passes, at_pre_grad_hook

_RETURNED = "_fx_returned"  # the generated code's name for the graph's output tuple


@dataclasses.dataclass(frozen=True)
class PreGrad(AtHook):
    """The graph Inductor's ``pre_grad_custom_pass`` receives: Dynamo's graph after Inductor's own pre-grad passes,
    parameters and buffers read as attributes of the module."""

    name: str = "inductor_pre_grad"
    stages = ("pre_grad",)
    bakes_dtypes = True  # Dynamo bakes what the code read of a tensor (x.dtype, x.device, sizes) into the graph
    switches_mode = False  # the mode is traced in (batch_norm's and dropout's training argument)
    keeps_captures = True  # Dynamo costs tens of symbolic traces

    def capture(self, module: nn.Module, *, training: bool, inputs: tuple[Any, ...] = ()) -> fx.GraphModule:
        """A fresh graph of ``module`` in the given mode as ``pre_grad_custom_pass`` receives it, compiled on
        ``inputs``, taking the model's inputs and returning its outputs."""
        if not inputs:
            raise ValueError(f"the {self.name} capture needs example inputs")
        module.train(training)
        with torch.set_grad_enabled(training):
            handed = at_pre_grad_hook(module, inputs)
        return as_model(handed, module, inputs)

    def apply(self, transform: Transform, gm: fx.GraphModule, *, timeout: float | None) -> tuple[nn.Module, bool]:
        """``transform`` run on ``gm`` as the hook runs it, then what Inductor does after the hook; TransformFailed
        where the graph is left malformed beyond what it repairs."""
        kept = before_pass(self.at.hook, gm)
        result, in_place = transform.apply(gm, timeout=timeout)
        if isinstance(result, fx.GraphModule):
            carried_on(transform.spec, result, self.at.hook, kept)
        return result, in_place

    def describe(self) -> str:
        return f"{self.name} (Dynamo's graph where {self.at.hook.name} receives it; static shapes)"


def as_model(handed: Handed, module: nn.Module, inputs: tuple[Any, ...]) -> fx.GraphModule:
    """The hook's graph as a ``GraphModule`` taking ``module``'s ``inputs`` and returning its outputs: each
    placeholder of a parameter or buffer a ``get_attr`` of it under its own name (the node keeping its name and
    meta), another tensor Dynamo lifted (a plain tensor attribute, a global) a plain attribute, the model's inputs
    placeholders in its order, each where Dynamo read it (all where Dynamo read the first, where it read them in
    another order), the output node as Dynamo made it."""
    state = {id(tensor): name for name, tensor in [*module.named_parameters(), *module.named_buffers()]}
    positions = {id(value): index for index, value in reversed(list(enumerate(inputs)))}
    handed_placeholders = list(handed.gm.graph.find_nodes(op="placeholder"))
    values = dict(zip(handed_placeholders, handed.example_inputs, strict=True))
    read_inputs = {positions[id(value)]: node for node, value in values.items() if id(value) in positions}
    in_order = list(read_inputs) == sorted(read_inputs)  # Dynamo read the model's inputs in the model's order
    root = PreGradModule(nn.Module(), fx.Graph(), class_name=type(module).__name__)
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    placed: list[fx.Node] = []  # the model's inputs, in order
    names = _input_names(module, len(inputs))
    for node in handed.gm.graph.nodes:
        if node.op == "get_attr":  # what Inductor's pre-grad passes made (fuse_conv_bn's tensors under freezing)
            value = resolve(handed.gm, str(node.target))
            if isinstance(value, torch.Tensor):
                attach(root, handed.gm, str(node.target), value, parameter=isinstance(value, nn.Parameter))
            else:
                setattr(root, str(node.target), value)
        if node.op != "placeholder":
            env[node] = graph.node_copy(node, env.__getitem__)
        elif id(values[node]) in positions:
            index = positions[id(values[node])]
            until = index + 1 if in_order else len(inputs)  # and those before it Dynamo never read
            placed.extend(_placeholder(graph, names, at, read_inputs) for at in range(len(placed), until))
            env[node] = placed[index]
        else:
            env[node] = _attribute(graph, root, module, node, values[node], state)
    if len(placed) < len(inputs):  # inputs Dynamo never read: after the others, or first where it read none
        with graph.inserting_after(placed[-1]) if placed else graph.inserting_before(None):
            made = [_placeholder(graph, names, at, read_inputs) for at in reversed(range(len(placed), len(inputs)))]
        placed.extend(reversed(made))  # each was inserted before the one made before it
    codegen = _ModelReturn.of(handed, graph.output_node(), placed, positions)
    if codegen is not None:
        graph.set_codegen(codegen)
    root.graph = graph
    root.meta.update(handed.gm.meta)
    return root.train(module.training)


def _placeholder(graph: fx.Graph, names: list[str], index: int, read: dict[int, fx.Node]) -> fx.Node:
    """The placeholder of the model's input ``index``: Dynamo's where it ``read`` the input (name, target and meta
    kept), else one named after the forward's parameter (``names``)."""
    return graph.node_copy(read[index]) if index in read else graph.placeholder(names[index])


def _input_names(module: nn.Module, count: int) -> list[str]:
    """Names for ``count`` positional inputs of ``module``'s forward (``input_<i>`` past its named parameters)."""
    try:
        named = [p.name for p in inspect.signature(module.forward).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        named = []
    return [named[i] if i < len(named) else f"input_{i}" for i in range(count)]


def _attribute(graph: fx.Graph, root: fx.GraphModule, module: nn.Module, node: fx.Node, value: Any,
               state: dict[int, str]) -> fx.Node:
    """The ``get_attr`` standing for Dynamo's placeholder ``node`` of ``value``: a parameter or buffer of
    ``module`` registered on ``root`` under its own name (only those the graph reads, as ``torch.fx`` keeps them),
    another tensor a plain attribute of ``root`` (as torch.fx keeps a
    tensor constant); named as ``node``, with its meta (but Dynamo's ``grapharg``: it is no graph input now)."""
    if not isinstance(value, torch.Tensor):
        raise NotImplementedError(f"Dynamo's graph input {node.target} is a {type(value).__name__}, neither an input "
                                  "of the model nor a tensor: not built")
    if id(value) in state:
        target = state[id(value)]
        attach(root, module, target, value, parameter=isinstance(value, nn.Parameter))
    else:
        target = f"_tensor_constant{len([n for n in graph.nodes if str(n.target).startswith('_tensor_constant')])}"
        setattr(root, target, value)
    read = graph.create_node("get_attr", target, name=node.name)
    read.meta.update({key: meta for key, meta in node.meta.items() if key != "grapharg"})
    return read


class PreGradModule(fx.GraphModule):
    """A capture's ``GraphModule``, which runs its graph with ``torch.fx.Interpreter`` where Python cannot compile
    its generated code, as AOTAutograd runs Dynamo's graph (``create_functional_call``: it never runs the code). A
    pass may put in a node an argument whose ``repr`` is no Python, as Inductor's own ``efficient_conv_bn_eval``
    passes the builtin ``torch.conv2d``: ``torch.compile`` compiles it, so it is no defect here either. The code
    is kept as text (``gm.code``) all the same; :attr:`uncompiled` says why it is not run."""

    uncompiled: str | None = None
    """Why the module runs its graph with ``torch.fx.Interpreter``, or None where it runs its generated code."""

    def recompile(self) -> Any:
        try:
            found = super().recompile()
        except SyntaxError as error:
            self.uncompiled = f"its generated code is no Python ({error.msg}, line {error.lineno})"
            type(self).forward = interpreted
            return None
        self.uncompiled = None
        return found


@dataclasses.dataclass(frozen=True)
class _Output:
    """A leaf of the model's output that is the graph's output ``index``."""

    index: int


class _ModelReturn(fx.graph.CodeGen):
    """Generated code returning what the model returns (a tensor, or tuples, named tuples, lists, dicts and
    OrderedDicts of tensors and constants) from the graph's output tuple, which stays as Dynamo made it."""

    def __init__(self, spec: pytree.TreeSpec, leaves: tuple[Any, ...]) -> None:
        super().__init__()
        self.spec = spec
        self.leaves = leaves  # each an _Output or a constant

    @classmethod
    def of(cls, handed: Handed, output: fx.Node, placed: list[fx.Node], positions: dict[int, int]
           ) -> _ModelReturn | None:
        """The code generator that returns the model's output from ``output``'s tuple (an input of the model it
        returns as it is appended to it), or None where the model returns that tuple itself."""
        returned = list(output.args[0])  # type: ignore[arg-type]
        given = {id(value): index for index, value in reversed(list(enumerate(handed.returned)))}
        leaves, spec = pytree.tree_flatten(handed.model_output)
        mapped: list[Any] = []
        for leaf in leaves:
            if not isinstance(leaf, torch.Tensor):
                mapped.append(leaf)
            elif id(leaf) in given:
                mapped.append(_Output(given[id(leaf)]))
            elif id(leaf) in positions:
                returned.append(placed[positions[id(leaf)]])
                mapped.append(_Output(len(returned) - 1))
            else:
                raise NotImplementedError("the model returns a tensor that is neither an output of Dynamo's graph "
                                          "nor one of its inputs: not built")
        output.args = (tuple(returned),)
        if spec.type is tuple and mapped == [_Output(i) for i in range(len(returned))]:
            return None
        _source(spec, iter(mapped))  # raises for what the generated code cannot build
        return cls(spec, tuple(mapped))

    def additional_globals(self) -> list[tuple[str, Any]]:
        return [(_class_name(cls), cls) for cls in dict.fromkeys(_classes(self.spec))]

    def process_outputs(self, outputs: Any) -> Any:
        return pytree.tree_unflatten([outputs[leaf.index] if isinstance(leaf, _Output) else leaf
                                      for leaf in self.leaves], self.spec)

    def generate_output(self, output_args: Any, *, descs: Any = None, repr_fn: Any = None) -> str:
        return (f"{_RETURNED} = {(repr_fn or repr)(output_args)}\n"
                f"return {_source(self.spec, iter(self.leaves))}")


def returning(value: Any) -> tuple[tuple[torch.Tensor, ...], fx.graph.CodeGen | None]:
    """The tensors of ``value`` (what a model returns) as a flat tuple, and the code generator returning ``value``
    from a graph that returns that tuple (None where ``value`` is that tuple).

    >>> tensors, codegen = returning({"logits": torch.ones(1), "aux": None})
    >>> len(tensors), codegen.process_outputs(tensors)
    (1, {'logits': tensor([1.]), 'aux': None})
    """
    leaves, spec = pytree.tree_flatten(value)
    tensors = tuple(leaf for leaf in leaves if isinstance(leaf, torch.Tensor))
    if spec == pytree.tree_flatten(tensors)[1]:
        return tensors, None
    index = iter(range(len(tensors)))
    mapped = tuple(_Output(next(index)) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves)
    _source(spec, iter(mapped))  # raises for what the generated code cannot build
    return tensors, _ModelReturn(spec, mapped)


def _source(spec: pytree.TreeSpec, leaves: Iterator[Any]) -> str:
    """Python source building the value of ``spec`` from the graph's output tuple and constant ``leaves``."""
    if spec.is_leaf():
        leaf = next(leaves)
        if isinstance(leaf, _Output):
            return f"{_RETURNED}[{leaf.index}]"
        if leaf is None or isinstance(leaf, (bool, int, float, str)):
            return repr(leaf)
        raise NotImplementedError(f"the model returns a {type(leaf).__name__} constant: not built")
    parts = [_source(child, leaves) for child in spec.children()]
    if spec.type is tuple:
        return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
    if spec.type is list:
        return f"[{', '.join(parts)}]"
    if spec.type is dict:
        return "{" + ", ".join(f"{key!r}: {part}" for key, part in zip(spec.context, parts, strict=True)) + "}"
    if spec.type is collections.OrderedDict:
        items = ", ".join(f"({key!r}, {part})" for key, part in zip(spec.context, parts, strict=True))
        return f"{_class_name(collections.OrderedDict)}([{items}])"
    if spec.type is collections.namedtuple:
        return f"{_class_name(spec.context)}({', '.join(parts)})"
    raise NotImplementedError(f"the model returns a {getattr(spec.type, '__name__', spec.type)}: only tensors, "
                              "tuples, named tuples, lists, dicts and OrderedDicts of them are built")


def _classes(spec: pytree.TreeSpec) -> list[type]:
    """The classes the generated code calls to build the value of ``spec`` (named tuples, OrderedDict)."""
    found = ([spec.context] if spec.type is collections.namedtuple
             else [collections.OrderedDict] if spec.type is collections.OrderedDict else [])
    return found + [cls for child in ([] if spec.is_leaf() else spec.children()) for cls in _classes(child)]


def _class_name(cls: type) -> str:
    """The generated code's global name for a class it calls to build what the model returns."""
    return f"{_RETURNED}_{cls.__name__}"


def as_aot_receives(module: nn.Module, inputs: tuple[Any, ...], *, training: bool) -> nn.Module:
    """``module`` as ``torch.compile`` hands it to AOTAutograd, the start of the Inductor captures after the pre-grad
    hook: Dynamo's graph after the whole of ``pre_grad_passes`` (Inductor's own pre-grad passes, no custom pass, then
    :func:`~fxverify.inductor.pre_grad.after_pre_grad_passes`), taking the model's inputs and returning its outputs,
    reading the model's own parameters and buffers under their names. ``module`` itself where Dynamo splits it into
    several graphs (each goes through the pre-grad passes on its own: the captures trace the model whole) or hands
    Inductor none."""
    module.train(training)
    try:
        with torch.set_grad_enabled(training):
            handed = at_pre_grad_hook(module, inputs)
    except (NotImplementedError, RuntimeError):
        return module
    gm = as_model(handed, module, inputs)
    after_pre_grad_passes(gm)
    gm.recompile()
    return gm
