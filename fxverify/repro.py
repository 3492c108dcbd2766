"""Standalone repro files: a minimised failure (:class:`fxverify.minimise.Minimised`)
written as one Python file that needs torch and the user's transform alone.

``<stem>.py`` holds the minimised module as code (``torch.nn`` layers rebuilt
from their constructors, the generated ``forward`` of the ``GraphModule``);
``<stem>.pt`` beside it its state and inputs, loaded with
``torch.load(weights_only=True)``. Running it traces the module (every submodule
kept a leaf, so the graph is the minimised one), calls the transform on it as
fxverify does, and compares with ``torch.testing.assert_close``: it exits with
the ``AssertionError`` as long as the bug is there. Layers that cannot be rebuilt
from their ``repr`` (not ``torch.nn`` classes) are pickled into
``<stem>.modules.pt`` and loaded with ``weights_only=False``.
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

from fxverify.errors import FxVerifyError
from fxverify.minimise import DIFFERS, Minimised
from fxverify.module_state import resolve


def repro_stem(model: str, check: str, spec: str) -> str:
    """A file-name-safe stem for a repro.

    >>> repro_stem("vit/b:16", "numerics", "my.passes:fold<bn>")
    'vit_b_16-numerics-fold_bn_'
    """
    function = spec.rpartition(":")[2] or spec
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{model}-{check}-{function}")


def write_repro(found: Minimised, directory: str | os.PathLike[str], stem: str = "fxverify_repro", *,
                title: str = "") -> Path:
    """Write ``<stem>.py`` (and its ``.pt`` files) into ``directory`` and check, by running
    it in this process, that it fails as ``found`` does; return the ``.py`` path.

    Raises :class:`FxVerifyError` when the transform cannot be imported by name (a
    lambda, a function of ``__main__``) or the file written does not reproduce.
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
        forward=code.src.strip().replace("\n", "\n    "),
        stem=stem,
        spec=_portable_spec(found.transform.spec),
        tracer_arg=", LeafTracer" if found.transform.takes_tracer_class else "",
        rtol=found.tolerance[0],
        atol=found.tolerance[1],
    )
    path = folder / f"{stem}.py"
    path.write_text(source)
    _check_reproduces(path, source, expect_assertion=found.kind == DIFFERS)
    return path


def _portable_spec(spec: str) -> str:
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
        rebuilt = eval(expression, {"torch": torch, "inf": math.inf, "nan": math.nan})  # noqa: S307 - our own repr
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


def _check_reproduces(path: Path, source: str, *, expect_assertion: bool) -> None:
    namespace: dict[str, Any] = {"__name__": "fxverify_repro", "__file__": str(path)}
    try:
        exec(compile(source, str(path), "exec"), namespace)  # noqa: S102 - the file we just wrote
        namespace["main"]()
    except AssertionError:
        return
    except Exception as exc:
        if not expect_assertion:
            return
        raise FxVerifyError(f"the repro written to {path} raised {type(exc).__name__}: {exc} "
                            "instead of failing the comparison; please report this to fxverify") from exc
    raise FxVerifyError(f"the repro written to {path} does not reproduce the failure; please report this to fxverify")


_TEMPLATE = '''"""{title}.

Written by fxverify: {size}.
Failure: {failure}

Run it from your project root (where the transform imports): python {stem}.py
It exits with an AssertionError from torch.testing.assert_close while the bug is there.
Needs torch and the transform only; the module's state and inputs are in {stem}.pt beside it.
"""

import importlib
import importlib.util
import os
import pathlib
import sys

import torch

TRANSFORM = {spec!r}
RTOL, ATOL = {rtol!r}, {atol!r}
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
{pickled}

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
    saved = torch.load(HERE / "{stem}.pt", weights_only=True)
    reference, given = trace(Repro(saved)), trace(Repro(saved))
    transform = _load_transform(TRANSFORM)
    with torch.no_grad():
        expected = reference(*_clone(saved["inputs"]))
        returned = transform(given{tracer_arg})
        result = given if returned is None else getattr(returned, "graph_module", returned)
        actual = result(*_clone(saved["inputs"]))
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, equal_nan=True)
    print("no failure: the transform's result matches the module")


if __name__ == "__main__":
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    main()
'''
