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
  registered as torch registers it (with the serialized pattern torch ships under that name, if any);
- a handler pattern (``register_graph_pattern``, as Inductor's ``addmm`` fusion), registered by such a function
  or held by a ``PatternMatcherPass`` given as it is: its search function is written from the pattern's
  ``CallFunction``/``Arg``/``KeywordArg`` tree and its example inputs inferred (:func:`derived_example`), or
  :class:`~fxverify.errors.TransformLoadError` gives the ``PatternExample(...)`` line to write.

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
import itertools
import keyword
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from fxverify.compile.pattern_variants import hooks, quiet, unwrapped
from fxverify.core.contracts import SPELLING_FAMILIES, Contract, contract_of
from fxverify.core.graph_passes import register_into, registers_patterns
from fxverify.errors import TransformLoadError

FORMS = ("a function registering replacements into the PatternMatcherPass it is given (first parameter annotated "
         "PatternMatcherPass or named pass_dict / patterns), a PatternMatcherPass of register_graph_pattern handlers, "
         "or a list of register_replacement's keyword arguments as (name, kwargs) pairs, as "
         "torch._inductor.fx_passes.fuse_attention._get_sfdp_patterns() yields them, and of "
         "fxverify.compile.pattern_sources.PatternExample (a pass and the program its pattern is written for)")


@dataclasses.dataclass(frozen=True)
class PatternExample:
    """A pattern and the program it is written for: ``name`` (the registration's, else the search
    function's), the search function and its example inputs, the ``trace_fn`` it is traced with
    (``fwd_only`` or ``joint_fwd_bwd``), the ``scalar_workaround`` it was registered with, and the
    ``matcher`` that rewrites it: the whole pass it was registered into, as Inductor runs it (a variant of
    one pattern's program may be rewritten by another pattern of the pass), and the ``hooks`` it is for: the
    Inductor captures whose hooks receive the graphs it is applied to (from the registering function's contract,
    ``captures=("inductor_post",)``; empty: as ``trace_fn`` traces them).

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
    hooks: tuple[str, ...] = ()  # Inductor captures (pattern_variants.hooks()), the first the one variants are traced at

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
        """The search function's source (written from its pattern, for a derived one), or its name where Python keeps
        none."""
        if hasattr(self.search_fn, SOURCE_ATTRIBUTE):
            return str(getattr(self.search_fn, SOURCE_ATTRIBUTE))
        try:
            return inspect.getsource(self.search_fn).strip()
        except (OSError, TypeError):
            return getattr(self.search_fn, "__qualname__", repr(self.search_fn))


SPELLINGS_ATTRIBUTE = "__fxverify_spellings__"  # set on a search function by also_spelled
SOURCE_ATTRIBUTE = "__fxverify_source__"  # set on a search function written from a pattern (derived_example)
RANKS = (2, 1, 3, 4)  # the ranks tried for each input of a derived search function, the likeliest first
INFERENCE_TRIES = 64  # rank combinations tried before giving up
SIZES = (3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13)  # distinct sizes given to the dimensions a derived example leaves free


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
        declared = pattern_contract(source, spec)
        at = tuple(capture for capture in declared.captures or () if capture in hooks())
        return tuple(dataclasses.replace(example, hooks=at) for example in _record_registrations(source, spec))
    if isinstance(source, PatternMatcherPass):
        return _from_pass(source, spec)
    if isinstance(source, Mapping) or hasattr(source, "uuid"):
        raise TransformLoadError(
            f"patterns {spec}: a {type(source).__name__} keeps the patterns it was given but not the search functions "
            f"they were traced from, which fuzzing varies; give {FORMS}")
    if isinstance(source, Iterable) and not isinstance(source, (str, bytes)):
        return _register_each(list(source), spec)
    raise TransformLoadError(f"patterns {spec}: got {type(source).__name__}; give {FORMS}")


def pattern_contract(source: Any, spec: str) -> Contract:
    """The contract of the registering function ``source`` (:data:`~fxverify.core.contracts.STRICT` for another
    source), as pattern fuzzing reads it: ``rewrites_spellings`` and ``dtypes`` promise spellings, ``captures`` name
    the hooks its patterns are for. :class:`~fxverify.errors.TransformLoadError` for ``rewrites_every_occurrence``
    declared without ``rewrites_spellings``: that is the ``variants`` check's promise, not a pattern's.

    >>> import fxverify
    >>> pattern_contract(fxverify.contract(rewrites_every_occurrence=True)(lambda pass_dict: None), "my:register")
    Traceback (most recent call last):
    ...
    fxverify.errors.TransformLoadError: patterns my:register: rewrites_every_occurrence=True is the variants ...
    """
    declared = contract_of(source)
    if declared.rewrites_every_occurrence and declared.rewrites_spellings is None:
        raise TransformLoadError(
            f"patterns {spec}: rewrites_every_occurrence=True is the variants check's promise (every occurrence of "
            "each op the pass rewrites is rewritten, over a corpus: a fusion rightly leaves the ops outside its "
            "pattern), not pattern fuzzing's. Say which spellings every pattern fires on with "
            f"@fxverify.contract(rewrites_spellings=(...)), of {SPELLING_FAMILIES} (() for none; the contract's "
            "dtypes are promised too), beside rewrites_every_occurrence=True only if you also mean that promise")
    return declared


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
    recorded = {id(pattern) for pattern, *_ in found}
    derived = [derived_example(entry, whole, spec) for entry in _entries(whole) if id(entry.pattern) not in recorded]
    if not found and not derived:
        raise TransformLoadError(
            f"patterns {spec}: calling it with a fresh PatternMatcherPass registered no pattern; register with "
            "register_replacement(search_fn, replace_fn, example_inputs, trace_fn, pass_dict) or "
            "register_graph_pattern(pattern, pass_dict=pass_dict)(handler)")
    names = _unique([*(getattr(fn, "__name__", "pattern") for _, fn, *_ in found), *(e.name for e in derived)])
    return (*(PatternExample(name, fn, inputs, trace, workaround, whole)
              for name, (_, fn, inputs, trace, workaround) in zip(names, found)),
            *(dataclasses.replace(e, name=name) for name, e in zip(names[len(found):], derived)))


def _entries(matcher: Any) -> list[Any]:
    """The pattern entries of a ``PatternMatcherPass``, each once (an entry is kept under each target it may match)."""
    unique: dict[int, Any] = {}
    for entries in matcher.patterns.values():
        for entry in entries:
            unique.setdefault(id(entry), entry)
    return list(unique.values())


def _from_pass(matcher: Any, spec: str) -> tuple[PatternExample, ...]:
    """The handler patterns of a ``PatternMatcherPass`` given as it is (:func:`derived_example`), in that pass;
    :class:`TransformLoadError` for a pass holding a pattern traced from a search function it no longer keeps."""
    from torch._inductor.pattern_matcher import ReplacementPatternEntry

    entries = _entries(matcher)
    if not entries or any(isinstance(entry, ReplacementPatternEntry) for entry in entries):
        held = "holds no pattern" if not entries else ("keeps the patterns it was given but not the search functions "
                                                       "they were traced from, which fuzzing varies")
        raise TransformLoadError(f"patterns {spec}: a {type(matcher).__name__} {held}; give {FORMS}")
    derived = [derived_example(entry, matcher, spec) for entry in entries]
    return tuple(dataclasses.replace(e, name=name) for name, e in zip(_unique([e.name for e in derived]), derived))


def derived_example(entry: Any, matcher: Any, spec: str) -> PatternExample:
    """A handler pattern's program (``register_graph_pattern``): a search function written from its pattern (each
    ``CallFunction`` a call, each ``Arg`` a parameter in the handler's order, each ``KeywordArg`` a parameter of its
    name), traced with ``fwd_only`` on example inputs inferred from the ops (tensors of the ranks they take, each
    dimension a distinct size unless an op makes two equal), in ``matcher``; :class:`TransformLoadError` saying what
    to write where the pattern allows no search function or its inputs cannot be inferred.

    >>> from torch._inductor.fx_passes import post_grad
    >>> from torch._inductor.pattern_matcher import CallFunction, KeywordArg, Arg, GraphPatternEntry
    >>> aten = torch.ops.aten
    >>> entry = GraphPatternEntry(CallFunction(aten.add, CallFunction(aten.mm, Arg(), Arg()), KeywordArg("inp")),
    ...                           lambda match: True, post_grad.addmm)
    >>> example = derived_example(entry, None, "addmm")
    >>> print(example.search_source())
    def addmm(arg0, arg1, inp):
        mm = torch.ops.aten.mm(arg0, arg1)
        add = torch.ops.aten.add(mm, inp)
        return add
    >>> [tuple(value.shape) for value in example.example_inputs]
    [(3, 4), (4, 5), (3, 5)]
    """
    from torch._inductor.pattern_matcher import GraphPatternEntry, fwd_only

    handler = getattr(entry, "handler", None)
    label = _identifier(getattr(handler, "__name__", type(entry).__name__))
    if not isinstance(entry, GraphPatternEntry):
        raise TransformLoadError(
            f"patterns {spec}: pattern {label} is a {type(entry).__name__}: its handler runs inside Inductor's "
            f"lowering, not on an FX graph; fuzz the computation it stands for as a PatternExample: {_example_line(label)}")
    try:
        source, parameters = _search_source(entry.pattern, label)
    except _Underivable as why:
        raise TransformLoadError(
            f"patterns {spec}: the pattern of handler {label} cannot be written as a search function ({why}); give the "
            f"computation it stands for as a PatternExample: {_example_line(label)}") from None
    namespace: dict[str, Any] = {"torch": torch, "operator": operator}
    exec(compile(source, f"<search function written from the pattern of {label}>", "exec"), namespace)
    search = namespace[label]
    setattr(search, SOURCE_ATTRIBUTE, source)
    inputs = _inferred_inputs(search, len(parameters))
    if inputs is None:
        raise TransformLoadError(
            f"patterns {spec}: the pattern of handler {label} keeps no search function and fxverify could not infer "
            f"inputs for the one written from it (tensors of ranks {RANKS} for each of {', '.join(parameters)}); "
            f"give it as a PatternExample with the inputs it takes:\n{_indented(source)}\n"
            f"    {_example_line(label, parameters)}")
    return PatternExample(label, search, inputs, fwd_only, {}, matcher)


class _Underivable(Exception):
    """A pattern holds what no search function written from it can call (the reason)."""


def _search_source(pattern: Any, name: str) -> tuple[str, list[str]]:
    """The source of a function ``name`` computing what ``pattern`` matches, and its parameters (each ``Arg`` in
    depth-first order, as the handler receives them, then each ``KeywordArg`` and ``Ignored``)."""
    from torch._inductor import pattern_matcher as pm

    positional: list[str] = []
    keywords: list[str] = []
    lines: list[str] = []
    written: dict[int, str] = {}
    taken: set[str] = set()

    def expression(node: Any) -> str:
        if isinstance(node, pm.Arg):
            positional.append(f"arg{len(positional)}")
            return positional[-1]
        if isinstance(node, (pm.KeywordArg, pm.ExclusiveKeywordArg)):
            keywords.extend([node.name] if node.name not in keywords else [])
            return node.name
        if isinstance(node, pm.Ignored):
            keywords.append(f"ignored{len(keywords)}")
            return keywords[-1]
        if type(node) is pm.CallFunction:
            if id(node) not in written:
                call = [expression(arg) for arg in node.args]
                call += [f"{key}={expression(value)}" for key, value in node.kwargs.items()]
                local = _fresh_name(_short(node.fns[0]), taken)
                lines.append(f"    {local} = {_callee(node.fns[0])}({', '.join(call)})")
                written[id(node)] = local
            return written[id(node)]
        if isinstance(node, pm.MultiOutputPattern):
            return "(" + "".join(f"{expression(output)}, " for output in node.outputs) + ")"
        if isinstance(node, (list, tuple)):
            items = ", ".join(expression(item) for item in node)
            return f"[{items}]" if isinstance(node, list) else f"({items}{',' if len(node) == 1 else ''})"
        if isinstance(node, pm.PatternExpr):
            raise _Underivable(f"it holds a {type(node).__name__}")
        return repr(node)

    result = expression(pattern)
    parameters = [*positional, *keywords]
    return "\n".join([f"def {name}({', '.join(parameters)}):", *lines, f"    return {result}"]), parameters


def _callee(target: Any) -> str:
    """How a search function names the op ``target`` (``torch.ops.aten.add``, ``operator.getitem``)."""
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return f"torch.ops.{target}"
    name = str(getattr(target, "__name__", ""))
    if getattr(operator, name, None) is target:
        return f"operator.{name}"
    module = getattr(target, "__module__", None) or ""
    if module == "torch" or module.startswith("torch."):
        return f"{module}.{target.__qualname__}"
    raise _Underivable(f"it calls {target!r}, which a search function written here cannot name")


def _short(target: Any) -> str:
    """A local name for ``target``'s result (``mm`` for ``aten.mm.default``)."""
    name = str(getattr(target, "__name__", target)).split(".")
    return _identifier(name[1] if len(name) > 1 and name[0] in ("aten", "prims") else name[0])


def _fresh_name(base: str, taken: set[str]) -> str:
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


def _identifier(text: str) -> str:
    """``text`` made a Python identifier (``<lambda>`` is ``lambda_``)."""
    cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in text).strip("_") or "pattern"
    return cleaned + "_" if keyword.iskeyword(cleaned) or cleaned[0].isdigit() else cleaned


def _inferred_inputs(search: Callable[..., Any], count: int) -> tuple[torch.Tensor, ...] | None:
    """Example inputs ``search`` runs on: for each combination of :data:`RANKS` (the likeliest first), the search
    function run on fake tensors whose every dimension is a symbol of its own; the dimensions the ops made equal
    (a matmul's inner ones, broadcast ones) share one size, the others get distinct sizes; None where no
    combination runs."""
    combinations = sorted(itertools.product(RANKS, repeat=count), key=lambda ranks: sum(RANKS.index(r) for r in ranks))
    with quiet():
        for ranks in combinations[:INFERENCE_TRIES]:
            shapes = _unified_shapes(search, ranks)
            if shapes is None:
                continue
            generator = torch.Generator().manual_seed(0)
            inputs = tuple(torch.randn(shape, generator=generator) for shape in shapes)
            try:
                search(*inputs)
            except Exception:  # sizes the symbols did not capture (a guard on a value): the next ranks
                continue
            return inputs
    return None


def _unified_shapes(search: Callable[..., Any], ranks: Sequence[int]) -> list[tuple[int, ...]] | None:
    """Concrete shapes of the given ranks on which ``search`` runs, read from a ``ShapeEnv`` (all dimensions alike at
    first, so each check an op makes of two of them records them equal), or None where it raises."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    env = ShapeEnv(duck_shape=False)
    mode = FakeTensorMode(shape_env=env)
    fakes = [mode.from_tensor(torch.empty([8] * rank), source=ConstantSource(f"input{i}"),
                              symbolic_context=StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * rank))
             for i, rank in enumerate(ranks)]
    try:
        with mode:
            search(*fakes)
    except Exception:  # these ranks are no program of its ops
        return None
    sizes: dict[Any, int] = {}
    shapes = []
    for fake in fakes:
        shape = []
        for size in fake.shape:
            symbol = env.replace(size.node.expr) if isinstance(size, torch.SymInt) else int(size)
            if not isinstance(symbol, int) and not symbol.is_Symbol:
                return None
            shape.append(int(symbol) if isinstance(symbol, int) or symbol.is_Integer
                         else sizes.setdefault(symbol, SIZES[len(sizes) % len(SIZES)]))
        shapes.append(tuple(shape))
    return shapes


def _example_line(name: str, parameters: Sequence[str] = ()) -> str:
    """The ``PatternExample`` line to write for pattern ``name`` (its search function ``name``)."""
    inputs = ", ".join(f"<{parameter}>" for parameter in parameters) or "<its example inputs>"
    return f"PatternExample({name!r}, {name}, ({inputs},), fwd_only, {{}}, <the pass>)"


def _indented(text: str) -> str:
    return "    " + text.replace("\n", "\n    ")


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
