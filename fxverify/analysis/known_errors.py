"""Known torch behaviours behind an exception: where one is recognised, a finding that reports the exception
adds one line saying what it is and the way around it (:func:`known_cause`).

Each entry of :data:`KNOWN` recognises one behaviour: given the exception, it returns its hint (worded from
what the exception names) or None; the first that matches speaks. Measured on torch 2.14.1. A behaviour that
only the graphs show, not the exception (a node that lost its ``torch.fx.wrap`` mark), is named by the check
that compares them (:mod:`fxverify.checks.roundtrips`).

>>> known_cause(ValueError("unrelated")) is None
True
"""

from __future__ import annotations

import re
from collections.abc import Callable

_RENAMED_INPUT = re.compile(r"Input spec name (?P<name>\w+) does not match node name (?P=name)_\d+")


def renamed_by_deepcopy(exc: BaseException) -> str | None:
    """``copy.deepcopy(ep)`` of an ExportedProgram renames a placeholder named like a Python builtin."""
    found = _RENAMED_INPUT.search(str(exc)) if type(exc).__name__ == "SpecViolationError" else None
    if found is None:
        return None
    name = found.group("name")
    return (f"torch's copy.deepcopy of an ExportedProgram renames the placeholder {name!r} (a Python builtin's "
            f"name, as a forward(self, {name}) gives it) to {name}_1 but not its input spec, so the copy fails "
            "validation (torch 2.14): copy the program with copy.deepcopy(ep).run_decompositions({}), which names "
            "it from the signature again, or rename the copy's placeholders to "
            "ep.graph_signature.input_specs[i].arg.name")


def unpatchable_wrap(exc: BaseException) -> str | None:
    """The ``KeyError`` of a ``torch.fx.wrap`` registration no module's globals hold (see
    :func:`fxverify.capture.symbolic.forget_unpatchable_wraps`): a torch.fx defect, not the code that
    happened to trace next."""
    from torch.fx import _symbolic_trace  # here: engine.transform reads this table, and keeps torch out of start-up

    name = exc.args[0] if isinstance(exc, KeyError) and exc.args else None
    if not isinstance(name, str) or name not in {key[1] for key in _symbolic_trace._wrapped_fns_to_patch}:
        return None
    return (f"a torch.fx defect (torch 2.14): code generated for a trace with a None concrete arg runs "
            f"torch.fx.wrap({name!r}), a dotted name no module's globals hold, and every trace after it in the "
            "process raises this KeyError")


KNOWN: tuple[Callable[[BaseException], str | None], ...] = (renamed_by_deepcopy, unpatchable_wrap)


def known_cause(exc: BaseException) -> str | None:
    """The one-line hint of the first known torch behaviour behind ``exc`` (:data:`KNOWN`), or None.

    >>> known_cause(KeyError("x")) is None
    True
    """
    return next((hint for hint in (recognise(exc) for recognise in KNOWN) if hint is not None), None)
