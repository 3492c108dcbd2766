"""The checks: one registry, in the order they run and are reported.

Importing this package imports no check and no torch (the pytest plugin reads
:data:`NAMES` at start-up); :func:`get` imports a check when it is first run.
Each check is ``check(subject) -> dict | None``: it returns details on success and
raises :class:`~fxverify.core.results.Finding` to fail or :class:`~fxverify.core.results.Skip`
when it does not apply. A row says which kind of subject its check takes (:data:`KINDS`): a model
under a capture (a transform's checks), a pattern of a pattern-matcher pass, a model compiled with a
backend, or a set of graph-pass instances (the FX graph cache contract). The public
``fxverify.check_<name>`` / ``assert_<name>`` pairs (of the model checks) and the ``--fxverify-checks``
help come from :data:`REGISTRY`; the check tables of README.md, docs/checks.md and docs/options.md are held
to it by tests/test_docs.py.

>>> NAMES[:3]
('lint', 'determinism', 'numerics')
>>> get("lint").__module__
'fxverify.checks.lint'
>>> names(BACKEND)[:2]
('backend-outputs', 'backend-recompile')
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from fxverify.core import captures
from fxverify.core.captures import CaptureTraits

if TYPE_CHECKING:
    from fxverify.capture import Capture
    from fxverify.cases.case import ModelCase
    from fxverify.core.transform import Transform


class RunService(Protocol):
    """What a check needs from a whole run of several subjects (``CheckSpec.service``), made once per run by
    whoever runs them (the pytest plugin): ``Service(transforms, cases, captures=..., timeout=..., options=...)``,
    ``options`` the run's check options. It hears which subjects will run the check, gives each subject what
    the check reads from its settings (``Settings.services[check]``), and sees each subject go."""

    def want(self, transform: Transform, case: ModelCase, capture: str) -> None:
        """An item of the check will run on ``case`` under ``capture`` (said once the run's items are known)."""

    def prepare(self, transform: Transform, case: ModelCase, capture: Capture) -> Any:
        """The subject of ``case`` under ``capture`` is about to be made: what its settings hand the check."""

    def release(self, runner: Any) -> None:
        """The runner of a subject is about to be dropped (the next model's is made)."""

    def close(self) -> None:
        """The run is over."""


def services_for(names: Sequence[str], transforms: Sequence[Transform], cases: Sequence[ModelCase], *,
                 captures: Sequence[str], timeout: float, options: Mapping[str, Any]) -> dict[str, RunService]:
    """The run-scoped service of each check of ``names`` that needs one, by check name (imports them, with torch)."""
    found = {}
    for name in names:
        cls = service_class(name)
        if cls is not None:
            found[name] = cls(transforms, cases, captures=tuple(captures), timeout=timeout, options=options)
    return found


MODEL, PATTERN, BACKEND, PASS_SET = "model", "pattern", "backend", "pass set"


@dataclasses.dataclass(frozen=True)
class SubjectKind:
    """A kind of subject the checks take, and how a run names it: the ``option`` that gives its specs (the
    prefix of its items' node ids, ``backend:my.mod:fn::fxverify[resnet18-backend-outputs]``) and the
    ``subjects`` function (``module:function`` in fxverify, imported when used) giving the subjects of one
    spec (see :func:`subjects_of`); the model kind's are the corpus models under each capture."""

    name: str
    option: str
    subjects: str = ""
    one: str = ""  # "module:function": ``one(under_test, subject=None, **options)`` makes one subject (see fxverify.api)


KINDS: tuple[SubjectKind, ...] = (
    SubjectKind(MODEL, "fxverify"),
    SubjectKind(PATTERN, "patterns", "fxverify.compile.patterns:pattern_subjects", "fxverify.compile.patterns:fuzzer_of"),
    SubjectKind(BACKEND, "backend", "fxverify.compile.backend:backend_subjects", "fxverify.compile.backend:trial_of"),
    SubjectKind(PASS_SET, "graph-cache", "fxverify.compile.graph_cache:pass_set_subjects",
                "fxverify.compile.graph_cache:pass_set"),
)


def kind(name: str) -> SubjectKind:
    """The subject kind called ``name``, or whose ``option`` is ``name``; KeyError for neither.

    >>> kind("graph-cache").name
    'pass set'
    """
    for entry in KINDS:
        if name in (entry.name, entry.option):
            return entry
    raise KeyError(name)


@dataclasses.dataclass(frozen=True)
class Given:
    """What a run gives the subjects of a spec beside the spec: the models selected (``ModelCase`` objects: the
    models a backend compiles), the seconds a run of the subject may take, the folder for repro files, the dtype
    a backend compiles the models in, the model graph passes compile (``None``: their default)."""

    cases: tuple[Any, ...] = ()
    timeout: float | None = None
    repro_dir: Any = None
    dtype: str = "float32"
    graph_cache_model: str | None = None


def one_subject(kind_name: str) -> Callable[..., Any]:
    """The function making one subject of kind ``kind_name`` from what is under test (imported now, with torch)."""
    module, _, function = kind(kind_name).one.partition(":")
    return getattr(importlib.import_module(module), function)


def subjects_of(option: str) -> Callable[..., Any]:
    """The function giving the subjects of one spec of the kind given by ``option`` (imported now, with torch):
    ``subjects(spec, given) -> [(name, make)]`` (``given`` a :class:`Given`), ``make()`` building the subject."""
    module, _, function = kind(option).subjects.partition(":")
    return getattr(importlib.import_module(module), function)


@dataclasses.dataclass(frozen=True)
class CheckSpec:
    """Where a check lives: ``fxverify.checks.<module>.<function>`` (a dotted ``module`` names a module outside
    fxverify), what it is for in one line, and the
    traits of a capture's graphs it needs (fields of :class:`~fxverify.core.captures.CaptureTraits`): under a
    capture without them it is not collected, and run through the API it skips saying which is missing."""

    name: str
    module: str
    function: str
    summary: str
    requires: tuple[str, ...] = ()
    verify_each: bool = False  # structural: run after every step of a pipeline whose contract declares verify_each
    options: tuple[tuple[str, Any], ...] = ()  # (key, default) of each run option it reads (see option())
    service: str | None = None  # "module:Class" in fxverify.checks: the run-scoped service it needs (see RunService)
    repro: bool = False  # a failure is minimised into a standalone repro file (--fxverify-repro-dir)
    on_rewrite_rules: bool = False  # run by check_rewrite on each random graph a rewrite rule applies to
    subject: str = MODEL  # the kind of subject the check takes (KINDS)


REGISTRY: tuple[CheckSpec, ...] = (
    CheckSpec("lint", "lint", "check", "the result is a well-formed GraphModule that runs", verify_each=True,
              on_rewrite_rules=True),
    CheckSpec("determinism", "determinism", "check", "the transform gives the same graph and code every time",
              options=(("train_capture", True),), service="_digest_server:CrossProcessService",
              on_rewrite_rules=True),
    CheckSpec("numerics", "numerics", "check", "the result computes what the original computes",
              options=(("train_capture", True),), repro=True, on_rewrite_rules=True),
    CheckSpec("gradients", "gradients", "check", "backward through the result matches backward through the original",
              requires=("differentiated",)),
    CheckSpec("devices", "devices", "check", "every tensor the result reads moves with .to(device) and .to(dtype)"),
    CheckSpec("cuda", "cuda", "check", "on a GPU, the result on CUDA computes what the original computes on CPU",
              requires=("moves_device",)),
    CheckSpec("purity", "purity", "check", "the transform leaves its input alone and its outputs behave like the "
                                           "original's"),
    CheckSpec("observers", "observers", "check", "on PT2E prepared graphs, the observers stay as prepare_pt2e placed "
                                                 "them: annotated edges observed, one observer a sharing group, none "
                                                 "elsewhere; calibrated and converted, the result matches",
              requires=("observed",)),
    CheckSpec("stateful", "stateful", "check", "a model whose buffers change in forward leaves the same buffers "
                                               "after each call"),
    CheckSpec("meta", "meta", "check", "on ATen graphs, every node's meta['val'] exists and says what a real run "
                                       "computes", requires=("carries_meta_val",), verify_each=True),
    CheckSpec("dynamic", "dynamic", "check", "on a dynamic-batch capture, the result takes and computes right "
                                             "every batch size the capture takes", requires=("dynamic_batch",)),
    CheckSpec("agreement", "agreement", "check", "with several captures selected, the transform changes the "
                                                 "outputs alike under each", service="agreement:HandOver"),
    CheckSpec("verifier", "verifier", "check", "a program the transform returns still validates: its dialect's "
                                               "rules, and a signature naming the graph's nodes",
              requires=("has_program",), verify_each=True),
    CheckSpec("opset", "opset", "check", "on ATen graphs, the result keeps the capture's operator set (ATen, "
                                         "functional, core ATen)", requires=("opset",), verify_each=True),
    CheckSpec("qdq", "qdq", "check", "on quantized graphs, every quantize / dequantize pair stays consistent: "
                                     "parameters, per-channel axes, shared parameters, no observer left",
              requires=("quantized",), verify_each=True),
    CheckSpec("runtime", "runtime", "check", "on Edge programs, the result lowered to an ExecuTorch .pte (XNNPACK) "
                                             "loads and runs through executorch.runtime and computes what its "
                                             "program computes", requires=("lowers",)),
    CheckSpec("idempotence", "idempotence", "check", "on Edge programs, running the pass again on its result "
                                                     "changes nothing more", requires=("lowers",)),
    CheckSpec("variants", "variants", "check", "the ops the transform rewrote, and the variants of them it left "
                                               "untouched (a warning; a failure under rewrites_every_occurrence)"),
    CheckSpec("recompile", "roundtrips", "check_recompile", "a copy recompiled gives the same code and outputs"),
    CheckSpec("retrace", "roundtrips", "check_retrace", "re-capturing the generated code gives an isomorphic graph",
              requires=("recaptures",)),
    CheckSpec("reexport", "roundtrips", "check_reexport", "on export captures, exporting the result again gives the "
                                                          "same operators and outputs", requires=("has_program", "round_trips")),
    CheckSpec("to_folder", "roundtrips", "check_to_folder", "gm.to_folder() exported and imported again computes "
                                                            "the same", requires=("pickles",)),
    CheckSpec("pickle", "roundtrips", "check_pickle", "copy.deepcopy and a pickle round trip give the same graph "
                                                      "and outputs", requires=("pickles",)),
    CheckSpec("serde", "roundtrips", "check_serde", "a program the transform returns saved with torch.export.save "
                                                    "and loaded again computes the same",
              requires=("has_program", "round_trips")),
    CheckSpec("interpreter", "roundtrips", "check_interpreter", "torch.fx.Interpreter running the graph equals the "
                                                                "generated forward"),
    CheckSpec("golden", "golden", "check", "the generated code and graph match the committed golden file",
              options=(("golden_dir", None), ("update_golden", False))),
    # a pattern of an Inductor pattern-matcher pass (--fxverify-patterns)
    CheckSpec("patterns-sound", "fxverify.compile.patterns", "soundness", "wherever the pattern fires on a variant "
              "of its search function, the rewritten program lints and computes what the program did",
              subject=PATTERN, repro=True),
    CheckSpec("patterns-complete", "fxverify.compile.patterns", "completeness", "the pattern fires on its own search "
              "function, at every hook it is declared for, and on each spelling it promises", subject=PATTERN),
    # a torch.compile backend on a model (--fxverify-backend)
    CheckSpec("backend-outputs", "fxverify.compile.backend", "Trial.outputs", "the compiled model's outputs and "
              "buffers match eager's, call after call", subject=BACKEND),
    CheckSpec("backend-recompile", "fxverify.compile.backend", "Trial.recompile", "a recompile for another batch "
              "size computes what eager computes", subject=BACKEND),
    CheckSpec("backend-dtypes", "fxverify.compile.backend", "Trial.dtypes", "the model compiled in bfloat16 then "
              "float32 computes each dtype's eager results", subject=BACKEND),
    CheckSpec("backend-input-unchanged", "fxverify.compile.backend", "Trial.input_unchanged", "the backend leaves "
              "the GraphModule and example_inputs it is handed unchanged", subject=BACKEND),
    CheckSpec("backend-graph-breaks", "fxverify.compile.backend", "Trial.graph_breaks", "with graph breaks, every "
              "piece compiled by the backend computes what eager computes", subject=BACKEND),
    CheckSpec("backend-dynamic-shapes", "fxverify.compile.backend", "Trial.dynamic_shapes", "under dynamic=True, "
              "the graph with symbolic sizes computes eager's results at other sizes", subject=BACKEND),
    CheckSpec("backend-gradients", "fxverify.compile.backend", "Trial.gradients", "gradients through what the "
              "backend returns match eager's", subject=BACKEND),
    CheckSpec("backend-backward-graph", "fxverify.compile.backend", "Trial.backward_graph", "a backend compiling "
              "the backward graph (AOTAutograd) computes eager's gradients", subject=BACKEND),
    # instances of an Inductor CustomGraphPass (--fxverify-graph-cache)
    CheckSpec("graph-cache-uuid", "fxverify.compile.graph_cache", "uuid_contract", "uuid() is set, pickles and is "
              "the same in two fresh processes", subject=PASS_SET),
    CheckSpec("graph-cache-stale", "fxverify.compile.graph_cache", "stale_entries", "each instance compiled into "
              "one fresh FX graph cache gives its output with caches disabled", subject=PASS_SET),
    CheckSpec("graph-cache-bypass", "fxverify.compile.graph_cache", "bypasses", "Inductor used the FX graph cache "
              "with the pass in its hook (bypasses are a warning)", subject=PASS_SET),
)
NAMES: tuple[str, ...] = tuple(spec.name for spec in REGISTRY if spec.subject == MODEL)  # the model checks shipped


def names(subject: str | None = MODEL) -> tuple[str, ...]:
    """The registered checks' names that take ``subject`` (a kind of :data:`KINDS`; None: every kind), in the
    order they run (what :data:`REGISTRY` holds now)."""
    return tuple(spec.name for spec in REGISTRY if subject is None or spec.subject == subject)


def _defaults() -> dict[str, Any]:
    return {key: default for spec in REGISTRY for key, default in spec.options}


def spec(name: str) -> CheckSpec:
    """The registry entry of check ``name``; KeyError for an unknown name."""
    for entry in REGISTRY:
        if entry.name == name:
            return entry
    raise KeyError(name)


def not_applicable(name: str, traits: CaptureTraits, capture: str) -> str | None:
    """Why check ``name`` does not apply to graphs of ``capture`` with these ``traits`` (the trait it needs
    that they lack), or None.

    >>> from fxverify.core import captures
    >>> print(not_applicable("retrace", captures.spec("export").traits, "export"))
    export graphs are not captured again from a result's code here (captures whose graphs are: symbolic_trace)
    """
    return captures.lacking(traits, spec(name).requires, capture)


def option(settings: Any, key: str) -> Any:
    """The run's value of the check option ``key`` in ``settings`` (a :class:`~fxverify.engine.subject.Settings`,
    or a mapping of options), or its registered default.

    >>> option(None, "train_capture"), option(None, "golden_dir")
    (True, None)
    """
    given = settings if isinstance(settings, Mapping) else getattr(settings, "options", None) or {}
    return given[key] if key in given else _defaults()[key]


def option_keys() -> tuple[str, ...]:
    """The keys of the run options the checks read (``CheckSpec.options``)."""
    return tuple(_defaults())


def owner_of(key: str) -> str:
    """The check that reads option ``key``; KeyError for a key no check reads.

    >>> owner_of("update_golden")
    'golden'
    """
    for entry in REGISTRY:
        if key in dict(entry.options):
            return entry.name
    raise KeyError(key)


def service_class(name: str) -> type[Any] | None:
    """The run-scoped service class check ``name`` needs (imported now, with torch), or None."""
    entry = spec(name)
    if entry.service is None:
        return None
    module, _, cls = entry.service.partition(":")
    return getattr(importlib.import_module(_module(module)), cls)


def get(name: str) -> Callable[[Any], dict[str, Any] | None]:
    """The check function called ``name`` (imported now, with torch): a function of its module, or a method of a
    class there (``Trial.outputs``: the subject is the instance)."""
    entry = spec(name)
    found: Any = importlib.import_module(_module(entry.module))
    for part in entry.function.split("."):
        found = getattr(found, part)
    return found


def _module(name: str) -> str:
    """A check module's full name: ``fxverify.checks.<name>``, or ``name`` itself where it is dotted (a check
    that lives outside fxverify)."""
    return name if "." in name else f"fxverify.checks.{name}"
