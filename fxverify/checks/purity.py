"""purity: the transform leaves its input alone and its outputs behave like the original's.

A transform that returns a new module must not have mutated the GraphModule
it was given (parameters, buffers, graph, code), nor one of form ``program`` the
ExportedProgram it was given (graph, signature, tensors); one that returns ``None``,
the module or program it was given, or a new GraphModule over the Graph it was given (torchao's
``prepare_pt2e``) works in place, as allowed. A quantizer under test (form ``quantizer``) is applied through
``prepare_pt2e``, which consumes the model it is given (its own conv-BN fold edits it before the quantizer is called;
its users write ``m = prepare_pt2e(m, quantizer)``): what became of its input is not judged. Outputs must not newly
alias inputs, and output strides and contiguity must be unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

from fxverify.analysis.compare import leaves_with_paths
from fxverify.core.results import Finding, exception_summary
from fxverify.engine.subject import Subject


def check(subject: Subject) -> dict[str, Any]:
    applied = subject.applied()
    if applied.input_change is not None and subject.transform.form != "quantizer":
        if subject.transform.form == "program":
            raise Finding(
                f"the transform returned a new ExportedProgram but also mutated the one it was given: "
                f"{applied.input_change}. Return the program it was given (changed in place) or None to declare an "
                "in-place pass, or leave it unchanged (torch's ep._transform_do_not_use changes the program it is "
                "called on)",
                where="the transform's input program",
            )
        raise Finding(
            f"the transform returned a new module but also mutated the GraphModule it was given: {applied.input_change}. "
            "Work on a copy (copy.deepcopy) or return None to declare an in-place transform",
            where="the transform's input module",
        )
    config = subject.primary
    where = f"{config.describe()}, {subject.dtype}, {applied.mode} mode"
    layouts = []
    for module in (applied.original, applied.result):
        inputs = config.make(subject.case.seed)
        try:
            with torch.no_grad():
                outputs = module(*inputs)
        except Exception as exc:
            raise Finding(f"the module raised when run: {exception_summary(exc)}", input=where) from None
        layouts.append(_layout(outputs, inputs))
    expected, actual = layouts
    for (path, old), (_, new) in zip(expected, actual):
        if new["aliases"] - old["aliases"]:
            raise Finding(
                f"{path} now aliases input {sorted(new['aliases'] - old['aliases'])[0]} (shares its storage); "
                "callers may mutate one through the other",
                input=where,
                where=path,
            )
        if (new["stride"], new["contiguous"]) != (old["stride"], old["contiguous"]):
            raise Finding(
                f"{path} layout changed: stride {old['stride']} (contiguous={old['contiguous']}) became "
                f"{new['stride']} (contiguous={new['contiguous']})",
                input=where,
                where=path,
            )
    return {"in_place": applied.in_place}


def _layout(outputs: Any, inputs: tuple[torch.Tensor, ...]) -> list[tuple[str, dict[str, Any]]]:
    storages = {t.untyped_storage().data_ptr(): i for i, t in enumerate(inputs)}
    layout = []
    for path, leaf in leaves_with_paths(outputs)[0]:
        if isinstance(leaf, torch.Tensor):
            ptr = leaf.untyped_storage().data_ptr()
            layout.append((path, {
                "aliases": {storages[ptr]} if ptr in storages else set(),
                "stride": leaf.stride(),
                "contiguous": leaf.is_contiguous(),
            }))
    return layout
