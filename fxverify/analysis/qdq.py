"""What the quantize / dequantize nodes of a quantized graph promise, read from the graph alone: the q/dq
nodes ``convert_pt2e`` leaves (``torch.ops.quantized_decomposed``, or their Edge ops in an ExecuTorch Edge program:
:func:`op_of`), and the problems a pass over such a graph
can make of them (:func:`qdq_problems`):

- ``pairing``: a quantize feeds dequantizes with its own scale, zero point, dtype (and axis), and a range holding
  its own;
- ``parameters``: scales positive and finite, zero points inside the range, the range inside the dtype's;
- ``axis``: a per-channel weight feeding a convolution or linear is quantized along the output-channel
  dimension (``conv_transpose`` with ``groups=1``: dimension 1; with more groups no dimension of the weight
  holds the output channels), one scale a channel;
- ``sharing``: an op that only moves values (``cat``, a view, a permute, pooling by max) between a
  dequantize and a quantize keeps the parameters, where the quantizer made them equal;
- ``observer``: no observer or fake-quantize module left after ``convert_pt2e``.

A problem names its node, the parameter and what it should be; :func:`new_problems` keeps those a pass made
(the graph before it may carry the quantizer's own).

>>> import torch
>>> from torch import fx
>>> g = fx.Graph()
>>> x = g.placeholder("x")
>>> q = g.call_function(torch.ops.quantized_decomposed.quantize_per_tensor.default, (x, 0.1, 3, 0, 255, torch.uint8))
>>> dq = g.call_function(torch.ops.quantized_decomposed.dequantize_per_tensor.default, (q, 0.2, 3, 0, 255, torch.uint8))
>>> _ = g.output(dq)
>>> [p.describe() for p in qdq_problems(fx.GraphModule(torch.nn.Module(), g))]  # doctest: +NORMALIZE_WHITESPACE
['%dequantize_per_tensor_default: scale 0.2 where its quantize %quantize_per_tensor_default has 0.1: a dequantize
  must read the parameters its quantize wrote (pairing)']
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
import torch.ao.quantization.fx._decomposed
from torch import fx

from fxverify.analysis.module_state import resolve

_QD = torch.ops.quantized_decomposed
QUANTIZE = {_QD.quantize_per_tensor.default, _QD.quantize_per_tensor.tensor, _QD.quantize_per_channel.default}
DEQUANTIZE = {_QD.dequantize_per_tensor.default, _QD.dequantize_per_tensor.tensor, _QD.dequantize_per_channel.default}
PER_CHANNEL = {_QD.quantize_per_channel.default, _QD.dequantize_per_channel.default}
# ops that only move values: a quantizer shares one set of parameters between their input and output
_A = torch.ops.aten
MOVES_VALUES = {_A.cat.default, _A.view.default, _A.reshape.default, _A.permute.default, _A.flatten.using_ints,
                _A.slice.Tensor, _A.max_pool2d.default, _A.transpose.int, _A.squeeze.dim, _A.unsqueeze.default,
                # their core ATen forms, in Edge programs
                _A.view_copy.default, _A.permute_copy.default, _A.slice_copy.Tensor, _A.squeeze_copy.dims,
                _A.unsqueeze_copy.default, _A.transpose_copy.int}
WEIGHTED = {_A.conv1d.default: 0, _A.conv2d.default: 0, _A.conv3d.default: 0, _A.linear.default: 0,
            _A.conv_transpose1d.default: 1, _A.conv_transpose2d.input: 1, _A.conv_transpose3d.input: 1}
OBSERVER_WORDS = ("Observer", "FakeQuantize")  # the class names of what prepare_pt2e inserts


@dataclasses.dataclass(frozen=True)
class Params:
    """A q/dq node's parameters: scale(s) and zero point(s) as tuples, range, dtype and axis (None: per-tensor). A
    scale or zero point computed at run time (dynamic quantization: ``choose_qparams``) is the name of the node
    computing it (``'%choose_qparams'``): a dequantize must read the same node."""

    scale: tuple[float | str, ...]
    zero_point: tuple[int | str, ...]
    qmin: int
    qmax: int
    dtype: torch.dtype
    axis: int | None = None

    def differs(self, other: Params, *, holding: bool = False) -> str | None:
        """The first parameter that differs from ``other``'s, as ``'<name> <ours> where ... has <theirs>'``; with
        ``holding`` (a dequantize's against its quantize's), a range holding ``other``'s is none: every integer the
        quantize writes lies in it (ExecuTorch's Arm backend narrows a quantize's ``qmin`` to its zero point, fusing
        a ReLU, and leaves its dequantizes at the dtype's range).

        >>> written = Params((0.1,), (-128,), -128, 127, torch.int8)
        >>> read = dataclasses.replace(written, qmin=-128, qmax=127)
        >>> narrowed = dataclasses.replace(written, qmin=-128, qmax=100)
        >>> read.differs(dataclasses.replace(written, qmin=0), holding=True), narrowed.differs(written, holding=True)
        (None, 'qmax 100 where {other} has 127')
        """
        held = holding and self.qmin <= other.qmin and self.qmax >= other.qmax
        for name in ("scale", "zero_point", "qmin", "qmax", "dtype", "axis"):
            ours, theirs = getattr(self, name), getattr(other, name)
            if ours != theirs and not (held and name in ("qmin", "qmax")):
                return f"{name} {_shown(ours)} where {{other}} has {_shown(theirs)}"
        return None


@dataclasses.dataclass(frozen=True)
class Problem:
    """One problem of the q/dq nodes: its ``kind`` (see the module's docstring), the ``node`` and ``what``."""

    kind: str
    node: str
    what: str

    def describe(self) -> str:
        return f"%{self.node}: {self.what} ({self.kind})"

    @property
    def key(self) -> tuple[str, str]:
        """What the problem is, without the node's name (which a pass may change)."""
        return self.kind, self.what


def op_of(node: fx.Node) -> Any:
    """The operator ``node`` calls: its target, or for an ExecuTorch Edge op (``EdgeOpOverload``) the ATen or
    ``quantized_decomposed`` operator it wraps."""
    target = node.target
    return getattr(target, "_op", target) if type(target).__name__ == "EdgeOpOverload" else target


def params(gm: fx.GraphModule, node: fx.Node) -> Params:
    """The parameters a quantize or dequantize ``node`` of ``gm`` reads (tensors from ``get_attr`` nodes resolved)."""
    args = [_value(gm, a) for a in node.args]
    if op_of(node) in PER_CHANNEL:
        _, scale, zero_point, axis, qmin, qmax, dtype = args[:7]
        return Params(_floats(scale), _ints(zero_point), int(qmin), int(qmax), dtype, int(axis))
    _, scale, zero_point, qmin, qmax, dtype = args[:6]
    return Params(_floats(scale), _ints(zero_point), int(qmin), int(qmax), dtype)


def qdq_problems(gm: fx.GraphModule) -> list[Problem]:
    """Every problem of ``gm``'s q/dq nodes, in graph order (see the module's docstring)."""
    found: list[Problem] = []
    for node in gm.graph.nodes:
        if node.op == "call_module" and any(word in type(resolve(gm, str(node.target))).__name__
                                            for word in OBSERVER_WORDS):
            found.append(Problem("observer", node.name, f"{type(resolve(gm, str(node.target))).__name__} "
                                 f"{node.target} is left: convert_pt2e replaces each observer with its q/dq pair"))
        if node.op != "call_function" or op_of(node) not in QUANTIZE | DEQUANTIZE:
            continue
        own = params(gm, node)
        found.extend(_parameter_problems(node, own))
        if op_of(node) in QUANTIZE:
            found.extend(_pairing_problems(gm, node, own))
        elif op_of(node) in PER_CHANNEL:
            found.extend(_axis_problems(gm, node, own))
    found.extend(_sharing_problems(gm))
    return found


def new_problems(before: fx.GraphModule, after: fx.GraphModule) -> list[Problem]:
    """The problems of ``after`` that ``before`` (the graph a pass was given) does not have: the pass's."""
    had = Counter(p.key for p in qdq_problems(before))
    made = []
    for problem in qdq_problems(after):
        if had[problem.key]:
            had[problem.key] -= 1
        else:
            made.append(problem)
    return made


def quantization_step(gm: fx.GraphModule) -> float | None:
    """The largest step (scale) of a per-tensor dequantize of ``gm``'s activations known before it runs: what one
    quantization step of its coarsest activation is worth, the unit a tolerance on its outputs is counted in; None
    without one (none, or only scales computed at run time)."""
    scales = [scale for n in gm.graph.nodes if n.op == "call_function" and op_of(n) in DEQUANTIZE - PER_CHANNEL
              for scale in params(gm, n).scale if isinstance(scale, float)]
    return max(scales) if scales else None


def _parameter_problems(node: fx.Node, own: Params) -> Iterator[Problem]:
    info = torch.iinfo(own.dtype) if not own.dtype.is_floating_point else None
    if info is not None and not info.min <= own.qmin <= own.qmax <= info.max:
        yield Problem("parameters", node.name, f"range [{own.qmin}, {own.qmax}] outside {own.dtype}'s "
                                               f"[{info.min}, {info.max}]")
    bad = [s for s in own.scale if isinstance(s, float) and not (math.isfinite(s) and s > 0)]
    if bad:
        yield Problem("parameters", node.name, f"scale {_shown(bad[0])}: a scale must be positive and finite")
    outside = [z for z in own.zero_point if isinstance(z, int) and not own.qmin <= z <= own.qmax]
    if outside:
        yield Problem("parameters", node.name, f"zero point {outside[0]} outside its range [{own.qmin}, {own.qmax}]")


def _pairing_problems(gm: fx.GraphModule, node: fx.Node, own: Params) -> Iterator[Problem]:
    for user in node.users:
        if user.op == "call_function" and op_of(user) in DEQUANTIZE:
            differs = params(gm, user).differs(own, holding=True)
            if differs:
                yield Problem("pairing", user.name, differs.format(other=f"its quantize %{node.name}")
                              + ": a dequantize must read the parameters its quantize wrote")


def _axis_problems(gm: fx.GraphModule, node: fx.Node, own: Params) -> Iterator[Problem]:
    for user in node.users:
        want = _output_channels(user)
        if want is None or len(user.args) < 2 or user.args[1] is not node:
            continue
        weight = _value(gm, node.args[0])
        shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else None
        groups = _groups(user)
        if want == 1 and groups > 1:
            yield Problem("axis", node.name, f"per-channel on axis {own.axis} of the weight of %{user.name}, a transposed "
                                             f"convolution with groups={groups}: no dimension of its weight holds the "
                                             "output channels; quantize it per tensor")
        elif own.axis != want:
            yield Problem("axis", node.name, f"axis {own.axis} where %{user.name} ({_op(user)}) has its output "
                                             f"channels on dimension {want} of its weight: quantize along it")
        elif shape is not None and len(own.scale) != shape[want]:
            yield Problem("axis", node.name, f"{len(own.scale)} scales for the {shape[want]} output channels of "
                                             f"%{user.name}: one scale a channel")


def _sharing_problems(gm: fx.GraphModule) -> Iterator[Problem]:
    """An op that moves values, read through dequantizes and quantized after: its output keeps its inputs'
    parameters where those are all alike."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or op_of(node) not in MOVES_VALUES:
            continue
        read = [params(gm, a) for a in node.all_input_nodes if a.op == "call_function" and op_of(a) in DEQUANTIZE]
        written = [params(gm, u) for u in node.users if u.op == "call_function" and op_of(u) in QUANTIZE]
        if not read or not written or any(r != read[0] for r in read[1:]):
            continue
        for out in written:
            differs = out.differs(read[0])
            if differs:
                yield Problem("sharing", node.name, f"quantized after it with {differs.format(other='its input')}: "
                                                    f"{_op(node)} only moves values, so its output keeps its input's "
                                                    "parameters")


def _output_channels(node: fx.Node) -> int | None:
    """The dimension of its weight (second argument) holding the output channels, for a convolution or linear
    ``node``; None for any other node. ``aten.convolution`` (core ATen) says by its ``transposed`` argument."""
    if node.op != "call_function":
        return None
    if op_of(node) is _A.convolution.default:
        return 1 if len(node.args) > 6 and node.args[6] else 0
    return WEIGHTED.get(op_of(node))


def _groups(node: fx.Node) -> int:
    """The ``groups`` argument of a (transposed) convolution node: its seventh argument either way (ninth of
    ``aten.convolution``; 1 for linear)."""
    position = 8 if op_of(node) is _A.convolution.default else 6
    groups = node.kwargs.get("groups", node.args[position] if len(node.args) > position else 1)
    return groups if isinstance(groups, int) else 1  # a symbolic groups: none of the kinds this reads


def _op(node: fx.Node) -> str:
    return str(op_of(node)).removeprefix("aten.")


def _value(gm: fx.GraphModule, arg: Any) -> Any:
    if isinstance(arg, fx.Node) and arg.op == "get_attr":
        return resolve(gm, str(arg.target))
    return arg


def _floats(value: Any) -> tuple[float | str, ...]:
    if isinstance(value, fx.Node):  # computed at run time
        return (f"%{value.name}",)
    if isinstance(value, torch.Tensor):
        return tuple(float(v) for v in value.flatten().tolist())
    return (float(value),)


def _ints(value: Any) -> tuple[int | str, ...]:
    if isinstance(value, fx.Node):
        return (f"%{value.name}",)
    if isinstance(value, torch.Tensor):
        return tuple(int(v) for v in value.flatten().tolist())
    return (int(value),)


def _shown(value: Any) -> str:
    if isinstance(value, tuple) and len(value) == 1:
        value = value[0]
    if isinstance(value, tuple) and len(value) > 4:
        return f"({', '.join(map(_shown, value[:4]))}, ... {len(value)} values)"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
