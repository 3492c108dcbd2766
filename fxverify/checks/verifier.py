"""verifier: a pass that returns an ``ExportedProgram`` returns one that still validates.

An ``ExportedProgram`` is a graph plus a ``graph_signature`` that names, by node name, which
placeholders are parameters, buffers, constants and user inputs and which outputs are user outputs
or buffer and input mutations. A pass that rewrites the graph and leaves the signature alone (it
erases the node an output spec names, say) leaves a program that still runs through ``module()``
but that ``torch.export.save``, ``to_edge`` and every other user of ``validate()`` reject, far from
the pass. This check runs the program's own verifiers (``ep.validate()``: its dialect's operator
rules, ``meta['val']`` on every node, the signature against the graph) on the program the transform
returned, after checking that the program it was given validates untouched; a signature entry that
names another node than the graph's at its position is reported with both names.

Applies to transforms of form ``program`` and ``lifted`` (see
:attr:`~fxverify.core.contracts.Contract.form`) under the export captures; a transform taking
``ep.module()`` returns no program (``meta`` and ``opset`` check its nodes).
"""

from __future__ import annotations

from typing import Any

import torch

from fxverify.capture.export import PROGRAM, named_as_exported, program_of, signature_nodes
from fxverify.core.results import Finding, Skip, exception_summary
from fxverify.engine.subject import Subject


def check(subject: Subject) -> dict[str, Any]:
    applied = subject.applied()
    result = program_of(applied.result)
    if result is None:
        raise Skip(f"the transform takes the program's module() (form={subject.transform.form}) and returns no "
                   "ExportedProgram: no signature to verify (meta and opset check its nodes)")
    given = named_as_exported(applied.original.meta[PROGRAM])
    untouched = validation_error(given)
    if untouched is not None:
        raise Skip(f"the {subject.capture.name} program fails its own verifier untouched ({untouched}): nothing to "
                   "compare the result with")
    found = validation_error(result)
    if found is None:
        return {"verifiers": [verifier.__name__ for verifier in result.verifiers]}
    stale = _stale_signature(result)
    advice = (f" ({stale[1]}). Keep the graph_signature in step with the graph: replace nodes inside `with "
              "ep.graph_module._set_replace_hook(ep.graph_signature.get_replace_hook()):`, or run a GraphModule "
              "pass through ep._transform_do_not_use(pass), which rebuilds the signature" if stale else
              ". The verifier's message names the rule the program breaks and the node")
    raise Finding(
        f"the program the transform returned fails its own verifier ({result.dialect} dialect): "
        f"{found.rstrip('. ')}. torch.export.save, to_edge and everything else that calls validate() raise on "
        f"this program, far from this pass{advice}.",
        node=stale[0] if stale else None)


def validation_error(program: torch.export.ExportedProgram) -> str | None:
    """What ``program.validate()`` raises, in one line, or None when it validates."""
    try:
        program.validate()
    except Exception as exc:  # SpecViolationError and whatever else the verifiers raise on a broken program
        return exception_summary(exc)
    return None


def _stale_signature(program: torch.export.ExportedProgram) -> tuple[str | None, str] | None:
    """``(node, how)`` for the first input or output spec that names another node than the graph has at
    its position, or None."""
    for what, nodes, named in signature_nodes(program):
        for position, (node, spec) in enumerate(zip(nodes, named, strict=False)):
            name = getattr(spec.arg, "name", None)
            if isinstance(name, str) and name != node.name:
                return node.format_node() or node.name, (
                    f"graph_signature.{what}_specs[{position}] ({spec.kind.name}) names %{name}, but the graph's "
                    f"{what} {position} is %{node.name}")
        if len(nodes) != len(named):
            return None, f"the graph has {len(nodes)} {what}s and graph_signature.{what}_specs {len(named)}"
    return None
