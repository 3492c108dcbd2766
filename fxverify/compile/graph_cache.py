"""The FX graph cache contract of an Inductor ``CustomGraphPass``: ``uuid()`` must tell apart every state the
pass acts on.

Inductor keys its FX graph cache on the graph, the example inputs, its config and the ``uuid()`` of each pass
in a custom-pass hook (``torch/_inductor/codecache.py``). A ``uuid()`` that misses part of the pass's state (a
constructor argument, a helper module, a config value) lets one instance's compiled graph serve another, which
then silently returns the first one's results; a ``uuid()`` of None bypasses the cache. Given two or more
instances of a pass that differ in their state, :func:`check_graph_cache` reports three aspects:

- ``graph-cache-uuid``: ``uuid()`` is set, pickles, and is the same in two fresh processes with different
  ``PYTHONHASHSEED`` (this part needs the passes as a spec, which those processes import); instances whose state
  differs while their ``uuid()`` keys alike are a warning, found without compiling;
- ``graph-cache-stale``: the instances compiled one after the other into one fresh cache folder, each one's
  cached result must equal its result with caches disabled; where no instance changes the model's graph, this
  proves nothing and says so;
- ``graph-cache-bypass``: how often Inductor bypassed the cache (``fxgraph_cache_bypass``), and why.

The compiles run in this process, on the model given (:func:`load_model`: a corpus entry, or a factory of the
user's; ``relu(x) * 2 + x`` by default) under ``torch.no_grad()``, inside ``torch._inductor.utils.fresh_cache``
(a temporary cache folder, in-memory caches cleared before and after) and ``torch._inductor.config.patch``: the
user's cache folder and config are left as they were, but the ``torch._dynamo.reset()`` before each compile drops
every function this process compiled before.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import pickle
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config
from torch._inductor.codecache import BypassFxGraphCache, FxGraphCachePickler
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.utils import clear_caches, fresh_cache
from torch.utils import _pytree as pytree

from fxverify import checks
from fxverify.analysis.compare import Mismatch, compare_trees
from fxverify.analysis.graph_text import canonical_text, target_name
from fxverify.cases.case import load_case
from fxverify.core.results import NOTE, CheckResult, Finding, Skip, exception_summary, short_repr
from fxverify.core.transform import CallTimedOut, call_with_timeout, load_object
from fxverify.engine.judging import judge
from fxverify.engine.subject import DEFAULT_TIMEOUT
from fxverify.errors import CorpusError, FxVerifyError, TransformLoadError
from fxverify.inductor.hooks import GRAPH_HOOKS

UUID, STALE, BYPASS = "graph-cache-uuid", "graph-cache-stale", "graph-cache-bypass"  # its checks (the registry's)
HOOKS = tuple(hook.name for hook in GRAPH_HOOKS)  # the config hooks a CustomGraphPass is installed at
HASH_SEEDS = ("0", "1")  # the PYTHONHASHSEED of the two processes uuid() must agree in
DEFAULT_MODEL = "relu_mul_add"
Digests = dict[str, list[dict[str, str]]]  # per PYTHONHASHSEED, uuid_digests of the passes in a fresh process
FIX = "return (get_hash_for_files((__file__,)), {state})"  # the uuid() that names the pass's code and its state


class ReluMulAdd(nn.Module):
    """The default model, ``relu(x) * 2 + x``: its post-grad graph holds ``aten.relu``, ``aten.mul`` and
    ``aten.add``, the ops small passes rewrite."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2 + x


def check_graph_cache(passes: Sequence[CustomGraphPass] | str, *, hook: str = "post_grad_custom_post_pass",
                      model: Callable[..., Any] | str | None = None, inputs: Sequence[Any] | None = None,
                      timeout: float | None = DEFAULT_TIMEOUT) -> list[CheckResult]:
    """One result per check (the registry's graph-cache checks) of the FX graph cache contract of ``passes``: two or more
    instances of a ``CustomGraphPass`` that differ in their state, or a spec ``'package.module:NAME'`` naming
    such a sequence or a function of no arguments returning one (:func:`load_passes`). Each is installed alone as
    ``torch._inductor.config.<hook>`` (one of :data:`HOOKS`) to compile ``model`` and run it on ``inputs``:
    a model the passes rewrite, else the stale aspect proves nothing and says so. ``model`` is a module or
    function with ``inputs`` (or a module with ``example_inputs()``), a corpus entry's name or
    ``'package.module:factory'`` (:func:`load_model`), or None: :class:`ReluMulAdd` on an 8x16 input.
    ``timeout`` bounds each compile, in seconds.

    >>> from fxverify.compile.graph_cache import check_graph_cache
    >>> for result in check_graph_cache("tests.compile_cache_passes:stale_matmuls",
    ...                                 model="tests.compile_cache_passes:mlp"):  # doctest: +SKIP
    ...     print(result.check, result.outcome)
    graph-cache-uuid passed
    graph-cache-stale failed
    graph-cache-bypass passed
    """
    subject = pass_set(passes, model, hook=hook, inputs=inputs, timeout=timeout)
    return [judge(name, checks.get(name), subject) for name in checks.names(checks.PASS_SET)]


def pass_set_subjects(spec: str, given: checks.Given) -> list[tuple[str, Callable[[], PassSet]]]:
    """The one subject of graph passes ``spec`` in a run: its instances (loaded now, so that a spec naming no
    usable passes fails at once) at their default hook, compiling ``given.graph_cache_model`` (the default model
    when None)."""
    passes = load_passes(spec)
    return [("passes", lambda: PassSet(passes, spec, "post_grad_custom_post_pass", _model(given.graph_cache_model, None),
                                       given.timeout))]


# -- the checks -------------------------------------------------------------------------------------------------


def uuid_contract(setup: PassSet) -> dict[str, Any]:
    """``graph-cache-uuid``: decided here where this process can (a uuid() that raises, is unset or does not
    pickle; no spec to import elsewhere), else by two fresh processes, while this one compiles the passes for the
    other checks."""
    _uuid_in_process(setup)
    with _uuids_across_processes(setup.spec, setup.timeout) as across:
        setup.compiled  # noqa: B018 (made while the fresh processes import the passes; the other checks read it)
        return _stability(setup, across())


def stale_entries(setup: PassSet) -> dict[str, Any]:
    """``graph-cache-stale``: each instance's output served from one fresh FX graph cache equals its own."""
    compiled = setup.compiled
    if isinstance(compiled, _CompileRaised):
        _raised(setup, compiled)
    cached, fresh = compiled
    return _stale(setup, cached, fresh)


def bypasses(setup: PassSet) -> dict[str, Any]:
    """``graph-cache-bypass``: how often Inductor bypassed the cache for the compiles, and why (a warning)."""
    compiled = setup.compiled
    if isinstance(compiled, _CompileRaised):
        raise Skip(f"no compile finished, so there is no count to report: see {STALE}")
    return _bypass(setup, compiled[0])


def differing_state(a: object, b: object) -> dict[str, tuple[Any, Any]]:
    """The instance attributes (``vars``) whose values differ between ``a`` and ``b``, as ``(a's, b's)``; an
    attribute only one of them has reads as ``<unset>`` on the other.

    >>> class Floor:
    ...     def __init__(self, floor, name="floor"):
    ...         self.floor, self.name = floor, name
    >>> differing_state(Floor(0.0), Floor(0.5)), differing_state(Floor(0.0), Floor(0.0))
    ({'floor': (0.0, 0.5)}, {})
    """
    ours, theirs = getattr(a, "__dict__", {}), getattr(b, "__dict__", {})
    return {name: (ours.get(name, _UNSET), theirs.get(name, _UNSET)) for name in [*ours, *(n for n in theirs if n not in ours)]
            if not _same(ours.get(name, _UNSET), theirs.get(name, _UNSET))}


def describe_state(difference: dict[str, tuple[Any, Any]]) -> str:
    """``difference`` (from :func:`differing_state`) in words.

    >>> describe_state({"floor": (0.0, 0.5)})
    '`floor` differs (0.0, 0.5)'
    >>> describe_state({"floor": (0.0, 0.5), "name": ("a", "b")})
    "`floor` (0.0, 0.5) and `name` ('a', 'b') differ"
    >>> describe_state({})
    'no instance attribute differs'
    """
    parts = [f"`{name}` ({short_repr(ours, 60)}, {short_repr(theirs, 60)})" for name, (ours, theirs) in difference.items()]
    if not parts:
        return "no instance attribute differs"
    if len(parts) == 1:
        return parts[0].replace(" (", " differs (", 1)
    return ", ".join(parts[:-1]) + f" and {parts[-1]} differ"


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET = _Unset()


def _same(ours: Any, theirs: Any) -> bool:
    if isinstance(ours, torch.Tensor) or isinstance(theirs, torch.Tensor):
        return (isinstance(ours, torch.Tensor) and isinstance(theirs, torch.Tensor) and ours.shape == theirs.shape
                and ours.dtype == theirs.dtype and bool(torch.equal(ours, theirs)))
    try:
        return bool(ours == theirs)
    except Exception:  # an __eq__ that raises or returns no truth value: only the object itself counts as the same
        return ours is theirs



FACTORY = ("give 'package.module:factory' naming a function of no arguments that returns "
           "(module, inputs), inputs the tuple of forward's arguments, or a module class whose instances have "
           "example_inputs() returning that tuple")


@dataclasses.dataclass(frozen=True)
class Model:
    """What the passes' compiles run: ``module`` (a module or function) called on ``inputs``, named ``name`` in
    messages; ``spec`` is the string :func:`load_model` makes it from again (None for objects given as they are)."""

    name: str
    module: Callable[..., Any]
    inputs: tuple[Any, ...]
    spec: str | None = None


def load_model(spec: str) -> Model:
    """The model ``spec`` names: :data:`DEFAULT_MODEL`; a corpus entry's name (built as the corpus builds it, with
    its example inputs); or ``'package.module:factory'`` (or ``'path/to/file.py:factory'``), a function of no
    arguments (a module class too) returning ``(module, inputs)`` or a module with an ``example_inputs()`` method
    (or attribute) giving its inputs as a tuple, or such a pair or module itself. The factory is called with
    torch's RNG seeded (0), so every call gives the same weights and inputs. Anything else is an
    :class:`~fxverify.errors.FxVerifyError` saying what to give.

    >>> [tuple(x.shape) for x in load_model("tests.compile_cache_passes:mlp").inputs]
    [(4, 16)]
    >>> load_model("edge_tiny_decoder")
    Traceback (most recent call last):
    fxverify.errors.CorpusError: no corpus entry named 'edge_tiny_decoder'; did you mean edge_tiny_decoder_block, ...
    """
    if spec == DEFAULT_MODEL:
        return Model(spec, ReluMulAdd(), (torch.randn(8, 16, generator=torch.Generator().manual_seed(0)),), spec)
    if ":" not in spec:
        try:
            case = load_case(spec)
        except CorpusError as exc:
            said = str(exc) if str(exc).endswith("?") else f"{exc}."
            raise CorpusError(f"{said} To compile a model of your own, {FACTORY}") from None
        return Model(spec, case.build(), case.example_inputs(), spec)
    loaded = load_object(spec, "graph-cache model")
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            made = loaded() if callable(loaded) and not isinstance(loaded, nn.Module) else loaded
            found = _with_inputs(made)
    except Exception as exc:
        raise TransformLoadError(f"graph-cache model spec {spec!r}: building it raised {exception_summary(exc)}; "
                                 f"{FACTORY}") from None
    if found is None:
        raise TransformLoadError(f"graph-cache model spec {spec!r} gives {short_repr(made, 60)}: {FACTORY}")
    return Model(spec, *found, spec)


def _with_inputs(made: Any) -> tuple[Callable[..., Any], tuple[Any, ...]] | None:
    """``made`` as (module, inputs): a pair, or a module with its ``example_inputs``; None when it is neither."""
    if isinstance(made, (tuple, list)) and len(made) == 2 and callable(made[0]):
        module, inputs = made
    else:
        module, inputs = made, getattr(made, "example_inputs", None)
        inputs = inputs() if callable(inputs) else inputs
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if not callable(module) or not isinstance(inputs, (tuple, list)):
        return None
    return module, tuple(inputs)


def _model(model: Callable[..., Any] | str | None, inputs: Sequence[Any] | None) -> Model:
    """check_graph_cache's ``model`` and ``inputs`` as one :class:`Model`."""
    if isinstance(model, str) or model is None:
        found = load_model(DEFAULT_MODEL if model is None else model)
        return found if inputs is None else dataclasses.replace(found, inputs=tuple(inputs), spec=None)
    given = (model, tuple(inputs)) if inputs is not None else _with_inputs(model)
    if given is None:
        raise FxVerifyError("model= was given without inputs=: pass the inputs to compile and run it on (a tuple), or "
                            "give a module with an example_inputs() method")
    return Model(getattr(model, "__name__", type(model).__name__), *given)


@dataclasses.dataclass(frozen=True)
class PassSet:
    """The subject of the graph-cache checks: the passes, where they go, the model they compile, and the
    compiles the checks share (made once, on first use)."""

    passes: tuple[CustomGraphPass, ...]
    spec: str | None
    hook: str
    compiles: Model
    timeout: float | None

    capture = None  # the passes run inside torch.compile
    about = "the passes"

    @property
    def label(self) -> str:
        """The passes in a result's ``transform`` field: the spec, or what the instances are."""
        kinds = sorted({type(p).__qualname__ for p in self.passes})
        return self.spec or f"{len(self.passes)} instances of {' / '.join(kinds)}"

    @property
    def model(self) -> str:
        return self.compiles.name

    @property
    def under_test(self) -> str:
        return self.label

    def input_text(self) -> str:
        leaves = pytree.tree_leaves(self.compiles.inputs)
        return ", ".join(f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}" if isinstance(x, torch.Tensor)
                         else short_repr(x, 60) for x in leaves)

    def header(self) -> list[tuple[str, str]]:
        return [("model", self.compiles.name), ("passes", self.label), ("hook", f"torch._inductor.config.{self.hook}")]

    def not_applicable(self, check: str) -> None:
        return None

    def reproduce(self, check: str) -> str | None:
        if self.spec is None or self.compiles.spec is None:
            return None
        model = "" if self.compiles.spec == DEFAULT_MODEL else f", model='{self.compiles.spec}'"
        return (f"python -c \"from fxverify.compile.graph_cache import check_graph_cache as c; "
                f"[print(r.message) for r in c('{self.spec}', hook='{self.hook}'{model})]\"")

    @functools.cached_property
    def compiled(self) -> tuple[list[_Compiled], dict[int, _Compiled]] | _CompileRaised:
        """Every pass compiled in order into one fresh cache folder, then each but the first with caches disabled;
        or the first compile that raised."""
        return _compile_all(self)


def pass_set(passes: Sequence[CustomGraphPass] | str, model: Callable[..., Any] | str | None = None, *,
             hook: str = "post_grad_custom_post_pass", inputs: Sequence[Any] | None = None,
             timeout: float | None = DEFAULT_TIMEOUT) -> PassSet:
    """The :class:`PassSet` of ``passes`` (instances, or a spec naming them) at ``hook`` compiling ``model`` (see
    :func:`check_graph_cache`): the subject of the graph-cache checks.

    >>> pass_set("tests.compile_cache_passes:keyed_matmuls", "tests.compile_cache_passes:mlp").header()[0]
    ('model', 'tests.compile_cache_passes:mlp')
    """
    if hook not in HOOKS:
        raise FxVerifyError(f"hook={hook!r} is not a custom graph pass hook of torch._inductor.config; one of {HOOKS}")
    found = load_passes(passes) if isinstance(passes, str) else _passes(passes, None)
    return PassSet(found, passes if isinstance(passes, str) else None, hook, _model(model, inputs), timeout)


def load_passes(spec: str) -> tuple[CustomGraphPass, ...]:
    """The two or more ``CustomGraphPass`` instances ``spec`` (``'package.module:NAME'``) names: a sequence of them,
    or a function of no arguments returning one; :class:`~fxverify.errors.TransformLoadError` saying what to give
    for anything else.

    >>> [p.dtype for p in load_passes("tests.compile_cache_passes:keyed_matmuls")]
    [torch.bfloat16, torch.float16]
    >>> load_passes("tests.compile_cache_passes:FLOORS")
    Traceback (most recent call last):
    fxverify.errors.TransformLoadError: graph-cache passes 'tests.compile_cache_passes:FLOORS'[0] is a float, not a ...
    """
    return _passes(load_object(spec, "graph-cache passes"), spec)


def _passes(given: Any, spec: str | None) -> tuple[CustomGraphPass, ...]:
    """``given`` as two or more ``CustomGraphPass`` instances; ``TransformLoadError`` saying what it is instead."""
    what = f"graph-cache passes {spec!r}" if spec else "passes"
    if callable(given) and not isinstance(given, (CustomGraphPass, Sequence)):
        try:
            given = given()
        except Exception as exc:
            raise TransformLoadError(f"{what}: calling it raised {exception_summary(exc)}; give a sequence of two or "
                                     "more CustomGraphPass instances, or a function of no arguments returning one") from None
    if isinstance(given, CustomGraphPass) or not isinstance(given, Sequence) or isinstance(given, str):
        raise TransformLoadError(f"{what} must be a sequence of two or more CustomGraphPass instances that differ in "
                                 f"their state (or a function returning one), not {short_repr(given, 60)}")
    found = tuple(given)
    if len(found) < 2:
        raise TransformLoadError(f"{what} holds {len(found)} instance(s): give two or more that differ in their state, "
                                 "so that one can be served the other's cache entry")
    for i, graph_pass in enumerate(found):
        if not isinstance(graph_pass, CustomGraphPass):
            raise TransformLoadError(
                f"{what}[{i}] is a {type(graph_pass).__qualname__}, not a torch._inductor.custom_graph_pass."
                "CustomGraphPass: Inductor bypasses the FX graph cache for any other callable in a custom-pass hook, so "
                "there is no cache contract to check. Subclass CustomGraphPass (__call__(graph) and uuid())")
    return found


# -- graph-cache-uuid -------------------------------------------------------------------------------------------


def _uuid_in_process(setup: PassSet) -> None:
    """Raise the ``graph-cache-uuid`` finding or skip where this process decides it (a uuid() that raises, is unset
    or does not pickle; no spec to import elsewhere); return where fresh processes must."""
    values = []
    for i, graph_pass in enumerate(setup.passes):
        try:
            values.append(graph_pass.uuid())
        except Exception as exc:
            raise Finding(f"passes[{i}].uuid() raised {exception_summary(exc)}; Inductor calls it for every compile "
                          "with the pass in its hook, so such a compile raises too", input=setup.input_text()) from None
    name = type(setup.passes[0]).__qualname__
    unset = [i for i, value in enumerate(values) if not value]
    if unset:
        value = values[unset[0]]
        falsy = "" if value is None else " (Inductor takes any falsy uuid for None)"
        raise Skip(
            f"warning: {name}.uuid() returns {value!r} (passes[{unset[0]}]){falsy}, torch's documented opt-out: "
            f"Inductor bypasses the FX graph cache for every graph it compiles with the pass (see {BYPASS}), so "
            "every such compile runs cold and nothing can go stale. To be cached, return a picklable value naming "
            "the pass's code and every state it reads, e.g. `" + FIX.format(state="self.<state>") + "`",
            details={"uuids": [short_repr(v, 60) for v in values]})
    for i, value in enumerate(values):
        try:
            pickle.dumps(value)
        except Exception as exc:
            raise Finding(_unpicklable(setup, values, i, exception_summary(exc)), input=setup.input_text(),
                          details={"uuids": [short_repr(v, 60) for v in values]}) from None
    if setup.spec is None:
        warning, same = _same_key(setup)
        raise Skip(
            f"uuid() is set and pickles for all {len(values)} instances; whether another process computes the same "
            "value needs the passes as a spec it can import: give 'package.module:NAME' (a sequence of the instances, "
            "or a function returning one) instead of the objects" + warning,
            details={"uuids": [short_repr(v, 60) for v in values], **same})


def same_key_pairs(passes: Sequence[CustomGraphPass]) -> list[tuple[int, int, dict[str, tuple[Any, Any]]]]:
    """``(i, j, difference)`` for each pair of ``passes`` whose ``uuid()`` Inductor puts into its cache key alike
    (:func:`inductor_key`) while their instance attributes differ (:func:`differing_state`): one is served the
    graph the other compiled wherever that state changes what the pass does. Found without compiling.

    >>> from tests.compile_cache_passes import FileHashFloor, KeyedFloor
    >>> same_key_pairs([FileHashFloor(0.0), FileHashFloor(0.5)]), same_key_pairs([KeyedFloor(0.0), KeyedFloor(0.5)])
    ([(0, 1, {'floor': (0.0, 0.5)})], [])
    """
    keys = [inductor_key(p.uuid()) for p in passes]
    return [(i, j, difference) for j in range(len(passes)) for i in range(j)
            if keys[i] == keys[j] and not isinstance(keys[i], str)
            and (difference := differing_state(passes[i], passes[j]))]


def _same_key(setup: PassSet) -> tuple[str, dict[str, Any]]:
    """The warning of :func:`same_key_pairs` in words (or "") and as details (or none)."""
    pairs = same_key_pairs(setup.passes)
    if not pairs:
        return "", {}
    i, j, difference = pairs[0]
    more = f" ({len(pairs)} such pairs)" if len(pairs) > 1 else ""
    warning = (f"\nWARNING: passes[{i}] and passes[{j}] get the same cache key from uuid() while their "
               f"{describe_state(difference)}{more}: if that changes what the pass does, Inductor serves one of them "
               f"the graph the other compiled. {STALE}'s compiles show whether it does on this model")
    return warning, {"same_key": [{"passes": [a, b], "differ": {name: [short_repr(v, 60) for v in values]
                                                               for name, values in differ.items()}}
                                  for a, b, differ in pairs]}


def _unpicklable(setup: PassSet, values: list[Any], i: int, error: str) -> str:
    """Why ``values[i]``, a uuid that does not pickle, breaks the cache, as Inductor's cache pickler treats it."""
    key = inductor_key(values[i])
    if isinstance(key, str):
        effect = f"Inductor cannot put it in its cache key and bypasses the FX graph cache ('{key}', see {BYPASS})"
    else:
        alike = sum(inductor_key(v) == key for v in values)
        effect = ("Inductor's cache pickler falls back to keying it by its type and its name/value attributes only, "
                  f"whatever it holds ({alike} of the {len(values)} instances get the same key here), so instances "
                  f"whose state differs share cache entries (see {STALE})")
    return (f"{type(setup.passes[i]).__qualname__}.uuid() returns a {type(values[i]).__qualname__} (passes[{i}]: "
            f"{short_repr(values[i], 60)}), which does not pickle ({error}): {effect}. Return a picklable value: bytes or "
            "str (a hashlib digest is `.digest()` / `.hexdigest()`, not the hash object), numbers, tuples of them")


def inductor_key(value: Any) -> bytes | str:
    """``value`` as Inductor's FX graph cache pickles it into its key (a pass's ``uuid()``), or the reason it
    bypasses the cache instead. A value that does not pickle is keyed by its type and ``name`` / ``value``
    attributes only, when it has them.

    >>> inductor_key(b"code") == inductor_key(b"code"), inductor_key(b"code") == inductor_key(b"other")
    (True, False)
    >>> import hashlib
    >>> inductor_key(hashlib.sha256(b"code")) == inductor_key(hashlib.sha256(b"other"))  # both keyed as 'sha256'
    True
    >>> inductor_key(lambda: 0)
    'Failed to pickle cache key'
    """
    logger = logging.getLogger("torch._inductor.codecache")
    disabled, logger.disabled = logger.disabled, True  # its warning with a traceback: the reason says it
    try:
        return FxGraphCachePickler(torch.fx.GraphModule(nn.Module(), torch.fx.Graph())).dumps(value)
    except BypassFxGraphCache as exc:
        return str(exc)
    finally:
        logger.disabled = disabled


def uuid_digests(spec: str) -> list[dict[str, str]]:
    """For each pass ``spec`` names: the sha256 of its pickled ``uuid()`` and the value's repr, or the ``error`` it
    raised. Run in the fresh processes of the ``graph-cache-uuid`` aspect (``python -m fxverify.compile.graph_cache
    SPEC`` prints it as JSON).

    >>> uuid_digests("tests.compile_cache_passes:keyed_floors")[1]  # doctest: +SKIP
    {'sha256': '5c0e...', 'repr': "(b'...', 0.5)"}
    """
    found = []
    for graph_pass in load_passes(spec):
        try:
            value = graph_pass.uuid()
            found.append({"sha256": hashlib.sha256(pickle.dumps(value)).hexdigest(), "repr": short_repr(value, 60)})
        except Exception as exc:
            found.append({"error": exception_summary(exc)})
    return found


@contextlib.contextmanager
def _uuids_across_processes(spec: str | None, timeout: float | None) -> Iterator[Callable[[], Digests | str]]:
    """Starts ``uuid_digests(spec)`` in a fresh process per seed of :data:`HASH_SEEDS` (none without a spec) and
    yields a function that waits for their answers, or says why there are none; kills what still runs on exit."""
    path = os.pathsep.join(p for p in sys.path if p)
    processes = {} if spec is None else {
        seed: subprocess.Popen([sys.executable, "-m", __name__, spec], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": path})
        for seed in HASH_SEEDS}

    def answers() -> Digests | str:
        found: Digests = {}
        for seed, process in processes.items():
            try:
                out, err = process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                return f"the process with PYTHONHASHSEED={seed} did not finish within {timeout:g} s"
            if process.returncode != 0:
                return f"the process with PYTHONHASHSEED={seed} exited {process.returncode}: {err.strip()[-600:]}"
            found[seed] = json.loads(out.strip().splitlines()[-1])
        return found

    try:
        yield answers
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
            process.communicate()


def _stability(setup: PassSet, across: Digests | str) -> dict[str, Any]:
    if isinstance(across, str):
        raise Skip(f"uuid() is set and pickles, but computing it in fresh processes failed, so its stability is not "
                   f"known: {across}")
    first, second = (across[seed] for seed in HASH_SEEDS)
    details = {f"PYTHONHASHSEED={seed}": values for seed, values in across.items()}
    raised = next((f"passes[{i}]: {entry['error']}" for i, entry in enumerate(first) if "error" in entry), None)
    if raised:
        raise Skip(f"uuid() raised in a fresh process that imported {setup.spec!r} ({raised}) though not in this one: "
                   "it needs state this process set up, so its stability is not known; make the spec build the passes "
                   "alone", details=details)
    for i, (ours, theirs) in enumerate(zip(first, second)):
        if ours != theirs:
            seeds = " and ".join(f"PYTHONHASHSEED={seed}: {v.get('repr') or v.get('error')}"
                                 for seed, v in zip(HASH_SEEDS, (ours, theirs)))
            raise Finding(
                f"{type(setup.passes[i]).__qualname__}.uuid() of passes[{i}] differs between two fresh processes "
                f"({seeds}): the cache key changes with every process, so no compile ever reads an entry another "
                "process wrote (results stay right, every compile runs cold). The usual causes are hash() of a str or "
                "bytes, a set's order, id() or an address in the value: hash text with hashlib instead "
                "(get_hash_for_files((__file__,)) for the code)", input=setup.input_text(), details=details)
    warning, same = _same_key(setup)
    return {**details, **same, NOTE: f"uuid() is set, pickles and is the same under PYTHONHASHSEED="
                                     f"{' and '.join(HASH_SEEDS)} for all {len(first)} instances{warning}"}


# -- compiles ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Compiled:
    """One compile of the model with one pass in its hook, and one run of it."""

    outputs: Any
    received: tuple[str, ...]  # the graphs the pass was given, as canonical text (none when the cache served it)
    graphs: tuple[str, ...]  # the graphs the pass left
    ops: tuple[str, ...]  # the ops the graphs it was given call
    counts: dict[str, int]  # what the compile added to counters["inductor"]: fxgraph_cache_hit, _miss, _bypass
    bypass_reasons: tuple[str, ...]  # Inductor's reasons for each bypass
    seconds: float

    @property
    def changed(self) -> bool:
        """The pass ran and left some graph other than it was given."""
        return self.graphs != self.received


class _GraphRecorder(CustomGraphPass):
    """Keeps each graph it is called on, as canonical text, and the ops it calls: before the pass in its hook, the
    graphs the pass is given; after it, those it left. No graph means the pass never ran (a cache hit)."""

    def __init__(self) -> None:
        self.graphs: list[str] = []
        self.ops: set[str] = set()

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.graphs.append(canonical_text(graph))
        self.ops.update(target_name(n).removeprefix("torch.ops.") for n in graph.nodes if n.op == "call_function")

    def uuid(self) -> str:
        return "fxverify.compile.graph_cache._GraphRecorder"


class _BypassReasons(logging.Filter):
    """On Inductor's cache logger, lowered to INFO: keeps the reason of each "Bypassing FX Graph Cache" record
    and drops the records below the level the logger had, which it would not have let through."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level
        self.reasons: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Bypassing FX Graph Cache"):
            self.reasons.append(str(record.args[0]) if isinstance(record.args, tuple) and record.args
                                else record.getMessage())
        return record.levelno >= self.level


@contextlib.contextmanager
def _bypass_reasons() -> Iterator[list[str]]:
    logger = logging.getLogger("torch._inductor.codecache")
    keeper, level = _BypassReasons(logger.getEffectiveLevel()), logger.level
    logger.addFilter(keeper)
    logger.setLevel(min(logging.INFO, logger.getEffectiveLevel()))
    try:
        yield keeper.reasons
    finally:
        logger.setLevel(level)
        logger.removeFilter(keeper)


def _compile(setup: PassSet, graph_pass: CustomGraphPass | None, *, cached: bool) -> _Compiled:
    """Compile the model afresh with ``graph_pass`` alone in the hook (with the cache, or with caches disabled),
    and run it once with the RNG seeded."""
    given, left = _GraphRecorder(), _GraphRecorder()
    torch._dynamo.reset()
    clear_caches()
    before = collections.Counter(counters["inductor"])
    patch = {setup.hook: [p for p in (given, graph_pass, left) if p is not None], "fx_graph_cache": cached,
             "fx_graph_remote_cache": False, "force_disable_caches": not cached}
    start = time.perf_counter()
    with inductor_config.patch(patch), _bypass_reasons() as reasons, torch.no_grad(), \
            torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dynamo_pgo's "force disabled by force_disable_caches", and the like
        torch.manual_seed(0)
        outputs = call_with_timeout(lambda: torch.compile(setup.compiles.module)(*setup.compiles.inputs), (), setup.timeout)
    added = collections.Counter(counters["inductor"])
    added.subtract(before)
    return _Compiled(outputs, tuple(given.graphs), tuple(left.graphs), tuple(sorted(given.ops)),
                     {k: v for k, v in sorted(added.items()) if v > 0}, tuple(reasons), time.perf_counter() - start)


class _CompileRaised(Exception):
    def __init__(self, index: int | None, cached: bool, why: str) -> None:
        super().__init__(why)
        self.index, self.cached, self.why = index, cached, why


def _guarded(setup: PassSet, index: int | None, *, cached: bool) -> _Compiled:
    graph_pass = None if index is None else setup.passes[index]
    try:
        return _compile(setup, graph_pass, cached=cached)
    except CallTimedOut:
        raise _CompileRaised(index, cached, f"did not finish within {setup.timeout:g} s (if it is just slow, raise "
                                            "timeout=)") from None
    except Exception as exc:
        raise _CompileRaised(index, cached, f"raised {exception_summary(exc)}") from exc


def _compile_all(setup: PassSet) -> tuple[list[_Compiled], dict[int, _Compiled]] | _CompileRaised:
    with fresh_cache():  # an exception leaving it would keep its folder
        try:
            cached = [_guarded(setup, i, cached=True) for i in range(len(setup.passes))]
            return cached, {i: _guarded(setup, i, cached=False) for i in range(1, len(setup.passes))}
        except _CompileRaised as raised:
            return raised


def _raised(setup: PassSet, raised: _CompileRaised) -> NoReturn:
    """A compile raised: the pass's doing when the model compiles without it, else the model's."""
    doing = f"compiling the model with passes[{raised.index}] " + ("" if raised.cached else "and caches disabled ")
    with fresh_cache():
        try:
            _guarded(setup, None, cached=False)
        except _CompileRaised as alone:
            raise Skip(f"{doing}{raised.why}, and the model does not compile without the pass either ({alone.why}): "
                       "give a model that torch.compile takes") from None
    raise Finding(f"{doing}{raised.why}, while it compiles without the pass: the pass breaks the compile",
                  input=setup.input_text())


# -- graph-cache-stale and graph-cache-bypass ---------------------------------------------------------------------


def _stale(setup: PassSet, cached: list[_Compiled], fresh: dict[int, _Compiled]) -> dict[str, Any]:
    details = {"compiles": _compile_details(cached, fresh)}
    for i, alone in fresh.items():
        mismatch = compare_trees(cached[i].outputs, alone.outputs)
        if mismatch is None:
            continue
        if cached[i].graphs:  # the pass ran in both compiles
            raise Skip(f"passes[{i}] compiled with the cache and with caches disabled gives different outputs "
                       f"({mismatch.describe()}), and the cache served neither compile: the pass or the model is not "
                       "deterministic, which says nothing of the cache; check that the model gives the same output "
                       "twice", details=details)
        _stale_failure(setup, cached, fresh, i, mismatch, details)
    if all(c.counts.get("fxgraph_cache_bypass") for c in cached[1:]):
        raise Skip(f"Inductor bypassed the FX graph cache (see {BYPASS}): no entry was written or read, so none could "
                   "go stale", details=details)
    ran = {0: cached[0], **fresh}  # a compile in which each instance ran: the first's into the empty cache, the others'
    #                                 with caches disabled
    if not any(c.changed for c in ran.values()):
        raise Skip(_proved_nothing(setup, ran), details=details)
    same = [(i, j, difference) for i, j, difference in same_key_pairs(setup.passes) if ran[i].graphs == ran[j].graphs]
    if same:
        i, j, difference = same[0]
        raise Skip(
            f"proved nothing for passes[{i}] and passes[{j}]: they get the same cache key from uuid() while their "
            f"{describe_state(difference)}, and leave the same graph on {setup.compiles.name}, so a stale entry could "
            "not show here. If what differs does not change what the pass does, this is fine; else give a model whose "
            "graph it changes (model=, or --fxverify-graph-cache-model in pytest)", details=details)
    return {**details, NOTE: f"each of {len(fresh)} later instance(s), compiled after the others into one fresh FX "
                             "graph cache, gives the output it gives with caches disabled"}


def _proved_nothing(setup: PassSet, ran: dict[int, _Compiled]) -> str:
    """Why the stale aspect proves nothing where no instance changed the model's graph, and what to give instead."""
    ops = sorted({op for c in ran.values() for op in c.ops})
    listed = ", ".join(ops[:12]) + (f" and {len(ops) - 12} more" if len(ops) > 12 else "")
    pairs = same_key_pairs(setup.passes)
    untold = "" if not pairs else (
        f" Whether passes[{pairs[0][0]}] and passes[{pairs[0][1]}], which get the same cache key from uuid() while "
        f"their {describe_state(pairs[0][2])}, share a stale entry is not known (see {UUID})")
    return (f"proved nothing: none of the {len(ran)} instances changed the graph of {setup.compiles.name} (it calls "
            f"{listed or 'no op'}), so each one's compiled graph computes what any other's would, and a stale entry "
            "could not show. Give a model holding the ops the passes rewrite: model= (a corpus "
            "entry's name, or 'package.module:factory' returning (module, inputs)), or --fxverify-graph-cache-model "
            f"in pytest.{untold}")


def _stale_failure(setup: PassSet, cached: list[_Compiled], fresh: dict[int, _Compiled], i: int, mismatch: Mismatch,
                   details: dict[str, Any]) -> NoReturn:
    key = inductor_key(setup.passes[i].uuid())
    j = next((j for j in range(i) if inductor_key(setup.passes[j].uuid()) == key
              and compare_trees(cached[i].outputs, cached[j].outputs) is None), None)
    name = type(setup.passes[i]).__qualname__
    if j is None:  # served from the cache, but not one of the entries these passes wrote
        raise Finding(f"passes[{i}] got a cache hit and was never called, and the output served differs from its output "
                      f"with caches disabled; uuid() ({short_repr(setup.passes[i].uuid(), 60)}) misses some state the "
                      "pass reads", input=setup.input_text(), where=mismatch.describe(), details=details)
    difference = differing_state(setup.passes[j], setup.passes[i])
    state = describe_state(difference)
    fix = (f"put {', '.join(f'`{n}`' for n in difference)} into uuid(), e.g. `"
           + FIX.format(state=", ".join(f"self.{n}" for n in difference)) + "`") if difference else (
        "the state that differs is no instance attribute (a class attribute, a global, a helper module's code, a "
        "config value): put it into uuid(), e.g. hash the helper module's file with get_hash_for_files")
    finding = (
        f"{name}.uuid() is equal for instances whose {state} (passes[{j}] and passes[{i}]): compiled after passes[{j}] "
        f"into the same fresh FX graph cache, passes[{i}] got a cache hit (fxgraph_cache_hit) and was never called, so "
        f"Inductor ran the graph passes[{j}] produced, and its output differs from passes[{i}] compiled with caches "
        f"disabled. uuid() must name every state the pass reads: {fix}")
    raise Finding(finding, input=setup.input_text(), where=mismatch.describe(),
                  node=_first_node(cached[j].graphs, fresh[i].graphs, j, i), details=details)


def _first_node(served: Sequence[str], own: Sequence[str], j: int, i: int) -> str | None:
    """The first line where the graph passes[j] left (served from the cache) and the one passes[i] leaves differ."""
    for ours, theirs in zip("\n".join(served).splitlines(), "\n".join(own).splitlines()):
        if ours != theirs:
            return f"{ours.strip()}  (served, as passes[{j}] left it)\n{theirs.strip()}  (as passes[{i}] leaves it)"
    return None


def _compile_details(cached: list[_Compiled], fresh: dict[int, _Compiled]) -> list[dict[str, Any]]:
    runs = [(i, "on", c) for i, c in enumerate(cached)] + [(i, "disabled", c) for i, c in fresh.items()]
    return [{"pass": i, "cache": cache, "seconds": round(c.seconds, 3), **c.counts} for i, cache, c in runs]


def _bypass(setup: PassSet, cached: list[_Compiled]) -> dict[str, Any]:
    bypasses = sum(c.counts.get("fxgraph_cache_bypass", 0) for c in cached)
    details = {"fxgraph_cache_bypass": bypasses, "compiles": _compile_details(cached, {})}
    if not bypasses:
        hits = sum(c.counts.get("fxgraph_cache_hit", 0) for c in cached)
        return {**details, NOTE: f"Inductor used the FX graph cache in all {len(cached)} compiles "
                                 f"(fxgraph_cache_bypass 0, fxgraph_cache_hit {hits})"}
    reasons = sorted({r for c in cached for r in c.bypass_reasons})
    text = "; ".join(reasons) or "(no reason logged)"
    uuids = [p.uuid() for p in setup.passes]
    if not all(uuids):
        cause = f"the pass's uuid() is None or falsy (see {UUID})"
    elif any(isinstance(inductor_key(u), str) for u in uuids):
        cause = f"the pass's uuid() does not go into a cache key (see {UUID})"
    else:
        cause = "not the pass's doing: the model's graph is one Inductor does not cache; give another model"
    seconds = ", ".join(f"{c.seconds:.2f}" for c in cached)
    raise Skip(f"warning: Inductor bypassed the FX graph cache {bypasses} time(s) in {len(cached)} compiles "
               f"(fxgraph_cache_bypass={bypasses}) because: {text}. Cause: {cause}. Every compile with the pass runs "
               f"cold (compiles took {seconds} s here)", details={**details, "reasons": reasons})


if __name__ == "__main__":  # the fresh processes of the graph-cache-uuid aspect
    print(json.dumps(uuid_digests(sys.argv[1])))
