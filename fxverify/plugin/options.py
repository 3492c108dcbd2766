"""fxverify's pytest options, declared once: each :class:`Option` gives its command-line flag, its
ini name, its default and its help; the plugin declares both forms from :data:`OPTIONS`, and
:meth:`RunOptions.from_config` reads and checks them all in one place, so every bad value is a
usage error that names the option (``--fxverify-timeout (ini fxverify_timeout) must be ...``).
``docs/options.md`` is kept in step with the table by a test.

Nothing here imports torch: pytest reads the options of every run, with fxverify in use or not.

>>> [o.flag for o in OPTIONS][:3]
['--fxverify', '--fxverify-corpus', '--fxverify-exclude']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pytest

from fxverify.checks import names, option_keys, owner_of, spec
from fxverify.core.captures import DEFAULT_CAPTURE, capture_names, summaries

TEXT, LINES, PATH, FLAG, SWITCH, REPORT = "text", "lines", "path", "flag", "switch", "report"
PREFIX = "fxverify_"  # of every option's ini name
FAST_ORDER, CATALOGUE_ORDER = "fast", "catalogue"  # the values of --fxverify-order
# the options naming passes that run inside torch.compile, and the kind of spec each names
COMPILE_OPTIONS = {"fxverify_patterns": "patterns", "fxverify_backend": "backend", "fxverify_graph_cache": "graph-cache"}
BACKEND_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class Option:
    """One option: ``--<flag>`` on the command line and ``name`` in the ini file (``ini=False``:
    command line only); ``default`` as the ini file would give it; ``kind`` one of ``text``,
    ``lines`` (repeatable / one per line), ``path`` (relative to where pytest was started on the
    command line, to the rootdir in the ini file), ``flag`` (given or not), ``switch`` (``on`` or ``off``) and
    ``report`` (a path where the report of format ``<name>`` of ``fxverify_<name>`` is written, a row of
    :data:`fxverify.reports.FORMATS`).
    An option named ``fxverify_<key>`` where a check declares ``key`` in the check registry
    (``CheckSpec.options``) is handed to that check (:attr:`RunOptions.check_options`)."""

    name: str
    metavar: str
    default: str
    help: str
    kind: str = TEXT
    ini: bool = True
    shown_default: str = ""  # the default in words, when the empty value stands for something ("all")

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def describe_default(self) -> str:
        """The default as the docs and ``--help`` show it."""
        if self.kind == FLAG:
            return "off"
        return self.shown_default or self.default or "none"


OPTIONS: tuple[Option, ...] = (
    Option("fxverify", "MOD:FN", "", "transform(s) to verify: 'package.module:function' or "
           "'path/to/file.py:function'; repeatable (ini: one per line)", LINES),
    Option("fxverify_corpus", "SELECTION", "default", "models to verify on: profiles (default, smoke, full, large_input, "
           "edge, layers), model names or globs, comma-separated"),
    Option("fxverify_exclude", "SELECTION", "", "models to leave out: profiles, names or globs, comma-separated"),
    Option("fxverify_tags", "TAGS", "", "keep only models with at least one of these tags, comma-separated, "
           "e.g. attention,batchnorm"),
    Option("fxverify_shard", "I/N", "", "run shard I of N of the selected models (a stable partition, for CI "
           "matrices)"),
    Option("fxverify_durations", "FILE", "", "balance the shards of --fxverify-shard by the seconds each model "
           "took in FILE, the JSON report (--fxverify-json) of an earlier run, e.g. last night's merged report; "
           "every shard must be given the same file", PATH),
    Option("fxverify_capture", "CAPTURES", DEFAULT_CAPTURE, "how the models become the graphs the transform takes, "
           f"comma-separated: {'; '.join(f'{name}: {summary}' for name, summary in summaries().items())}. Items of "
           "another capture than the first are named model@capture, and the capture's name is a -k keyword"),
    Option("fxverify_quantizer", "MOD:FN", "", "the PT2E quantizer the pt2e, pt2e_prepared and edge_pt2e captures "
           "quantize the models with: 'package.module:factory' naming a function of no arguments that returns a "
           "Quantizer", shown_default="pt2e, pt2e_prepared: torchao's X86InductorQuantizer, default config; "
           "edge_pt2e: ExecuTorch's XNNPACKQuantizer, per-channel"),
    Option("fxverify_checks", "CHECKS", "", f"comma-separated subset of checks: {','.join(names(None))}",
           shown_default="all"),
    Option("fxverify_order", "ORDER", FAST_ORDER, "the order the items run in: 'fast' (what failed last time first, "
           "then the edge-case and layer-variant modules, then the other models, cheapest first, as the last run "
           "timed them: pytest's cache) or 'catalogue' (the catalogue's order)"),
    Option("fxverify_reference_cache", "on/off", "on", "keep the untransformed models' reference outputs in "
           "pytest's cache directory, for the other transforms of the run and for later runs ('off': compute them "
           "for each transform; --cache-clear drops them)", SWITCH),
    Option("fxverify_train_capture", "on/off", "on", "numerics' train stage on the captures that fix the mode "
           "when they capture (export, export_core, make_fx): 'on' also captures each model in train mode, for a "
           "contract covering it (its cost: docs/performance.md); 'off' checks the primary mode only there", SWITCH),
    Option("fxverify_timeout", "SECONDS", "300", "seconds a transform may run on one model before its items fail"),
    Option("fxverify_golden_dir", "DIR", "fxverify_golden", "golden files of the golden check: "
           "DIR/<transform>/<model>.golden", PATH),
    Option("fxverify_update_golden", "", "", "write or rewrite the golden files instead of comparing them; the "
           "summary lists what changed", FLAG, ini=False),
    Option("fxverify_random_graphs", "N", "0", "add N new random FX graphs (fxverify.strategies.graph_modules) to "
           "the models, drawn from the ops the transform rewrites, plus the graphs that failed before (kept in the "
           "Hypothesis example database, .hypothesis/, and replayed until they pass)"),
    Option("fxverify_random_graph_options", "JSON", "", "options of those graphs, as a JSON object of "
           "fxverify.strategies.graph_modules keywords, e.g. '{\"dtypes\": [\"float32\", \"int64\"], "
           "\"max_nodes\": 20}'; without ops, the ops the transform rewrites ('{\"ops\": null}': all)"),
    Option("fxverify_repro_dir", "DIR", "", "for each failing numerics item, minimise the model to the few nodes "
           "that still fail and write a standalone repro (DIR/<model>-numerics-<transform>.py and its inputs) "
           "there", PATH),
    Option("fxverify_patterns", "MOD:NAME", "", "Inductor pattern-matcher passes to fuzz (fxverify.check_patterns): "
           "a function registering replacements into the PatternMatcherPass it is given, or a list of "
           "register_replacement keyword arguments; two items a pattern, patterns-sound and patterns-complete; "
           "repeatable (ini: one per line)", LINES),
    Option("fxverify_backend", "MOD:NAME", "", "torch.compile backends to run over the selected models "
           "(fxverify.check_backend): fn(gm, example_inputs) -> callable, or an aot_autograd(...) object; one item a "
           "model and aspect; repeatable (ini: one per line)", LINES),
    Option("fxverify_backend_dtype", "DTYPE", "float32", "the dtype the backends' models run in: float32 or "
           "bfloat16"),
    Option("fxverify_graph_cache", "MOD:NAME", "", "CustomGraphPass instances whose FX graph cache contract to "
           "check (fxverify.check_graph_cache): a sequence of two or more instances that differ in state, or a "
           "function returning one; compiles --fxverify-graph-cache-model with Inductor; repeatable (ini: one per line)",
           LINES),
    Option("fxverify_graph_cache_model", "MODEL", "", "the model --fxverify-graph-cache compiles, one whose graph the "
           "passes rewrite (else graph-cache-stale proves nothing, and says so): a corpus entry's name, or "
           "'package.module:factory' (or 'path/to/file.py:factory') naming a function of no arguments that returns "
           "(module, inputs), inputs the tuple of forward's arguments, or a module class with an example_inputs() "
           "method returning that tuple", shown_default="relu(x) * 2 + x"),
    Option("fxverify_json", "FILE", "", "write machine-readable results (one record per item, with numbers and "
           "timing) to FILE", REPORT),
    Option("fxverify_html", "FILE", "", "write a self-contained HTML report (matrix, graph pictures and code diff "
           "of each failure) to FILE", REPORT),
)


def add_options(parser: pytest.Parser) -> None:
    """Declare every option on the command line and, unless command-line only, in the ini file."""
    group = parser.getgroup("fxverify", "fxverify: verify torch.fx transforms over a model corpus")
    for option in OPTIONS:
        where = f"ini: {option.name}; " if option.ini else ""
        text = f"{option.help} ({where}default: {option.describe_default()})"
        if option.kind == FLAG:
            group.addoption(option.flag, dest=option.name, action="store_true", default=False, help=text)
        elif option.kind == LINES:
            group.addoption(option.flag, dest=option.name, action="append", default=[], metavar=option.metavar,
                            help=text)
        else:
            group.addoption(option.flag, dest=option.name, default=None, metavar=option.metavar, help=text)
        if option.ini:
            # named and typed: mypy reads a bare string in addini's type= as a type form (pytest 9.2's stubs)
            ini_type: Literal["linelist", "string"] = "linelist" if option.kind == LINES else "string"
            parser.addini(option.name, type=ini_type, default=([] if option.kind == LINES else option.default),
                          help=option.help)


def usage(option: str, problem: str) -> pytest.UsageError:
    """The usage error of a bad value of ``option`` (its ini name), naming its flag and ini key."""
    named = next(o for o in OPTIONS if o.name == option)
    where = f" (ini {named.name})" if named.ini else ""
    return pytest.UsageError(f"fxverify: {named.flag}{where} {problem}")


def raw(config: pytest.Config, name: str) -> Any:
    """An option as given: on the command line, else in the ini file, else its default."""
    given = config.getoption(name)
    option = next(o for o in OPTIONS if o.name == name)
    if given not in (None, []) or not option.ini:
        return given
    return config.getini(name)


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """Every option of a run, read and checked once (:meth:`from_config`)."""

    transforms: tuple[str, ...]
    corpus: str
    exclude: str
    tags: str
    shard: str
    durations: Path | None
    captures: tuple[str, ...]
    capture_settings: dict[str, Any]  # what the captures read of the run (Capture.configured): the quantizer
    checks: tuple[str, ...]
    order: str
    reference_cache: bool
    timeout: float
    check_options: dict[str, Any]  # the options checks read, by the key each declares (CheckSpec.options)
    random_graphs: int
    random_graph_options: dict[str, Any]
    repro_dir: Path | None
    reports: dict[str, Path]  # the report files asked for, by format (fxverify.reports.FORMATS)

    def checks_of(self, subject: str) -> tuple[str, ...]:
        """The checks of the run that take ``subject`` (a kind of :data:`fxverify.checks.KINDS`), in their order."""
        return tuple(check for check in self.checks if spec(check).subject == subject)

    @classmethod
    def from_config(cls, config: pytest.Config) -> RunOptions:
        """The options of ``config``; :class:`pytest.UsageError` naming the option for a bad value."""
        transforms = tuple(dict.fromkeys(s.strip() for s in raw(config, "fxverify") if s.strip()))
        every = names(None)
        chosen = tuple(c.strip() for c in (raw(config, "fxverify_checks") or "").split(",") if c.strip()) or every
        unknown = [c for c in chosen if c not in every]
        if unknown:
            raise usage("fxverify_checks", f"names unknown checks {unknown}; known: {', '.join(every)}")
        captures = tuple(dict.fromkeys(c.strip() for c in (raw(config, "fxverify_capture") or "").split(",")
                                       if c.strip())) or (DEFAULT_CAPTURE,)
        unknown = [c for c in captures if c not in capture_names()]
        if unknown:
            raise usage("fxverify_capture", f"names unknown captures {unknown}; known: {', '.join(capture_names())}")
        check_options = {option.name.removeprefix(PREFIX): _value(config, option) for option in OPTIONS
                         if option.name.removeprefix(PREFIX) in option_keys()}
        for option in OPTIONS:  # a flag given for a check the run leaves out
            key = option.name.removeprefix(PREFIX)
            if option.kind == FLAG and check_options.get(key) and owner_of(key) not in chosen:
                raise usage(option.name, f"is for the {owner_of(key)} check, but --fxverify-checks leaves out the "
                                          f"{owner_of(key)} check: add {owner_of(key)} to it")
        return cls(
            transforms=transforms,
            corpus=raw(config, "fxverify_corpus") or "default",
            exclude=raw(config, "fxverify_exclude") or "",
            tags=raw(config, "fxverify_tags") or "",
            shard=raw(config, "fxverify_shard") or "",
            durations=_path(config, "fxverify_durations"),
            captures=captures,
            capture_settings={"quantizer": (raw(config, "fxverify_quantizer") or "").strip() or None},
            checks=chosen,
            order=_choice("fxverify_order", raw(config, "fxverify_order") or FAST_ORDER, (FAST_ORDER, CATALOGUE_ORDER)),
            reference_cache=_value(config, _named("fxverify_reference_cache")),
            timeout=_number("fxverify_timeout", raw(config, "fxverify_timeout"), float, "a number of seconds > 0",
                            lambda n: n > 0),
            check_options=check_options,
            random_graphs=_number("fxverify_random_graphs", raw(config, "fxverify_random_graphs"), int,
                                  "a whole number >= 0", lambda n: n >= 0),
            random_graph_options=_graph_options(raw(config, "fxverify_random_graph_options") or ""),
            repro_dir=_path(config, "fxverify_repro_dir"),
            reports={option.name.removeprefix(PREFIX): path for option in OPTIONS
                     if option.kind == REPORT and (path := _path(config, option.name)) is not None},
        )


def compile_specs(config: pytest.Config) -> dict[str, tuple[str, ...]]:
    """The specs of the passes inside torch.compile that the run is given, by kind (none: an empty dict)."""
    given = {kind: tuple(dict.fromkeys(s.strip() for s in raw(config, name) if s.strip()))
             for name, kind in COMPILE_OPTIONS.items()}
    return {kind: specs for kind, specs in given.items() if specs}


def backend_dtype(config: pytest.Config) -> str:
    """``--fxverify-backend-dtype``, checked."""
    return _choice("fxverify_backend_dtype", raw(config, "fxverify_backend_dtype") or "float32", BACKEND_DTYPES)


def graph_cache_model(config: pytest.Config) -> str | None:
    """``--fxverify-graph-cache-model`` as given, or None for the default model (the plugin loads it, and makes a bad
    one a :func:`usage` error)."""
    return (raw(config, "fxverify_graph_cache_model") or "").strip() or None


def _named(name: str) -> Option:
    return next(o for o in OPTIONS if o.name == name)


def _value(config: pytest.Config, option: Option) -> Any:
    """``option`` as given, read as its kind says: a path, a flag's bool, a switch's bool (on), or text."""
    if option.kind == PATH:
        return _path(config, option.name)
    if option.kind == FLAG:
        return bool(raw(config, option.name))
    if option.kind == SWITCH:
        return _choice(option.name, (raw(config, option.name) or option.default).lower(), ("on", "off")) == "on"
    return raw(config, option.name)


def _number(name: str, value: Any, kind: Callable[[Any], Any], expected: str, valid: Callable[[Any], bool]) -> Any:
    try:
        number = kind(value)
    except (TypeError, ValueError):
        number = None
    if number is None or not valid(number):
        raise usage(name, f"must be {expected}, got {value!r}")
    return number


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise usage(name, f"must be one of {', '.join(allowed)}, got {value!r}")
    return value


def _graph_options(text: str) -> dict[str, Any]:
    """``graph_from_seed`` keywords, checked even when no random graph is asked for (a typo in the ini
    file shows at once, not on the day someone adds ``--fxverify-random-graphs``)."""
    if not text.strip():
        return {}
    from fxverify.strategies.corpus import parse_graph_options  # imports torch: only for a value given

    try:
        return parse_graph_options(text)
    except ValueError as exc:
        raise usage("fxverify_random_graph_options", str(exc)) from None


def _path(config: pytest.Config, name: str) -> Path | None:
    """A path option: from the command line relative to where pytest was started, from the ini
    file relative to the rootdir, as pytest's own ``cache_dir``; None when unset."""
    given = config.getoption(name)
    if given:
        return (config.invocation_params.dir / given).resolve()
    configured = config.getini(name)
    return (config.rootpath / configured).resolve() if configured else None
