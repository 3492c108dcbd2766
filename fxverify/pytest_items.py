"""The pytest items fxverify generates, and the run that owns them.

Imported by the plugin only when ``--fxverify`` is in use. One item per
(transform, model, check), named ``fxverify[<model>-<check>]``; a model's
items share one :class:`~fxverify.verification.Verification` (build, trace,
transform, reference outputs done once per worker), and under pytest-xdist
they are scheduled together on one worker.
"""

from __future__ import annotations

import dataclasses
import gc
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from fxverify.cases import ModelCase
from fxverify.catalogue import CorpusEntry
from fxverify.checks.golden import RANDOM_GRAPH_TAG
from fxverify.checks import CHECKS
from fxverify.crossprocess import CrossProcessDigests
from fxverify.errors import CheckFailed, FxVerifyError
from fxverify.reports.pytest_plugin import report_properties
from fxverify.result import ERROR, FAILED, SKIPPED, XFAILED
from fxverify.summary import format_table, rewrite_warning
from fxverify.transform import Transform
from fxverify.verification import Verification

ITEM_PREFIX = "fxverify["
ITEM_SUFFIX = "]"
OUTCOME = "fxverify_outcome"  # user_properties key: the item's outcome when it is an fxverify error
CHANGED = "fxverify_changed"  # user_properties key: what the transform changed on the item's model
CRASHED = "???"  # the ``when`` of the report pytest-xdist makes for an item whose worker died


@dataclasses.dataclass(eq=False)  # pytest plugins must be hashable
class FxVerifyRun:
    """The transforms, models and checks of this pytest run (a pytest plugin object)."""

    transforms: list[Transform]
    cases: list[ModelCase]
    checks: list[str]
    timeout: float
    golden_dir: Path | None = None  # the golden check's folder (None: fxverify_golden in the current directory)
    update_golden: bool = False
    repro_dir: Path | None = None  # where failing numerics items write minimised repros (None: nowhere)

    def __post_init__(self) -> None:
        self._verification: tuple[tuple[str, str], Verification] | None = None
        self._digests = {
            t.spec: CrossProcessDigests(t, self.cases, timeout=self.timeout) for t in self.transforms
        }
        self._outcomes: dict[str, dict[tuple[str, str], str]] = defaultdict(dict)
        self._changes: dict[str, dict[str, list[str] | None]] = defaultdict(dict)
        self._golden_updates: dict[str, list[str]] = defaultdict(list)  # status -> golden files
        self._digest_wanted: set[tuple[str, str]] = set()  # (transform, model) with a selected determinism item

    @classmethod
    def from_options(
        cls, specs: list[str], *, entries: list[CorpusEntry], checks: str, timeout: float,
        golden_dir: Path | None = None, update_golden: bool = False, repro_dir: Path | None = None,
    ) -> FxVerifyRun:
        """Load every transform and check the options; raises FxVerifyError on bad input."""
        transforms = [Transform.load(spec.strip()) for spec in dict.fromkeys(specs)]
        cases = [ModelCase(entry) for entry in entries]
        chosen = [c.strip() for c in checks.split(",") if c.strip()] if checks else list(CHECKS)
        unknown = [c for c in chosen if c not in CHECKS]
        if unknown:
            raise FxVerifyError(f"unknown checks {unknown} in --fxverify-checks; known: {', '.join(CHECKS)}")
        if timeout <= 0:
            raise FxVerifyError(f"--fxverify-timeout must be positive, got {timeout:g}")
        if update_golden and "golden" not in chosen:
            raise FxVerifyError("--fxverify-update-golden writes golden files, but --fxverify-checks leaves out "
                                "the golden check: add golden to it")
        return cls(transforms, cases, chosen, timeout, golden_dir, update_golden, repro_dir)

    def verification(self, transform: Transform, case: ModelCase) -> Verification:
        """The shared Verification of (transform, case); only the latest is kept in memory."""
        key = (transform.spec, case.name)
        if self._verification is None or self._verification[0] != key:
            self._verification = None  # release the previous model before building the next;
            gc.collect()  # GraphModules hold reference cycles: without this, big models pile up
            digests = self._digests[transform.spec]
            if (transform.spec, case.name) in self._digest_wanted:
                digests.request(case.name)  # the server works on it while the other checks run
            v = Verification(transform, case, timeout=self.timeout, cross_process=digests,
                             golden_dir=self.golden_dir, update_golden=self.update_golden, repro_dir=self.repro_dir)
            self._verification = (key, v)
        return self._verification[1]

    # -- pytest hooks ------------------------------------------------------------
    @pytest.hookimpl(trylast=True)  # after -k, --deselect and --lf have had their say
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self._digest_wanted = {
            (item.parent.transform.spec, item.case.name)
            for item in items if isinstance(item, CheckItem) and item.check == "determinism"
        }

    def pytest_unconfigure(self) -> None:
        for digests in self._digests.values():
            digests.close()

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(self, collector: pytest.Collector) -> Any:
        """Add one collector per transform next to what the session collected from its arguments."""
        report = yield
        if isinstance(collector, pytest.Session) and report.passed:
            for transform in self.transforms:
                node = TransformCollector.from_parent(collector, name=transform.spec, nodeid=transform.spec)
                node.run, node.transform = self, transform
                report.result.append(node)
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        parsed = parse_nodeid(report.nodeid)
        if parsed is None or (report.when != "call" and not (report.failed or report.skipped)):
            return
        spec, model, check = parsed
        if hasattr(report, "wasxfail"):
            outcome = "xfail"
        elif is_error(report):
            outcome = "ERR"
        else:
            outcome = {"passed": "pass", "failed": "FAIL", "skipped": "skip"}[report.outcome]
        self._outcomes[spec][(model, check)] = outcome
        for key, value in report.user_properties:
            if key == CHANGED:
                self._changes[spec][model] = value
            if key == "fxverify_golden_update":
                status, path = value
                self._golden_updates[status].append(path)

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report: pytest.TestReport) -> tuple[str, str, str] | None:
        """An item fxverify could not judge (its own code raised, or the worker died) is an error,
        not a failure of the transform."""
        if is_error(report) and parse_nodeid(report.nodeid) is not None:
            return "error", "E", "ERROR"
        return None

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self._outcomes:
            return
        terminalreporter.write_sep("=", "fxverify summary")
        random_graphs = {c.name for c in self.cases if RANDOM_GRAPH_TAG in c.entry.tags}
        for transform in self.transforms:
            outcomes = self._outcomes.get(transform.spec)
            if outcomes:
                changes = self._changes[transform.spec]
                table = format_table(transform.spec, transform.contract.describe(), outcomes, self.checks, changes)
                terminalreporter.write_line(table)
                warning = rewrite_warning(transform.spec, changes, random_graphs)
                if warning:
                    terminalreporter.write_line(warning, yellow=True, bold=True)
                terminalreporter.write_line("")
        if self._golden_updates:
            from fxverify.golden import format_updates

            terminalreporter.write_line(format_updates(self._golden_updates, terminalreporter.config.rootpath))


def is_error(report: pytest.TestReport) -> bool:
    """Whether ``report`` is of an item fxverify could not judge: its own code raised (an ERROR
    outcome), or the process running it died (pytest-xdist's crash report)."""
    return report.failed and (report.when == CRASHED or (OUTCOME, ERROR) in report.user_properties)


class TransformCollector(pytest.Collector):
    """The items of one transform: a model x check grid."""

    run: FxVerifyRun
    transform: Transform

    def collect(self) -> list[pytest.Item]:
        items = []
        for case in self.run.cases:
            for check in self.run.checks:
                item = CheckItem.from_parent(self, name=f"{ITEM_PREFIX}{case.name}-{check}{ITEM_SUFFIX}")
                item.case, item.check = case, check
                item.add_marker(pytest.mark.fxverify)
                for tag in case.entry.tags:
                    item.extra_keyword_matches.add(tag)
                items.append(item)
        return items


class CheckItem(pytest.Item):
    """One check of one transform on one model."""

    case: ModelCase
    check: str

    def runtest(self) -> None:
        parent = self.parent
        assert isinstance(parent, TransformCollector)
        v = parent.run.verification(parent.transform, self.case)
        result = v.run(self.check)
        try:
            changes = None if self.case.entry.xfail else v.changes
            self.user_properties.extend(report_properties(self.config, v, result, changes))
            if not self.case.entry.xfail:
                self.user_properties.append((CHANGED, changes))
            if v.update_golden and "golden_file" in result.details:
                self.user_properties.append(("fxverify_golden_update", (result.details["golden"], result.details["golden_file"])))
        except Exception as exc:  # fxverify's bookkeeping must not turn the check's verdict into a failure
            result = v.internal_error(self.check, exc, doing="recording the item's result for the summary and reports")
            self.user_properties.extend(report_properties(self.config, None, result))
        if result.outcome == SKIPPED:
            pytest.skip(result.message)
        if result.outcome == XFAILED:
            pytest.xfail(result.message)
        if result.outcome == ERROR:
            self.user_properties.append((OUTCOME, ERROR))
            raise CheckFailed(result.message)
        if result.outcome == FAILED:
            raise CheckFailed(result.message)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, CheckFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"{self.parent.name if self.parent else ''} {self.name}"


def parse_nodeid(nodeid: str) -> tuple[str, str, str] | None:
    """``(transform spec, model, check)`` from an fxverify item's node id, else None.

    >>> parse_nodeid("my.mod:fn::fxverify[resnet18-numerics]")
    ('my.mod:fn', 'resnet18', 'numerics')
    """
    spec, sep, name = nodeid.rpartition("::")
    if not sep or not name.startswith(ITEM_PREFIX) or not name.endswith(ITEM_SUFFIX):
        return None
    model, _, check = name[len(ITEM_PREFIX):-len(ITEM_SUFFIX)].rpartition("-")
    return spec, model, check


class XdistGrouping:
    """Under ``-n``, keep each (transform, model)'s items on one worker so the
    expensive per-model work is shared (xdist's ``load`` distribution otherwise),
    and when a model kills its worker (``os.abort()`` in a transform, a crash in
    a C++ extension), report that model's items as errors instead of crashing a
    new worker with each of them; the other models go on."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if config.getvalue("dist") != "load":
            return None
        from xdist.scheduler import LoadScopeScheduling

        class ModelScheduling(LoadScopeScheduling):
            """xdist's scope scheduling with one scope per (transform, model). Overrides the
            private ``_split_scope`` (the public ``xdist_group`` mark needs ``--dist loadgroup``,
            which a user would have to pass)."""

            def _split_scope(self, nodeid: str) -> str:
                parsed = parse_nodeid(nodeid)
                return f"{parsed[0]}::{parsed[1]}" if parsed else nodeid

            def drop_scope(self, nodeid: str) -> list[str]:
                """Take the items of ``nodeid``'s scope out of the queue; return the others not run."""
                work = self.workqueue.pop(self._split_scope(nodeid), {})
                return [other for other, done in work.items() if not done and other != nodeid]

        return ModelScheduling(config, log)

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        parsed = parse_nodeid(crashitem)
        if parsed is None or not hasattr(sched, "drop_scope"):
            return
        spec, model, check = parsed
        worker = getattr(getattr(report, "node", None), "gateway", None)
        died = (f"the worker process{f' {worker.id}' if worker else ''} died while running the {check} check of "
                f"{spec} on model {model!r}: the transform or the model killed the process (os.abort(), sys.exit "
                "from a thread, a crash in a C++ extension). fxverify could not judge it")
        report.longrepr = died
        report.user_properties.append((OUTCOME, ERROR))
        for nodeid in sched.drop_scope(crashitem):
            config = sched.config
            fspath = nodeid.split("::")[0]
            skipped = pytest.TestReport(
                nodeid=nodeid, location=(fspath, None, fspath), keywords={}, outcome="failed",
                longrepr=f"not run: {died} (on its {check} check); the other items of {model!r} would kill their "
                         "workers too",
                when=CRASHED, user_properties=[(OUTCOME, ERROR)],  # type: ignore[arg-type]
            )
            config.hook.pytest_runtest_logreport(report=skipped)
