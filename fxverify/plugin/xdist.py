"""pytest-xdist glue: each (transform, model)'s items, under every capture, on one worker, and a
model whose transform kills its worker reported as errors while the other models go on."""

from __future__ import annotations

from typing import Any

import pytest

from fxverify.cases.catalogue import split_label
from fxverify.core.results import ERROR
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
            public ``xdist_group`` mark needs ``--dist loadgroup``, which a user would have to pass)
            and ``remove_node``, whose xdist version hangs the run after a worker dies (below)."""

            def __init__(self, config: pytest.Config, log: Any = None) -> None:
                super().__init__(config, log)
                self.crashed: dict[str, dict[str, bool]] = {}  # the scope each dead worker was running

            def _split_scope(self, nodeid: str) -> str:
                parsed = parse_nodeid(nodeid)
                return f"{parsed[0]}::{split_label(parsed[1])[0]}" if parsed else nodeid

            def remove_node(self, node: Any) -> str | None:
                """Forget a worker that finished or died; for a dead one, return the item it was running.

                xdist (3.8) queues every scope the dead worker was given again, those it had run to the end
                too: each is later handed to a worker as an empty list of items, and a worker holding its
                last item (it runs one only once it has the next, or is told to stop) then waits for ever
                while such scopes stay queued. Over `default` a transform that aborted the process on one
                model hung the run with 50 of them left. Here only scopes with items still to run go back to
                the queue, and the scope of an fxverify item that killed the worker is kept aside for
                :meth:`drop_scope`, so that no other worker runs that model again and dies too (another
                test's scope goes back without the item that killed the worker)."""
                workload = self.assigned_work.pop(node)
                unfinished = {scope: work for scope, work in workload.items() if not all(work.values())}
                if not unfinished:
                    return None
                scope, work = next(iter(unfinished.items()))  # xdist runs the scopes, and their items, in order
                crashitem = next(nodeid for nodeid, done in work.items() if not done)
                if parse_nodeid(crashitem) is not None:
                    self.crashed[scope] = unfinished.pop(scope)
                else:
                    work[crashitem] = True
                    if all(work.values()):
                        del unfinished[scope]
                self.workqueue.update(unfinished)
                for other in self.assigned_work:
                    self._reschedule(other)
                return crashitem

            def _reschedule(self, node: Any) -> None:
                """xdist's, then more scopes while the worker would hold a single item: it runs an item only
                once it has the next or is told to stop, so a worker given one single-item scope (a replacement
                worker, under one check and one capture) waits for ever otherwise (xdist issue 1327); one
                holding its last item is told to stop."""
                super()._reschedule(node)
                while self.workqueue and not node.shutting_down and self._pending_of(self.assigned_work[node]) < 2:
                    self._assign_work_unit(node)
                if not self.workqueue and not node.shutting_down and self._pending_of(self.assigned_work[node]) < 2:
                    node.shutdown()

            def drop_scope(self, nodeid: str) -> list[str]:
                """The items of ``nodeid``'s scope, whose worker died running ``nodeid``, that were not run."""
                work = self.crashed.pop(self._split_scope(nodeid), {})
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
