"""determinism: the transform gives the same graph and code every time.

A pass that iterates a ``set`` of nodes orders its output by the nodes' hashes
(their object addresses) or, for a set of names, by string hash (which changes
with ``PYTHONHASHSEED``). The transform is applied to two more fresh traces in
this process while every node made (by a copy of the trace, the transform) hashes
in the order nodes are made, then in the reverse order (see :func:`hash_ordered`),
so a set of nodes iterates one way, then the other (the trace is made before, and copied under
the order: how a capture orders its own graph, ``torch.export``'s included, is not the transform's doing):
an order-dependent pass gives two graphs, every time, where address-dependent
reruns would agree by chance. Their canonical graph and code are compared; then
with a digest computed in another process under a different hash seed (one
long-lived server process per transform, see :mod:`fxverify.checks._digest_server`); where they differ and
the model captured there differs too before the transform, the transform is not blamed.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
from collections.abc import Iterator
from typing import Any

import torch.fx.graph as fx_graph
from torch import fx, nn

from fxverify.analysis.graph_text import canonical_text, without_addresses, without_floats
from fxverify.analysis.module_state import first_line_difference
from fxverify.capture import Capture
from fxverify.checks import option
from fxverify.checks._common import graph_result
from fxverify.core.contracts import Contract, Mode
from fxverify.core.results import Finding
from fxverify.engine.subject import Subject
from fxverify.errors import TransformFailed

NAME = "determinism"  # its registry name: the key of what its service hands each subject (Settings.services)
ORDERS = ("ascending", "descending")  # how the nodes of the reruns' traces hash: in graph order, reversed

_patched_graph: Any = fx_graph  # torch.fx.graph, whose Node class hash_ordered swaps (mypy forbids assigning to a class)


class _HashOrderedNode(fx.Node):
    """A Node whose hash is set when it is made (under :func:`hash_ordered`), not its address."""

    _order_hash: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._order_hash = next(_next_hash)  # before Node.__init__, which puts the node in dicts
        super().__init__(*args, **kwargs)

    def __hash__(self) -> int:
        return self._order_hash


_next_hash: Iterator[int] = iter(())


@contextlib.contextmanager
def hash_ordered(order: str) -> Iterator[None]:
    """While active, every node made (a trace, a ``copy.deepcopy`` of a GraphModule, what a
    transform creates) hashes to a small integer in the order nodes are made (``"ascending"``) or
    the reverse (``"descending"``), instead of its address: a ``set`` of them iterates in that order
    (a set puts a small integer hash at that slot of its table), and a pass that iterates one
    orders its output one way, then the other.

    >>> import copy
    >>> gm = fx.symbolic_trace(nn.Sequential(nn.ReLU(), nn.Tanh(), nn.Sigmoid()))
    >>> with hash_ordered("descending"):
    ...     copied = copy.deepcopy(gm)
    >>> [n.name for n in set(copied.graph.nodes)]
    ['output', '_2', '_1', '_0', 'input_1']
    """
    global _next_hash
    step = 1 if order == "ascending" else -1
    _next_hash = itertools.count(1 if step == 1 else -2, step)  # -1 is no hash: CPython makes it -2
    plain = fx_graph.Node
    _patched_graph.Node = _HashOrderedNode  # Graph.create_node makes its nodes from this name
    try:
        yield
    finally:
        _patched_graph.Node = plain
        _next_hash = iter(())


def fingerprint(module: nn.Module, *, calibrated: bool = False) -> str:
    """Canonical graph text followed by the generated code, object addresses blanked in both (a builtin passed as an
    argument, as Inductor's efficient_conv_bn_eval passes ``torch.conv2d``, prints with its address); ``calibrated``
    (the transform calibrates: a quantizer under test), floating-point literals blanked too: the scales it computes
    from activations differ in their last digits with the number of threads (the other process runs on one)."""
    module = graph_result(module, "no graph to compare")
    text = canonical_text(module.graph) + "\n--- code ---\n" + without_addresses(module.code)
    return without_floats(text) if calibrated else text


def digest(module: nn.Module, *, calibrated: bool = False) -> str:
    """A short hash of :func:`fingerprint`, for comparing across processes."""
    return hashlib.sha256(fingerprint(module, calibrated=calibrated).encode()).hexdigest()[:16]


def cross_process_capture(contract: Contract, capture: Capture, train_capture: bool) -> tuple[Mode, bool]:
    """The mode of the capture the cross-process run transforms, and whether it is made at the example shapes
    (static): the primary mode's capture, except where that one has a dynamic dimension (``torch.export`` with a
    dynamic batch) and numerics' stage in the other mode captures the model at the example shapes anyway (a capture
    that fixes the mode, ``train_capture`` on). The other process then exports that one, which costs less than
    a dynamic export (docs/performance.md has the figures), and this process has it already.

    >>> from fxverify.capture import Export
    >>> cross_process_capture(Contract(), Export(), train_capture=True)
    ('train', True)
    >>> cross_process_capture(Contract(modes=("eval",)), Export(), True), cross_process_capture(Contract(), Export(), False)
    (('eval', False), ('eval', False))
    """
    others = [mode for mode in contract.modes if mode != contract.primary_mode and not capture.inference_only]
    if others and train_capture and not capture.switches_mode and capture.at_example_shapes() != capture:
        return others[0], True
    return contract.primary_mode, False


def check(subject: Subject) -> dict[str, Any]:
    mode = subject.contract.primary_mode
    first = fingerprint(subject.applied().result)
    _rerun_in_hash_orders(subject, mode, False, first)
    in_process = {"in_process_runs": 1 + len(ORDERS)}
    cross_process = subject.settings.services.get(NAME)  # CrossProcessService.prepare's digests, where the run has them
    if cross_process is None:
        return {**in_process, "cross_process": "not run (no cross-process runner)"}
    mode, static = cross_process_capture(subject.contract, subject.capture, option(subject.settings, "train_capture"))
    captured = _captured_at_example_shapes(mode, static)
    primary = (mode, static) == (subject.contract.primary_mode, False)
    try:  # before the other process's answer: the transform failing here is not the other process's failure
        result = subject.applied().result if primary else \
            subject.transformed_copy(subject.capture_source(mode, static=static), mode)
    except TransformFailed as exc:  # numerics' stage in that mode reports it
        return {**in_process, "cross_process": f"not compared: the transform raised{captured}: {exc.cause}"}
    other = cross_process(subject.case.name, mode=mode, static=static)
    if other.startswith("error:"):
        raise Finding(f"the cross-process run (different PYTHONHASHSEED){captured} failed: {other[6:].strip()}")
    if other.startswith("skip:"):
        return {**in_process, "cross_process": other}
    here = digest(result, calibrated=not subject.compares_values)
    if other != here:
        if not primary:  # the reruns above were of the primary mode's capture
            _rerun_in_hash_orders(subject, mode, static, fingerprint(result))
        captured_here = digest(subject.capture_source(mode, static=static))
        captured_there = cross_process(subject.case.name, mode=mode, static=static, transformed=False)
        if captured_there != captured_here:  # the model, not the transform, differs in the other process
            return {**in_process, "cross_process": f"not compared: the model{captured} is another graph in the other "
                    f"process before the transform (digest {captured_there} there, {captured_here} here: it depends "
                    "on the process, such as constants calibrated in floating point on another number of threads)"}
        raise Finding(
            f"the transform gave a different graph in another process with a different PYTHONHASHSEED{captured} "
            "(node order depends on string hashing: is a set of names or targets iterated?)",
            where=f"digest here {here}, in the other process {other}",
        )
    return {**in_process, "cross_process": f"same digest{captured}"}


def _rerun_in_hash_orders(subject: Subject, mode: Mode, static: bool, first: str) -> None:
    """Raise the in-process finding where the transform, applied to fresh copies of the capture in ``mode``
    (``static``: at the example shapes) while the nodes hash in each of :data:`ORDERS`, gives another
    fingerprint than ``first``, what it gave with the nodes hashing by address."""
    runs = {}
    for order in ORDERS:
        original = subject.capture_source(mode, static=static)  # outside: the capture's own order is not the transform's doing
        with hash_ordered(order):
            result = subject.transformed_copy(original, mode)
        runs[order] = fingerprint(result)
    captured = _captured_at_example_shapes(mode, static)
    for order, again in runs.items():
        if again != first:
            raise Finding(
                f"fresh traces{captured} transformed in the same process gave different graphs: with the nodes hashing in "
                f"{order} graph order the transform made another graph than with the nodes hashing by address "
                "(its output depends on the order of a set or dict of nodes, or on id(): iterate the graph's "
                "node list, or sort)",
                where=first_line_difference(first, again),
            )


def _captured_at_example_shapes(mode: Mode, static: bool) -> str:
    """What the findings and details add where the capture compared is not the primary one (``static``)."""
    return f" (on the model captured in {mode} mode at the example shapes)" if static else ""
