"""Standalone repro files: a minimised failure (:class:`fxverify.diagnose.minimise.Minimised`)
written as one Python file that needs torch and the user's transform alone.

``<stem>.py`` holds the minimised module as code (``torch.nn`` layers rebuilt
from their constructors, the generated ``forward`` of the ``GraphModule``, its
``torch.fx.wrap`` registrations at module level); ``<stem>.pt`` beside it its
state and inputs, loaded with ``torch.load(weights_only=True)``. Running it traces
the module (every submodule kept a leaf, so the graph is the minimised one; on a ``make_fx``
capture, traces it again with ``make_fx`` as the minimiser did each candidate), calls
the transform on it as fxverify does, and runs the result: while the bug is there
it prints the traceback and exits with :data:`~fxverify.diagnose.repro_script.EXIT_DIFFERS` (the
``torch.testing.assert_close`` failure) or :data:`~fxverify.diagnose.repro_script.EXIT_RAISES` (the
result raised), any other error exits with 1 as usual. Layers that cannot be rebuilt from their
``repr`` (not ``torch.nn`` classes) are pickled into ``<stem>.modules.pt`` and
loaded with ``weights_only=False``.

:func:`write_repro` runs the file in a fresh Python process before returning it,
and deletes it again unless it fails the way the minimised failure did. The repro of a failure on an
export capture is a saved program, minimised too, and the pass call (:mod:`fxverify.diagnose.program_repro`).
"""

from __future__ import annotations

import math
import os
import re
import types
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn

from fxverify import checks
from fxverify.analysis.golden import portable_spec, safe_name
from fxverify.analysis.module_state import resolve
from fxverify.cases.catalogue import file_label
from fxverify.core.results import Finding, exception_summary
from fxverify.diagnose.minimise import Minimised, minimise_failure
from fxverify.diagnose.program_repro import write_program_repro
from fxverify.diagnose.repro_script import absolute_spec, check_reproduces, script_source
from fxverify.engine.subject import Subject
from fxverify.errors import FxVerifyError


class ReproOnFailure:
    """A runner's post-failure hook (see :mod:`fxverify.runner`): a numerics failure in the
    contract's primary mode is minimised (:func:`fxverify.diagnose.minimise.minimise_failure`) and
    written into ``directory`` as a standalone repro, named in the finding (``finding.repro``, and a
    line of the message); on an export capture, the saved program and the pass call are
    (:func:`fxverify.diagnose.program_repro.write_program_repro`); when that cannot be done, the
    finding says why.

    >>> hook = ReproOnFailure("repros")
    >>> hook.directory
    'repros'
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = directory

    def __call__(self, subject: Subject, check: str, finding: Finding) -> None:
        if not checks.spec(check).repro:  # the minimiser shrinks a numerics failure
            return
        exported = subject.capture.traits.has_program
        # a symbolic trace of each candidate is what a torch-level capture gives; an ATen-level one says how
        if not exported and subject.capture.repro_given is None and subject.capture.traits.opset is not None:
            finding.what += f"\nno repro written: repros are not written for {subject.capture.name} graphs yet"
            return
        if finding.mode is not None and finding.mode != subject.contract.primary_mode:
            finding.what += f"\nno repro written: only failures in {subject.contract.primary_mode} mode are minimised"
            return
        stem = repro_stem(file_label(subject.case.name, subject.capture.name), check, subject.transform.spec)
        try:
            if exported:
                path, how = write_program_repro(subject, self.directory, stem,
                                                title=f"{subject.transform.spec} fails numerics on {subject.case.name}")
                finding.repro = str(path)
                program = f"a subgraph's {subject.capture.name} program, {how}" if how else \
                    f"the {subject.capture.name} program"
                finding.what += f"\nrepro:      python {path}  ({program}, and the pass call)"
                return
            found = minimise_failure(subject)
            path = write_repro(found, self.directory, stem,
                               title=f"{subject.transform.spec} fails numerics on a subgraph of {subject.case.name}")
        except FxVerifyError as exc:
            finding.what += f"\nno repro written: {exc}"
            return
        except Exception as exc:  # torch's minifier on a graph it was not written for: the finding stands
            doing = "saving the program" if exported else "minimising"
            finding.what += (f"\nno repro written: {doing} raised {exception_summary(exc)}; "
                             "please report this to fxverify")
            return
        finding.repro = str(path)
        finding.what += f"\nrepro:      python {path}  ({found.describe()})"


def repro_stem(model: str, check: str, spec: str) -> str:
    """A file-name-safe stem for a repro, named as golden files name the transform
    (:func:`fxverify.golden.portable_spec`), so two transforms never share one.

    >>> repro_stem("resnet18", "numerics", "src/passes.py:fuse"), repro_stem("resnet18", "numerics", "pkg.a:fuse")
    ('resnet18-numerics-passes.fuse', 'resnet18-numerics-pkg.a.fuse')
    >>> repro_stem("vit/b:16", "numerics", "my.passes:fold<bn>")
    'vit_b_16-numerics-my.passes.fold_bn_-bbd7a72f'
    """
    return safe_name(f"{model}-{check}-{portable_spec(spec).replace(':', '.')}")


def write_repro(found: Minimised, directory: str | os.PathLike[str], stem: str = "fxverify_repro", *,
                title: str = "") -> Path:
    """Write ``<stem>.py`` (and its ``.pt`` files) into ``directory`` and check, by running
    it in a fresh Python process from the current directory, that it fails as ``found``
    does; return the ``.py`` path.

    Raises :class:`FxVerifyError` when the transform cannot be imported by name (a
    lambda, a function of ``__main__``) or the file written does not reproduce (the
    files are then deleted). For example (``my_passes.fold_bn`` is the transform)::

        import fxverify
        from my_passes import fold_bn

        found = fxverify.minimise_numerics(fold_bn, "resnet18")  # see fxverify.api
        path = fxverify.write_repro(found, "repros", "resnet18-fold_bn")
        # python repros/resnet18-fold_bn.py exits with EXIT_DIFFERS (3) while the bug is there
    """
    if not found.transform.reloadable:
        raise FxVerifyError(
            f"transform {found.transform.spec} cannot be imported by name (a lambda, a local function or one "
            "defined in __main__), so a standalone repro cannot call it: define it in an importable module"
        )
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    gm = found.module
    given_import, given = found.given or _TRACED
    code = gm.graph.python_code(root_module="self")
    wraps, forward = _split_wraps(code.src)
    pickled: dict[str, nn.Module] = {}
    layers = [_install_line(target, resolve(gm, target), pickled) for target in _targets(gm, "call_module")]
    attributes = {target: _attribute(gm, target) for target in _targets(gm, "get_attr")}
    torch.save({"inputs": list(found.inputs), "state": gm.state_dict(), "attributes": attributes},
               folder / f"{stem}.pt")
    if pickled:
        torch.save(pickled, folder / f"{stem}.modules.pt")
    source = script_source(
        _DOCSTRING, _BODY,
        title=title or f"transform {found.transform.spec} fails",
        failure=found.failure,
        size=found.describe(),
        imports="\n".join([_import_line(name, value) for name, value in sorted(code.globals.items())
                            if name != "torch" and re.search(rf"\b{re.escape(name)}\b", code.src)]
                           + ([given_import] if given_import else [])),
        wrapped="".join(f"{n}, " for n, v in sorted(code.globals.items()) if isinstance(v, types.FunctionType)),
        pickled=f'PICKLED = torch.load(HERE / "{stem}.modules.pt", weights_only=False)  # not torch.nn layers\n'
        if pickled else "",
        layers="".join(f"        {line}\n" for line in layers),
        attributes="".join(f'        _install(self, {t!r}, saved["attributes"][{t!r}][1], {k!r})\n'
                           for t, (k, _) in attributes.items()),
        training=gm.training,
        wraps="".join(f"{line}\n" for line in wraps),
        forward=forward.replace("\n", "\n    "),
        stem=stem,
        run_path=os.path.relpath(folder / f"{stem}.py"),
        spec=absolute_spec(found.transform.spec),
        tracer_arg=", LeafTracer" if found.transform.takes_tracer_class else "",
        given=given,
        rtol=found.tolerance[0],
        atol=found.tolerance[1],
    )
    path = folder / f"{stem}.py"
    path.write_text(source)
    try:
        check_reproduces(path, found.kind, found.failure, found.raised)
    except FxVerifyError:
        for written in (path, folder / f"{stem}.pt", folder / f"{stem}.modules.pt"):
            written.unlink(missing_ok=True)
        raise
    return path


def _split_wraps(src: str) -> tuple[list[str], str]:
    r"""The ``torch.fx.wrap("fn")`` lines of generated code (they must run at module level)
    and the ``def forward`` that follows them.

    >>> _split_wraps('\ntorch.fx._symbolic_trace.wrap("pad")\n\ndef forward(self, x):\n    return pad(x)\n')
    (['torch.fx._symbolic_trace.wrap("pad")'], 'def forward(self, x):\n    return pad(x)')
    """
    head, sep, body = src.partition("\ndef ")
    return [line for line in head.splitlines() if line.strip()], (sep.lstrip("\n") + body).strip()


def _targets(gm: fx.GraphModule, op: str) -> list[str]:
    return sorted({str(n.target) for n in gm.graph.nodes if n.op == op}, key=lambda t: (t.count("."), t))


def _install_line(target: str, module: nn.Module, pickled: dict[str, nn.Module]) -> str:
    """``_install(self, target, torch.nn.Conv2d(...), "module")``, or a pickled module's entry."""
    expression = _constructor(module)
    if expression is None:
        pickled[target] = module
        expression = f"PICKLED[{target!r}]"
    return f"_install(self, {target!r}, {expression}, 'module')"


def _constructor(module: nn.Module) -> str | None:
    """``torch.nn.Conv2d(3, 8, kernel_size=(3, 3), ...)`` when the module's repr rebuilds
    one of the same class and state shapes (torch.nn layers), else None."""
    cls = type(module)
    if getattr(nn, cls.__name__, None) is not cls or any(True for _ in module.children()):
        return None
    expression = f"torch.nn.{module!r}"
    try:
        rebuilt = eval(expression, {"torch": torch, "inf": math.inf, "nan": math.nan})
    except Exception:
        return None
    def shapes(m: nn.Module) -> dict[str, torch.Size]:
        return {k: v.shape for k, v in m.state_dict().items()}

    same_state = shapes(rebuilt) == shapes(module)
    return expression if type(rebuilt) is cls and rebuilt.extra_repr() == module.extra_repr() and same_state else None


def _attribute(gm: fx.GraphModule, target: str) -> tuple[str, Any]:
    """What a get_attr target holds: ``("parameter" | "buffer" | "tensor" | "value", value)``."""
    owner_name, _, name = target.rpartition(".")
    owner = gm.get_submodule(owner_name) if owner_name else gm
    value = getattr(owner, name)
    if isinstance(value, nn.Module):
        raise FxVerifyError(f"cannot write a repro: get_attr {target!r} reads a module")
    if name in owner._parameters:
        return "parameter", value.detach()
    return ("buffer" if name in owner._buffers else "tensor" if isinstance(value, torch.Tensor) else "value"), value


def _import_line(name: str, value: Any) -> str:
    """The line of the repro that binds a global name of the generated code."""
    builtin = fx.graph._custom_builtins.get(name)
    if builtin is not None and builtin.obj is value:
        return builtin.import_str
    if isinstance(value, (str, int, float, bool, type(None))):  # e.g. an annotation kept as text
        return f"{name} = {value!r}"
    if isinstance(value, types.ModuleType):
        return f"import {value.__name__}" if value.__name__ == name else f"import {value.__name__} as {name}"
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        raise FxVerifyError(f"cannot write a repro: the generated code uses {name} = {value!r}, "
                            "which cannot be imported by name")
    return f"{name} = _resolve({module!r}, {qualname!r})"


# the graph the script gives the transform, (import, expression), where the minimiser gave it each candidate
# as a symbolic trace (a capture that captures them again says how in its repro_given)
_TRACED = ("", "trace(Repro(saved))")

_DOCSTRING = '''"""{title}.

Written by fxverify: {size}.
Failure: {failure}

Run it from the directory fxverify ran in (where the transform imports): python {run_path}
While the bug is there it prints the traceback and exits with {exit_differs} (torch.testing.assert_close
fails) or {exit_raises} (the transformed module raises); any other exit status is another problem.
Needs torch and the transform only; the module's state and inputs are in {stem}.pt beside it.
"""
'''

_BODY = '''
{imports}
{wraps}{pickled}

def _install(root, target, value, kind):
    *parents, name = target.split(".")
    for parent in parents:
        if not hasattr(root, parent):
            root.add_module(parent, torch.nn.Module())
        root = getattr(root, parent)
    if kind == "module":
        root.add_module(name, value)
    elif kind == "parameter":
        root.register_parameter(name, torch.nn.Parameter(value))
    elif kind == "buffer":
        root.register_buffer(name, value)
    else:
        setattr(root, name, value)


class Repro(torch.nn.Module):
    def __init__(self, saved):
        super().__init__()
{layers}{attributes}        self.load_state_dict(saved["state"], assign=True)
        self.train({training})

    {forward}


class LeafTracer(torch.fx.Tracer):
    """Keeps every submodule call a call_module node, so the graph is the minimised one."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("autowrap_functions", ({wrapped}))
        super().__init__(*args, **kwargs)

    def is_leaf_module(self, module, qualname):
        return True


def trace(module):
    return torch.fx.GraphModule(module, LeafTracer().trace(module))


def main():
    saved = torch.load(HERE / "{stem}.pt", weights_only=True)
    reference, given = trace(Repro(saved)), {given}
    transform = _load_transform(TRANSFORM)
    with torch.no_grad():
        expected = reference(*_clone(saved["inputs"]))
        returned = transform(given{tracer_arg})
    result = given if returned is None else getattr(returned, "graph_module", returned)
    return _judge(result, saved["inputs"], expected)
'''
