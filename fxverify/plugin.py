"""The pytest plugin: options, the ``fx_model`` fixture, and wiring to the core.

Registered through the ``pytest11`` entry point. It imports neither torch nor
the checks unless ``--fxverify`` (or the ``fxverify`` ini option) is given or a
test uses ``fx_model``; the work is done by :mod:`fxverify.pytest_items`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fxverify import _CHECK_NAMES as CHECK_NAMES  # fxverify's __init__ imports nothing heavy


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fxverify", "fxverify: verify torch.fx transforms over a model corpus")
    group.addoption(
        "--fxverify", action="append", default=[], metavar="MOD:FN",
        help="transform to verify: 'package.module:function' or 'path/to/file.py:function'; repeatable "
        "(ini: fxverify, one per line)",
    )
    group.addoption(
        "--fxverify-corpus", default=None, metavar="SELECTION",
        help="models to verify on: profiles (default, smoke, full, edge), names or globs, comma-separated "
        "(ini: fxverify_corpus; default: default)",
    )
    group.addoption(
        "--fxverify-exclude", default=None, metavar="SELECTION",
        help="models to leave out: profiles, names or globs, comma-separated (ini: fxverify_exclude)",
    )
    group.addoption(
        "--fxverify-tags", default=None, metavar="TAGS",
        help="keep only models with at least one of these tags, comma-separated, e.g. attention,batchnorm "
        "(ini: fxverify_tags)",
    )
    group.addoption(
        "--fxverify-shard", default=None, metavar="I/N",
        help="run shard I of N of the selected models (a stable partition, for CI matrices; ini: fxverify_shard)",
    )
    group.addoption(
        "--fxverify-checks", default=None, metavar="CHECKS",
        help=f"comma-separated subset of checks: {','.join(CHECK_NAMES)} (ini: fxverify_checks; default: all)",
    )
    group.addoption(
        "--fxverify-golden-dir", default=None, metavar="DIR",
        help="golden files of the golden check: DIR/<transform>/<model>.golden (ini: fxverify_golden_dir, relative "
        "to the rootdir; default: fxverify_golden under the rootdir)",
    )
    group.addoption(
        "--fxverify-update-golden", action="store_true", default=False,
        help="write or rewrite the golden files instead of comparing them; the summary lists what changed",
    )
    group.addoption(
        "--fxverify-timeout", default=None, type=float, metavar="SECONDS",
        help="fail a model's items when the transform runs longer than this (ini: fxverify_timeout; default: 300)",
    )
    group.addoption(
        "--fxverify-random-graphs", default=None, type=int, metavar="N",
        help="add N new random FX graphs (fxverify.strategies.graph_modules) to the models, plus the graphs that "
        "failed before: those are kept in the Hypothesis example database (.hypothesis/) and replayed until they "
        "pass (ini: fxverify_random_graphs)",
    )
    group.addoption(
        "--fxverify-random-graph-options", default=None, metavar="JSON",
        help="options of those graphs, as a JSON object of fxverify.strategies.graph_modules keywords, e.g. "
        "'{\"dtypes\": [\"float32\", \"int64\"], \"max_nodes\": 20}' (ini: fxverify_random_graph_options; default: {})",
    )
    group.addoption(
        "--fxverify-repro-dir", default=None, metavar="DIR",
        help="for each failing numerics item, minimise the model to the few nodes that still fail and write a "
        "standalone repro (DIR/<model>-numerics-<transform>.py and its inputs) there (ini: fxverify_repro_dir)",
    )
    group.addoption(
        "--fxverify-json", default=None, metavar="FILE",
        help="write machine-readable results (one record per item, with numbers and timing) to FILE "
        "(ini: fxverify_json)",
    )
    group.addoption(
        "--fxverify-html", default=None, metavar="FILE",
        help="write a self-contained HTML report (matrix, graph pictures and code diff of each failure) to FILE "
        "(ini: fxverify_html)",
    )
    parser.addini("fxverify", type="linelist", default=[], help="transforms to verify, one per line")
    parser.addini("fxverify_corpus", default="default", help="corpus selection (see --fxverify-corpus)")
    parser.addini("fxverify_exclude", default="", help="models to leave out (see --fxverify-exclude)")
    parser.addini("fxverify_tags", default="", help="tags a model must have one of (see --fxverify-tags)")
    parser.addini("fxverify_shard", default="", help="shard I/N of the selected models (see --fxverify-shard)")
    parser.addini("fxverify_checks", default="", help="checks to run (see --fxverify-checks)")
    parser.addini("fxverify_golden_dir", default="fxverify_golden", help="golden files directory (see --fxverify-golden-dir)")
    parser.addini("fxverify_timeout", default="300", help="transform timeout in seconds")
    parser.addini("fxverify_random_graphs", default="0", help="random graphs to add (see --fxverify-random-graphs)")
    parser.addini("fxverify_random_graph_options", default="",
                  help="options of the random graphs (see --fxverify-random-graph-options)")
    parser.addini("fxverify_repro_dir", default="", help="directory for minimised repros (see --fxverify-repro-dir)")
    parser.addini("fxverify_json", default="", help="JSON report file (see --fxverify-json)")
    parser.addini("fxverify_html", default="", help="HTML report file (see --fxverify-html)")


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from fxverify import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def option(config: pytest.Config, name: str) -> Any:
    """A command-line option, falling back to its ini equivalent."""
    value = config.getoption(name)
    return value if value not in (None, []) else config.getini(name)


def selected_entries(config: pytest.Config) -> list[Any]:
    """The corpus entries the options select (``CorpusEntry`` objects); UsageError on a bad selection."""
    from fxverify import catalogue
    from fxverify.errors import FxVerifyError

    try:
        return catalogue.choose(
            option(config, "fxverify_corpus"),
            exclude=option(config, "fxverify_exclude"),
            tags=option(config, "fxverify_tags"),
            shard_spec=option(config, "fxverify_shard"),
        )
    except FxVerifyError as exc:
        raise pytest.UsageError(f"fxverify: {exc}") from None


def random_graph_entries(config: pytest.Config, specs: list[str]) -> list[Any]:
    """Entries for ``--fxverify-random-graphs N`` (registering the plugin object that replays failures)."""
    raw = option(config, "fxverify_random_graphs")
    try:
        count = int(raw)
    except (TypeError, ValueError):
        count = -1
    if count < 0:
        raise pytest.UsageError(f"fxverify: --fxverify-random-graphs must be a whole number >= 0, got {raw!r}")
    if not count:
        return []
    from fxverify.strategies.corpus import RandomGraphs, parse_graph_options

    try:
        options = parse_graph_options(option(config, "fxverify_random_graph_options"))
    except ValueError as exc:
        raise pytest.UsageError(f"fxverify: --fxverify-random-graph-options {exc}") from None
    graphs = RandomGraphs(config, count, specs, options)
    config.pluginmanager.register(graphs, "fxverify-random-graphs")
    return graphs.entries


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "fxverify: an item generated by fxverify (transform x model x check)")
    register_user_models(config)
    specs = [s for s in option(config, "fxverify") if s.strip()]
    if not specs:
        return
    from fxverify.errors import FxVerifyError
    from fxverify.pytest_items import FxVerifyRun

    entries = selected_entries(config) + random_graph_entries(config, specs)
    raw_timeout = option(config, "fxverify_timeout")
    try:
        timeout = float(raw_timeout)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"fxverify: --fxverify-timeout (ini fxverify_timeout) must be a number of seconds, "
                                f"got {raw_timeout!r}") from None
    try:
        run = FxVerifyRun.from_options(
            specs,
            entries=entries,
            checks=option(config, "fxverify_checks"),
            timeout=timeout,
            golden_dir=path_option(config, "fxverify_golden_dir"),
            update_golden=config.getoption("fxverify_update_golden"),
            repro_dir=path_option(config, "fxverify_repro_dir"),
        )
    except FxVerifyError as exc:
        raise pytest.UsageError(f"fxverify: {exc}") from None
    config.pluginmanager.register(run, "fxverify-run")
    from fxverify.reports.pytest_plugin import ReportWriter

    ReportWriter.register(config)
    share_cores_between_workers(config)
    if config.pluginmanager.hasplugin("xdist"):
        from fxverify.pytest_items import XdistGrouping

        config.pluginmanager.register(XdistGrouping(), "fxverify-xdist")


def path_option(config: pytest.Config, name: str) -> Path | None:
    """A path option: from the command line relative to where pytest was started, from the ini
    file relative to the rootdir, as pytest's own ``cache_dir``; None when unset."""
    given = config.getoption(name)
    if given:
        return (config.invocation_params.dir / given).resolve()
    configured = config.getini(name)
    return (config.rootpath / configured).resolve() if configured else None


def register_user_models(config: pytest.Config) -> None:
    """Add the entries that ``pytest_fxverify_models`` implementations (conftest.py, plugins) return."""
    hook = config.hook.pytest_fxverify_models
    if not hook.get_hookimpls():
        return
    from fxverify.catalogue import CorpusEntry, register_model
    from fxverify.errors import FxVerifyError

    for returned in hook(config=config):
        for entry in returned or ():
            if not isinstance(entry, CorpusEntry):
                raise pytest.UsageError(
                    f"fxverify: pytest_fxverify_models must return fxverify.CorpusEntry objects, got {entry!r}"
                )
            try:
                register_model(entry)
            except FxVerifyError as exc:
                raise pytest.UsageError(f"fxverify: {exc}") from None


def share_cores_between_workers(config: pytest.Config) -> None:
    """On an xdist worker, give torch its share of the cores: N workers each
    running the default thread count on the same cores slow down many times over."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return
    import os

    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workerinput.get("workercount", 1))))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "fx_model" not in metafunc.fixturenames:
        return
    names = [e.name for e in selected_entries(metafunc.config)]
    metafunc.parametrize("fx_model", names, indirect=True, ids=names)


@pytest.fixture
def fx_model(request: pytest.FixtureRequest) -> Any:
    """A corpus model (:class:`fxverify.ModelCase`), one test per selected model.

    ``fx_model.build()`` gives a fresh instance, ``fx_model.trace()`` a fresh
    GraphModule and ``fx_model.example_inputs()`` its inputs::

        def test_my_pass(fx_model):
            fxverify.assert_transform_ok(my_pass, fx_model)
    """
    from fxverify.cases import load_case

    return load_case(request.param)
