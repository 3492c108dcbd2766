"""Standalone repro files: a minimised failure (:class:`fxverify.diagnose.minimise.Minimised`)
written as one Python file that needs torch and the user's transform alone.

``<stem>.py`` holds the minimised module as code (``torch.nn`` layers rebuilt
from their constructors, the generated ``forward`` of the ``GraphModule``, its
``torch.fx.wrap`` registrations at module level); ``<stem>.pt`` beside it its
state and inputs, loaded with ``torch.load(weights_only=True)``. Running it traces
the module (every submodule kept a leaf, so the graph is the minimised one), calls
the transform on it as fxverify does, and runs the result: while the bug is there
it prints the traceback and exits with :data:`EXIT_DIFFERS` (the
``torch.testing.assert_close`` failure) or :data:`EXIT_RAISES` (the result raised),
any other error exits with 1 as usual. Layers that cannot be rebuilt from their
``repr`` (not ``torch.nn`` classes) are pickled into ``<stem>.modules.pt`` and
loaded with ``weights_only=False``.

:func:`write_repro` runs the file in a fresh Python process before returning it,
and deletes it again unless it fails the way the minimised failure did.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn

from fxverify.analysis.module_state import resolve
from fxverify.cases.catalogue import CAPTURES
from fxverify.diagnose.minimise import DIFFERS, Minimised, minimise_failure
from fxverify.engine.results import Finding, exception_summary
from fxverify.engine.subject import Subject
from fxverify.errors import FxVerifyError
from fxverify.golden import portable_spec, safe_name

EXIT_DIFFERS, EXIT_RAISES = 3, 4  # a repro's exit status while the bug is there
OUTCOME_ENV = "FXVERIFY_REPRO_OUTCOME"  # a file where a repro run by fxverify writes the exception type raised
CHECK_TIMEOUT_S = 300.0  # for the run of a freshly written repro


class ReproOnFailure:
    """A runner's post-failure hook (see :mod:`fxverify.engine.runner`): a numerics failure in the
    contract's primary mode is minimised (:func:`fxverify.diagnose.minimise.minimise_failure`) and
    written into ``directory`` as a standalone repro, named in the finding (``finding.repro``, and a
    line of the message); when that cannot be done, the finding says why.

    >>> hook = ReproOnFailure("repros")
    >>> hook.directory
    'repros'
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = directory

    def __call__(self, subject: Subject, check: str, finding: Finding) -> None:
        if check != "numerics":
            return
        if subject.capture.name != CAPTURES[0]:
            finding.what += (f"\nno repro written: repros are written for {CAPTURES[0]} graphs only (a repro of "
                             f"{subject.capture.name}, a saved program and the pass call, is not built yet)")
            return
        if finding.mode is not None and finding.mode != subject.contract.primary_mode:
            finding.what += f"\nno repro written: only failures in {subject.contract.primary_mode} mode are minimised"
            return
        try:
            found = minimise_failure(subject)
            path = write_repro(found, self.directory, repro_stem(subject.case.name, check, subject.transform.spec),
                               title=f"{subject.transform.spec} fails numerics on a subgraph of {subject.case.name}")
        except FxVerifyError as exc:
            finding.what += f"\nno repro written: {exc}"
            return
        except Exception as exc:  # torch's minifier on a graph it was not written for: the finding stands
            finding.what += (f"\nno repro written: minimising raised {exception_summary(exc)}; "
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
    code = gm.graph.python_code(root_module="self")
    wraps, forward = _split_wraps(code.src)
    pickled: dict[str, nn.Module] = {}
    layers = [_install_line(target, resolve(gm, target), pickled) for target in _targets(gm, "call_module")]
    attributes = {target: _attribute(gm, target) for target in _targets(gm, "get_attr")}
    torch.save({"inputs": list(found.inputs), "state": gm.state_dict(), "attributes": attributes},
               folder / f"{stem}.pt")
    if pickled:
        torch.save(pickled, folder / f"{stem}.modules.pt")
    source = _TEMPLATE.format(
        title=title or f"transform {found.transform.spec} fails",
        failure=found.failure,
        size=found.describe(),
        imports="\n".join(_import_line(name, value) for name, value in sorted(code.globals.items())
                           if name != "torch" and re.search(rf"\b{re.escape(name)}\b", code.src)),
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
        spec=_absolute_spec(found.transform.spec),
        exit_differs=EXIT_DIFFERS,
        exit_raises=EXIT_RAISES,
        tracer_arg=", LeafTracer" if found.transform.takes_tracer_class else "",
        outcome_env=OUTCOME_ENV,
        rtol=found.tolerance[0],
        atol=found.tolerance[1],
    )
    path = folder / f"{stem}.py"
    path.write_text(source)
    try:
        _check_reproduces(path, found)
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


def _absolute_spec(spec: str) -> str:
    """The transform spec with a file path made absolute, so the repro runs from anywhere."""
    module_part, _, qualname = spec.rpartition(":")
    if module_part.endswith(".py"):
        return f"{Path(module_part).expanduser().resolve()}:{qualname}"
    return spec


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


def _check_reproduces(path: Path, found: Minimised) -> None:
    """Run the repro in a fresh process (this one's ``sys.path``, from the current directory)
    and raise :class:`FxVerifyError` unless it fails as ``found`` does: outputs that differ,
    or the result raising the same exception type."""
    with tempfile.TemporaryDirectory(prefix="fxverify-repro-") as tmp:
        told = Path(tmp) / "raised"
        env = {**os.environ, OUTCOME_ENV: str(told),
               "PYTHONPATH": os.pathsep.join(p for p in [*sys.path, os.environ.get("PYTHONPATH")] if p)}
        try:
            run = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True,
                                 timeout=CHECK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise FxVerifyError(f"the repro written to {path} did not finish within {CHECK_TIMEOUT_S:g} s") from None
        raised = told.read_text() if told.exists() else None
    expected = EXIT_DIFFERS if found.kind == DIFFERS else EXIT_RAISES
    if run.returncode == expected and (found.kind == DIFFERS or raised == found.raised):
        return
    tail = "\n".join(run.stderr.strip().splitlines()[-3:]) or run.stdout.strip()
    wanted = "outputs that differ" if found.kind == DIFFERS else f"the transformed module raising {found.raised}"
    raise FxVerifyError(f"the repro written to {path} (now deleted) exited with {run.returncode} instead of failing "
                        f"with {wanted} ({found.failure}); it said:\n{tail}\nIt runs from the current directory, "
                        "as its user will: if the transform imports here, please report this to fxverify")


_TEMPLATE = '''"""{title}.

Written by fxverify: {size}.
Failure: {failure}

Run it from the directory fxverify ran in (where the transform imports): python {run_path}
While the bug is there it prints the traceback and exits with {exit_differs} (torch.testing.assert_close
fails) or {exit_raises} (the transformed module raises); any other exit status is another problem.
Needs torch and the transform only; the module's state and inputs are in {stem}.pt beside it.
"""

import importlib
import importlib.util
import os
import pathlib
import sys
import traceback

import torch

TRANSFORM = {spec!r}
RTOL, ATOL = {rtol!r}, {atol!r}
EXIT_DIFFERS, EXIT_RAISES = {exit_differs!r}, {exit_raises!r}
HERE = pathlib.Path(__file__).resolve().parent


def _resolve(module, qualname):
    value = importlib.import_module(module)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


def _load_transform(spec):
    module_part, _, qualname = spec.rpartition(":")
    if module_part.endswith(".py"):
        file_spec = importlib.util.spec_from_file_location("repro_transform", module_part)
        module = sys.modules["repro_transform"] = importlib.util.module_from_spec(file_spec)
        file_spec.loader.exec_module(module)
        module_part = "repro_transform"
    return _resolve(module_part, qualname)


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


def _clone(values):
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def main():
    """EXIT_DIFFERS or EXIT_RAISES (after printing the traceback) while the bug is there, else 0."""
    saved = torch.load(HERE / "{stem}.pt", weights_only=True)
    reference, given = trace(Repro(saved)), trace(Repro(saved))
    transform = _load_transform(TRANSFORM)
    with torch.no_grad():
        expected = reference(*_clone(saved["inputs"]))
        returned = transform(given{tracer_arg})
        result = given if returned is None else getattr(returned, "graph_module", returned)
        try:
            actual = result(*_clone(saved["inputs"]))
        except Exception as exc:
            traceback.print_exc()
            print(f"fxverify repro: the transformed module raised {{type(exc).__qualname__}}", file=sys.stderr)
            _tell(raised=type(exc).__qualname__)
            return EXIT_RAISES
    try:
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, equal_nan=True)
    except AssertionError:
        traceback.print_exc()
        print("fxverify repro: the transformed module's outputs differ", file=sys.stderr)
        _tell()
        return EXIT_DIFFERS
    print("no failure: the transform's result matches the module")
    return 0


def _tell(raised=""):
    """When fxverify runs this file to check it, it asks which exception the module raised."""
    if os.environ.get("{outcome_env}"):
        pathlib.Path(os.environ["{outcome_env}"]).write_text(raised)


if __name__ == "__main__":
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    sys.exit(main())
'''
