"""Where a transform's result first goes wrong: both modules are run with a
:class:`~fxverify.analysis.recording.RecordingInterpreter`, result nodes are mapped to
original nodes (:func:`fxverify.analysis.node_map.correspondence`: name, provenance,
position), and the first node the transform kept whose value differs beyond
tolerance is reported with its opcode, target, line of generated code, shape,
dtype and error, the nodes the transform changed that feed it, and the original's
nodes it removed that fed it (in-place writes included). For a gradient failure
with equal values, :func:`localise_gradients` names the kept node nearest the
outputs whose gradient differs, and the changed nodes it feeds.

>>> import copy, torch
>>> from fxverify.analysis.compare import Tolerance
>>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh()))
>>> broken = copy.deepcopy(gm)  # a "cleanup" that removes the relu as if it were a no-op
>>> relu = broken.graph.find_nodes(op="call_module", target="0")[0]
>>> _ = relu.replace_all_uses_with(relu.args[0]); broken.graph.erase_node(relu)
>>> _ = broken.recompile()
>>> found = localise(gm, broken, (torch.tensor([[-1.0, 2.0]]),), Tolerance())
>>> print(found.divergence.describe())  # doctest: +ELLIPSIS
%_1 (call_module 1): %_1: values differ: max abs err 0.762 at index (0, 0), max rel err ...
code: _1 = getattr(self, "1")(input_1);  input_1 = None
value: (1, 2) float32; the original's %_1, mapped by name
the original's nodes the transform removed before it: %_0 (call_module 0)
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import operator
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import fx, nn
from torch.fx.node import Target
from torch.utils import _pytree as pytree

from fxverify.analysis.compare import Mismatch, Tolerance, compare_trees
from fxverify.analysis.graph_text import target_name
from fxverify.analysis.node_map import Match, correspondence, kept_nodes
from fxverify.analysis.recording import RecordingInterpreter

MAX_CHANGED_SHOWN = 5
AHEAD_BYTES = 128 * 2**20  # how far the original's recorded values may run ahead of the result's comparisons


@dataclasses.dataclass(frozen=True)
class Divergence:
    """The first kept node whose value (or gradient) differs, and where it sits."""

    result_node: fx.Node
    match: Match
    mismatch: Mismatch
    code_line: str | None
    value: Any
    changed: tuple[str, ...]  # result nodes the transform changed that feed it (or that it feeds)
    changed_role: str = "reads"  # "reads": a value diverged; "feeds": a gradient diverged
    removed: tuple[str, ...] = ()  # original nodes the transform removed that fed its counterpart

    def details(self) -> dict[str, Any]:
        """JSON-serialisable facts (``CheckResult.divergence``)."""
        node, value = self.result_node, self.value
        tensor = isinstance(value, torch.Tensor)
        return {
            "result_node": node.name,
            "original_node": self.match.original.name,
            "op": node.op,
            "target": target_name(node),
            "code_line": self.code_line,
            "shape": list(value.shape) if tensor else None,
            "dtype": str(value.dtype).removeprefix("torch.") if tensor else None,
            "max_abs": self.mismatch.max_abs,
            "max_rel": self.mismatch.max_rel,
            "how_mapped": self.match.how,
            "changed": list(self.changed),
            "removed": list(self.removed),
        }

    def describe(self, note: str = "") -> str:
        """A few lines for a failure message: the node and error (then ``note``), its code, its value,
        the changed nodes it reads."""
        facts = self.details()
        head = f"%{facts['result_node']} ({facts['op']} {facts['target']}): {self.mismatch.describe()}"
        lines = [head + note]
        if self.code_line:
            lines.append(f"code: {self.code_line}")
        shape = f"{tuple(facts['shape'])} {facts['dtype']}" if facts["shape"] is not None else type(self.value).__name__
        lines.append(f"value: {shape}; the original's %{facts['original_node']}, mapped by {facts['how_mapped']}")
        if self.changed:
            changed = describe_nodes(self.result_node.graph, self.changed)
            lines.append(f"{self.changed_role} nodes the transform changed: {changed}")
        if self.removed:
            removed = describe_nodes(self.match.original.graph, self.removed)
            lines.append(f"the original's nodes the transform removed before it: {removed}")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Localisation:
    """Both modules run on the same inputs: the first output difference, the first divergent
    kept node (None when every kept node agrees), how many kept nodes were compared, and,
    when no kept node diverged, the changed nodes that feed the outputs (described)."""

    outputs: Mismatch | None
    divergence: Divergence | None
    compared: int
    changed_before_output: str = ""
    unmapped: str = ""  # why no node could be compared (the result is not a GraphModule)


def localise(
    original: fx.GraphModule,
    result: nn.Module,
    inputs: tuple[Any, ...],
    tolerance: Tolerance,
    *,
    guard: Callable[[Callable[[], Any]], Any] = lambda run: run(),
) -> Localisation:
    """Run ``original`` and ``result`` on ``inputs`` (no grad), recording every kept node,
    and find the first kept node whose value differs. ``guard`` wraps the result's run
    (to turn its exceptions into findings)."""
    if not isinstance(result, fx.GraphModule):  # nothing to map: the outputs alone
        with torch.no_grad():
            expected, actual = original(*inputs), guard(lambda: result(*inputs))
        return Localisation(compare_trees(actual, expected, tolerance=tolerance), None, 0,
                            unmapped=f"the result is a {type(result).__name__}, not a GraphModule: no nodes to map")
    matches = correspondence(original, result)
    strict = kept_nodes(original, result, matches)
    pairs = kept_nodes(original, result, matches, strict=False)
    with torch.no_grad(), uninitialised_memory_filled():
        expected_run = _SteppedRun(original, inputs, {old.name for old, _ in pairs})
        differing = _FirstDifferences(pairs, {new for _, new in strict}, expected_run, tolerance)
        actual_run = _SteppedRun(result, inputs, {new.name for _, new in pairs}, observe=differing)
        needs = {new: old.name for old, new in pairs}

        def waits(node: fx.Node) -> bool:  # the result is to compare a node the original has not run yet
            return node in needs and needs[node] not in expected_run.ran

        while guard(lambda: actual_run.advance(waits)):  # the result's own exceptions are findings
            assert actual_run.waiting is not None  # it stopped before this node
            expected_run.run_past(needs[actual_run.waiting])
        expected_run.advance(lambda _: False)
    if differing.error is not None:  # fxverify's own comparison raised: its error, not the result's
        raise differing.error
    outputs = compare_trees(actual_run.returned, expected_run.returned, tolerance=tolerance)
    if outputs is None:  # outputs agree: only a node known to compute the same value may fail the check
        pairs = strict
    kept = {new for _, new in pairs} | set(result.graph.find_nodes(op="placeholder"))
    first = differing.first[outputs is None]
    if first is not None:
        _, old, new, found, value = first
        kept_originals = {o for o, _ in pairs} | set(original.graph.find_nodes(op="placeholder"))
        divergence = Divergence(new, matches[new], found, code_line(result, new), value, changed_upstream(new, kept),
                                removed=removed_upstream(old, {m.original for m in matches.values()}, kept_originals))
        return Localisation(outputs, divergence, len(pairs))
    changed = changed_upstream(next(iter(result.graph.find_nodes(op="output"))), kept)
    return Localisation(outputs, None, len(pairs), describe_nodes(result.graph, changed))


@contextlib.contextmanager
def uninitialised_memory_filled() -> Iterator[None]:
    """While active, torch fills the memory of new uninitialised tensors (NaN for floats, the largest
    value for integers): an ``aten.empty`` that a graph fills piece by piece (core ATen's circular
    padding) holds the same values in both runs until it is filled, instead of whatever memory held.
    torch does this under deterministic algorithms, which are switched on (warnings only) meanwhile."""
    enabled, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory  # type: ignore[attr-defined]
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True  # type: ignore[attr-defined]
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not have a deterministic implementation.*")
            yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill  # type: ignore[attr-defined]


def _bytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor))


class _Paused(Exception):
    """Stops a :class:`_SteppedRun` before a node; never leaves it."""


class _SteppedRun(RecordingInterpreter):
    """A run of a GraphModule on ``inputs`` in stretches, each node run once: :meth:`advance` runs on
    until ``stops(node)`` holds for the next node, keeping the live values for the next stretch. The
    original and the result advance in turn, so that the original's recorded values are compared
    and dropped as the result reaches them: the original runs up to :data:`AHEAD_BYTES` of recorded
    values ahead (fewer, longer stretches), beyond that only as far as the result waits for."""

    def __init__(self, module: fx.GraphModule, inputs: tuple[Any, ...], record: set[str], *,
                 observe: Callable[[fx.Node, Any], None] | None = None) -> None:
        super().__init__(module, record, observe=observe)
        self.inputs = inputs
        self._inputs_left = iter(self.graph.process_inputs(*inputs))  # placeholders take them across stretches
        self.ran: set[str] = set()
        self.held = 0  # bytes of the recorded values still kept
        self.waiting: fx.Node | None = None  # the node it stopped before
        self.returned: Any = None  # (not `output`: that is the Interpreter's method for output nodes)
        self.finished = False
        self._live: dict[fx.Node, Any] | None = None
        self._stops: Callable[[fx.Node], bool] = lambda _: False

    def run_node(self, n: fx.Node) -> Any:
        if self._stops(n):
            self.waiting = n
            raise _Paused
        value = super().run_node(n)
        self.ran.add(n.name)
        if n.name in self.values:
            self.held += _bytes(self.values[n.name])
        return value

    def run_past(self, name: str) -> None:
        """Advance until node ``name`` has run, and on while its recorded values are within :data:`AHEAD_BYTES`."""
        self.advance(lambda _: name in self.ran and self.held > AHEAD_BYTES)

    def placeholder(self, target: Target, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.args_iter = self._inputs_left  # run() starts each stretch at the first input
        return super().placeholder(target, args, kwargs)

    def take(self, name: str) -> Any:
        """The value recorded for ``name``, no longer kept."""
        value = self.values.pop(name)
        self.held -= _bytes(value)
        return value

    def advance(self, stops: Callable[[fx.Node], bool]) -> bool:
        """Run on until ``stops`` holds for the next node (True; ``waiting`` is that node) or to the
        end (False; ``returned`` is what the module returned)."""
        if self.finished:
            return False
        self._stops = stops
        try:
            self.returned = self.run(*self.inputs, initial_env=self._live)
        except _Paused:
            # every node before the one waiting has run: the live ones keep their values, the others
            # stand in the environment as done (None), so the next stretch starts at the waiting node
            self._live = {node: self.env.get(node) for node in self.graph.nodes if node.name in self.ran}
            return True
        self._live, self.finished = None, True
        return False


class _FirstDifferences:
    """Compares each kept node of the result with the original's recorded value as the result runs,
    dropping each recorded value once its last pair is compared, and keeps the first difference in
    the pairs' order: ``first[False]`` among all ``pairs``, ``first[True]`` among the ``strict`` ones
    (nodes known to compute the same value). Only the first differences' values are copied, so a
    model's every activation is held once (the original's), not twice."""

    def __init__(self, pairs: list[tuple[fx.Node, fx.Node]], strict: set[fx.Node], recorded: _SteppedRun,
                 tolerance: Tolerance) -> None:
        self.order = {new: (index, old) for index, (old, new) in enumerate(pairs)}
        self.uses = collections.Counter(old.name for old, _ in pairs)
        self.strict, self.recorded, self.tolerance = strict, recorded, tolerance
        self.first: dict[bool, tuple[int, fx.Node, fx.Node, Mismatch, Any] | None] = {False: None, True: None}
        self.error: Exception | None = None  # what comparing raised (it runs inside the result's guarded run)

    def __call__(self, new: fx.Node, value: Any) -> None:
        if self.error is None:
            try:
                self._compare(new, value)
            except Exception as exc:
                self.error = exc

    def _compare(self, new: fx.Node, value: Any) -> None:
        index, old = self.order[new]
        self.uses[old.name] -= 1
        expected = self.recorded.values[old.name] if self.uses[old.name] else self.recorded.take(old.name)
        value = pytree.tree_map_only(torch.Tensor, lambda t: t, value)  # containers as recorded (a Size: a tuple)
        found = compare_trees(value, expected, tolerance=self.tolerance, root=f"%{new.name}")
        if found is None:
            return
        copied = None
        for among in (False, True) if new in self.strict else (False,):
            earlier = self.first[among]
            if earlier is None or index < earlier[0]:
                if copied is None:  # later in-place ops must not change it
                    copied = pytree.tree_map_only(torch.Tensor, lambda t: t.detach().clone(), value)
                self.first[among] = (index, old, new, found, copied)


def localise_gradients(
    original: fx.GraphModule,
    result: fx.GraphModule,
    inputs: tuple[Any, ...],
    tolerance: Tolerance,
    loss: Callable[[Any], torch.Tensor],
) -> Divergence | None:
    """Backpropagate ``loss(outputs)`` through both modules, recording the gradient of every
    kept node, and return the kept node nearest the outputs whose gradient differs: the
    gradient first goes wrong in a changed node it feeds (None when all agree).

    >>> from fxverify.analysis.compare import Tolerance
    >>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Tanh(), torch.nn.ReLU()))
    >>> broken = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Tanh(), torch.nn.ReLU()))
    >>> relu = broken.graph.find_nodes(op="call_module", target="1")[0]
    >>> with broken.graph.inserting_before(relu):
    ...     relu.args = (broken.graph.call_method("detach", (relu.args[0],)),)
    >>> _ = broken.recompile()
    >>> found = localise_gradients(gm, broken, (torch.ones(3),), Tolerance(), lambda out: out.sum())
    >>> found.details()["result_node"], found.changed, found.mismatch.reason
    ('_0', ('detach', '_1'), 'expected tensor (3,) torch.float32, got None')
    """
    matches = correspondence(original, result)
    pairs = kept_nodes(original, result, matches, strict=False)  # gradients already differ: name where
    grads = []
    for module, names in ((original, {old.name for old, _ in pairs}), (result, {new.name for _, new in pairs})):
        with uninitialised_memory_filled():
            grads.append(_recorded_gradients(module, names, inputs, loss))
    expected, actual = grads
    kept = {new for _, new in pairs} | set(result.graph.find_nodes(op="placeholder"))
    for old, new in reversed(pairs):
        found = compare_trees(actual.get(new.name), expected.get(old.name), tolerance=tolerance,
                              root=f"gradient of %{new.name}")
        if found is not None:
            return Divergence(new, matches[new], found, code_line(result, new), actual.get(new.name),
                              changed_downstream(new, kept), "feeds")
    return None


def _recorded_gradients(module: fx.GraphModule, names: set[str], inputs: tuple[Any, ...],
                        loss: Callable[[Any], torch.Tensor]) -> dict[str, Any]:
    """The gradient of ``loss(outputs)`` w.r.t. the value of each node named in ``names``."""
    recorder = RecordingInterpreter(module, names, retain_grad=True)
    given = tuple(t.detach().clone().requires_grad_(True) if isinstance(t, torch.Tensor) and t.is_floating_point()
                  else t for t in inputs)
    module.zero_grad(set_to_none=True)
    outputs = recorder.run(*given)
    if differentiable(outputs):
        loss(outputs).backward()
    module.zero_grad(set_to_none=True)
    return {name: pytree.tree_map_only(torch.Tensor, lambda t: t.grad, value) for name, value in recorder.values.items()}


def code_line(gm: fx.GraphModule, node: fx.Node) -> str | None:
    """The line of ``gm.code`` that computes ``node`` (None for placeholders and code not found).

    >>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    >>> code_line(gm, list(gm.graph.nodes)[1])
    'relu = torch.nn.functional.relu(input_1, inplace = False);  input_1 = None'
    """
    if node.op == "placeholder":
        return None
    pattern = re.compile(r"return\b" if node.op == "output" else rf"{re.escape(node.name)}\s*(:[^=]*)?=[^=]")
    return next((line.strip() for line in gm.code.splitlines() if pattern.match(line.strip())), None)


def changed_upstream(node: fx.Node, kept: set[fx.Node]) -> tuple[str, ...]:
    """Names of the nodes that feed ``node`` through nodes the transform changed (not in
    ``kept``), stopping at kept nodes, in graph order."""
    return _changed_around(node, kept, lambda n: n.all_input_nodes)


def removed_upstream(node: fx.Node, corresponded: set[fx.Node], kept: set[fx.Node]) -> tuple[str, ...]:
    """Names of the original's nodes the transform removed (no counterpart in the result) that fed
    ``node``: those above it up to the nodes the transform kept (``kept``, the original's side),
    and the in-place writes before it (``y.relu_()``, ``y[:, 0].copy_(...)``: no users of their own)
    into a value read on the way."""
    visited: set[fx.Node] = set()
    stack = list(node.all_input_nodes)
    while stack:
        current = stack.pop()
        if current not in visited:
            visited.add(current)
            if current not in kept:
                stack.extend(current.all_input_nodes)
    removed = {n for n in visited if n not in corresponded}
    for earlier in node.graph.nodes:
        if earlier is node:
            break
        if earlier not in corresponded and mutates(earlier) and earlier.args:
            written = _written(earlier.args[0], corresponded)
            if written and written[-1] in visited:
                removed.update({earlier, *written[:-1]})
    return tuple(n.name for n in node.graph.nodes if n in removed)


def _written(target: Any, corresponded: set[fx.Node]) -> list[fx.Node]:
    """What an in-place write into ``target`` writes into: the removed views it goes through
    (``y[:, 0]``) and, last, the value underneath them."""
    chain = []
    while isinstance(target, fx.Node):
        chain.append(target)
        if target in corresponded or not target.all_input_nodes:
            return chain
        target = target.all_input_nodes[0]
    return chain


_INPLACE_OPERATORS = {getattr(operator, name) for name in fx.graph.inplace_methods}


def mutates(node: fx.Node) -> bool:
    """Whether ``node`` writes into a tensor it is given: ``x.add_()``, ``operator.iadd``,
    ``F.relu(x, inplace=True)``, ``nn.ReLU(inplace=True)``.

    >>> gm = torch.fx.symbolic_trace(lambda x: x.relu_() + torch.relu(x))
    >>> [mutates(n) for n in gm.graph.nodes]
    [False, True, False, False, False]
    """
    if node.op == "call_module":
        owner = node.graph.owning_module
        module = owner.get_submodule(str(node.target)) if owner is not None else None
        return getattr(module, "inplace", False) is True
    if node.op not in ("call_function", "call_method"):
        return False
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return ((name.endswith("_") and not name.endswith("__")) or node.target in _INPLACE_OPERATORS
            or node.kwargs.get("inplace") is True)


def written_arguments(node: fx.Node) -> list[Any]:
    """The arguments an ATen operator's schema says ``node`` writes into (``self`` of ``aten.add_.Tensor``, ``out``
    of an ``out=`` overload); none for any other node (:func:`mutates` judges torch-level ones).

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> gm = make_fx(lambda x: x.add_(1) * 2)(torch.ones(2))
    >>> [[a.name for a in written_arguments(n)] for n in gm.graph.nodes]
    [[], ['x_1'], [], []]
    """
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return []
    return [node.args[position] if position < len(node.args) else node.kwargs.get(argument.name)
            for position, argument in enumerate(node.target._schema.arguments)
            if argument.alias_info is not None and argument.alias_info.is_write]


def changed_downstream(node: fx.Node, kept: set[fx.Node]) -> tuple[str, ...]:
    """Names of the changed nodes (not in ``kept``) that ``node`` feeds, up to kept nodes and the output."""
    return _changed_around(node, kept, lambda n: [u for u in n.users if u.op != "output"])


def _changed_around(node: fx.Node, kept: set[fx.Node], step: Callable[[fx.Node], list[fx.Node]]) -> tuple[str, ...]:
    seen: set[fx.Node] = set()
    stack = [n for n in step(node) if n not in kept]
    while stack:
        current = stack.pop()
        if current not in seen:
            seen.add(current)
            stack.extend(n for n in step(current) if n not in kept)
    return tuple(n.name for n in node.graph.nodes if n in seen)


def describe_nodes(graph: fx.Graph, names: tuple[str, ...]) -> str:
    """``%a (op target), %b (op target)`` for the nodes of ``graph`` named ``names`` (the first few)."""
    nodes = {n.name: n for n in graph.nodes}
    shown = [f"%{name} ({nodes[name].op} {target_name(nodes[name])})" for name in names[:MAX_CHANGED_SHOWN]]
    more = f" and {len(names) - MAX_CHANGED_SHOWN} more" if len(names) > MAX_CHANGED_SHOWN else ""
    return ", ".join(shown) + more


def differentiable(outputs: Any) -> list[torch.Tensor]:
    """The tensors among ``outputs`` (any pytree) that require grad: those a loss can backpropagate through.

    >>> [t.shape for t in differentiable({"a": torch.ones(2, requires_grad=True), "b": (torch.ones(3), 1)})]
    [torch.Size([2])]
    """
    return [o for o in pytree.tree_leaves(outputs) if isinstance(o, torch.Tensor) and o.requires_grad]

