"""agreement: with several captures selected, the transform changes the outputs the same way under each.

A pass over ATen graphs matches operators, and the operators differ between captures: the training
IR (``export``) keeps ``aten.conv2d``, ``aten.linear`` and ``aten.relu_`` where core ATen
(``export_core``) has ``aten.convolution``, ``aten.addmm`` and ``aten.relu``. A pass keyed on one
spelling silently does nothing under the other. Where its contract lets the outputs change (``rtol``,
``atol`` or ``range_tol``: a quantizing or approximating pass), numerics passes under both captures,
and only comparing them shows it.

Compared on the primary input in float64: the transform's effect on the outputs under this capture
(the result's minus the original's) against its effect under the *reference* capture, the first
selected capture the transform runs on and the model captures under (the reference's own item
skips). The captures' own rounding differences cancel. Judged:

- when the result moves away from its original beyond the contract's tolerance under either capture,
  the numerics check fails there and reports it: skipped;
- when the transform changes the outputs by no more than rounding (the dtype's default tolerance,
  with the corpus entry's) under both captures, they agree: passed;
- otherwise the effects must agree within that tolerance.

A failure names both captures, how far the transform moved the outputs under each, and the nodes
it rewrote in each graph. The plugin hands the reference capture's outputs over from its own items;
called alone (``Verification(..., captures=("export", "export_core"))``), the check captures and
transforms the model under the reference too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from fxverify.analysis.compare import Tolerance, compare_trees
from fxverify.analysis.module_state import tensor_state, tensors_equal
from fxverify.cases.catalogue import CorpusEntry
from fxverify.core.results import CaptureFailed, Finding, ModuleRaised, Skip, rewrites
from fxverify.core.transform import Transform
from fxverify.engine.subject import Settings, Subject
from fxverify.errors import TransformFailed

NAME = "agreement"  # its registry name: the key of what its service hands each subject (Settings.services)

aten = torch.ops.aten
LAYOUT = (aten.permute.default, aten.t.default, aten.transpose.int, aten.view.default, aten.reshape.default,
          aten.expand.default)  # ops that only lay out a weight for the op that reads it
SHOWN = 4  # rewritten nodes named in a finding


@dataclasses.dataclass(frozen=True)
class CaptureOutputs:
    """What one capture contributes: the float64 outputs of the ``original`` and the ``result`` on the
    primary input, whether the result stays ``within_contract`` of the original (numerics' float64 rule)
    and ``moved`` beyond rounding, whether its new parameters were made in float64 (``exact``), and what
    the transform ``changes`` in the primary mode; or ``problem``, why there are none.

    >>> CaptureOutputs("export", problem="the model does not capture").problem
    'the model does not capture'
    """

    capture: str
    original: Any = None
    result: Any = None
    within_contract: bool = True
    moved: bool = False
    exact: bool = True
    changes: list[str] | None = None
    rewritten: tuple[str, ...] = ()
    problem: str | None = None


def reference_capture(transform: Transform, entry: CorpusEntry, captures: Sequence[str]) -> str | None:
    """The capture others are compared with: the first of ``captures`` the transform runs on and the
    model is not expected to fail under; None when fewer than two such captures are selected."""
    usable = [c for c in captures if transform.skips_capture(c) is None and entry.expected_failure(c) is None]
    return usable[0] if len(usable) > 1 else None


def rounding(subject: Subject, *, exact: bool = True) -> Tolerance:
    """The tolerance of rounding alone in ``subject``'s float64 runs: the corpus entry's over float64's defaults,
    or the model's dtype's when new parameters were made in it (``exact=False``); never the contract's."""
    entry = Tolerance(subject.case.entry.rtol, subject.case.entry.atol)
    return entry if exact else entry.at_least(getattr(torch, subject.dtype))


def capture_outputs(subject: Subject) -> CaptureOutputs:
    """``subject``'s contribution to the comparison (raises what ``subject.applied()`` raises: the transform's failure,
    the model's)."""
    applied = subject.applied()
    if subject.float64_skip is not None:
        return CaptureOutputs(subject.capture.name, problem=subject.float64_skip)
    original = subject.outputs("original", dtype=torch.float64)
    result = subject.outputs("result", dtype=torch.float64)
    moved = compare_trees(result, original, tolerance=rounding(subject, exact=subject.float64_exact)) is not None
    # the contract's tolerance is never tighter than rounding's: unmoved is within it
    within_contract = not moved or compare_trees(result, original, tolerance=subject.float64_tolerance) is None
    return CaptureOutputs(subject.capture.name, original, result, within_contract=within_contract, moved=moved,
                          exact=subject.float64_exact, changes=applied.changes,
                          rewritten=rewritten_nodes(applied.original, applied.result))


def rewritten_nodes(original: nn.Module, result: nn.Module) -> tuple[str, ...]:
    """The operator nodes of ``result`` the transform rewrote (as ``%name = target``): those the original
    has no node of that name and target for, and those reading a parameter or buffer with other values
    than the original's (through layout ops such as the ``permute`` of a linear's weight in core ATen).

    >>> import torch.fx
    >>> gm = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    >>> rewritten_nodes(gm, gm)
    ()
    """
    if not isinstance(result, fx.GraphModule) or not isinstance(original, fx.GraphModule):
        return ()
    before, now = tensor_state(original), tensor_state(result)
    changed = {name for name, tensor in now.items() if name not in before or not tensors_equal(before[name], tensor)}
    known = {(node.name, node.target) for node in original.graph.nodes}
    reads: set[fx.Node] = {node for node in result.graph.nodes if node.op == "get_attr" and node.target in changed}
    found = []
    for node in result.graph.nodes:
        if node.op != "call_function":
            continue
        if any(arg in reads for arg in node.all_input_nodes) and node.target in LAYOUT:
            reads.add(node)  # the permuted weight: its readers are the rewritten ones
        elif (node.name, node.target) not in known or any(arg in reads for arg in node.all_input_nodes):
            target = node.target if isinstance(node.target, torch._ops.OpOverload) else \
                getattr(node.target, "__name__", node.target)
            found.append(f"%{node.name} = {target}")
    return tuple(found)


def check(subject: Subject) -> dict[str, Any]:
    name = subject.capture.name
    reference = reference_capture(subject.transform, subject.case.entry, subject.settings.captures)
    if reference is None:
        if len(subject.settings.captures) < 2:
            raise Skip("one capture selected: select several (--fxverify-capture export,export_core) to compare "
                       "the transform's effect across them")
        raise Skip(f"of the selected captures ({', '.join(subject.settings.captures)}), only {name} runs the transform on "
                   "this model (its contract or form leaves out the others, or the model is expected to fail "
                   "under them)")
    if reference == name:
        raise Skip(f"{name} is the capture the others are compared with (the first selected): their agreement "
                   "items report any difference")
    mine = capture_outputs(subject)
    theirs = _reference_outputs(subject, reference)
    for outputs in (mine, theirs):
        if outputs.problem is not None:
            raise Skip(f"no float64 outputs under {outputs.capture} to compare: {outputs.problem}")
        if not outputs.within_contract:
            raise Skip(f"the result differs from its original under {outputs.capture} beyond the contract's "
                       "tolerance: the numerics check reports that there")
    effects = {outputs.capture: _largest_change(outputs) for outputs in (mine, theirs)}
    details = {"reference": reference, "largest_change": effects}
    if not mine.moved and not theirs.moved:
        return {**details, "judged": "the transform changes the outputs by no more than rounding under either"}
    expected = _moved_as(mine.original, theirs)
    found = compare_trees(mine.result, expected, tolerance=rounding(subject, exact=mine.exact and theirs.exact))
    if found is None:
        return {**details, "judged": "the transform changes the outputs alike under both"}
    raise Finding(
        f"the transform changes the outputs differently under {name} than under {reference}: the {name} result "
        f"against the {name} original moved as the transform moves the {reference} one: {found.describe()}. "
        f"It changes the outputs by up to {effects[reference]:.3g} under {reference} ({_changed(theirs)}) and "
        f"by up to {effects[name]:.3g} under {name} ({_changed(mine)}). {_advice(mine, theirs)}",
        input=f"{subject.primary.describe()}, float64, {subject.contract.primary_mode} mode", where=found.path,
        node=_rewrites(mine, theirs), max_abs=found.max_abs, max_rel=found.max_rel, details=details)


def _reference_outputs(subject: Subject, reference: str) -> CaptureOutputs:
    """The reference capture's outputs: handed over by the run when it has them, else made here."""
    handed_over = subject.settings.services.get(NAME)  # HandOver.prepare's lookup, where the run keeps outputs
    handed = handed_over(reference) if handed_over is not None else None
    if isinstance(handed, CaptureOutputs):
        return handed
    peer = Subject(subject.transform, subject.case, timeout=subject.timeout, capture=subject.case.capture_named(reference),
                   settings=Settings(references=subject.settings.references))
    try:
        return capture_outputs(peer)
    except (TransformFailed, CaptureFailed, ModuleRaised) as exc:
        return CaptureOutputs(reference, problem=f"{exc}".splitlines()[0])


def _floating(leaf: Any) -> bool:
    return isinstance(leaf, torch.Tensor) and leaf.is_floating_point()


def _moved_as(original: Any, reference: CaptureOutputs) -> Any:
    """``original`` (outputs under one capture) plus the transform's change of the reference's outputs,
    leaf by leaf (flattened when the captures structure their outputs differently, as ``make_fx`` does);
    a leaf that is not a float tensor is expected as the reference's result has it."""
    mine, spec = pytree.tree_flatten(original)
    before, after = pytree.tree_leaves(reference.original), pytree.tree_leaves(reference.result)
    shapes = [getattr(leaf, "shape", None) for leaf in mine]
    if len(before) != len(mine) or len(after) != len(mine) or shapes != [getattr(x, "shape", None) for x in before]:
        raise Skip(f"the original's outputs under {reference.capture} do not match this capture's leaf for leaf "
                   f"({len(before)} against {len(mine)} outputs): there is nothing to compare the transform's "
                   "change with")
    moved = [m + (a - b) if _floating(m) and _floating(a) and _floating(b) else a for m, b, a in zip(mine, before, after)]
    return pytree.tree_unflatten(moved, spec)


def _largest_change(outputs: CaptureOutputs) -> float:
    pairs = zip(pytree.tree_leaves(outputs.result), pytree.tree_leaves(outputs.original))
    return max((float((a - b).abs().max()) for a, b in pairs if _floating(a) and _floating(b) and a.numel()
                and a.shape == b.shape), default=0.0)


def _rewrites(mine: CaptureOutputs, theirs: CaptureOutputs) -> str:
    """What the transform rewrote under each capture, for the finding's node line."""
    def listed(outputs: CaptureOutputs) -> str:
        nodes = outputs.rewritten
        more = f" and {len(nodes) - SHOWN} more" if len(nodes) > SHOWN else ""
        return f"under {outputs.capture}: {', '.join(nodes[:SHOWN]) + more if nodes else 'no node rewritten'}"
    return f"{listed(theirs)}; {listed(mine)}"


def _changed(outputs: CaptureOutputs) -> str:
    if outputs.changes is None:
        return "what it changed is unknown"
    return f"it changed the {'+'.join(outputs.changes)}" if outputs.changes else "it changed nothing"


def _advice(mine: CaptureOutputs, theirs: CaptureOutputs) -> str:
    idle = [o.capture for o in (mine, theirs) if not rewrites(o.changes)]
    if len(idle) == 1:
        return (f"It rewrote nothing under {idle[0]}: what it matches is missing from that graph (the training IR "
                "of export has aten.conv2d, aten.linear and aten.relu_ where core ATen has aten.convolution, "
                "aten.addmm and aten.relu). Match every spelling of what it rewrites, or declare the captures it "
                "is written for (@fxverify.contract(captures=(...)))")
    return (f"It rewrote both graphs, but not alike: compare what it does to the {theirs.capture} and "
            f"{mine.capture} graphs of this model (the golden check's files show both)")


class HandOver:
    """The agreement check's run-scoped service (``CheckSpec.service``): where a model has agreement items
    under other captures still to run, the reference capture's outputs are kept when its subject is dropped
    (one model's at a time) and handed to the others' items, which would otherwise capture and transform the
    model under the reference capture again. Each subject's settings get a function from a capture's name to
    the outputs handed over for it (or None)."""

    def __init__(self, transforms: Sequence[Transform], cases: Sequence[Any], *, captures: Sequence[str],
                 timeout: float, options: Mapping[str, Any]) -> None:
        self.captures = tuple(captures)
        self.wanted: set[tuple[str, str]] = set()  # (transform, model) with an item outside the reference capture
        self.handed: dict[tuple[str, str, str], CaptureOutputs] = {}

    def want(self, transform: Transform, case: Any, capture: str) -> None:
        if capture != reference_capture(transform, case.entry, self.captures):
            self.wanted.add((transform.spec, case.name))

    def prepare(self, transform: Transform, case: Any, capture: Any) -> Callable[[str], CaptureOutputs | None]:
        return lambda reference: self.handed.get((transform.spec, case.name, reference))

    def release(self, runner: Any) -> None:
        subject: Subject = runner.subject
        spec, model, capture = subject.transform.spec, subject.case.name, subject.capture.name
        if (spec, model) not in self.wanted or capture != reference_capture(subject.transform, subject.case.entry,
                                                                              self.captures):
            return
        self.handed = {}
        try:
            self.handed[spec, model, capture] = capture_outputs(subject)
        except Exception:  # the agreement items make them again, and report what fails there
            pass

    def close(self) -> None:
        self.handed = {}
