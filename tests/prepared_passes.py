"""Passes over PT2E prepared graphs (observers in place, before calibration), written the way torchao's and
ExecuTorch's authors write them (a function over the prepared ``GraphModule``, edited in place, returning it), each
buggy one beside its correct twin:

- ``name_observers_by_node`` registers each observer under a name saying which node it observes
  (``observer_of_<node>``), the same module object under each name, so a sharing group keeps one module;
  ``name_observers_by_node_copied`` registers a ``copy.deepcopy`` of it instead: every node of a sharing group
  (XNNPACK's ``cat`` and ``max_pool2d``) gets its own observer, calibrated apart: caught by ``observers`` (split);
- ``clone_before_observer`` gives each convolution a copy of its input (``aten.clone``, as a pass that will edit
  it in place does), inserted before the observer (the observer then observes the clone, which the convolution
  reads); ``clone_after_observer`` inserts it between the observer and the convolution, leaving the convolution's
  input unobserved (no q/dq pair will stand before it: it is not lowered as a quantized op): caught by
  ``observers``.
"""

from __future__ import annotations

import copy

import torch
from torch import fx

CONV = torch.ops.aten.conv2d.default


def _is_observer(gm: fx.GraphModule, node: fx.Node) -> bool:
    return node.op == "call_module" and type(gm.get_submodule(str(node.target))).__name__.endswith("Observer")


def _name_observers_by_node(gm: fx.GraphModule, *, copied: bool) -> fx.GraphModule:
    for node in gm.graph.nodes:
        if not _is_observer(gm, node):
            continue
        observer = gm.get_submodule(str(node.target))
        name = f"observer_of_{node.args[0].name}"
        gm.add_submodule(name, copy.deepcopy(observer) if copied else observer)
        node.target = name
    gm.delete_all_unused_submodules()
    gm.recompile()
    return gm


def name_observers_by_node(gm: fx.GraphModule) -> fx.GraphModule:
    return _name_observers_by_node(gm, copied=False)


def name_observers_by_node_copied(gm: fx.GraphModule) -> fx.GraphModule:
    return _name_observers_by_node(gm, copied=True)


def _copy_conv_inputs(gm: fx.GraphModule, *, before_observer: bool) -> fx.GraphModule:
    for conv in list(gm.graph.find_nodes(op="call_function", target=CONV)):
        observer = conv.args[0]
        if not isinstance(observer, fx.Node) or not _is_observer(gm, observer):
            continue
        if before_observer:
            value = observer.args[0]
            if isinstance(value, fx.Node) and value.target is torch.ops.aten.clone.default:
                continue  # copied for another convolution reading it
            with gm.graph.inserting_before(observer):
                clone = gm.graph.call_function(torch.ops.aten.clone.default, (value,))
            observer.replace_input_with(value, clone)
        else:
            with gm.graph.inserting_before(conv):
                clone = gm.graph.call_function(torch.ops.aten.clone.default, (observer,))
            conv.replace_input_with(observer, clone)
    gm.recompile()
    return gm


def clone_before_observer(gm: fx.GraphModule) -> fx.GraphModule:
    return _copy_conv_inputs(gm, before_observer=True)


def clone_after_observer(gm: fx.GraphModule) -> fx.GraphModule:
    return _copy_conv_inputs(gm, before_observer=False)
