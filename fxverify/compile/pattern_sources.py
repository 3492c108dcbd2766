"""Where the patterns of an Inductor pattern-matcher pass come from, with what fuzzing needs of each:
its search function, the example inputs it was traced with and the trace function, and a
``PatternMatcherPass`` holding that pattern alone (so a rewrite is attributed to one pattern).

A ``PatternMatcherPass`` keeps only the pattern expressions it was given, not the search
functions they were traced from, so fxverify records them while the patterns are registered:

- a function registering replacements into the pass it is given
  (``def register(pass_dict): register_replacement(search, replace, inputs, fwd_only, pass_dict)``)
  is called with a fresh ``PatternMatcherPass`` while fxverify records each search function
  ``register_replacement`` traces;
- ``register_replacement``'s keyword arguments as ``(name, kwargs)`` pairs or dicts, as
  ``torch._inductor.fx_passes.fuse_attention._get_sfdp_patterns()`` yields Inductor's own; each is
  registered as torch registers it (with the serialized pattern torch ships under that name, if any).

>>> import torch
>>> from torch._inductor.pattern_matcher import fwd_only, register_replacement
>>> def register(pass_dict):
...     register_replacement(lambda x: x + x, lambda x: x * 2, [torch.randn(4)], fwd_only, pass_dict)
>>> [(p.name, p.traced_with) for p in pattern_examples(register, "register")]
[('lambda', 'fwd_only')]
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from fxverify.compile.pattern_variants import unwrapped
from fxverify.core.graph_passes import register_into, registers_patterns
from fxverify.errors import TransformLoadError

FORMS = ("a function registering replacements into the PatternMatcherPass it is given (first parameter annotated "
         "PatternMatcherPass or named pass_dict / patterns), or a list of register_replacement's keyword arguments as "
         "(name, kwargs) pairs, as torch._inductor.fx_passes.fuse_attention._get_sfdp_patterns() yields them, and of "
         "fxverify.compile.pattern_sources.PatternExample (a pass and the program its pattern is written for)")


@dataclasses.dataclass(frozen=True)
class PatternExample:
    """A pattern and the program it is written for: ``name`` (the registration's, else the search
    function's), the search function and its example inputs, the ``trace_fn`` it is traced with
    (``fwd_only`` or ``joint_fwd_bwd``), the ``scalar_workaround`` it was registered with, and the
    ``matcher`` that rewrites it: the whole pass it was registered into, as Inductor runs it (a variant of
    one pattern's program may be rewritten by another pattern of the pass).

    Give one directly for a pass whose patterns keep no search function (``register_graph_pattern``
    with a handler, as Inductor's own ``addmm`` fusion): the search function is then the computation
    the pattern stands for, written as a user writes it::

        PatternExample("addmm", lambda inp, a, b: inp + a @ b, (torch.randn(4), torch.randn(3, 5),
                       torch.randn(5, 4)), fwd_only, {}, post_grad.pass_patterns[2])
    """

    name: str
    search_fn: Callable[..., Any]
    example_inputs: tuple[Any, ...]
    trace_fn: Callable[..., Any]
    scalar_workaround: Mapping[str, Any]
    matcher: Any  # torch._inductor.pattern_matcher.PatternMatcherPass, or any pass with .apply(graph)

    @property
    def traced_with(self) -> str:
        """The trace function's name (of the function a ``functools.partial`` wraps)."""
        return getattr(unwrapped(self.trace_fn), "__name__", repr(self.trace_fn))

    def traced_inputs(self) -> list[Any]:
        """The arguments the search function is traced with, as ``register_replacement`` passes them: the example
        inputs, with each ``scalar_workaround`` value at its own parameter.

        >>> import torch
        >>> from torch._inductor.pattern_matcher import fwd_only
        >>> scaled = PatternExample("scaled", lambda x, scale: x * scale, (torch.ones(2),), fwd_only, {"scale": 0.5}, None)
        >>> scaled.traced_inputs()
        [tensor([1., 1.]), 0.5]
        """
        given = iter(self.example_inputs)
        return [self.scalar_workaround[name] if name in self.scalar_workaround else next(given)
                for name in inspect.signature(self.search_fn).parameters]

    @property
    def spellings(self) -> Mapping[str, Callable[..., Any]]:
        """The other spellings of the search function its author declared (:func:`also_spelled`), by label."""
        return getattr(self.search_fn, SPELLINGS_ATTRIBUTE, {})

    def search_source(self) -> str:
        """The search function's source, or its name where Python keeps none."""
        try:
            return inspect.getsource(self.search_fn).strip()
        except (OSError, TypeError):
            return getattr(self.search_fn, "__qualname__", repr(self.search_fn))


SPELLINGS_ATTRIBUTE = "__fxverify_spellings__"  # set on a search function by also_spelled


def also_spelled(**spellings: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare, on a search function, other functions computing what it computes as users' programs spell it
    (a custom op and its native implementation, an op writing into an ``out`` buffer): pattern fuzzing adds each
    to the completeness matrix (traced as ``torch.compile`` hands Inductor a graph, so a mutable op arrives as
    ``auto_functionalized``) and judges the rewrite wherever the pattern fires on it.

    >>> import torch
    >>> @also_spelled(builtin=torch.nn.functional.silu)
    ... def silu(x):
    ...     return x * torch.sigmoid(x)
    >>> sorted(getattr(silu, SPELLINGS_ATTRIBUTE))
    ['builtin']
    """
    def declare(search_fn: Callable[..., Any]) -> Callable[..., Any]:
        setattr(search_fn, SPELLINGS_ATTRIBUTE, {**getattr(search_fn, SPELLINGS_ATTRIBUTE, {}), **spellings})
        return search_fn

    return declare


def pattern_examples(source: Any, spec: str) -> tuple[PatternExample, ...]:
    """The patterns ``source`` registers (see the module's docstring for its forms), each in a pass of its own;
    :class:`~fxverify.errors.TransformLoadError` naming ``spec`` for any other form, or when nothing is registered."""
    from torch._inductor.pattern_matcher import PatternMatcherPass

    if isinstance(source, PatternExample):
        return (source,)
    if registers_patterns(source):
        return _record_registrations(source, spec)
    if isinstance(source, (PatternMatcherPass, Mapping)) or hasattr(source, "uuid"):
        raise TransformLoadError(
            f"patterns {spec}: a {type(source).__name__} keeps the patterns it was given but not the search functions "
            f"they were traced from, which fuzzing varies; give {FORMS}")
    if isinstance(source, Iterable) and not isinstance(source, (str, bytes)):
        return _register_each(list(source), spec)
    raise TransformLoadError(f"patterns {spec}: got {type(source).__name__}; give {FORMS}")


@contextlib.contextmanager
def _recording(found: list[tuple[Any, Callable[..., Any], tuple[Any, ...], Callable[..., Any], Mapping[str, Any]]]
               ) -> Iterator[None]:
    """Record ``(pattern, search_fn, example_inputs, trace_fn, scalar_workaround)`` for every pattern registered
    inside the block: a search function ``register_replacement`` traces (``gen_pattern_and_search_gm``), or a
    serialized pattern it is given (``search_fn_pattern=``, as ``gen_register_replacement`` passes Inductor's
    own). Both are looked up in their module at each call, so recording replaces them there."""
    from torch._inductor import pattern_matcher

    tracing, registering = pattern_matcher.gen_pattern_and_search_gm, pattern_matcher.register_replacement

    def traced(search_fn: Any, example_inputs: Any, trace_fn: Any, scalar_workaround: Any = None,
               *args: Any, **kwargs: Any) -> Any:
        pattern, gm = tracing(search_fn, example_inputs, trace_fn, scalar_workaround, *args, **kwargs)
        found.append((pattern, search_fn, tuple(example_inputs), trace_fn, dict(scalar_workaround or {})))
        return pattern, gm

    def registered(*args: Any, **kwargs: Any) -> Any:
        bound = inspect.signature(registering).bind(*args, **kwargs)
        given = bound.arguments
        if given.get("search_fn_pattern") is not None:
            found.append((given["search_fn_pattern"], given["search_fn"], tuple(given["example_inputs"]),
                          given["trace_fn"], dict(given.get("scalar_workaround") or {})))
        return registering(*args, **kwargs)

    pattern_matcher.gen_pattern_and_search_gm, pattern_matcher.register_replacement = traced, registered
    try:
        yield
    finally:
        pattern_matcher.gen_pattern_and_search_gm, pattern_matcher.register_replacement = tracing, registering


def _record_registrations(register: Callable[..., Any], spec: str) -> tuple[PatternExample, ...]:
    from torch._inductor.pattern_matcher import PatternMatcherPass

    whole = PatternMatcherPass(pass_name=f"fxverify[{spec}]")
    found: list[Any] = []
    with _recording(found):
        register_into(register, whole, f"patterns {spec}")
    if not found:
        raise TransformLoadError(
            f"patterns {spec}: calling it with a fresh PatternMatcherPass registered no pattern that fxverify saw "
            "traced (register_replacement with search_fn_pattern=, a serialized pattern, or register_graph_pattern "
            "keep no search function); register with register_replacement(search_fn, replace_fn, example_inputs, "
            "trace_fn, pass_dict)")
    names = _unique([getattr(fn, "__name__", "pattern") for _, fn, *_ in found])
    return tuple(PatternExample(name, fn, inputs, trace, workaround, whole)
                 for name, (_, fn, inputs, trace, workaround) in zip(names, found))


def _unique(names: list[str]) -> list[str]:
    """``names`` made fit for test ids and told apart: ``<lambda>`` is ``lambda``, a second ``lambda_2``.

    >>> _unique(["<lambda>", "rms", "<lambda>"])
    ['lambda', 'rms', 'lambda_2']
    """
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        plain = name.strip("<>") or "pattern"
        seen[plain] = seen.get(plain, 0) + 1
        unique.append(plain if seen[plain] == 1 else f"{plain}_{seen[plain]}")
    return unique


def _register_each(rows: list[Any], spec: str) -> tuple[PatternExample, ...]:
    """Register each row into one pass as torch registers it: ``gen_register_replacement`` (the serialized pattern
    Inductor ships, where one is kept under the row's name), else ``register_replacement``."""
    from torch._inductor import pattern_matcher

    whole = pattern_matcher.PatternMatcherPass(pass_name=f"fxverify[{spec}]")
    given: list[PatternExample] = []
    registered: list[tuple[str | None, Any]] = []
    for i, row in enumerate(rows):
        if isinstance(row, PatternExample):
            given.append(row)
            continue
        name, kwargs = row if isinstance(row, tuple) and len(row) == 2 else (None, row)
        if not isinstance(kwargs, Mapping) or "search_fn" not in kwargs:
            raise TransformLoadError(f"patterns {spec}: item {i} is {type(row).__name__}, not register_replacement's "
                                     f"keyword arguments; give {FORMS}")
        found: list[Any] = []
        arguments = {**kwargs, "pass_dicts": whole}
        with _recording(found):
            if name is not None and _serialized(str(name), kwargs["search_fn"]):
                pattern_matcher.gen_register_replacement(str(name), **arguments)
            else:
                pattern_matcher.register_replacement(**arguments)
        registered += [(name, record) for record in found]
    names = _unique([str(name or getattr(fn, "__name__", "pattern")) for name, (_, fn, *_) in registered])
    return (*given, *(PatternExample(unique, fn, inputs, trace, workaround, whole)
                      for unique, (_, (_, fn, inputs, trace, workaround)) in zip(names, registered)))


def _serialized(name: str, search_fn: Any) -> bool:
    """Whether torch ships the pattern ``name`` serialized (``serialized_patterns/<search function>.py``)."""
    import importlib

    try:
        module = importlib.import_module(f"torch._inductor.fx_passes.serialized_patterns.{search_fn.__name__}")
    except (ImportError, AttributeError):
        return False
    return hasattr(module, name)
