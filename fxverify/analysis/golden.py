"""Golden files: the generated code and graph of a model before and after a transform, kept
as text and compared on later runs (as pytest-regressions and syrupy do).

One file per (transform, model): ``<root>/<transform>/<model>.golden``. A header names the
model, the transform and the torch, torchvision and timm versions; then come the code after
tracing, the code after the transform, the transform's graph as canonical text (opcode, name,
target, users, args, kwargs) and the code of any GraphModule submodules. Volatile content is
normalised away (object addresses, file paths and line numbers, set order, the path hash in
names of file-loaded transforms), so the bytes are the same across runs, processes, hash seeds
and machines.

:func:`check_golden` compares: a mismatch writes ``<model>.obtained`` beside the golden file
and raises :class:`GoldenMismatch` with a unified diff, saying first when the versions in the
header differ from this run's. :func:`update_golden` writes, atomically (temporary file in the
same folder, then ``os.replace``), so an interrupted run never leaves a truncated file.

>>> import tempfile, torch
>>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
>>> text = golden_text(gm, gm, model="relu", transform="my.passes:noop")
>>> print(text)  # doctest: +ELLIPSIS
# fxverify golden file: generated code of relu, traced, then transformed by my.passes:noop
# model: relu
# transform: my.passes:noop
# versions: torch ..., torchvision ..., timm ...
<BLANKLINE>
## code after tracing
def forward(self, input : torch.Tensor) -> torch.Tensor:
    input_1 = input
    relu = torch.nn.functional.relu(input_1, inplace = False);  input_1 = None
    return relu
<BLANKLINE>
## code after the transform
def forward(self, input : torch.Tensor) -> torch.Tensor:
    input_1 = input
    relu = torch.nn.functional.relu(input_1, inplace = False);  input_1 = None
    return relu
<BLANKLINE>
## graph after the transform (opcode name target users args kwargs)
placeholder input_1 target=input users=[relu] args=() kwargs={}
call_function relu target=torch.nn.functional.relu users=[output] args=(%input_1,) kwargs={'inplace': False}
output output target=output users=[] args=(%relu,) kwargs={}
<BLANKLINE>
>>> tmp = tempfile.TemporaryDirectory()
>>> path = golden_path(tmp.name, "my.passes:noop", "relu")
>>> path.parent.name, path.name
('my.passes.noop', 'relu.golden')
>>> update_golden(path, text), update_golden(path, text), check_golden(path, text)
('created', 'unchanged', 'matches')
>>> tmp.cleanup()
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import importlib.metadata
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from torch import fx, nn

from fxverify.analysis.graph_text import canonical_text
from fxverify.errors import GoldenDirMissing, GoldenMismatch

SUFFIX = ".golden"
OBTAINED_SUFFIX = ".obtained"
DEFAULT_DIR = "fxverify_golden"  # under pytest's rootdir (the current directory without pytest)
LIBRARIES = ("torch", "torchvision", "timm")
MAX_DIFF_LINES = 80
UPDATE_HINT = (
    "if the change is intended, accept it: rerun with --fxverify-update-golden "
    "(without pytest: fxverify.golden.update_golden)"
)


# -- names -----------------------------------------------------------------------------


def golden_path(root: str | os.PathLike[str], transform: str, model: str) -> Path:
    """Where the golden file of ``model`` (under another capture than symbolic tracing, ``model.capture``:
    :func:`fxverify.cases.catalogue.file_label`) under ``transform`` lives below ``root``.

    >>> golden_path("g", "src/passes.py:fuse", "my model/v2").as_posix()
    'g/passes.fuse/my_model_v2-5d1c7314.golden'
    >>> golden_path("g", "pkg.passes:fuse", "resnet18.export_core").as_posix()
    'g/pkg.passes.fuse/resnet18.export_core.golden'
    """
    return Path(root) / safe_name(portable_spec(transform).replace(":", ".")) / (safe_name(model) + SUFFIX)


def portable_spec(spec: str) -> str:
    """The transform spec without the machine's path: ``path/to/passes.py:fn`` becomes ``passes:fn``.

    >>> portable_spec("/home/me/proj/passes.py:fuse"), portable_spec("pkg.passes:fuse")
    ('passes:fuse', 'pkg.passes:fuse')
    """
    module, sep, attr = spec.rpartition(":")
    if sep and (module.endswith(".py") or "/" in module or "\\" in module):
        return f"{Path(module.replace(chr(92), '/')).stem}:{attr}"
    return spec


def safe_name(name: str) -> str:
    """``name`` as a file name valid on every OS: other characters become ``_``, and a short hash of
    the original is appended when anything was replaced, so two names never share a file.

    >>> safe_name("resnet18"), safe_name("a/b"), safe_name("a_b")
    ('resnet18', 'a_b-c14cddc0', 'a_b')
    """
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name).strip(".")[:100] or "_"
    if cleaned.split(".")[0].upper() in _WINDOWS_RESERVED:
        cleaned = "_" + cleaned
    if cleaned == name:
        return name
    return f"{cleaned}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


_WINDOWS_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(10)), *(f"LPT{i}" for i in range(10))}


def obtained_path(path: Path) -> Path:
    """Where a mismatching run writes what it obtained: ``resnet18.golden`` -> ``resnet18.obtained``."""
    return path.with_suffix(OBTAINED_SUFFIX)


# -- content ---------------------------------------------------------------------------


def versions() -> str:
    """The library versions recorded in each header, e.g. ``torch 2.14.1, torchvision 0.29.1, timm 1.0.31``."""
    found = []
    for name in LIBRARIES:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def golden_text(original: fx.GraphModule, result: nn.Module, *, model: str, transform: str,
                capture: str | None = None, signature: str | None = None) -> str:
    """The golden file content for ``original`` (the trace, or the graph of another ``capture`` than symbolic
    tracing) and ``result`` (the transform's GraphModule); ``signature``, what an exported result
    promises beyond its code (:func:`fxverify.capture.export.signature_text`), follows the code."""
    if not isinstance(result, fx.GraphModule):
        raise TypeError(f"golden files hold generated code: expected a GraphModule, got {type(result).__name__}")
    captured = f"captured with {capture}" if capture else "traced"
    header = [
        f"# fxverify golden file: generated code of {model}, {captured}, then transformed by {portable_spec(transform)}",
        f"# model: {model}",
        f"# transform: {portable_spec(transform)}",
        f"# versions: {versions()}",
    ]
    sections = [
        (f"code after {capture}" if capture else "code after tracing", original.code),
        ("code after the transform", result.code),
        ("graph after the transform (opcode name target users args kwargs)", canonical_text(result.graph)),
    ]
    if signature is not None:
        sections.append(("signature and range constraints after the transform", signature))
    sections += [(f"code of submodule {name}", sub.code) for name, sub in result.named_modules()
                 if name and isinstance(sub, fx.GraphModule)]
    body = "\n".join(f"## {title}\n{_tidy(text)}\n" for title, text in sections)
    return "\n".join(header) + "\n\n" + normalise(body)


def normalise(text: str) -> str:
    r"""Replace what varies between runs, processes and machines.

    >>> normalise("<function f at 0x7f3a2c> # File: /home/me/venv/lib/site-packages/timm/x.py:12 in fwd")
    '<function f at 0x?> # File: timm/x.py:? in fwd'
    >>> normalise("fxverify_user_passes_0a1b2c3d_helper(x, {'b', 'a'})")
    "fxverify_user_passes_helper(x, {'a', 'b'})"
    """
    text = _ADDRESS.sub("0x?", text)
    text = _TRACEBACK_FILE.sub(lambda m: f'File "{_portable_path(m[1])}", line ?', text)
    text = _FX_FILE.sub(lambda m: f"# File: {_portable_path(m[1])}:?", text)
    text = _USER_MODULE.sub(r"fxverify_user_\1_", text)
    return _STRING_SET.sub(lambda m: "{" + ", ".join(sorted(_SET_ITEM.findall(m[0]))) + "}", text)


_ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")
_TRACEBACK_FILE = re.compile(r'File "([^"]+)", line \d+')
_FX_FILE = re.compile(r"# File: (\S+?):\d+")
_USER_MODULE = re.compile(r"fxverify_user_(\w+?)_[0-9a-f]{8}_")  # transform files are imported under a path hash
_STRING_SET = re.compile(r"\{'[^'{}:]*'(?:, '[^'{}:]*')+\}")  # a set of strings prints in hash-seed order
_SET_ITEM = re.compile(r"'[^']*'")


def _portable_path(path: str) -> str:
    """A path without the machine's part: below site-packages, else the file name."""
    path = path.replace("\\", "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    return path.rsplit("/", 1)[-1]


def _tidy(code: str) -> str:
    """No trailing whitespace (editors and git strip it), no blank lines around."""
    return "\n".join(line.rstrip() for line in code.strip("\n").splitlines()).strip("\n")


# -- comparing and writing ----------------------------------------------------------------


def check_golden(path: str | os.PathLike[str], text: str) -> str:
    """Compare ``text`` with the golden file at ``path``; ``'matches'`` when equal.

    Raises :class:`GoldenDirMissing` when its folder does not exist, :class:`GoldenMismatch` when
    the file is missing or differs (then ``<name>.obtained`` is written beside it). Versions alone
    differing in the header is a match (said in the returned text).
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise GoldenDirMissing(
            f"no golden files for this transform yet: {path.parent} does not exist. Create them with "
            "--fxverify-update-golden (without pytest: fxverify.golden.update_golden)"
        )
    if not path.is_file():
        raise GoldenMismatch(
            f"golden file {path} is missing: create it with --fxverify-update-golden "
            "(without pytest: fxverify.golden.update_golden)",
            where=path.name,
        )
    golden = path.read_text(encoding="utf-8")
    obtained = obtained_path(path)
    if _body(golden) == _body(text):
        with contextlib.suppress(FileNotFoundError):
            obtained.unlink()  # stale from an earlier mismatch
        was, now = _header(golden).get("versions"), _header(text).get("versions")
        return "matches" if was == now else f"matches (golden file written with {was})"
    atomic_write(obtained, text)
    raise GoldenMismatch(_mismatch_message(path, golden, text), where=_first_difference(golden, text))


def update_golden(path: str | os.PathLike[str], text: str) -> str:
    """Write ``text`` to the golden file at ``path`` if it differs: ``'created'``, ``'changed'`` or ``'unchanged'``."""
    path = Path(path)
    with contextlib.suppress(FileNotFoundError):
        obtained_path(path).unlink()
    if not path.is_file():
        atomic_write(path, text)
        return "created"
    if path.read_text(encoding="utf-8") == text:
        return "unchanged"
    atomic_write(path, text)
    return "changed"


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and ``os.replace``:
    readers (and an interrupted run) see the old file or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp makes it private; golden files are shared
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _header(text: str) -> dict[str, str]:
    head = text.split("\n\n", 1)[0]
    return dict(line[2:].split(": ", 1) for line in head.splitlines() if line.startswith("# ") and ": " in line[2:])


def _body(text: str) -> str:
    return text.split("\n\n", 1)[-1]


def _mismatch_message(path: Path, golden: str, obtained: str) -> str:
    lines = []
    was, now = _versions(golden), _versions(obtained)
    changed = [f"{name} {was.get(name, '?')} -> {version}" for name, version in now.items() if was.get(name) != version]
    if changed:
        lines.append(
            f"library versions differ from those the golden file was written with: {', '.join(changed)}. Generated "
            "code often changes between versions: review the diff, then accept it"
        )
    lines += [
        "generated code or graph differs from the golden file",
        f"golden:   {path}",
        f"obtained: {obtained_path(path)}",
        UPDATE_HINT,
    ]
    diff = list(difflib.unified_diff(golden.splitlines(), obtained.splitlines(),
                                     path.name, obtained_path(path).name, lineterm="", n=2))
    if len(diff) > MAX_DIFF_LINES:
        diff = diff[:MAX_DIFF_LINES] + [f"... {len(diff) - MAX_DIFF_LINES} more diff lines: diff the two files"]
    return "\n".join(lines + diff)


def _versions(text: str) -> dict[str, str]:
    """``{"torch": "2.14.1", ...}`` from a header's versions line."""
    listed = _header(text).get("versions", "")
    return dict(item.split(" ", 1) for item in listed.split(", ") if " " in item)


def _first_difference(golden: str, obtained: str) -> str:
    """``section 'code after the transform', line 12 of the file``."""
    old, new = golden.splitlines(), obtained.splitlines()
    start = len(golden.split("\n\n", 1)[0].splitlines())  # the header may differ (versions)
    section = "header"
    for i in range(start, max(len(old), len(new))):
        line = old[i] if i < len(old) else None
        if line is not None and line.startswith("## "):
            section = line[3:]
        if line != (new[i] if i < len(new) else None):
            return f"section {section!r}, line {i + 1} of the file"
    return "the header"


def format_updates(updates: Mapping[str, Sequence[str]], root: str | os.PathLike[str] | None = None) -> str:
    """The terminal summary of ``--fxverify-update-golden``: counts, then each created or changed
    file (relative to ``root`` when given).

    >>> print(format_updates({"created": ["/p/g/a.golden"], "unchanged": ["/p/g/b.golden", "/p/g/c.golden"]}, "/p"))
    golden files: 1 created, 0 changed, 2 unchanged
      created g/a.golden
    """
    counts = ", ".join(f"{len(updates.get(status, ()))} {status}" for status in ("created", "changed", "unchanged"))
    lines = [f"golden files: {counts}"]
    for status in ("created", "changed"):
        for path in sorted(updates.get(status, ())):
            lines.append(f"  {status} {Path(os.path.relpath(path, root)).as_posix() if root else path}")
    return "\n".join(lines)
