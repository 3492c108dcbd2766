"""lint: the result is a well-formed GraphModule that runs.

``graph.lint()``; generated code in sync with the graph (a forgotten
``recompile()``); every get_attr / call_module target resolvable; no value
used before it is defined; placeholders and output structure (pytree spec)
unchanged; runs under ``torch.fx.Interpreter``; a ``PassResult`` saying ``modified=False`` changed nothing
(its callers trust the bit); survives ``copy.deepcopy`` where the contract
declares ``serializable=False`` (otherwise the pickle check, whose job the copy is, reports it once).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import fx

from fxverify.analysis.compare import leaves_with_paths
from fxverify.analysis.module_state import first_line_difference, resolve
from fxverify.checks._common import graph_result
from fxverify.core.results import Finding, exception_summary
from fxverify.core.transform import CLAIMED_MODIFIED
from fxverify.engine.subject import Subject


def check(subject: Subject) -> dict[str, Any]:
    applied = subject.applied()
    result = applied.result
    result = graph_result(result, "no graph to lint")
    graph = result.graph
    try:
        graph.lint()
    except Exception as exc:  # lint raises RuntimeError/ValueError with the whole graph appended
        raise Finding(f"graph.lint() failed: {exception_summary(exc)}") from None
    regenerated = graph.python_code(root_module="self").src
    if regenerated != result.code:
        raise Finding(
            "the generated code is out of sync with the graph: the transform changed the graph "
            "but did not call gm.recompile() afterwards",
            where=first_line_difference(result.code, regenerated),
        )
    for node in graph.nodes:
        if node.op in ("get_attr", "call_module"):
            try:
                resolve(result, str(node.target))
            except AttributeError as exc:
                raise Finding(
                    f"{node.op} node %{node.name} targets {node.target!r}, which does not resolve: {exc}",
                    node=f"%{node.name}",
                ) from None
    before = _placeholders(applied.original.graph)
    after = _placeholders(graph)
    if before != after:
        raise Finding(f"placeholder signature changed: expected {before}, got {after}")
    interpreted, interpreter_note = _interpret(subject, result, applied.original)
    _, expected_spec = leaves_with_paths(subject.outputs("original"))
    _, actual_spec = leaves_with_paths(subject.outputs("result"))
    _, interpreted_spec = leaves_with_paths(interpreted if interpreter_note is None else subject.outputs("result"))
    if expected_spec != actual_spec or expected_spec.num_leaves != interpreted_spec.num_leaves:
        raise Finding(
            f"output structure changed: expected {expected_spec}, got {actual_spec}{_lost_codegen(applied.original, graph)}",
            input=subject.primary.describe(),
            where="output",
        )
    details = {"nodes": len(graph.nodes), "interpreter": interpreter_note or "runs", **_modified_bit(result, applied.changes)}
    if subject.contract.serializable:
        return details  # check_pickle deep-copies the result first and reports what the copy gets wrong
    try:
        copied = copy.deepcopy(result)
    except Exception as exc:
        raise Finding(f"copy.deepcopy of the result raised {exception_summary(exc)}") from None
    if copied.code != result.code:
        raise Finding("copy.deepcopy of the result generates different code",
                      where=first_line_difference(result.code, copied.code))
    return details


def _interpret(subject: Subject, result: fx.GraphModule, original: fx.GraphModule) -> tuple[Any, str | None]:
    """The result run by ``torch.fx.Interpreter``, and None; or, when the original does
    not run under the Interpreter either (not the transform's fault), None and why."""
    inputs = subject.primary.make(subject.case.seed)
    with torch.no_grad():
        try:
            return fx.Interpreter(result).run(*inputs), None
        except Exception as exc:
            failure = exception_summary(exc)
        try:
            fx.Interpreter(original).run(*subject.primary.make(subject.case.seed))
        except Exception as exc:
            return None, f"the original does not run under torch.fx.Interpreter either: {exception_summary(exc)}"
    raise Finding(f"the result does not run under torch.fx.Interpreter: {failure}", input=subject.primary.describe())


CHANGES_THAT_COUNT = ("graph", "state", "code", "modules")  # what a modified=False may not have changed


def _modified_bit(result: fx.GraphModule, changes: list[str] | None) -> dict[str, Any]:
    """Hold a ``PassResult``'s ``modified`` bit to what the pass changed: ``False`` where it changed the graph, the
    state, the code or the submodules is a finding (a ``PassManager`` stops iterating on it, ExecuTorch's pass
    manager skips what it runs after a modifying pass); ``True`` where it changed nothing is reported in the
    details only (a conservative bit costs a caller a recompile, nothing more)."""
    claimed = result.meta.get(CLAIMED_MODIFIED)
    if claimed is None:
        return {}
    changed = [change for change in changes or () if change in CHANGES_THAT_COUNT]
    if claimed is False and changed:
        raise Finding(f"the pass returned PassResult(modified=False) but changed the module's {' and '.join(changed)}: "
                      "callers trust the bit (torch.fx's PassManager stops iterating on it, ExecuTorch's pass manager "
                      "skips re-validating and re-propagating after it); return modified=True whenever the graph "
                      "changes", where="PassResult.modified")
    return {"modified": claimed if changed or claimed is False else "True, with nothing changed (conservative)"}


def _placeholders(graph: fx.Graph) -> list[str]:
    return [f"{n.target}={n.args[0]!r}" if n.args else str(n.target) for n in graph.find_nodes(op="placeholder")]


def _lost_codegen(original: fx.GraphModule, graph: fx.Graph) -> str:
    """Why the outputs' structure changed when the result's graph lost the original's own code generator
    (an ``ep.module()``'s ``_PyTreeCodeGen`` packs and unpacks its inputs and outputs); "" otherwise."""
    kept = type(original.graph._codegen)
    if kept is type(graph._codegen) or kept is fx.graph.CodeGen:
        return ""
    return (f". The original's graph has a {kept.__name__}, which packs its inputs and outputs, and the result's "
            f"graph a plain {type(graph._codegen).__name__}: a pass that builds a new fx.Graph must carry it over "
            "(new_graph.set_codegen(copy.deepcopy(gm.graph._codegen)))")
