"""Pattern fuzzing: ``check_patterns`` runs each pattern of an Inductor pattern-matcher pass on the
variants of its search function (:mod:`~fxverify.compile.pattern_variants`) and judges every rewrite.

**Soundness** (``patterns-sound``): wherever the pattern fired, the rewritten program must lint (every
node defined before its use) and compute what the program did: outputs compared with the
un-rewritten program by fxverify's float64 rule (the rewritten error against a float64 run of the
program may not exceed a small multiple of the program's own), or, where the replacement's kernel
cannot run here (a CUDA-only fused op on a CPU machine), each output's dtype and shape from fake
tensors. A training pattern (``joint_fwd_bwd``) is judged on the joint graph of each variant's forward: its
outputs and the gradient of each input, on drawn tangents; where the program draws random numbers (dropout),
which a replacement draws otherwise, by dtype and shape. Differences below ``ROUNDING`` of an output's scale
are rounding (a fused kernel computes in another order). A targeted sweep runs first (each variant
family alone: coinciding sizes, dtypes, strides, then each single edit, then each edit at each
coinciding size); then Hypothesis draws combinations
and shrinks a failing one. The property is an ordinary Hypothesis test (:func:`soundness_test`), so
a campaign can run it under HypoFuzz and share failing variants through an example database.

**Completeness** (``patterns-complete``): whether the pattern fired on its own search function and
on each equivalent spelling, as a matrix: other sizes, every floating input in another dtype, the operands of
a commutative op the search function writes swapped, inputs defined late, and the spellings its author
declares with :func:`also_spelled` (a custom op against its native implementation, a mutable op). Mixed
dtypes, other layouts, broadcasts and operand orders inside one op's decomposition are for soundness only.
Not firing on its own search function fails, and so does not firing at a hook the registration's contract
names (``captures=("inductor_post",)``: each variant is traced as that hook receives graphs); not firing on
a spelling its contract promises (``rewrites_spellings``, ``dtypes``: a :class:`Promise`) fails; on another,
warns.

>>> import torch
>>> from torch._inductor.pattern_matcher import fwd_only, register_replacement
>>> def double(pass_dict):
...     register_replacement(lambda x: x + x, lambda x: x * 2, [torch.randn(4, 3)], fwd_only, pass_dict)
>>> [(r.check, r.outcome.value) for r in check_patterns(double, max_examples=5)]
[('patterns-sound', 'passed'), ('patterns-complete', 'passed')]
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import hashlib
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from hypothesis.database import ExampleDatabase
from torch import fx
from torch.utils import _pytree as pytree

from fxverify import checks as registry
from fxverify.analysis.compare import Tolerance, compare_trees
from fxverify.compile.pattern_sources import PatternExample, pattern_contract, pattern_examples
from fxverify.compile.pattern_variants import (
    LOW_PRECISION,
    SPELLINGS,
    Edit,
    Variant,
    build,
    compiled_trace,
    copied,
    dtype_options,
    edits_of,
    fake_outputs,
    forward_trace,
    hook_name,
    hooks,
    quiet,
    size_options,
    traces_joint,
    uniform_dtype,
)
from fxverify.core.contracts import SPELLING_FAMILIES
from fxverify.core.results import NOTE, CheckResult, Finding, exception_summary
from fxverify.core.transform import load_object
from fxverify.engine import judging
from fxverify.errors import TransformLoadError
from fxverify.inductor.aot import aot_roles

SOUND, COMPLETE = "patterns-sound", "patterns-complete"  # its checks (the registry's)
SWEEP_LIMIT = 600  # targeted variants per pattern, before Hypothesis draws combinations
# a replacement computes in another order (a fused kernel, x * (1 / s) for x / s): on drawn inputs, some of them
# ill-conditioned (a softmax of logits scaled by -8), rounding differences up to this fraction of an output's scale pass
ROUNDING = Tolerance(range_tol=1e-5)
# the edits a sweep tries first: arguments the matcher wildcards, then spellings, then structure
EDIT_ORDER = ("dims", "dim", "sizes", "scalar", "swap", "inner_swap", "late_input", "extra_user")
EDIT_FAMILY = {"swap": "operand_orders", "late_input": "late_inputs"}  # the spelling families of edit kinds
JUDGED_BY = {"values": "its outputs against the un-rewritten program's (float64 rule)",
             "fake": "fake tensors' dtype and shape (the replacement has no kernel here)",
             "structure": "torch.fx's graph.lint()", "raised": "the pass raising on a valid program",
             "random": "fake tensors' dtype and shape (the program draws random numbers, which the replacement "
                       "draws otherwise, so values cannot be compared)"}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What became of one variant: whether the pattern fired, and what is wrong with the rewrite (``problem``,
    the ``node`` the rewrite inserted first, ``how`` it was judged: a key of :data:`JUDGED_BY`)."""

    fired: bool
    problem: str | None = None
    node: str | None = None
    how: str = ""


class UnsoundRewrite(AssertionError):
    """A pattern fired on a variant and rewrote it wrongly (raised inside the Hypothesis property)."""

    def __init__(self, pattern: PatternExample, variant: Variant, verdict: Verdict) -> None:
        self.pattern, self.variant, self.verdict = pattern, variant, verdict
        super().__init__(f"pattern {pattern.name} fired on variant [{variant.describe()}] and {verdict.problem}")

    def __reduce__(self) -> tuple[Any, ...]:  # Hypothesis may copy the error it reports
        return (UnsoundRewrite, (self.pattern, self.variant, self.verdict))


@dataclasses.dataclass(frozen=True)
class Promise:
    """What a registering function promises ``patterns-complete`` (read from its contract by
    :func:`promises_every_spelling`): ``spellings``, the families of
    :data:`~fxverify.core.contracts.SPELLING_FAMILIES` each of its patterns fires on, and ``dtypes``, the dtypes it
    fires on with every floating input in one of them. Missing a promised spelling fails; missing another is a
    warning.

    >>> Promise(frozenset({"operand_orders"})).covers("operand_orders"), Promise().covers("sizes")
    (True, False)
    >>> Promise(dtypes=("bfloat16",)).covers("dtypes", "bfloat16")
    True
    """

    spellings: frozenset[str] = frozenset()
    dtypes: tuple[str, ...] = ()

    @classmethod
    def every(cls) -> Promise:
        """Every family, and bfloat16 (``check_patterns(complete=True)``)."""
        return cls(frozenset(SPELLING_FAMILIES), (str(LOW_PRECISION).removeprefix("torch."),))

    def covers(self, family: str, dtype: str | None = None) -> bool:
        """Whether a spelling of ``family`` (``dtypes``: in ``dtype``) is promised."""
        return dtype in self.dtypes if family == "dtypes" else family in self.spellings

    def describe(self) -> str:
        """The promise as its contract says it, e.g. ``rewrites_spellings=operand_orders dtypes=bfloat16``."""
        parts = [f"rewrites_spellings={'+'.join(sorted(self.spellings))}"] if self.spellings else []
        parts += [f"dtypes={'+'.join(self.dtypes)}"] if self.dtypes else []
        return " ".join(parts) or "nothing"


OWN = "own"  # the family of the search function's own program: it must fire there, promised or not


class Fuzzer:
    """The variants of one pattern and their verdicts (kept, so the sweep, the property and the
    completeness matrix judge each variant once). Every variant is traced as the first hook the pattern is
    declared for receives graphs (``pattern.hooks``), or as its ``trace_fn`` traces it."""

    about = "the pattern"

    def __init__(self, pattern: PatternExample, promise: Promise = Promise(), *, spec: str = "",
                 max_examples: int = 100, budget_s: float = 60.0, repro_dir: str | os.PathLike[str] | None = None,
                 database: ExampleDatabase | None = None) -> None:
        self.pattern, self.promise = pattern, promise
        self.spec = spec or pattern.name  # the patterns' spec: a repro file is written only where it loads them back
        self.max_examples, self.budget_s, self.repro_dir, self.database = max_examples, budget_s, repro_dir, database
        self.hook = pattern.hooks[0] if pattern.hooks else None
        self.example = pattern.traced_inputs()
        self.edits: list[Edit] = edits_of(forward_trace(pattern.trace_fn)(pattern.search_fn, list(self.example)))
        self.sizes = size_options(self.example)
        self.dtypes = dtype_options(self.example, uniform=promise.dtypes)
        self.tensors = [i for i, value in enumerate(self.example) if isinstance(value, torch.Tensor) and value.dim()]
        scalars = any(isinstance(value, torch.Tensor) and value.dim() == 0 for value in self.example)
        self.numbers = (False, True) if scalars else (False,)
        self.verdicts: dict[Variant, Verdict | None] = {}

    # the subject, as results and messages name it (fxverify.engine.judging.Judged)

    @property
    def model(self) -> str:
        return self.pattern.name

    @property
    def under_test(self) -> str:
        return self.spec

    @property
    def capture(self) -> str:
        """The Inductor capture each variant is traced as (the first hook the pattern is declared for)."""
        return self.hook or "inductor"

    def header(self) -> list[tuple[str, str]]:
        return [("pattern", self.pattern.name), ("patterns", self.spec)]

    def not_applicable(self, check: str) -> None:
        return None

    def reproduce(self, check: str) -> None:
        return None  # a failing variant's repro file is named in the finding

    def judge(self, variant: Variant) -> Verdict | None:
        """The verdict on ``variant``, or None where it is no program."""
        if variant not in self.verdicts:
            self.verdicts[variant] = judge(self.pattern, variant)
        return self.verdicts[variant]

    def matrix(self) -> list[tuple[Variant, str]]:
        """The completeness matrix: each variant spelling the search function's computation as users' programs do,
        with its family (:data:`OWN`, or one of ``SPELLING_FAMILIES``, or ``dtypes``): its own program (0-dim inputs
        as tensors and as Python numbers, where it has any), then at other sizes, with every floating input in
        another dtype, each commutative op it writes with its operands swapped, an input computed late, and each
        spelling its author declared, each in the spellings of 0-dim inputs it fires on as registered. Mixed
        dtypes, other layouts, broadcasts and operand orders inside one op's decomposition are no spellings a
        pattern owes (an extra_check declining a kernel's precondition is right): soundness only."""
        own = [(Variant(numbers=n, hook=self.hook), OWN) for n in self.numbers]
        families = [*((Variant(sizes=s), "sizes") for s in self.sizes[1:]),
                    *((Variant(dtypes=d), "dtypes") for d in self.dtypes[1:] if uniform_dtype(d, self.example)),
                    *((Variant(edits=(e,)), EDIT_FAMILY[e.kind]) for e in self.edits if e.kind in EDIT_FAMILY),
                    *((Variant(spelling=label), "declared") for label in self.pattern.spellings)]
        return [*own, *((dataclasses.replace(v, numbers=n, hook=self.hook), family)
                        for v, family in families for n in self.firing())]

    def firing(self) -> list[bool]:
        """The spellings of 0-dim inputs (tensors, Python numbers) the pattern fires on as registered (all where
        it fires on none)."""
        fired = [n for n in self.numbers if (self.judge(Variant(numbers=n, hook=self.hook)) or Verdict(False)).fired]
        return fired or list(self.numbers)

    def sweep(self) -> list[Variant]:
        """The targeted variants, simplest first: the completeness matrix, the variants for soundness only (mixed
        dtypes, other layouts, broadcasts), each edit alone, then each edit at each coinciding size and in each
        dtype, the edits of wildcarded arguments first. Variants keep the spellings of 0-dim inputs the pattern
        fires on as registered."""
        firing = self.firing()
        mixed = [Variant(dtypes=d) for d in self.dtypes[1:] if not uniform_dtype(d, self.example)]
        layouts = [Variant(strided=i) for i in self.tensors if self.example[i].dim() >= 2]
        alone = [*(v for v, _ in self.matrix()),
                 *(dataclasses.replace(v, numbers=n) for v in (*mixed, *layouts, *(Variant(broadcast=i) for i in self.tensors))
                   for n in firing)]
        edits = sorted(self.edits, key=lambda edit: EDIT_ORDER.index(edit.kind))
        edited = [Variant(numbers=n, edits=(edit,)) for edit in edits for n in firing]
        edited += [Variant(sizes=s, numbers=n, edits=(edit,)) for edit in edits for s in self.sizes[1:] for n in firing]
        edited += [Variant(dtypes=d, numbers=n, edits=(edit,)) for edit in edits for d in self.dtypes[1:] for n in firing]
        return [dataclasses.replace(v, hook=self.hook) for v in [*alone, *edited][:SWEEP_LIMIT]]

    def variants(self) -> st.SearchStrategy[Variant]:
        """Hypothesis's strategy over combinations of every family; it shrinks towards the example inputs
        and fewer edits."""
        optional = st.sampled_from([None, *self.tensors])
        edits = st.lists(st.sampled_from(self.edits), max_size=2, unique=True).map(tuple) if self.edits else st.just(())
        return st.builds(Variant, sizes=st.sampled_from(self.sizes), dtypes=st.sampled_from(self.dtypes),
                         strided=optional, broadcast=optional, numbers=st.sampled_from(self.numbers), edits=edits,
                         hook=st.just(self.hook))


def judge(pattern: PatternExample, variant: Variant) -> Verdict | None:
    """Apply ``pattern`` (its pass alone) to the program ``variant`` describes; the verdict, or None where the
    variant is no well-typed program."""
    with quiet():
        return _judged(pattern, variant)


def _judged(pattern: PatternExample, variant: Variant) -> Verdict | None:
    search, trace_fn = pattern.search_fn, pattern.trace_fn
    if variant.spelling is not None:  # a spelling declared by the author: traced as torch.compile hands it over
        search = pattern.spellings[variant.spelling]
        trace_fn = trace_fn if traces_joint(trace_fn) else compiled_trace
    built = build(search, trace_fn, pattern.traced_inputs(), variant)
    if built is None:
        return None
    program, inputs = built
    rewritten = copied(program)
    before = {node.name for node in program.graph.nodes}
    try:
        fired = bool(pattern.matcher.apply(rewritten.graph))
    except Exception as exc:  # the pass crashing on a valid program is the finding
        return Verdict(True, f"the pass raised {exception_summary(exc)} on it", how="raised")
    if not fired:
        return Verdict(False)
    inserted = [node for node in rewritten.graph.nodes if node.name not in before and node.op == "call_function"]
    first = _named(inserted[0]) if inserted else None
    try:
        rewritten.graph.lint()
        rewritten.recompile()
    except Exception as exc:  # a graph torch.fx rejects
        return Verdict(True, f"left a graph torch.fx rejects: {exception_summary(exc)}", first, "structure")
    if _draws_random(program):  # the replacement draws its random numbers otherwise: values differ either way
        return Verdict(True, _meta_difference(program, rewritten, inputs), first, "random")
    expected = program(*inputs)
    try:
        actual = rewritten(*inputs)
    except Exception as exc:  # e.g. a fused op with a fake kernel only: judge meta
        problem = _meta_difference(program, rewritten, inputs)
        if problem is None and not _runs_nowhere(exc):
            problem = f"the rewritten program raised {exception_summary(exc)}"
        return Verdict(True, problem, first, "fake")
    found = compare_trees(_labelled(program, actual), _labelled(program, expected), tolerance=ROUNDING,
                          fp64_expected=lambda: _labelled(program, _in_float64(program)(*_upcast(inputs))))
    if found is None:
        return Verdict(True)
    replaced = sorted(before - {node.name for node in rewritten.graph.nodes})
    return Verdict(True, f"changed the result: {found.describe()} (it replaced {_listed(['%' + n for n in replaced])} "
                         f"by {_listed([_named(n) for n in inserted]) or 'nothing'})", first, "values")


def _listed(items: list[str], limit: int = 6) -> str:
    """``items`` joined, the first ``limit`` and how many more."""
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _named(node: fx.Node) -> str:
    return f"%{node.name} ({node.target})"


def _labelled(program: fx.GraphModule, outputs: Any) -> Any:
    """A joint graph's flat outputs named by what AOTAutograd says each is (``{"output 0": ..., "gradient of input
    1": ...}``), so a finding says whether the forward or the backward went wrong; another program's as they are."""
    descriptions = program.graph.output_node().meta.get("desc")
    if not descriptions or not isinstance(outputs, (list, tuple)) or len(outputs) != len(descriptions):
        return outputs
    _, gives = aot_roles(program)
    words = {"output": "output {}", "grad": "gradient of input {}"}
    named = {}
    for (kind, index), value in zip(gives, outputs):
        if kind in words:
            named[words[kind].format(index)] = value
        elif value is not None:
            named[f"other {len(named)}"] = value
    return named


def _draws_random(program: fx.GraphModule) -> bool:
    """Whether ``program`` calls a seeded random op (dropout's ``rand`` in a training pattern's joint graph)."""
    return any(torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())
               for node in program.graph.nodes if node.op == "call_function")


def _runs_nowhere(exc: Exception) -> bool:
    """Whether ``exc`` says an op has no kernel here (a replacement for another device), not that it failed."""
    text = str(exc)
    return isinstance(exc, NotImplementedError) or "Could not run" in text or "no kernel" in text


def _meta_difference(program: fx.GraphModule, rewritten: fx.GraphModule, inputs: list[Any]) -> str | None:
    """How the rewritten program's outputs differ in dtype or shape from the program's, run on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)  # one mode for both: the same fake inputs
    try:
        expected = fake_outputs(program, inputs, mode)
        actual = fake_outputs(rewritten, inputs, mode)
    except Exception as exc:  # no fake kernel either: nothing left to judge with
        return f"cannot be judged: the rewritten program runs neither here nor on fake tensors ({exception_summary(exc)})"
    for i, (a, e) in enumerate(zip(pytree.tree_leaves(actual), pytree.tree_leaves(expected))):
        if isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor) and (a.dtype, a.shape) != (e.dtype, e.shape):
            return (f"changed output {i}'s meta['val']: expected {e.dtype} {tuple(e.shape)}, got {a.dtype} "
                    f"{tuple(a.shape)}")
    return None


def _in_float64(program: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``program`` computing in float64: every floating dtype argument of its nodes made float64."""
    copied = copy.deepcopy(program)
    widen = lambda value: torch.float64 if isinstance(value, torch.dtype) and value.is_floating_point else value
    for node in copied.graph.nodes:
        node.args = pytree.tree_map(widen, node.args)
        node.kwargs = pytree.tree_map(widen, node.kwargs)
    copied.recompile()
    return copied


def _upcast(inputs: list[Any]) -> list[Any]:
    return [value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value
            for value in inputs]


def soundness_test(fuzzer: Fuzzer, *, max_examples: int = 100, database: ExampleDatabase | None = None,
                   budget_s: float | None = None, sweep: bool = True) -> Callable[[], None]:
    """The soundness property of one pattern as a Hypothesis test: the targeted sweep as explicit examples
    (``sweep``), then ``max_examples`` drawn combinations; it raises :class:`UnsoundRewrite` for a failing
    variant, shrunk. Run it as a test (``test_my_pattern = soundness_test(Fuzzer(pattern))``) to fuzz for
    longer under HypoFuzz. ``budget_s``: stop drawing new variants after that many seconds."""
    started = time.monotonic()

    @settings(max_examples=max_examples, deadline=None, database=database, derandomize=database is None,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    @given(fuzzer.variants())
    def sound(variant: Variant) -> None:
        if budget_s is not None and time.monotonic() - started > budget_s:
            assume(variant in fuzzer.verdicts)  # out of time: only variants already judged
        verdict = fuzzer.judge(variant)
        assume(verdict is not None)
        assert verdict is not None
        if verdict.problem:
            raise UnsoundRewrite(fuzzer.pattern, variant, verdict)

    for variant in reversed(fuzzer.sweep() if sweep else []):
        sound = example(variant)(sound)
    sound.__name__ = sound.__qualname__ = f"test_{fuzzer.pattern.name}_is_sound"
    return sound


def check_patterns(patterns: Any, *, max_examples: int = 100, budget_s: float = 60.0,
                   complete: bool | Promise | None = None,
                   repro_dir: str | os.PathLike[str] | None = None, database: ExampleDatabase | None = None,
                   names: Sequence[str] | None = None, checks: Sequence[str] | None = None) -> list[CheckResult]:
    """Fuzz each pattern ``patterns`` registers: two results a pattern, ``patterns-sound`` and
    ``patterns-complete`` (see the module's docstring).

    ``patterns``: a function registering replacements into the ``PatternMatcherPass`` it is given,
    ``register_replacement``'s keyword arguments as ``(name, kwargs)`` pairs, or a spec string naming either.
    ``complete``: the spellings whose misses fail (a :class:`Promise`; True: every spelling, False: none, each
    miss a warning; default: the registering function's contract, ``@fxverify.contract(rewrites_spellings=(...),
    dtypes=(...))``, see :func:`promises_every_spelling`). A pattern's contract ``captures`` name the hooks it is
    for (``("inductor_post",)``): each variant is traced as that hook receives graphs.
    ``repro_dir``: where a failing variant's repro script is written (it needs ``patterns`` as a spec).
    ``names``: the patterns to fuzz (default: all); ``checks``: which of its checks to run (default: both).

    >>> import fxverify
    >>> from torch._inductor.pattern_matcher import fwd_only, register_replacement
    >>> def relu_to_clamp(pass_dict):
    ...     register_replacement(lambda x: x.relu(), lambda x: x.clamp_min(0.5), [torch.randn(4)], fwd_only, pass_dict)
    >>> found = fxverify.check_patterns(relu_to_clamp, max_examples=0)
    >>> found[0].outcome.value, found[0].node
    ('failed', '%clamp_min_default (aten.clamp_min.default)')
    """
    spec = patterns if isinstance(patterns, str) else getattr(patterns, "__qualname__", type(patterns).__name__)
    source = load_object(patterns, "patterns") if isinstance(patterns, str) else patterns
    complete = promises_every_spelling(source) if complete is None else complete
    return [result for pattern in pattern_examples(source, spec) if names is None or pattern.name in names
            for result in check_pattern(pattern, spec, max_examples=max_examples, budget_s=budget_s,
                                        complete=complete, repro_dir=repro_dir if isinstance(patterns, str) else None,
                                        database=database, checks=checks)]


def fuzzer_of(patterns: Any, name: str | None = None, *, max_examples: int = 100, budget_s: float = 60.0,
              complete: bool | Promise | None = None, repro_dir: str | os.PathLike[str] | None = None,
              database: ExampleDatabase | None = None) -> Fuzzer:
    """The :class:`Fuzzer` of pattern ``name`` of ``patterns`` (as :func:`check_patterns` takes them; ``name`` may be
    left out where they register one pattern): the subject of the pattern checks.

    >>> from torch._inductor.pattern_matcher import fwd_only, register_replacement
    >>> def double(pass_dict):
    ...     register_replacement(lambda x: x + x, lambda x: x * 2, [torch.randn(4, 3)], fwd_only, pass_dict)
    >>> fuzzer_of(double).header()
    [('pattern', 'lambda'), ('patterns', 'double')]
    """
    spec = patterns if isinstance(patterns, str) else getattr(patterns, "__qualname__", type(patterns).__name__)
    source = load_object(patterns, "patterns") if isinstance(patterns, str) else patterns
    found = {pattern.name: pattern for pattern in pattern_examples(source, spec)}
    if name is None and len(found) == 1:
        name = next(iter(found))
    if name not in found:
        raise TransformLoadError(f"patterns {spec} register {', '.join(found)}: name one of them"
                                 + (f" (not {name!r})" if name is not None else ""))
    complete = promises_every_spelling(source, spec) if complete is None else complete
    promise = complete if isinstance(complete, Promise) else Promise.every() if complete else Promise()
    return Fuzzer(found[name], promise, spec=spec, max_examples=max_examples, budget_s=budget_s,
                  repro_dir=repro_dir if isinstance(patterns, str) else None, database=database)


def pattern_subjects(spec: str, given: registry.Given) -> list[tuple[str, Callable[[], Fuzzer]]]:
    """The subjects of patterns ``spec`` in a run: a :class:`Fuzzer` of each pattern it registers (made when its
    first check runs), fuzzing within the run's time limit (at most the default 60 s) and writing a failing
    variant's repro file to ``given.repro_dir``."""
    source = load_object(spec, "patterns")
    promise = promises_every_spelling(source, spec)
    budget = 60.0 if given.timeout is None else min(60.0, given.timeout)
    return [(pattern.name, functools.partial(Fuzzer, pattern, promise, spec=spec, budget_s=budget,
                                             repro_dir=given.repro_dir))
            for pattern in pattern_examples(source, spec)]


def promises_every_spelling(source: Any, spec: str = "") -> Promise:
    """What the patterns ``source`` registers promise ``patterns-complete``, from the registering function's contract:
    ``@fxverify.contract(rewrites_spellings=("operand_orders", "declared"), dtypes=("float32", "bfloat16"))``
    promises both operand orders of each commutative op its search functions write, the spellings they declare
    (``fxverify.also_spelled``), and their programs in float32 and bfloat16. Nothing for another source. A
    contract declaring ``rewrites_every_occurrence=True`` (the ``variants`` check's promise) without
    ``rewrites_spellings`` raises :class:`~fxverify.errors.TransformLoadError` saying which to declare.

    >>> import fxverify
    >>> @fxverify.contract(rewrites_spellings=("operand_orders",))
    ... def register(pass_dict):
    ...     pass
    >>> promises_every_spelling(register).describe()
    'rewrites_spellings=operand_orders'
    """
    declared = pattern_contract(source, spec or getattr(source, "__qualname__", type(source).__name__))
    return Promise(frozenset(declared.rewrites_spellings or ()), declared.dtypes or ())


def check_pattern(pattern: PatternExample, spec: str, *, max_examples: int = 100, budget_s: float = 60.0,
                  complete: bool | Promise = False, repro_dir: str | os.PathLike[str] | None = None,
                  database: ExampleDatabase | None = None, checks: Sequence[str] | None = None) -> list[CheckResult]:
    """The results of ``checks`` on one pattern of the patterns ``spec`` names (see :func:`check_patterns`); a repro
    is written to ``repro_dir`` only where ``spec`` loads the patterns back. ``complete``: what its registration
    promises (:func:`promises_every_spelling`), True for every spelling."""
    promise = complete if isinstance(complete, Promise) else Promise.every() if complete else Promise()
    fuzzer = Fuzzer(pattern, promise, spec=spec, max_examples=max_examples, budget_s=budget_s, repro_dir=repro_dir,
                    database=database)
    return [judging.judge(name, registry.get(name), fuzzer) for name in registry.names(registry.PATTERN)
            if checks is None or name in checks]


def soundness(fuzzer: Fuzzer) -> dict[str, Any]:
    """``patterns-sound``: the sweep (every distinct kind of failure kept), then, where it found none, Hypothesis's
    combinations, within the fuzzer's budget."""
    spec, budget_s, max_examples = fuzzer.spec, fuzzer.budget_s, fuzzer.max_examples
    started = time.monotonic()
    failures: dict[tuple[str, frozenset[str]], UnsoundRewrite] = {}
    first_seconds: float | None = None
    for variant in fuzzer.sweep():
        if time.monotonic() - started > budget_s:
            break
        verdict = fuzzer.judge(variant)
        if verdict is not None and verdict.problem:
            key = (verdict.how, frozenset(edit.kind for edit in variant.edits) - SPELLINGS)
            failures.setdefault(key, UnsoundRewrite(fuzzer.pattern, variant, verdict))
            if first_seconds is None:  # the first failure of the sweep, however early
                first_seconds = round(time.monotonic() - started, 2)
    if not failures and max_examples and time.monotonic() - started < budget_s:
        try:
            soundness_test(fuzzer, max_examples=max_examples, database=fuzzer.database, sweep=False,
                           budget_s=budget_s - (time.monotonic() - started))()
        except UnsoundRewrite as found:
            failures[("", frozenset())] = found
            first_seconds = round(time.monotonic() - started, 2)
    judged = [v for v in fuzzer.verdicts.values() if v is not None]
    fired = sum(v.fired for v in judged)
    by_meta = sum(v.how in ("fake", "random") for v in judged)
    counts = {"judged": len(judged), "fired": fired, "by_meta": by_meta, "seconds": round(time.monotonic() - started, 2)}
    if not failures:
        meta_only = (f"; {by_meta} of them judged by dtype and shape only ({_meta_reason(judged)})" if by_meta else "")
        return {**counts, NOTE: f"pattern {fuzzer.pattern.name}: {len(judged)} variants, it fired on {fired}, every "
                                f"rewrite sound{meta_only} ({counts['seconds']} s)"}
    kept = list(failures.values())
    variant, verdict = kept[0].variant, kept[0].verdict
    repro = write_repro(spec, fuzzer.pattern.name, variant, fuzzer.repro_dir) if fuzzer.repro_dir else None
    others = "".join(f"\nalso: [{other.variant.describe()}] {other.verdict.problem}" for other in kept[1:])
    finding = Finding(f"it fired and {verdict.problem}\njudged by {JUDGED_BY[verdict.how]}" + others
                      + f"\nsearch function:\n  {_indented(fuzzer.pattern.search_source())}\n"
                      + _advice(fuzzer, variant, verdict) + (f"\nrepro: python {repro}" if repro else ""),
                      input=variant.describe(), node=verdict.node,
                      details={**counts, "variant": repr(variant), "first_failure_s": first_seconds,
                               "failures": [(f.variant.describe(), f.verdict.how, f.verdict.problem) for f in kept]})
    finding.repro = repro
    raise finding


def _meta_reason(judged: list[Verdict]) -> str:
    """Why some rewrites were judged by their outputs' dtype and shape only."""
    reasons = {"random": "the program draws random numbers", "fake": "the replacement has no kernel here"}
    return "; ".join(text for how, text in reasons.items() if any(v.how == how for v in judged))


def _advice(fuzzer: Fuzzer, variant: Variant, verdict: Verdict) -> str:
    """What the pattern's author should do about an unsound rewrite of ``variant``."""
    if verdict.how == "raised":
        return ("advice: the pattern matched a program its replacement cannot be traced for: the match is "
                "wrong; check in extra_check what the search function fixes (shapes, permutations, dims)")
    if verdict.how == "structure":
        return ("advice: the replacement must be inserted after every input it uses is defined (a multi-output "
                "replacement or an input defined late); insert it before the match's last node, not its first")
    kinds = {edit.kind for edit in variant.edits}
    if "output['gradient of" in (verdict.problem or ""):
        return ("advice: the replacement's gradient differs from the search function's (a training pattern matches "
                "the backward too): check replace_fn's differentiable path (a detach, a custom autograd Function's "
                "backward), or register the pattern with fwd_only for inference only")
    if variant.equivalent and not (variant.sizes or any(variant.dtypes) or variant.strided is not None
                                   or variant.broadcast is not None):
        return ("advice: the replacement does not compute what the search function computes even on its own "
                "program: check replace_fn (a constant the search function binds and the replacement drops?)")
    wildcards = kinds & {"dims", "dim", "sizes", "scalar"}
    if variant.sizes and _sound_apart(fuzzer, variant):
        fixed = (f"; it matched here an argument the search function fixes ({', '.join(sorted(wildcards))}): check it "
                 "in extra_check too" if wildcards else "")
        return ("advice: the rewrite is wrong only when sizes coincide (the same program at the example sizes is "
                "rewritten soundly or not at all): the replacement or extra_check tells dimensions apart by their "
                f"sizes (a key's layout told by its sizes); use the positions the search function uses{fixed}")
    if wildcards:
        return ("advice: the pattern matches arguments its search function fixes (register_replacement traces "
                "ints, floats and lists as wildcards): check them in extra_check, or pass them as arguments of the "
                "search and replacement functions (scalar_workaround), so the replacement uses the matched ones")
    if any(variant.dtypes):
        return ("advice: the replacement assumes the inputs' dtypes: guard in extra_check (e.g. every input of "
                "the match has the same dtype) or register the pattern for each dtype it is right for")
    return "advice: guard the match in extra_check for the inputs this variant gives (see the variant above)"


def _sound_apart(fuzzer: Fuzzer, variant: Variant) -> bool:
    """Whether ``variant`` at the example sizes is rewritten soundly or not at all (so its coinciding sizes are
    what makes its rewrite wrong)."""
    apart = fuzzer.judge(dataclasses.replace(variant, sizes=()))
    return apart is not None and not apart.problem


def completeness(fuzzer: Fuzzer) -> dict[str, Any]:
    """``patterns-complete``: the matrix of where the pattern fires; a failure where it never fires on its own
    program, cannot fire at a hook it is declared for, or misses a promised spelling."""
    spec = fuzzer.spec
    judged = [(variant, family, fuzzer.judge(variant)) for variant, family in fuzzer.matrix()]
    covered = [family != OWN and fuzzer.promise.covers(family, uniform_dtype(variant.dtypes, fuzzer.example))
               for variant, family, _ in judged]
    rows = [(variant.describe(), None if verdict is None else verdict.fired) for variant, _, verdict in judged]
    matrix = "\n".join(f"    {'fired' if fired else 'not a program' if fired is None else 'NOT fired'}: {text}"
                       + ("" if family == OWN else f"  [{family}{', promised' if promised else ''}]")
                       for (text, fired), (_, family, _), promised in zip(rows, judged, covered))
    name, details = fuzzer.pattern.name, {"matrix": rows, "promise": fuzzer.promise.describe()}
    if not any(verdict is not None and verdict.fired for _, family, verdict in judged if family == OWN):
        if fuzzer.hook is not None and _fires(fuzzer, None):
            _cannot_fire_at(fuzzer, spec, [fuzzer.hook], matrix, details)
        raise Finding(f"pattern {name} of {spec} does not fire on its own search function traced as the pass meets "
                      f"it ({fuzzer.pattern.traced_with} on the example inputs): it never rewrites anything.\n"
                      f"fired / not fired:\n{matrix}\nadvice: check the example inputs (one tensor given for two "
                      "inputs binds them to one name) and extra_check", input=rows[0][0], details=details)
    elsewhere = [hook for hook in fuzzer.pattern.hooks[1:] if not _fires(fuzzer, hook)]
    if elsewhere:
        _cannot_fire_at(fuzzer, spec, elsewhere, matrix, details)
    missed = [(variant, family) for (variant, family, verdict), promised in zip(judged, covered)
              if promised and verdict is not None and not verdict.fired]
    if missed:
        first = missed[0][0]
        edited = next((v.edits[0] for v, _ in missed if v.edits), None)
        raise Finding(f"pattern {name} of {spec} promises {fuzzer.promise.describe()} and is NOT fired on "
                      f"{len(missed)} promised spelling(s), first: {first.describe()}\n"
                      f"fired / not fired:\n{matrix}\nadvice: {_missed_advice(missed)}",
                      input=first.describe(), details=details,
                      node=None if edited is None else f"{edited.target}#{edited.occurrence}")
    unpromised = sum(fired is False for fired in (row[1] for row in rows))
    warning = f"; WARNING: not fired on {unpromised} equivalent spelling(s) it does not promise" if unpromised else ""
    return {**details, "missed": [text for text, fired in rows if fired is False],
            NOTE: f"pattern {name}: fired on {sum(f is True for _, f in rows)} of {len(rows)} equivalent "
                  f"spellings{warning} (promised: {fuzzer.promise.describe()})\n{matrix}"}


def _missed_advice(missed: list[tuple[Variant, str]]) -> str:
    """How to keep the promise for the families missed."""
    families = dict.fromkeys(family for _, family in missed)
    spelled = [v.spelling for v, _ in missed if v.spelling is not None]
    advice = {"operand_orders": "register the pattern for each operand order it misses (its search function with "
                                "those operands swapped)",
              "declared": f"register a pattern for each declared spelling it misses ({', '.join(spelled)}: that "
                          "function as the search function)",
              "dtypes": "register the pattern for each dtype promised (example inputs in that dtype: decompositions "
                        "insert casts a float32 trace lacks), or drop the dtype from the contract's dtypes",
              "sizes": "check what extra_check declines when these sizes coincide, or register the pattern traced at "
                       "them too",
              "late_inputs": "check what extra_check declines where an input is computed just before its first use"}
    return "; ".join(advice[family] for family in families) + ", or drop the promise"


def _fires(fuzzer: Fuzzer, hook: str | None) -> bool:
    """Whether the pattern fires on its own program (0-dim inputs as tensors or as numbers) at ``hook``."""
    return any((fuzzer.judge(Variant(numbers=n, hook=hook)) or Verdict(False)).fired for n in fuzzer.numbers)


def _cannot_fire_at(fuzzer: Fuzzer, spec: str, missed: list[str], matrix: str, details: dict[str, Any]) -> NoReturn:
    """The failure of a pattern that fires on its own program as traced but not as the hooks ``missed`` (Inductor
    captures its contract names) receive graphs, naming the ops that differ and where it fires."""
    pattern = fuzzer.pattern
    numbers = next((n for n in fuzzer.numbers if (fuzzer.judge(Variant(numbers=n)) or Verdict(False)).fired), False)
    differs, culprit = _op_difference(pattern, Variant(numbers=numbers), missed[0])
    joint = traces_joint(pattern.trace_fn)
    where = [f"{hook_name(h)} (capture {h})" for h, capture in hooks().items()
             if capture.training_graphs == joint and (fuzzer.judge(Variant(numbers=numbers, hook=h)) or Verdict(False)).fired]
    named = ", ".join(f"{hook_name(h)} (capture {h})" for h in missed)
    register = (f"register it where it fires ({', '.join(where)})" if where else
                "it fires at none of Inductor's hooks as Inductor's passes leave its program")
    raise Finding(f"pattern {pattern.name} of {spec} cannot fire at {named}, which its contract names (captures): it "
                  f"fires on its search function traced by {pattern.traced_with}, not on that program as the hook "
                  f"receives graphs: {differs}.\nfired / not fired:\n{matrix}\nadvice: trace the pattern as the hook "
                  f"receives graphs (a trace_fn running on {pattern.traced_with}'s graph what Inductor runs before the "
                  "hook: torch._inductor.fx_passes.post_grad.view_to_reshape for the post-grad hooks), or " + register,
                  input=Variant(numbers=numbers, hook=missed[0]).describe(), node=culprit,
                  details={**details, "fires_at": where})


def _op_difference(pattern: PatternExample, variant: Variant, hook: str) -> tuple[str, str | None]:
    """How ``variant``'s program as traced differs in ops from that program as ``hook``'s capture receives it, in
    words, and the first op of the traced program the hook's graphs lack."""
    programs = [build(pattern.search_fn, pattern.trace_fn, pattern.traced_inputs(), dataclasses.replace(variant, hook=h))
                for h in (None, hook)]
    ops = [collections.Counter(str(n.target) for n in built[0].graph.nodes if n.op == "call_function")
           for built in programs if built is not None]
    if len(ops) < 2:
        return "the hook's passes leave no program to match", None
    traced, received = ops
    lost, gained = traced - received, received - traced
    if not lost and not gained:
        return "the same ops, with other arguments or structure", None
    words = lambda ops: ", ".join(f"{op} x{count}" for op, count in ops.items()) or "nothing"
    return (f"the search graph holds {words(lost)} where the hook's graphs hold {words(gained)}",
            next(iter(lost), None))


def _indented(text: str) -> str:
    return text.replace("\n", "\n  ")


def write_repro(spec: str, name: str, variant: Variant, directory: str | os.PathLike[str]) -> str:
    """A script that fails alone while pattern ``name`` of ``spec`` rewrites ``variant`` wrongly; its path."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha1(f"{spec}:{name}:{variant!r}".encode()).hexdigest()[:8]
    path = folder / f"pattern-{name}-{digest}.py"
    path.write_text(
        f'"""Pattern {name} of {spec} rewrites this variant wrongly: {variant.describe()}.\n\n'
        f'Run from the folder {spec!r} imports from: python {path}   (it fails while the pattern is unsound)"""\n'
        "import os\nimport sys\n\n"
        "sys.path.insert(0, os.getcwd())  # where the patterns' module is imported from\n"
        "from fxverify.compile.pattern_sources import pattern_examples  # noqa: E402\n"
        "from fxverify.compile.pattern_variants import Edit, Variant  # noqa: E402, F401 (in the variant below)\n"
        "from fxverify.compile.patterns import judge  # noqa: E402\n"
        "from fxverify.core.transform import load_object  # noqa: E402\n\n"
        f"pattern = next(p for p in pattern_examples(load_object({spec!r}), {spec!r}) if p.name == {name!r})\n"
        f"verdict = judge(pattern, {variant!r})\n"
        "assert verdict is not None and not verdict.problem, verdict\n"
        "print('the pattern rewrites this variant soundly now')\n")
    return str(path)
