"""The layer rule of docs/architecture.md, read from the source with ``ast``: a module imports only
from its own layer or the layers below it, and no import inside a function breaks an import cycle
(one that would close a cycle at import time is a layer problem to fix, not to hide)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fxverify"

# lowest first: one folder a row, or modules of the package root; a module belongs to the row naming it or its folder
LAYERS: list[tuple[str, ...]] = [
    ("fxverify.errors",),
    ("fxverify.analysis",),
    ("fxverify.inductor",),
    ("fxverify.core",),
    ("fxverify.capture",),
    ("fxverify.cases",),
    ("fxverify.strategies",),
    ("fxverify.engine",),
    ("fxverify.checks",),
    ("fxverify.diagnose",),
    ("fxverify.reports",),
    ("fxverify.compile",),
    ("fxverify.api", "fxverify.runner", "fxverify.rewrite", "fxverify.examples"),
    ("fxverify.plugin", "fxverify"),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(name: str) -> int:
    for rank, prefixes in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return rank
    raise AssertionError(f"{name} is in no layer: add it to LAYERS")


def imports(path: Path) -> list[tuple[str, bool, int]]:
    """``(module imported, inside a function, line)`` for every fxverify import of the file."""
    tree = ast.parse(path.read_text(), str(path))
    here = module_name(path)
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend((a.name, nested, child.lineno) for a in child.names if a.name.startswith("fxverify"))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative
                    base = ".".join(here.split(".")[: len(here.split(".")) - child.level + (path.name == "__init__.py")] + [base])
                if base.startswith("fxverify"):
                    for alias in child.names:  # "from fxverify.cases import catalogue" imports a submodule
                        sub = f"{base}.{alias.name}"
                        found.append((sub if (PACKAGE.parent / Path(*sub.split("."))).exists()
                                      or (PACKAGE.parent / Path(*sub.split("."))).with_suffix(".py").exists()
                                      else base, nested, child.lineno))
            visit(child, nested)

    visit(tree, False)
    return found


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_module_imports_only_its_own_layer_and_below():
    wrong = []
    for name, path in MODULES.items():
        for imported, _, line in imports(path):
            if imported != "fxverify" and layer(imported) > layer(name):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({LAYERS[layer(name)][0]}) imports {imported} "
                             f"({LAYERS[layer(imported)][0]}), a higher layer")
    assert not wrong, "\n".join(wrong)


def folder(name: str) -> str:
    """The folder a module is in, as a dotted name: ``fxverify.checks`` for ``fxverify.checks.meta``; a module of
    the package root is its own folder (``fxverify.api``)."""
    parts = name.split(".")
    return ".".join(parts[:2])


def test_each_folder_is_one_row_of_the_layer_table():
    folders = {folder(name) for name in MODULES if name != "fxverify"}
    rows = {prefix for row in LAYERS for prefix in row}
    packages = {f"fxverify.{p.name}" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages <= rows, f"folders in no row of LAYERS: {sorted(packages - rows)}"
    assert folders <= rows, f"modules of the package root in no row of LAYERS: {sorted(folders - rows)}"
    shared = [row for row in LAYERS if len(row) > 1 and packages & set(row)]
    assert shared == [("fxverify.plugin", "fxverify")], f"a folder shares its row with another: {shared}"


def test_the_folder_graph_has_no_loop():
    arrows: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        for imported, _, _ in imports(path):
            if imported != "fxverify" and folder(imported) != folder(name):
                arrows.setdefault(folder(name), set()).add(folder(imported))

    def loop_from(start: str, at: str, trail: list[str]) -> list[str] | None:
        for after in sorted(arrows.get(at, ())):
            if after == start:
                return [*trail, after]
            if after not in trail:
                found = loop_from(start, after, [*trail, after])
                if found:
                    return found
        return None

    loops = [" -> ".join(found) for start in sorted(arrows) if (found := loop_from(start, start, [start]))]
    assert not loops, "folders importing each other: " + "; ".join(loops)


def top_level_closure(name: str, seen: set[str] | None = None) -> set[str]:
    """Every fxverify module that importing ``name`` imports (its top-level imports, transitively)."""
    seen = set() if seen is None else seen
    if name in seen or name not in MODULES:
        return seen
    seen.add(name)
    for imported, nested, _ in imports(MODULES[name]):
        if not nested:
            top_level_closure(imported, seen)
    return seen


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_function_level_import_breaks_a_cycle(name):
    cycles = [f"{MODULES[name].relative_to(PACKAGE.parent)}:{line} imports {imported} inside a function, and "
              f"{imported} imports {name} back" for imported, nested, line in imports(MODULES[name])
              if nested and name in top_level_closure(imported)]
    assert not cycles, "\n".join(cycles)


# string constants that are a check's name by coincidence: a device type, a contract field, a capture trait, the
# public fxverify.golden submodule
HOMONYMS = {
    "fxverify/__init__.py": {"golden"},
    "fxverify/analysis/module_state.py": {"meta"},
    "fxverify/capture/copies.py": {"meta"},
    "fxverify/core/captures.py": {"opset"},
    "fxverify/core/contracts.py": {"cuda", "meta", "devices"},
    "fxverify/inductor/freezing.py": {"recompile", "lint"},  # torch's steps after the freezing pattern loop
    "fxverify/strategies/patterns.py": {"meta"},
}


def test_no_module_outside_the_checks_spells_a_check_name():
    """Knowledge of one check lives in that check: captures state traits, checks state what they need in the
    registry (CheckSpec.requires, options, service), and the plugin, runner and diagnosis read the registry. A check
    living outside fxverify/checks/ (the compile checks) may spell the names of the checks of its own module."""
    from fxverify.checks import REGISTRY, names

    NAMES = names(None)
    spelled = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = str(path.relative_to(PACKAGE.parent))
        if relative.startswith("fxverify/checks/"):
            continue
        mine = {spec.name for spec in REGISTRY if f"{spec.module.replace('.', '/')}.py" == relative}
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in NAMES and id(node) not in docstrings \
                    and node.value not in HOMONYMS.get(relative, ()) and node.value not in mine:
                spelled.append(f"{relative}:{node.lineno} spells {node.value!r}")
    assert not spelled, "\n".join(spelled)


def test_every_folder_of_the_package_is_shipped():
    """pyproject.toml lists the packages a wheel holds; a folder left out (fxverify.core was, having no
    __init__.py) installs in editable mode and is missing from a regular install."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {module_name(path.parent / "__init__.py") for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts}
    assert folders <= listed, sorted(folders - listed)
