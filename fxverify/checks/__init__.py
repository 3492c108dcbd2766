"""The checks: one registry, in the order they run and are reported.

Importing this package imports no check and no torch (the pytest plugin reads
:data:`NAMES` at start-up); :func:`get` imports a check when it is first run.
Each check is ``check(subject) -> dict | None``: it returns details on success and
raises :class:`~fxverify.core.results.Finding` to fail or :class:`~fxverify.core.results.Skip`
when it does not apply. The public ``fxverify.check_<name>`` / ``assert_<name>``
pairs and the ``--fxverify-checks`` help come from :data:`REGISTRY`; the check tables of
README.md, docs/checks.md and docs/options.md are held to it by tests/test_docs.py.

>>> NAMES[:3]
('lint', 'determinism', 'numerics')
>>> get("lint").__module__
'fxverify.checks.lint'
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
    CheckSpec("variants", "variants", "check", "the ops the transform rewrote, and the variants of them it left "
                                               "untouched (a warning; a failure under rewrites_every_occurrence)"),
    CheckSpec("recompile", "roundtrips", "check_recompile", "a copy recompiled gives the same code and outputs"),
    CheckSpec("retrace", "roundtrips", "check_retrace", "re-capturing the generated code gives an isomorphic graph",
              requires=("recaptures",)),
    CheckSpec("reexport", "roundtrips", "check_reexport", "on export captures, exporting the result again gives the "
                                                          "same operators and outputs", requires=("has_program",)),
    CheckSpec("to_folder", "roundtrips", "check_to_folder", "gm.to_folder() exported and imported again computes "
                                                            "the same", requires=("pickles",)),
    CheckSpec("pickle", "roundtrips", "check_pickle", "copy.deepcopy and a pickle round trip give the same graph "
                                                      "and outputs", requires=("pickles",)),
    CheckSpec("serde", "roundtrips", "check_serde", "a program the transform returns saved with torch.export.save "
                                                    "and loaded again computes the same",
              requires=("has_program",)),
    CheckSpec("interpreter", "roundtrips", "check_interpreter", "torch.fx.Interpreter running the graph equals the "
                                                                "generated forward"),
    CheckSpec("golden", "golden", "check", "the generated code and graph match the committed golden file",
              options=(("golden_dir", None), ("update_golden", False))),
)
NAMES: tuple[str, ...] = tuple(spec.name for spec in REGISTRY)  # the shipped checks (names() reads the registry now)


def names() -> tuple[str, ...]:
    """The registered checks' names, in the order they run (what :data:`REGISTRY` holds now)."""
    return tuple(spec.name for spec in REGISTRY)


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
    """The check function called ``name`` (imported now, with torch)."""
    entry = spec(name)
    return getattr(importlib.import_module(_module(entry.module)), entry.function)


def _module(name: str) -> str:
    """A check module's full name: ``fxverify.checks.<name>``, or ``name`` itself where it is dotted (a check
    that lives outside fxverify)."""
    return name if "." in name else f"fxverify.checks.{name}"
