"""stateful: a model whose buffers change in forward keeps doing so.

A model that updates buffers as it runs (a running mean kept by an observer, a call counter, a
cache) must, after the transform, leave the same buffers after each call: a pass that drops an
in-place update whose result nothing reads (dead-code elimination that ignores mutation, a
functionalization that loses the write-back ``copy_``) changes no output and leaves the state stale.
A fresh original and a fresh result are called ``CALLS`` times on the primary inputs; after each
call their outputs and every buffer the original has updated so far are compared (float32
tolerances: the state of the two is the float32 state they built themselves). Where values are not compared (a
quantizer under test: :attr:`~fxverify.engine.subject.Subject.compares_values`), the result's buffers must change
where the original's do, with the same shapes.

Which models update buffers is found by running them: a fresh original is called once on the primary
inputs in the checked mode, and the check skips where no buffer changed (a user's own model with a KV
cache needs no tag). The corpus tag ``stateful`` overrides that: a tagged entry is always compared.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import fx

from fxverify.analysis.compare import ANY_VALUE, Mismatch, compare_trees, compare_values
from fxverify.analysis.localise import written_arguments
from fxverify.analysis.module_state import tensor_state, tensors_equal
from fxverify.analysis.parameters import tensor_fates
from fxverify.checks._outputs import finding_of
from fxverify.core.contracts import Mode
from fxverify.core.results import Finding, ModuleRaised, Skip
from fxverify.engine.subject import Subject

TAG = "stateful"
CALLS = 3


def check(subject: Subject) -> dict[str, Any]:
    mode = subject.applied().mode
    if TAG not in subject.case.entry.tags and not _updates_buffers(subject, mode):
        raise Skip(f"no buffer of the original changed in one call in {mode} mode (tag the corpus entry "
                   f"{TAG!r} to compare its buffers anyway)")
    original = subject.capture_fresh(mode)
    copies: dict[int, Any] = {}  # the fates of its tensors by identity: fresh buffers are often equal in value
    result = subject.transformed_copy(original, mode, copies=copies)
    initial = {name: t.clone() for name, t in original.named_buffers()}
    tolerance = subject.tolerance if subject.compares_values else ANY_VALUE
    # where values are not compared, each buffer is held to having changed since the result was made
    result_initial = {} if subject.compares_values else {name: t.clone() for name, t in tensor_state(result).items()}
    moved = {fate.name: fate.now for fate in tensor_fates(original, result, copies) if fate.now is not None}
    updated: set[str] = set()  # the buffers the original has changed so far
    for call in range(1, CALLS + 1):
        where = f"{subject.primary.describe()}, {subject.dtype}, {mode} mode, call {call} of {CALLS} on fresh modules"
        inputs = subject.primary.make(subject.case.seed)
        with torch.no_grad():
            expected = ModuleRaised.guard("original", where, functools.partial(original, *inputs))
            actual = ModuleRaised.guard("result", where, functools.partial(result, *inputs))
        found = compare_trees(actual, expected, tolerance=tolerance)
        if found is not None:
            raise finding_of(found, where)
        before, after = dict(original.named_buffers()), tensor_state(result)
        updated.update(name for name, t in before.items() if not tensors_equal(t, initial[name]))
        for name in sorted(updated):
            now = _held_as(name, after, moved)
            if now is None:
                raise Finding(f"the result no longer holds the buffer {name!r} that the original updates in "
                              "forward", input=where)
            path = f"buffer {name!r} after call {call}"
            if subject.compares_values:
                found_buffer = compare_values(after[now], before[name], path=path, tolerance=tolerance)
            elif tensors_equal(after[now], result_initial[now]):
                found_buffer = Mismatch(path, "unchanged in the result since it was made, where the original's changed")
            elif (after[now].dtype, after[now].shape) != (before[name].dtype, before[name].shape):
                found_buffer = Mismatch(path, f"{after[now].dtype} {tuple(after[now].shape)} where the original's is "
                                              f"{before[name].dtype} {tuple(before[name].shape)}")
            else:  # a quantizer's calibration ran the model: its state starts elsewhere, and its values are its own
                found_buffer = None
            if found_buffer is not None:
                writers = _writers(original, name)
                kept = {node.name for node in _writers(result, now)}
                lost = [node for node in writers if node.name not in kept]
                at = (f"; the original updates it at %{lost[0].name} ({lost[0].target}), which the result no longer "
                      "has" if lost else "")
                first = next(iter(lost or writers), None)
                raise Finding(f"buffers updated differently: {found_buffer.describe()}; the result does not "
                              "update the state the original updates in forward (an in-place update whose result "
                              f"nothing reads was dropped, or its write-back copy_){at}", input=where,
                              where=found_buffer.path, node=first.format_node() if first is not None else None)
    if not updated:
        raise Skip(f"the corpus entry is tagged {TAG!r}, but no buffer of the original changed in {CALLS} calls "
                   f"in {mode} mode")
    return {"calls": CALLS, "updated_buffers": sorted(updated)}


def _held_as(name: str, state: dict[str, torch.Tensor], moved: dict[str, str]) -> str | None:
    """The name under which the result holds the original's buffer ``name``: the same name, the one name that
    ends with it (a result nesting the model, ``inner.calls``), or where it went before the first call (the
    fates of the original's tensors, matched by value); None where it holds it nowhere.

    >>> _held_as("calls", {"inner.calls": torch.zeros(())}, {}), _held_as("calls", {}, {"calls": "c"})
    ('inner.calls', None)
    """
    if name in state:
        return name
    nested = [now for now in state if now.endswith(f".{name}")]
    if len(nested) == 1:
        return nested[0]
    now = moved.get(name)
    return now if now in state else None


def _updates_buffers(subject: Subject, mode: Mode) -> bool:
    """Whether one call of a fresh original on the primary inputs changes any of its buffers."""
    original = subject.capture_fresh(mode)
    initial = {name: t.clone() for name, t in original.named_buffers()}
    if not initial:
        return False
    where = f"{subject.primary.describe()}, {subject.dtype}, {mode} mode, a first call to see whether its buffers change"
    with torch.no_grad():
        ModuleRaised.guard("original", where, functools.partial(original, *subject.primary.make(subject.case.seed)))
    return any(not tensors_equal(t, initial[name]) for name, t in original.named_buffers())


def _writers(module: torch.nn.Module, buffer: str) -> list[fx.Node]:
    """The nodes of ``module``'s graph that write ``buffer`` in place: an in-place ATen op or ``copy_``
    (its schema writes its first argument), or an in-place method (``add_``), on the buffer's
    ``get_attr``; none when ``module`` is not a GraphModule.

    >>> class Counter(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.register_buffer("calls", torch.zeros(()))
    ...     def forward(self, x):
    ...         self.calls.add_(x.sum())
    ...         return x
    >>> [node.name for node in _writers(fx.symbolic_trace(Counter()), "calls")]
    ['add_']
    """
    graph = getattr(module, "graph", None)
    if not isinstance(graph, fx.Graph):
        return []
    return [user for node in graph.nodes if node.op == "get_attr" and node.target == buffer
            for user in node.users if user.args and user.args[0] is node and _writes_first_argument(user)]


def _writes_first_argument(node: fx.Node) -> bool:
    if isinstance(node.target, torch._ops.OpOverload):
        return bool(node.args) and any(value is node.args[0] for value in written_arguments(node))
    return node.op == "call_method" and str(node.target).endswith("_")
