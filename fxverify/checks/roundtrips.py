"""Round trips: recompile, retrace, reexport, to_folder, pickle/deepcopy, torch.export's save and load, and the
Interpreter all agree with the module.

Seven checks, each on the transformed GraphModule, each comparing with that module's own
outputs on the primary inputs (value by value, first differing output path named):

- ``recompile``: a copy recompiled has the same code and outputs (a graph edited without
  ``recompile()``, or a forward patched by hand that the next pass's ``recompile()`` discards);
- ``retrace``: capturing the generated code again (the capture's ``recapture``: for
  ``symbolic_trace``, tracing it with the model's tracer) gives an isomorphic graph (see
  :func:`_same_graph`). Modules the graph calls stay leaves, so what is compared is the code, not
  the tracer's leaf policy; the entry's ``concrete_args`` are not passed again, since the
  generated code already holds their specialisation (its asserts, under renamed parameters). A
  plain Python function inserted as a ``call_function`` target without ``torch.fx.wrap`` is
  traced into, and a pass that retraces (torch's ``fuse``, ``remove_dropout``) sees another graph;
- ``reexport``: on export captures, the result exported again as the model was (decomposed again
  for ``export_core``, the same dynamic batch) calls the same operators in the same order and gives
  the same outputs (export canonicalises the rest: attribute reads, device strings):
  what a PT2E or ExecuTorch flow does with a transformed module (it replaces ``retrace`` there);
- ``to_folder``: ``gm.to_folder()`` exported, imported as a fresh package, same outputs;
- ``pickle``: ``copy.deepcopy`` gives the same code, a ``pickle`` round trip (which re-traces
  the code) an isomorphic graph, both the same outputs;
- ``interpreter``: ``torch.fx.Interpreter`` (the graph, node by node) equals the generated
  forward, output by output;
- ``serde``: an ``ExportedProgram`` the transform returned (forms ``program`` and ``lifted``) saved
  with ``torch.export.save`` and loaded again, its ``module()`` the same outputs (on export
  captures, where ``pickle`` and ``to_folder`` fail even untouched). A program that fails
  ``validate()``, which ``save`` runs first, is the ``verifier`` check's finding: skipped.

When the original trace fails the same round trip (torch's ``to_folder`` cannot export a
function registered with ``torch.fx.wrap``, say), the check skips saying that the original fails
it too, with both reasons: not the transform's doing.

>>> import fxverify
>>> fxverify.check_pickle(fxverify.examples.identity, "edge_conv_bn_head").outcome.value
'passed'
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import io
import pickle
import re
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn
from torch.fx.operator_schemas import normalize_function

from fxverify.analysis.compare import compare_trees
from fxverify.analysis.graph_text import canonical_text
from fxverify.analysis.known_errors import known_cause, unpatchable_wrap
from fxverify.analysis.module_state import first_line_difference, resolve
from fxverify.analysis.recording import RecordingInterpreter
from fxverify.capture.export import PROGRAM, named_as_exported, program_of
from fxverify.capture.symbolic import forget_unpatchable_wraps
from fxverify.checks._common import graph_result
from fxverify.checks.verifier import validation_error
from fxverify.core.results import Finding, Skip, Which, exception_summary
from fxverify.engine.subject import Subject

Trip = Callable[[Subject, Which], None]  # (subject, "result" or "original"): raises Finding


def check_recompile(subject: Subject) -> dict[str, Any]:
    return _round_trip(subject, _recompile)


def check_retrace(subject: Subject) -> dict[str, Any]:
    return _round_trip(subject, _retrace, retraces=True)


def check_reexport(subject: Subject) -> dict[str, Any]:
    if not subject.contract.keeps_opset:  # prepare_pt2e's observers: export raises on their data-dependent code
        raise Skip("the contract declares that the result leaves the capture's operator set for a later step to "
                   "bring back (keeps_opset=False, as prepare_pt2e's observers before convert_pt2e): it is not "
                   "exported again before that step")
    if not {"graph", "state"} & set(subject.applied().changes):  # an export each: worth sparing where it says nothing
        raise Skip("the transform left the graph and the tensors as captured: exporting the result again is "
                   "exporting the capture again, which says nothing of the transform")
    return _round_trip(subject, _reexport)


def check_to_folder(subject: Subject) -> dict[str, Any]:
    _require_serializable(subject)
    result = subject.applied().result
    if isinstance(result, fx.GraphModule) and _WRAP_REGISTRATION in result.code:
        raise Skip("torch's to_folder() cannot export code that registers torch.fx.wrap-ed functions (it puts "
                   "the registration inside the class body, where wrap() refuses to run): nothing to compare")
    return _round_trip(subject, _to_folder)


_WRAP_REGISTRATION = "torch.fx._symbolic_trace.wrap("


def check_pickle(subject: Subject) -> dict[str, Any]:
    _require_serializable(subject)
    return _round_trip(subject, _pickle, retraces=True)  # unpickling re-traces the code


def _require_serializable(subject: Subject) -> None:
    if not subject.contract.serializable:
        raise Skip("the contract declares the result not serializable (serializable=False): a run-time "
                   "optimisation that torch.save cannot write, so it is not saved and loaded")


def check_interpreter(subject: Subject) -> dict[str, Any]:
    return _round_trip(subject, _interpreter)


def check_serde(subject: Subject) -> dict[str, Any]:
    _require_serializable(subject)
    program = program_of(subject.applied().result)
    if program is None:
        raise Skip(f"the transform takes the program's module() (form={subject.transform.form}) and returns no "
                   "ExportedProgram to save")
    invalid = validation_error(program)
    if invalid is not None:
        raise Skip(f"the program fails validate() ({invalid}), which torch.export.save runs first: the verifier "
                   "check reports it")
    return _round_trip(subject, _serde)


def _round_trip(subject: Subject, trip: Trip, *, retraces: bool = False) -> dict[str, Any]:
    """Run ``trip`` on the result; when it fails, run it on the original to see whose fault it is (each
    in a process that can trace: a failed trip may leave torch.fx unable to, see ``forget_unpatchable_wraps``)."""
    result = subject.applied().result
    result = graph_result(result, "no graph to round-trip")
    try:
        _trip_result(subject, trip)
    except Finding as finding:
        try:
            forget_unpatchable_wraps()
            trip(subject, "original")
        except Finding as also:
            result_too = "" if also.what == finding.what else f" (the result: {finding.what})"
            raise Skip(f"the original trace fails this round trip too, so it is not the transform's doing: "
                       f"{also.what}{result_too}") from None
        lost = _lost_wraps(subject) if retraces else None
        if lost:
            raise Finding(finding.what + "; " + lost, input=finding.input, where=finding.where) from None
        raise
    return {"mode": subject.applied().mode}


def _trip_result(subject: Subject, trip: Trip) -> None:
    """``trip`` on the result; again on fresh copies of it where it failed on a copy ``copy.deepcopy`` made that
    raises where the result runs (:meth:`~fxverify.engine.subject.Subject.renew_result_copies`): fxverify's copy
    failed, not the result, and only the pickle check, whose round trip that copy is, reports it."""
    forget_unpatchable_wraps()
    try:
        trip(subject, "result")
    except Finding:
        if not subject.renew_result_copies():
            raise
        forget_unpatchable_wraps()
        trip(subject, "result")


def _lost_wraps(subject: Subject) -> str | None:
    """Why re-tracing the result may trace into functions the original kept opaque, if that is why."""
    applied = subject.applied()
    wrapped = {n.target for n in applied.original.graph.nodes if n.op == "call_function" and n.meta.get("is_wrapped")}
    lost = [f"%{n.name}" for n in _graph_module(subject, "result").graph.nodes
            if n.op == "call_function" and n.target in wrapped and not n.meta.get("is_wrapped")]
    if not lost:
        return None
    return (
        f"the original registered the function called by the result's {', '.join(lost[:3])} with torch.fx.wrap, "
        "but the result's node lost node.meta['is_wrapped'] (torch.fx.Transformer and Graph.create_node do not carry "
        "it over), so the generated code no longer registers it and re-tracing traces into it: copy "
        "node.meta['is_wrapped'] to the new node, or subclass fxverify.examples.KeepWrappedTransformer"
    )


# -- the round trips ---------------------------------------------------------------------


def _recompile(subject: Subject, which: Which) -> None:
    module = _graph_module(subject, which)
    copied = _step("copying the module", lambda: subject.copy_of(which))
    assert isinstance(copied, fx.GraphModule), type(copied)
    _step("recompile()", copied.recompile)
    _same_code(module, copied, "recompile() changes the generated code: the graph was edited without calling "
                               "gm.recompile() afterwards")
    _same_outputs(subject, which, copied, "after recompile() the module computes something else: its forward was not "
                                    "the code generated from its graph (patched by hand?), and the next pass that "
                                    "recompiles discards it")


def _retrace(subject: Subject, which: Which) -> None:
    module = _graph_module(subject, which)
    name = subject.capture.describe()
    graph = _step(f"capturing again with {name}", lambda: subject.capture.recapture(module))
    _same_graph(module, module.graph, module, graph,
                f"capturing the generated code again with {name} gives another graph: a call_function target "
                "that is a plain Python function is traced into unless registered with torch.fx.wrap; a pass that "
                "retraces will see the other graph")


def _reexport(subject: Subject, which: Which) -> None:
    module = _graph_module(subject, which)
    name = subject.capture.describe()
    again = _step(f"exporting it again with {name}",
                  lambda: subject.capture.reexport(module, subject.primary.make(subject.case.seed)))
    before, after = _operators(module.graph), _operators(again.graph)
    if before != after:
        raise Finding(f"exporting it again with {name} runs other operators: PT2E and ExecuTorch flows export the "
                      "transformed module again (a converted model is exported for lowering) and see those",
                      where=first_line_difference(before, after))
    _same_outputs(subject, which, again, f"the module exported again with {name} computes something else")


def _operators(graph: fx.Graph) -> str:
    """The operators a graph calls, in order, one a line: what re-exporting must keep (export itself
    canonicalises the rest: the order of attribute reads, a device given as a string, and a pure node nothing
    reads, which it writes for every output of a call, as the ``getitem`` of an LSTM's unused state, where a
    pass's dead-code elimination removed it)."""
    return "\n".join(str(node.target) for node in graph.nodes
                     if node.op == "call_function" and (node.users or node.is_impure()))


def _to_folder(subject: Subject, which: Which) -> None:
    module = _graph_module(subject, which)
    with tempfile.TemporaryDirectory(prefix="fxverify-") as tmp:
        folder = Path(tmp) / "exported"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "saved as pickled files instead": expected for most children
            _step("to_folder()", lambda: module.to_folder(folder, "FxModule"))
        exported = _step("importing the package that to_folder() wrote", lambda: _import_fresh(folder).FxModule(),
                         saving=True)
    exported.train(module.training)
    _same_outputs(subject, which, exported, "the module exported by to_folder() and imported again computes something else")


def _serde(subject: Subject, which: Which) -> None:
    program = named_as_exported(_graph_module(subject, which).meta[PROGRAM])
    buffer = io.BytesIO()
    try:
        _step("torch.export.save", lambda: torch.export.save(program, buffer))
    except Finding as finding:  # torch's serializer names the node it could not write: point at it
        named = re.search(r"serializing node (\S+) in graph", finding.what)
        found = [n for n in program.graph.nodes if named and n.name == named.group(1)]
        finding.node = found[0].format_node() if found else None
        raise
    buffer.seek(0)
    loaded = _step("torch.export.load", lambda: torch.export.load(buffer))
    module = _step("module() of the loaded program", loaded.module)
    _same_outputs(subject, which, module, "the program saved with torch.export.save and loaded again computes something else")


def _pickle(subject: Subject, which: Which) -> None:
    module = _graph_module(subject, which)
    copied = _step("copy.deepcopy", lambda: copy.deepcopy(module))
    _same_code(module, copied, "copy.deepcopy generates different code")
    _same_outputs(subject, which, copied, "copy.deepcopy computes something else",
                  running="running the module copy.deepcopy made", note=_lost_in_copy(module, copied))
    data = _step("pickle.dumps", functools.partial(pickle.dumps, copied))  # not the module: pickling recompiles it
    del copied  # one extra copy of a big model in memory at a time
    loaded = _step("pickle.loads", functools.partial(pickle.loads, data), saving=True)  # re-traces the pickled code
    del data
    _same_graph(module, module.graph, loaded, loaded.graph, "the unpickled module has another graph")
    _same_outputs(subject, which, loaded, "the unpickled module computes something else")


def _interpreter(subject: Subject, which: Which) -> None:
    module = _runnable(subject, which)
    interpreter = RecordingInterpreter(module)  # torch.fx.Interpreter, passing fresh lists as generated code does
    interpreted = _step("running the graph with torch.fx.Interpreter", lambda: _run(subject, interpreter.run))
    found = compare_trees(interpreted, _reference(subject, which), tolerance=subject.tolerance)
    if found is not None:
        raise Finding(
            "torch.fx.Interpreter running the graph and the generated forward disagree: "
            f"{found.describe()}; the code is not what the graph says (a custom CodeGen, or a forward patched by hand)",
            input=_where(subject), where=found.path,
        )


def _lost_in_copy(module: fx.GraphModule, copied: fx.GraphModule) -> str:
    """What ``copied``, ``copy.deepcopy(module)``, lacks of a GraphModule subclass's own state, and why, as
    "; the copy lacks ...", or "". ``GraphModule.__deepcopy__`` builds the copy with ``GraphModule.__init__``
    unless the subclass overrides ``_deepcopy_init``, so the attributes and submodules its own ``__init__``
    sets are lost (torch 2.14's ``FoldedGraphModule``, which ``split_const_subgraphs`` returns, loses
    ``has_folding_been_run``)."""
    lost = sorted((set(vars(module)) | set(module._modules)) - (set(vars(copied)) | set(copied._modules)))
    own = next((c for c in type(module).__mro__ if c is not fx.GraphModule and issubclass(c, fx.GraphModule)
                and "__init__" in vars(c)), None)
    if not lost or own is None or type(module)._deepcopy_init is not fx.GraphModule._deepcopy_init:
        return ""
    fix = (f"a torch defect ({own.__module__}.{own.__name__}); declare serializable=False if the pass does not "
           "promise copies" if own.__module__.startswith("torch.") else f"override _deepcopy_init in {own.__name__}")
    return (f"; the copy lacks {', '.join(lost[:4])}{' ...' if len(lost) > 4 else ''}, which {own.__name__}.__init__ "
            f"sets: GraphModule.__deepcopy__ builds copies with GraphModule.__init__ unless a subclass overrides "
            f"_deepcopy_init ({fix})")


# -- helpers ---------------------------------------------------------------------------------


def _step(what: str, fn: Callable[[], Any], *, saving: bool = False, note: str = "") -> Any:
    try:
        return fn()
    except Exception as exc:
        hint = known_cause(exc)
        if hint and saving and unpatchable_wrap(exc):
            hint += ("; loading what was saved runs such code, then traces GraphModules again (submodules saved "
                     "with torch.save are traced when loaded). The result cannot be saved this way until torch fixes "
                     "it: if the pass does not promise that, declare serializable=False")
        raise Finding(f"{what} raised {exception_summary(exc)}" + (f": {hint}" if hint else "") + note) from None


def _same_code(module: fx.GraphModule, other: fx.GraphModule, what: str) -> None:
    if other.code != module.code:
        raise Finding(what, where=first_line_difference(module.code, other.code))


def _same_graph(owner: nn.Module, graph: fx.Graph, other_owner: nn.Module, other: fx.Graph, what: str) -> None:
    """Isomorphic: the same anonymous canonical text (see :mod:`fxverify.analysis.graph_text`) once
    equivalent spellings are made one: call_function arguments bound by keyword
    (``normalize_function``: ``relu(input=x)`` and ``relu(x)`` are one call; a re-trace binds them
    positionally), attribute reads nothing uses left out (tracing creates those lazily, so a
    re-trace of ``y = x.ndim; y = None`` drops them), and get_attr / call_module targets named by
    the first path at which their object is found (after a fusion or a partition one module can be
    reachable under two paths, and a re-trace names it by the first)."""
    before, after = _isomorphism_form(graph, owner), _isomorphism_form(other, other_owner)
    if before != after:
        raise Finding(f"{what} (nodes numbered, names ignored, arguments bound by keyword)",
                      where=first_line_difference(before, after))


def _first_paths(owner: nn.Module) -> dict[int, str]:
    """``id()`` of each submodule, parameter and buffer of ``owner`` -> the first path it is found at,
    in the order a tracer looks (``named_modules``, ``named_parameters``, ``named_buffers``)."""
    paths: dict[int, str] = {}
    for found in (owner.named_modules(), owner.named_parameters(), owner.named_buffers()):
        for path, obj in found:
            paths.setdefault(id(obj), path)
    return paths


def _isomorphism_form(graph: fx.Graph, owner: nn.Module) -> str:
    graph = copy.deepcopy(graph)
    paths = _first_paths(owner)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # normalize_function warns about type hints it cannot build
        for node in list(graph.nodes):
            if node.op in ("get_attr", "call_module"):
                try:
                    node.target = paths.get(id(resolve(owner, str(node.target))), node.target)
                except AttributeError:  # lint reports targets that do not resolve
                    pass
            if node.op != "call_function":
                continue
            if node.target is getattr and not node.users:
                graph.erase_node(node)
                continue
            try:
                bound = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
            except (RuntimeError, TypeError, ValueError):  # overloads it cannot tell apart: compare as written
                bound = None
            if bound is not None:
                node.args, node.kwargs = (), bound.kwargs
        _reads_before_first_use(graph)
    return canonical_text(graph, anonymous=True)


def _reads_before_first_use(graph: fx.Graph) -> None:
    """Move each attribute read (``x.dtype``, ``x.shape``) to just before its first user, in the order
    that user reads them: tracing creates them when the call's arguments are evaluated, so a pass that
    builds them in another order (NormalizeArgs: ``x.device`` before ``x.dtype``) gives a re-trace
    that differs only in that order."""
    placed: set[fx.Node] = set()
    for node in list(graph.nodes):
        for read in node.all_input_nodes:
            if read.op == "call_function" and read.target is getattr and read not in placed:
                node.prepend(read)
                placed.add(read)


def _same_outputs(subject: Subject, which: Which, other: nn.Module, what: str, *,
                  running: str = "running the round-tripped module", note: str = "") -> None:
    """``other`` gives the outputs of ``subject``'s ``which`` module, or a finding saying ``what`` (``running`` it
    raised, with ``note``)."""
    actual = _step(running, lambda: _run(subject, other), note=note)
    found = compare_trees(actual, _reference(subject, which), tolerance=subject.tolerance)
    if found is not None:
        raise Finding(f"{what}: {found.describe()}", input=_where(subject), where=found.path)


def _reference(subject: Subject, which: Which) -> Any:
    """The module's own outputs (cached by the subject in eval mode; train mode reseeds dropout)."""
    if subject.applied().mode == "eval":
        return subject.outputs(which)
    return _run(subject, _runnable(subject, which))


def _runnable(subject: Subject, which: Which) -> fx.GraphModule:
    """The module to run: in train mode a copy, since a run updates state (BatchNorm running
    statistics) that later checks read from the shared module."""
    module = _graph_module(subject, which)
    if subject.applied().mode == "eval":
        return module
    copied = subject.copy_of(which)
    assert isinstance(copied, fx.GraphModule), type(copied)
    return copied


def _graph_module(subject: Subject, which: Which) -> fx.GraphModule:
    """``subject.module(which)``, known to be a GraphModule: the round trips run only on a result that is one."""
    module = subject.module(which)
    assert isinstance(module, fx.GraphModule), type(module)
    return module


def _run(subject: Subject, fn: Callable[..., Any]) -> Any:
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(subject.case.seed + 1)
        return fn(*subject.primary.make(subject.case.seed))


def _where(subject: Subject) -> str:
    return f"{subject.primary.describe()}, {subject.dtype}, {subject.applied().mode} mode"


def _import_fresh(folder: Path) -> Any:
    """Import ``folder`` as a package named after its (unique) temporary parent, then forget it."""
    name = "fxverify_to_folder_" + folder.parent.name.replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    try:
        spec.loader.exec_module(package)
    finally:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
    return package
