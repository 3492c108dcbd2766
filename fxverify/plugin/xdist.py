"""pytest-xdist glue: each (transform, model)'s items, under every capture, on one worker, and a
model whose transform kills its worker reported as errors while the other models go on."""

from __future__ import annotations

from typing import Any

import pytest

from fxverify.cases.catalogue import split_label
from fxverify.engine.results import ERROR
from fxverify.plugin.ledger import CRASHED, OUTCOME
from fxverify.plugin.nodeids import parse_nodeid


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
            """xdist's scope scheduling with one scope per (transform, model), all its captures
            together (the agreement check compares them). Overrides the private ``_split_scope`` (the
            public ``xdist_group`` mark needs ``--dist loadgroup``, which a user would have to pass)."""

            def _split_scope(self, nodeid: str) -> str:
                parsed = parse_nodeid(nodeid)
                return f"{parsed[0]}::{split_label(parsed[1])[0]}" if parsed else nodeid

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
        report.user_properties.append((OUTCOME, ERROR.value))
        for nodeid in sched.drop_scope(crashitem):
            config = sched.config
            fspath = nodeid.split("::")[0]
            not_run = pytest.TestReport(
                nodeid=nodeid, location=(fspath, None, fspath), keywords={}, outcome="failed",
                longrepr=f"not run: {died} (on its {check} check); the other items of {model!r} would kill their "
                         "workers too",
                when=CRASHED, user_properties=[(OUTCOME, ERROR.value)],  # type: ignore[arg-type]
            )
            config.hook.pytest_runtest_logreport(report=not_run)
