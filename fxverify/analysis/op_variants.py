"""Op-variant coverage: which ops a transform rewrote, and which spellings of them it left untouched.

A ReLU rewrite keyed on ``aten.relu.default`` never meets ``aten.relu_.default``, which is what the
training IR of torchvision models holds (``nn.ReLU(inplace=True)``): its outputs are exact, so no
check fails, and its author believes every ReLU is rewritten. Counting the targets of each graph
before and after the transform says what it rewrote (a count that went down) and which variants of
those ops it left where they were:

- ATen operators (``aten.relu.default``): the same op, other overloads of its packet
  (``aten.add.Scalar`` for ``aten.add.Tensor``), the in-place twin (``aten.relu_.default``), the
  ``out=`` variant (``aten.add.out``) and, for an in-place op, the functional twin;
- torch-level graphs (``symbolic_trace``): the function, method and module spellings of one op
  (``F.relu``, ``torch.relu``, ``Tensor.relu``, ``nn.ReLU``; ``operator.add``, ``torch.add``,
  ``Tensor.add``) and the in-place twin (``Tensor.relu_``, ``operator.iadd``).

An op whose count went up somewhere is what the transform rewrites *to* (``aten.relu.default`` for
a pass that makes relu_ functional): it is never reported as left. Everything here reads names
only, without torch, so the summary can use it at the end of a run.

>>> before = {"aten.relu.default": 2, "aten.relu_.default": 3, "aten.convolution.default": 2}
>>> after = {"aten.clamp_min.default": 2, "aten.relu_.default": 3, "aten.convolution.default": 2}
>>> print(coverage({"m": {"before": before, "after": after}}).describe())
rewrote aten.relu.default x2 in 1 model; left aten.relu_.default x3 in 1 model: in-place twin (m)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

OP_COUNTS = "op_counts"  # the key of a check's details holding {"before": counts, "after": counts} of one model
SHOWN = 3  # models named for each op left

# kinds of variant, from the op rewritten to the op left
SAME = "the same op"
OVERLOAD = "other overload"
IN_PLACE = "in-place twin"
FUNCTIONAL = "functional twin"
OUT = "out= variant"
FUNCTION = "function spelling"
METHOD = "method spelling"
MODULE = "module spelling"

_SYMBOLIC = ("F", "torch", "Tensor", "operator", "nn")  # the prefixes of torch-level names
_STRUCTURAL = {"operator.getitem"}  # reading one output of a call: not an op a pass rewrites
# nn module classes whose snake_case name is not the functional's name
_MODULE_BASES = {
    "ReLU": "relu", "ReLU6": "relu6", "LeakyReLU": "leaky_relu", "PReLU": "prelu", "RReLU": "rrelu", "GELU": "gelu",
    "SiLU": "silu", "ELU": "elu", "SELU": "selu", "CELU": "celu", "GLU": "glu", "LogSigmoid": "logsigmoid",
    "BatchNorm1d": "batch_norm", "BatchNorm2d": "batch_norm", "BatchNorm3d": "batch_norm", "SyncBatchNorm": "batch_norm",
    "InstanceNorm1d": "instance_norm", "InstanceNorm2d": "instance_norm", "InstanceNorm3d": "instance_norm",
    "MultiheadAttention": "multi_head_attention_forward", "Upsample": "interpolate", "RMSNorm": "rms_norm",
}
# operator's names for the torch functions they call, and its in-place forms
_OPERATOR_BASES = {"truediv": "div", "floordiv": "floor_divide", "and_": "bitwise_and", "or_": "bitwise_or",
                   "xor": "bitwise_xor", "invert": "bitwise_not", "lshift": "bitwise_left_shift",
                   "rshift": "bitwise_right_shift", "mod": "remainder", "inv": "bitwise_not"}
_OPERATOR_IN_PLACE = {f"i{name}": name for name in ("add", "sub", "mul", "truediv", "floordiv", "matmul", "pow", "mod",
                                                    "and", "or", "xor", "lshift", "rshift")}


# -- naming targets ------------------------------------------------------------------------------
def spelled_target(node: Any, owner: Any = None) -> str | None:
    """A readable name of what ``node`` calls: ``aten.relu.default`` (an ATen overload), ``F.relu``,
    ``torch.relu``, ``Tensor.relu`` (a method), ``operator.add``, ``nn.ReLU`` (a torch.nn module
    called through ``owner``, the GraphModule), ``package.module:Name`` for anything else; None for
    what calls nothing (placeholders, attributes, the output) and for reading an output of a call.

    >>> import operator, torch
    >>> from torch import fx
    >>> gm = fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
    >>> [spelled_target(n, gm) for n in gm.graph.nodes]
    [None, 'nn.ReLU', None]
    >>> class Node:
    ...     op, target = "call_function", torch.ops.aten.relu_.default
    >>> spelled_target(Node()), spelled_target(type("N", (Node,), {"target": torch.relu})())
    ('aten.relu_.default', 'torch.relu')
    >>> spelled_target(type("N", (Node,), {"op": "call_method", "target": "add_"})())
    'Tensor.add_'
    """
    op, target = node.op, node.target
    if op == "call_method":
        return f"Tensor.{target}"
    if op == "call_module":
        try:
            cls = type(owner.get_submodule(target))
        except AttributeError:  # a target that does not resolve: the lint check's finding
            return f"module {target}"
        if cls.__module__.startswith("torch.nn.modules."):
            return f"nn.{cls.__name__}"
        return f"{cls.__module__}:{cls.__qualname__}"
    if op != "call_function":
        return None
    name = _function_name(target)
    return None if name in _STRUCTURAL else name


def _function_name(target: Any) -> str:
    if hasattr(target, "overloadpacket") or type(target).__name__ == "OpOverloadPacket":
        return str(target)  # aten.relu.default, aten.relu
    module, name = getattr(target, "__module__", None), getattr(target, "__name__", None)
    qualname = getattr(target, "__qualname__", name) or repr(target)
    if name is None:
        return f"{type(target).__module__}:{type(target).__qualname__}"  # a callable object (a higher-order op)
    if module in ("torch.nn.functional", "torch._C._nn"):
        return f"F.{name}"
    if module in ("torch", "torch._C._VariableFunctions"):
        return f"torch.{name}"
    if module in ("_operator", "operator"):
        return f"operator.{name}"
    if module is None and qualname.split(".")[0] in ("TensorBase", "Tensor", "_TensorBase"):
        return f"Tensor.{name}"
    return f"{module}:{qualname}"


def op_counts(gm: Any) -> dict[str, int]:
    """How many nodes of ``gm`` (a GraphModule) call each target, by :func:`spelled_target`.

    >>> import torch
    >>> from torch import fx, nn
    >>> class M(nn.Module):
    ...     def forward(self, x):
    ...         return torch.relu(x) + x.relu() + nn.functional.relu(x)
    >>> op_counts(fx.symbolic_trace(M()))
    {'torch.relu': 1, 'Tensor.relu': 1, 'operator.add': 2, 'F.relu': 1}
    """
    counts: dict[str, int] = {}
    for node in gm.graph.nodes:
        name = spelled_target(node, gm)
        if name is not None:
            counts[name] = counts.get(name, 0) + 1
    return counts


def first_node(gm: Any, name: str) -> Any:
    """The first node of ``gm`` whose target is called ``name``, or None."""
    return next((node for node in gm.graph.nodes if spelled_target(node, gm) == name), None)


# -- families of variants ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Spelling:
    """What a name says of its op: its ``family`` (the op whatever the spelling: ``aten.relu`` for
    every ATen relu, ``relu`` for every torch-level one), whether it is ``in_place``, an ``out``
    variant, its ATen ``overload`` and torch-level ``style`` (function, method, module)."""

    family: str
    in_place: bool = False
    out: bool = False
    overload: str = ""
    style: str = ""


def spelling(name: str) -> Spelling:
    """What ``name`` (a :func:`spelled_target`) says of its op.

    >>> spelling("aten.relu_.default")
    Spelling(family='aten.relu', in_place=True, out=False, overload='default', style='')
    >>> spelling("aten.add.out").out, spelling("aten.__and__.Tensor").family
    (True, 'aten.__and__')
    >>> [spelling(n).family for n in ("F.relu", "torch.relu_", "Tensor.relu", "nn.ReLU", "nn.BatchNorm2d")]
    ['relu', 'relu', 'relu', 'relu', 'batch_norm']
    >>> spelling("operator.iadd"), spelling("my.pkg:Block").family
    (Spelling(family='add', in_place=True, out=False, overload='', style='function spelling'), 'my.pkg:Block')
    """
    prefix, _, rest = name.partition(".")
    if ":" in name or " " in name or not rest:
        return Spelling(name)
    if prefix not in _SYMBOLIC:  # an operator: namespace.packet[.overload]
        packet, _, overload = rest.partition(".")
        base, in_place = _strip_in_place(packet)
        out = overload == "out" or "out" in overload.split("_")
        return Spelling(f"{prefix}.{base}", in_place, out, overload or "default")
    if prefix == "nn":
        if rest in _MODULE_BASES:
            return Spelling(_MODULE_BASES[rest], style=MODULE)
        return Spelling(re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", rest).lower(), style=MODULE)
    style = METHOD if prefix == "Tensor" else FUNCTION
    if prefix == "operator":
        if rest in _OPERATOR_IN_PLACE:
            base = _OPERATOR_IN_PLACE[rest]
            return Spelling(_OPERATOR_BASES.get(base, base), in_place=True, style=style)
        return Spelling(_OPERATOR_BASES.get(rest, rest.rstrip("_")), style=style)
    base, in_place = _strip_in_place(rest)
    return Spelling(base, in_place, style=style)


def _strip_in_place(name: str) -> tuple[str, bool]:
    if name.endswith("_") and not name.endswith("__") and len(name) > 1:
        return name[:-1], True
    return name, False


def variant_kind(rewritten: str, left: str) -> str | None:
    """What ``left`` is to ``rewritten`` (both :func:`spelled_target` names): ``the same op``, ``in-place
    twin``, ``functional twin``, ``out= variant``, ``other overload`` (ATen), or which spelling
    (``function spelling``, ``method spelling``, ``module spelling``) of the same torch-level op;
    None when it is another op.

    >>> variant_kind("aten.relu.default", "aten.relu_.default"), variant_kind("aten.relu_.default", "aten.relu.default")
    ('in-place twin', 'functional twin')
    >>> variant_kind("aten.add.Tensor", "aten.add.Scalar"), variant_kind("aten.add.Tensor", "aten.add.out")
    ('other overload', 'out= variant')
    >>> variant_kind("F.relu", "nn.ReLU"), variant_kind("nn.ReLU", "Tensor.relu"), variant_kind("F.relu", "torch.relu")
    ('module spelling', 'method spelling', 'function spelling')
    >>> variant_kind("operator.add", "Tensor.add_"), variant_kind("F.relu", "F.gelu"), variant_kind("F.relu", "aten.relu.default")
    ('in-place twin', None, None)
    """
    if rewritten == left:
        return SAME
    one, other = spelling(rewritten), spelling(left)
    if one.family != other.family:
        return None
    if other.out and not one.out:
        return OUT
    if other.in_place != one.in_place:
        return IN_PLACE if other.in_place else FUNCTIONAL
    if other.overload != one.overload:
        return OVERLOAD
    return other.style or OVERLOAD


# -- coverage ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Rewrote:
    """An op the transform rewrote: ``count`` nodes fewer, in ``models`` models."""

    op: str
    count: int
    models: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Left:
    """An op ``op`` left untouched, ``count`` nodes in ``models``, that is a ``kind`` of the rewritten ``of``."""

    op: str
    kind: str
    of: str
    count: int
    models: tuple[str, ...]

    def describe(self) -> str:
        shown = ", ".join(self.models[:SHOWN]) + (f" and {len(self.models) - SHOWN} more"
                                                  if len(self.models) > SHOWN else "")
        return f"left {self.op} x{self.count} in {_models(len(self.models))}: {self.kind} ({shown})"


@dataclasses.dataclass(frozen=True)
class Coverage:
    """The ops a transform rewrote (those with variants left, first) and the variants it ``left``."""

    rewrote: tuple[Rewrote, ...]
    left: tuple[Left, ...]

    def describe(self) -> str:
        """``rewrote aten.relu.default x31 in 12 models; left aten.relu_.default x17 in 3 models: in-place
        twin (...)``: the rewritten ops that have variants left, and those variants; empty when none is left."""
        of = {found.of for found in self.left}
        rewrote = [f"{r.op} x{r.count} in {_models(len(r.models))}" for r in self.rewrote if r.op in of]
        if not rewrote:
            return ""
        return f"rewrote {', '.join(rewrote)}; " + "; ".join(found.describe() for found in self.left)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"rewrote": [{op, count, models}], "left": [{op, kind, of, count, models}]}``."""
        return {"rewrote": [dataclasses.asdict(r) | {"models": list(r.models)} for r in self.rewrote],
                "left": [dataclasses.asdict(found) | {"models": list(found.models)} for found in self.left]}


def _models(n: int) -> str:
    return f"{n} model{'s' if n != 1 else ''}"


def coverage(models: Mapping[str, Mapping[str, Mapping[str, int]]]) -> Coverage:
    """What a transform rewrote across ``models`` (each ``{"before": counts, "after": counts}`` of
    :func:`op_counts` of the original and of the result) and which variants of those ops it left:
    a node of a variant is left where the model's original has it and the result still has it; an op
    whose count went up in some model is what the transform rewrites to, never left.

    >>> counts = {"a": {"before": {"F.relu": 2, "nn.ReLU": 1}, "after": {"F.gelu": 2, "nn.ReLU": 1}},
    ...           "b": {"before": {"F.relu": 1, "Tensor.relu": 4}, "after": {"F.relu": 1, "Tensor.relu": 4}}}
    >>> found = coverage(counts)
    >>> found.rewrote
    (Rewrote(op='F.relu', count=2, models=('a',)),)
    >>> [(f.op, f.kind, f.count) for f in found.left]
    [('Tensor.relu', 'method spelling', 4), ('nn.ReLU', 'module spelling', 1), ('F.relu', 'the same op', 1)]
    >>> coverage({"a": {"before": {"aten.relu_.default": 2}, "after": {"aten.relu.default": 2}}}).left  # made functional
    ()
    """
    rewrote: dict[str, dict[str, int]] = {}
    produced: set[str] = set()
    for model, counts in models.items():
        before, after = counts.get("before") or {}, counts.get("after") or {}
        for op, n in before.items():
            if after.get(op, 0) < n:
                rewrote.setdefault(op, {})[model] = n - after.get(op, 0)
        produced.update(op for op, n in after.items() if n > before.get(op, 0))
    left: dict[str, dict[str, int]] = {}
    for model, counts in models.items():
        before, after = counts.get("before") or {}, counts.get("after") or {}
        for op, n in before.items():
            untouched = min(n, after.get(op, 0))
            if untouched and op not in produced:
                left.setdefault(op, {})[model] = untouched
    found = []
    for op, where in left.items():
        kinds = [(variant_kind(r, op), r) for r in _by_count(rewrote)]
        match = next(((kind, r) for kind, r in kinds if kind == SAME), None) or \
            next(((kind, r) for kind, r in kinds if kind is not None), None)
        if match is not None:
            found.append(Left(op, match[0], match[1], sum(where.values()), tuple(sorted(where, key=lambda m: -where[m]))))
    found.sort(key=lambda f: (f.kind == SAME, -f.count, f.op))
    of = {f.of for f in found}
    ops = sorted(rewrote, key=lambda op: (op not in of, -sum(rewrote[op].values()), op))
    return Coverage(tuple(Rewrote(op, sum(rewrote[op].values()), tuple(sorted(rewrote[op], key=lambda m: -rewrote[op][m])))
                          for op in ops), tuple(found))


def _by_count(rewrote: Mapping[str, Mapping[str, int]]) -> Iterable[str]:
    return sorted(rewrote, key=lambda op: (-sum(rewrote[op].values()), op))
