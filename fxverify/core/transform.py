"""What a transform is to fxverify: how it is found from a spec string, how it is
called, what it may return, and how long it may take.

A transform receives a freshly traced ``GraphModule`` and returns an
``nn.Module`` (usually a ``GraphModule``), ``None`` (it changed its argument in
place) or a ``PassResult``. The ``transform(m, tracer_class)`` convention of the
torch.fx docs is recognised from the signature. Under the export captures a
transform may instead take the ``ExportedProgram`` (its :attr:`Transform.form`,
declared in the contract or read from its first parameter's annotation). A pass Inductor calls on a
``torch.fx.Graph`` (a ``CustomGraphPass``, a ``PatternMatcherPass``, a function registering replacements
into one, a function annotated ``torch.fx.Graph``) is of form ``graph``: fxverify runs it on ``gm.graph``
and recompiles ``gm`` (:mod:`fxverify.core.graph_passes`). A list of passes or a
``torch.fx`` ``PassManager`` is one transform, a pipeline, whose :attr:`Transform.steps` are its
passes: a check that fails on the pipeline's result names the first step after which it fails. A PT2E
``Quantizer`` (a subclass or an instance) is of form ``quantizer``: the ``pt2e`` capture quantizes with it.
"""

from __future__ import annotations

import contextvars
import copy
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import signal
import sys
import threading
import traceback
import zlib
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, cast

from fxverify.analysis.known_errors import known_cause
from fxverify.core.captures import program_captures
from fxverify.core.contracts import PROGRAM_FORMS, QUANTIZER_CAPTURES, QUANTIZING, STRICT, Contract, contract_of
from fxverify.core.graph_passes import GraphPassRunner, takes_graph
from fxverify.core.results import exception_summary, short_repr
from fxverify.errors import TransformFailed, TransformLoadError

ACCEPTED_RETURNS = (
    "an nn.Module (usually a torch.fx.GraphModule), None (the argument was modified in place), "
    "or a torch.fx.passes.infra.pass_base.PassResult"
)
PROGRAM_RETURNS = "a torch.export.ExportedProgram, or None (the program was modified in place)"
CLAIMED_MODIFIED = "fxverify_claimed_modified"  # result.meta key: the modified bit of the PassResult it came in


@dataclasses.dataclass(frozen=True)
class Transform:
    """A user transform with its spec, contract and calling convention.

    >>> t = Transform.from_callable(lambda gm: gm)
    >>> t.takes_tracer_class
    False
    """

    fn: Callable[..., Any]
    spec: str
    contract: Contract
    takes_tracer_class: bool
    reloadable: bool = False  # ``Transform.load(spec)`` gives it back (another process can use it)
    form: str = "module"  # what it takes: see Contract.form
    steps: tuple[Transform, ...] = ()  # a pipeline's passes in order (empty: one pass)
    prefixes: Callable[[int], Callable[..., Any]] | None = None  # the pipeline of its first n steps

    def prefix(self, count: int) -> Transform:
        """The pipeline of this one's first ``count`` steps (a copy of a ``PassManager`` keeps its settings).

        >>> pipeline = Transform.from_steps([lambda gm: gm, lambda gm: None], "passes")
        >>> len(pipeline.steps), pipeline.prefix(1).spec, len(pipeline.prefix(1).steps)
        (2, 'passes[:1]', 1)
        """
        if self.prefixes is None or not 0 < count <= len(self.steps):
            raise ValueError(f"{self.spec} has no prefix of {count} steps")
        return dataclasses.replace(self, fn=self.prefixes(count), spec=f"{self.spec}[:{count}]",
                                   steps=self.steps[:count], reloadable=False)

    @classmethod
    def from_steps(cls, passes: Any, spec: str) -> Transform:
        """A pipeline: a list or tuple of passes run in order, or a ``PassManager`` (called as it is, its
        prefixes copies of it). Every step must take the same form; a list takes the strict contract (to
        declare one, decorate a ``PassManager``)."""
        from torch.fx.passes.infra.pass_manager import PassManager

        manager = inspect.unwrap(passes) if callable(passes) else passes
        listed = list(manager.passes) if isinstance(manager, PassManager) else list(passes)
        if not listed:
            raise TransformLoadError(f"transform {spec} is an empty pipeline: give it at least one pass")
        steps = tuple(cls.from_callable(step, f"{spec}[{i}] {getattr(step, '__qualname__', type(step).__name__)}")
                      for i, step in enumerate(listed))
        forms = {step.form for step in steps}
        if len(forms) > 1 or any(step.takes_tracer_class for step in steps):
            raise TransformLoadError(f"transform {spec}: the steps of a pipeline must all take the same argument "
                                     f"(forms {sorted(forms)}, no tracer_class); split it into one pipeline per form")
        if isinstance(manager, PassManager):
            prefixes: Callable[[int], Callable[..., Any]] = functools.partial(_manager_prefix, manager)
            fn: Callable[..., Any] = passes
        else:
            prefixes = functools.partial(_list_prefix, steps)
            fn = prefixes(len(steps))
        return cls(fn=fn, spec=spec, contract=contract_of(passes),
                   takes_tracer_class=False, reloadable=False, form=steps[0].form, steps=steps,
                   prefixes=prefixes)

    def skips_dtype(self, dtype: str) -> str | None:
        """Why the transform is not run on a model whose floating state and inputs are in ``dtype`` (a corpus
        entry's, e.g. ``"bfloat16"``): its contract's ``dtypes`` exclude it; or None.

        >>> import fxverify
        >>> float32_only = fxverify.contract(dtypes=("float32",))(lambda gm: gm)
        >>> Transform.from_callable(float32_only).skips_dtype("bfloat16")
        'the contract declares dtypes=float32: not run on a bfloat16 model'
        """
        if self.contract.supports_dtype(dtype):
            return None
        return f"the contract declares dtypes={'+'.join(self.contract.dtypes or ())}: not run on a {dtype} model"

    def skips_capture(self, capture: str) -> str | None:
        """Why the transform is not run on graphs of ``capture`` (its contract, or its form), or None.

        >>> Transform.from_callable(lambda gm: gm).skips_capture("export") is None
        True
        """
        if self.form == "quantizer" and capture not in QUANTIZER_CAPTURES:
            return (f"the transform is a PT2E Quantizer (form=quantizer), judged by quantizing the float exported model "
                    f"with it under the {' and '.join(QUANTIZER_CAPTURES)} capture: not run on {capture} (select it with "
                    f"--fxverify-capture {','.join(QUANTIZER_CAPTURES)})")
        if not self.contract.supports_capture(capture):
            declared = ", ".join(self.contract.captures or ())
            return f"the contract declares the transform for {declared} graphs: not run on {capture}"
        if self.form in PROGRAM_FORMS and capture not in program_captures():
            takes = "an ExportedProgram" if self.form == "program" else "an ExportedProgram's graph_module"
            return (f"the transform takes {takes} (form={self.form}), which only the {' and '.join(program_captures())} "
                    f"captures make: not run on {capture} (select them with --fxverify-capture "
                    f"{','.join(program_captures())})")
        return None

    @classmethod
    def from_callable(cls, fn: Callable[..., Any], spec: str | None = None) -> Transform:
        """Wrap a callable (or a ``PatternMatcherPass``), checking that fxverify can call it.

        >>> import torch
        >>> def fold(graph: torch.fx.Graph) -> None: ...
        >>> Transform.from_callable(fold).form
        'graph'
        """
        fn = _instance_of_pass_class(fn, spec or str(getattr(fn, "__qualname__", fn)))
        if _is_pipeline(fn):
            return cls.from_steps(fn, spec or "pipeline")
        if is_quantizer(fn):
            declared = contract_of(fn)
            return cls(fn=fn, spec=spec or f"{type(fn).__qualname__}()", contract=QUANTIZING if declared == STRICT
                       else declared, takes_tracer_class=False, reloadable=spec is not None, form="quantizer")
        if not callable(fn) and not takes_graph(fn):
            raise TransformLoadError(f"transform {spec or fn!r} is not callable (got {type(fn).__name__})")
        importable = spec or _importable_spec(fn)
        declared = contract_of(fn)
        form = declared.form or _form_of(fn)
        plain = form == "graph" or type(fn).__repr__ is object.__repr__  # an instance with no repr: its class
        named = getattr(fn, "__qualname__", f"{type(fn).__qualname__}()" if plain else repr(fn))
        return cls(
            fn=GraphPassRunner.of(fn, importable or named) if form == "graph" else fn,
            spec=importable or cast(str, named),
            contract=declared,
            takes_tracer_class=form == "module" and _takes_tracer_class(fn, spec or repr(fn)),
            reloadable=importable is not None,
            form=form,
        )

    @classmethod
    def load(cls, spec: str) -> Transform:
        """Load ``package.module:function`` or ``path/to/file.py:function``.

        >>> Transform.load("fxverify.examples:fuse_conv_bn").spec
        'fxverify.examples:fuse_conv_bn'
        """
        obj = load_object(spec)
        if _is_pipeline(obj):
            return dataclasses.replace(cls.from_steps(obj, spec), reloadable=True)
        if not callable(obj) and not takes_graph(obj) and not is_quantizer(obj):
            raise TransformLoadError(
                f"transform spec {spec!r} names a {type(obj).__name__}, not a callable; "
                "point it at a function taking a GraphModule, a pass taking a torch.fx.Graph, or a PT2E Quantizer"
            )
        return cls.from_callable(obj, spec)

    def apply(self, gm: Any, *extra: Any, timeout: float | None = None) -> tuple[Any, bool]:
        """Call the transform on ``gm`` (and ``extra`` arguments: the tracer class for the
        ``transform(m, tracer_class)`` convention, which the capture supplies); return
        ``(module, in_place)``.

        Raises :class:`TransformFailed` when it raises, hangs past ``timeout``
        seconds or returns an unusable value.
        """
        try:
            returned = call_with_timeout(self.fn, (gm, *extra), timeout)
        except CallTimedOut:
            raise TransformFailed(
                f"transform {self.spec} did not finish within {timeout:g} s "
                "(if it is just slow, raise --fxverify-timeout, or timeout= in the Python API)"
            ) from None
        except KeyboardInterrupt:  # the user stopping the run
            raise
        except BaseException as exc:  # the user's own error (sys.exit() too), reported with its traceback
            tb = "".join(traceback.format_exception(type(exc), exc, _users_frames(exc.__traceback__)))
            known = known_cause(exc)
            hint = f"known torch behaviour: {known}\n" if known else ""
            raise TransformFailed(f"transform {self.spec} raised {_raised(exc)}\n{hint}{tb}", _raised(exc)) from exc
        return self.normalize_result(returned, gm)

    def normalize_result(self, returned: Any, given: Any) -> tuple[Any, bool]:
        """Turn what the transform returned into ``(module, in_place)``."""
        import torch
        from torch.fx.passes.infra.pass_base import PassResult

        if returned is None:
            return given, True
        if self.form == "program":
            if isinstance(getattr(returned, "exported_program", None), torch.export.ExportedProgram):
                returned = returned.exported_program  # ExecuTorch's ExportedProgramPassResult
            if isinstance(returned, torch.export.ExportedProgram):
                return returned, returned is given
            raise TransformFailed(
                f"transform {self.spec} takes an ExportedProgram (form=program) and returned "
                f"{type(returned).__module__}.{type(returned).__qualname__} ({short_repr(returned)}); accepted: "
                f"{PROGRAM_RETURNS}. A pass on the program's graph_module declares form='lifted'.")
        if isinstance(returned, PassResult):
            if isinstance(returned.graph_module, torch.fx.GraphModule):  # what it says it did, for lint to hold it to
                returned.graph_module.meta[CLAIMED_MODIFIED] = bool(returned.modified)
            returned = returned.graph_module
        if isinstance(returned, torch.nn.Module):
            # a new GraphModule over the very Graph it was given (`GraphModule(gm, gm.graph)`, as torchao's
            # prepare_pt2e ends) is the given module's graph rewritten in place
            rewrapped = isinstance(returned, torch.fx.GraphModule) and isinstance(given, torch.fx.GraphModule) \
                and returned.graph is given.graph
            return returned, returned is given or rewrapped
        hint = ""
        if isinstance(returned, torch.fx.Graph):
            hint = " To return a Graph, wrap it: `return torch.fx.GraphModule(gm, graph)`."
        raise TransformFailed(
            f"transform {self.spec} returned {type(returned).__module__}.{type(returned).__qualname__} "
            f"({short_repr(returned)}); accepted: {ACCEPTED_RETURNS}.{hint}"
        )


def load_object(spec: str, what: str = "transform") -> Any:
    """The object ``package.module:name`` or ``path/to/file.py:name`` names (``name`` may be dotted);
    :class:`TransformLoadError` saying what is wrong with the spec (``what`` names what it is for).

    >>> load_object("fxverify.examples:fuse_conv_bn").__name__
    'fuse_conv_bn'
    """
    module_part, sep, attr_path = spec.rpartition(":")
    if not sep or not module_part or not attr_path:
        raise TransformLoadError(
            f"{what} spec {spec!r} must look like 'package.module:name' or 'path/to/file.py:name'"
        )
    module = _import_module(module_part, spec, what)
    obj: Any = module
    for attr in attr_path.split("."):
        if not hasattr(obj, attr):
            public = sorted(n for n in dir(module) if not n.startswith("_"))[:20]
            raise TransformLoadError(
                f"{what} spec {spec!r}: module {module_part!r} has no attribute {attr_path!r}. "
                f"Public names there: {', '.join(public) or '(none)'}"
            )
        obj = getattr(obj, attr)
    return obj


_PACKAGE = str(Path(__file__).resolve().parent)


def _users_frames(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without its first frames in fxverify (calling the transform, the contract wrapper):
    the traceback starts where the user's code does."""
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename.startswith(_PACKAGE):
        tb = tb.tb_next
    return tb


def _raised(exc: BaseException) -> str:
    """How the transform's exception reads in one line: ``SystemExit(3)``, ``ValueError: why``.

    >>> _raised(SystemExit(3)), _raised(ValueError("too big"))
    ('SystemExit(3)', 'ValueError: too big')
    """
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r})"
    return exception_summary(exc)


def is_quantizer(obj: Any) -> bool:
    """Whether ``obj`` is a PT2E ``Quantizer`` instance (torchao's or ``torch.ao``'s base class, read by name: no
    import of either here).

    >>> is_quantizer(lambda gm: gm)
    False
    """
    return not isinstance(obj, type) and any(cls.__name__ == "Quantizer" for cls in type(obj).__mro__) \
        and callable(getattr(obj, "annotate", None))


_PASS_CLASSES = ("PassBase", "ExportedProgramPassBase", "Quantizer")  # classes fxverify makes the instance of


def _instance_of_pass_class(obj: Any, spec: str) -> Any:
    """``obj()`` where ``obj`` is a pass class (a ``PassBase`` subclass such as ExecuTorch's ``ExportPass`` ones, or an
    ``ExportedProgramPassBase``) or a PT2E ``Quantizer`` subclass, as its authors' pipelines make them; ``obj``
    itself otherwise."""
    if not isinstance(obj, type) or not any(cls.__name__ in _PASS_CLASSES for cls in obj.__mro__):
        return obj
    try:
        return obj()
    except TypeError as exc:
        raise TransformLoadError(f"transform spec {spec!r} names the pass class {obj.__qualname__}, whose constructor "
                                 f"needs arguments ({exception_summary(exc)}): name an instance instead (a module-level "
                                 f"`my_pass = {obj.__name__}(...)`)") from exc


def as_transform(transform: Transform | Callable[..., Any] | str) -> Transform:
    """Accept a :class:`Transform`, a callable, a list of passes or a spec string."""
    if isinstance(transform, Transform):
        return transform
    if isinstance(transform, str):
        return Transform.load(transform)
    return Transform.from_callable(transform)


class CallTimedOut(Exception):
    """:func:`call_with_timeout`'s call ran past its timeout (callers say what timed out)."""


def call_with_timeout(fn: Callable[..., Any], args: tuple[Any, ...], timeout: float | None) -> Any:
    """Call ``fn(*args)``, raising ``CallTimedOut`` after ``timeout`` seconds.

    In the main thread a SIGALRM timer interrupts the call; elsewhere the call
    runs in a daemon thread that is abandoned when it overruns.
    """
    if not timeout:
        return fn(*args)
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGALRM"):
        def on_alarm(signum: int, frame: Any) -> None:
            raise CallTimedOut()

        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            return fn(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    outcome: dict[str, Any] = {}

    context = contextvars.copy_context()  # what the caller set (graph_passes.training_graph) holds in the thread

    def target() -> None:
        try:
            outcome["value"] = context.run(fn, *args)
        except BaseException as exc:  # handed back to the calling thread
            outcome["error"] = exc

    worker = threading.Thread(target=target, daemon=True, name="fxverify-transform")
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise CallTimedOut()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def _import_module(module_part: str, spec: str, what: str = "transform") -> Any:
    looks_like_path = module_part.endswith(".py") or "/" in module_part or "\\" in module_part
    if looks_like_path:
        path = Path(module_part).expanduser().resolve()
        if not path.is_file():
            raise TransformLoadError(f"{what} spec {spec!r}: file {str(path)!r} does not exist")
        name = f"fxverify_user_{path.stem}_{zlib.crc32(str(path).encode()):08x}"
        if name in sys.modules:
            return sys.modules[name]
        file_spec = importlib.util.spec_from_file_location(name, path)
        assert file_spec is not None and file_spec.loader is not None
        module = importlib.util.module_from_spec(file_spec)
        sys.modules[name] = module
        try:
            file_spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise TransformLoadError(
                f"{what} spec {spec!r}: importing {str(path)!r} raised {exception_summary(exc)}"
            ) from exc
        return module
    try:
        return importlib.import_module(module_part)
    except ImportError as exc:
        raise TransformLoadError(
            f"{what} spec {spec!r}: cannot import module {module_part!r} ({exception_summary(exc)}). "
            "Is the package installed, or the project root on sys.path (pytest's rootdir / pythonpath ini option)?"
        ) from exc
    except Exception as exc:
        raise TransformLoadError(
            f"{what} spec {spec!r}: importing module {module_part!r} raised {exception_summary(exc)}"
        ) from exc


_TRACER_PARAM_NAMES = ("tracer_class", "tracer_cls", "tracer")


def _is_pipeline(obj: Any) -> bool:
    """Whether ``obj`` is a list or tuple of passes, or a (contract-decorated) ``PassManager``."""
    if isinstance(obj, (list, tuple)):
        return True
    from torch.fx.passes.infra.pass_manager import PassManager

    return isinstance(inspect.unwrap(obj) if callable(obj) else obj, PassManager)


def _list_prefix(steps: tuple[Transform, ...], count: int) -> Callable[..., Any]:
    """The pass running ``steps[:count]`` in order, each on what the one before returned."""
    return functools.partial(_run_steps, steps[:count])


def _run_steps(steps: tuple[Transform, ...], module: Any) -> Any:
    for number, step in enumerate(steps, 1):
        try:
            returned = step.fn(module)
        except BaseException as exc:
            note = getattr(exc, "add_note", None)  # Python 3.11+; before, the traceback alone names the step
            if note is not None:
                note(f"(in step {number} of {len(steps)} of the pipeline: {step.spec})")
            raise
        module, _ = step.normalize_result(returned, module)
    return module


def _manager_prefix(manager: Any, count: int) -> Callable[..., Any]:
    """A copy of the ``PassManager`` ``manager`` running its first ``count`` passes."""
    prefix = copy.copy(manager)
    prefix.passes = list(manager.passes)[:count]
    return prefix


def _form_of(fn: Callable[..., Any]) -> str:
    """``program`` when ``fn``'s first parameter is annotated ``ExportedProgram``, ``graph`` when ``fn`` is a pass
    Inductor calls on a Graph (:func:`~fxverify.core.graph_passes.takes_graph`), else ``module``.

    >>> def fold(ep: "torch.export.ExportedProgram") -> None: ...
    >>> def fuse(graph: "torch.fx.Graph") -> None: ...
    >>> _form_of(fold), _form_of(fuse), _form_of(lambda gm: gm)
    ('program', 'graph', 'module')
    """
    if takes_graph(fn):
        return "graph"
    try:
        first = next(iter(inspect.signature(fn).parameters.values()), None)
    except (TypeError, ValueError):
        return "module"
    annotation = None if first is None else first.annotation
    named = annotation if isinstance(annotation, str) else getattr(annotation, "__qualname__", "")
    return "program" if named.strip("'\"").rpartition(".")[2] == "ExportedProgram" else "module"


def _takes_tracer_class(fn: Callable[..., Any], spec: str) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: call with one argument
        return False
    positional = [
        p for p in sig.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    has_varargs = any(p.kind == p.VAR_POSITIONAL for p in sig.parameters.values())
    required = [p for p in positional if p.default is p.empty]
    required_kw = [
        p for p in sig.parameters.values() if p.kind == p.KEYWORD_ONLY and p.default is p.empty
    ]
    if (not positional and not has_varargs) or len(required) > 2 or required_kw:
        factory = "" if positional or has_varargs or required_kw else (
            " A function of no arguments may be a factory: to test a quantizer, name the Quantizer itself (its class "
            "or an instance) under --fxverify-capture pt2e; to quantize the pt2e capture's graphs with it, give the "
            "factory to --fxverify-quantizer.")
        raise TransformLoadError(
            f"transform {spec} has signature {sig}; fxverify calls transform(gm) or "
            "transform(gm, tracer_class), so it must take one positional argument "
            f"(optionally a second, tracer_class) and no other required arguments.{factory}"
        )
    if len(required) == 2:
        return True
    return len(positional) >= 2 and positional[1].name in _TRACER_PARAM_NAMES


def _importable_spec(fn: Callable[..., Any]) -> str | None:
    """``module:qualname`` when that string loads back to ``fn`` (needed by subprocesses)."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not module or not qualname or "<" in qualname or module == "__main__":
        return None
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return f"{module}:{qualname}" if obj is fn else None


