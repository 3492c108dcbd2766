"""AOTAutograd's graphs as Inductor's hooks receive them in a training compile: what each placeholder and output of
a joint, forward or backward graph is (:func:`aot_roles`, from AOTAutograd's descriptors), and what makes
AOTAutograd compile the backward graph at all (:func:`backward_on_zeros`).

>>> import torch
>>> from torch._inductor.pattern_matcher import joint_fwd_bwd
>>> joint = joint_fwd_bwd(lambda x: x.sin(), [torch.randn(3, requires_grad=True)])
>>> aot_roles(joint)
((('flat', 0), ('tangent', 0)), (('output', 0), ('grad', 0)))
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree


def aot_roles(gm: fx.GraphModule, graph: str = "joint"
              ) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]:
    """What each placeholder of an AOTAutograd graph ``gm`` (the ``graph`` graph: ``forward``, ``backward``,
    ``joint``) reads and what each of its outputs is, from AOTAutograd's descriptors: reads ``("flat", flat
    input)``, ``("tangent", i)`` or ``("saved", i)`` (the backward reads what the forward saved, in order, a primal
    among them); outputs ``("output" | "mutation" | "grad", flat index)``, ``("saved", i)`` or ``("other", -1)``
    (the module's example reads a joint graph)."""
    from torch._functorch._aot_autograd.descriptors import (
        GradAOTOutput,
        InputMutationAOTOutput,
        PlainAOTInput,
        PlainAOTOutput,
        SavedForBackwardsAOTOutput,
        TangentAOTInput,
    )

    tangents, saved_read, saved_given = itertools.count(), itertools.count(), itertools.count()

    def read(desc: Any) -> tuple[str, int]:
        if isinstance(desc, TangentAOTInput):
            return "tangent", next(tangents)
        if graph != "backward" and isinstance(desc, PlainAOTInput):
            return "flat", desc.idx
        return "saved", next(saved_read)  # the backward's other inputs, a saved primal among them, in order

    def given(desc: Any) -> tuple[str, int]:
        if isinstance(desc, PlainAOTOutput):
            return "output", desc.idx
        if isinstance(desc, InputMutationAOTOutput) and isinstance(desc.mutated_input, PlainAOTInput):
            return "mutation", desc.mutated_input.idx
        if isinstance(desc, GradAOTOutput) and isinstance(desc.grad_of, PlainAOTInput):
            return "grad", desc.grad_of.idx
        if isinstance(desc, SavedForBackwardsAOTOutput):
            return "saved", next(saved_given)
        return "other", -1

    reads = tuple(read(node.meta.get("desc")) for node in gm.graph.find_nodes(op="placeholder"))
    return reads, tuple(given(desc) for desc in gm.graph.output_node().meta["desc"])


def backward_on_zeros(outputs: Any) -> None:
    """Backward from zero gradients of the tensors among ``outputs`` that require grad: what makes AOTAutograd
    compile the backward graph of a training compile (its compilers run at the first backward), leaving no
    gradient but zeros.

    >>> w = torch.ones(2, requires_grad=True)
    >>> backward_on_zeros({"y": w * 3, "n": 1}); w.grad
    tensor([0., 0.])
    """
    leaves = [out for out in pytree.tree_leaves(outputs) if isinstance(out, torch.Tensor) and out.requires_grad]
    torch.autograd.backward(leaves, [torch.zeros_like(out) for out in leaves])
