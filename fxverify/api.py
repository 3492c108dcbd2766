"""The public API over the engine: ``check_<name>`` returns a :class:`CheckResult`,
``assert_<name>`` raises :class:`CheckFailed` with a readable message, one pair per
registered check; :class:`Verification` runs several checks on one shared subject;
:func:`minimise_numerics` shrinks a numerics failure.

Each takes the transform (a callable, a ``"module:function"`` spec or a
:class:`Transform`) and the model (a :class:`ModelCase` or a corpus name)::

    fxverify.check_numerics(my_pass, "resnet18").ok
    fxverify.assert_transform_ok(my_pass, fx_model)   # every check

To run several checks without redoing the shared work, use one :class:`Verification`
and call ``run(check)`` on it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fxverify import checks as registry
from fxverify.capture import Capture
from fxverify.cases.case import ModelCase, load_case
from fxverify.checks import determinism
from fxverify.checks._digest_server import CrossProcessDigests
from fxverify.core.results import CheckResult
from fxverify.core.transform import Transform, as_transform
from fxverify.diagnose.minimise import DEFAULT_BUDGET, Minimised, minimise_failure
from fxverify.diagnose.repro import ReproOnFailure
from fxverify.engine.judging import judge
from fxverify.engine.references import ReferenceStore
from fxverify.engine.subject import DEFAULT_TIMEOUT, Settings, Subject
from fxverify.errors import CheckFailed
from fxverify.runner import Runner

TransformLike = Transform | Callable[..., Any] | str
CaseLike = ModelCase | str


class Verification(Runner):
    """Runs checks of ``transform`` on ``case`` (a :class:`ModelCase` or a corpus name), sharing the
    expensive work (``subject``): ``run(check)``, ``run_all()``.

    ``capture`` says how the model becomes a graph (default: the case's own, see :mod:`fxverify.capture`);
    with ``repro_dir``, a failing numerics check is minimised and written there as a standalone repro
    (:class:`fxverify.diagnose.repro.ReproOnFailure`). What the checks read beyond the subject is ``settings``
    (:class:`~fxverify.engine.subject.Settings`, built once for a run), or made of the keywords:
    ``references`` keeps the original's outputs for other transforms and later runs (:class:`ReferenceStore`);
    ``captures`` names the captures the agreement check compares the transform's effect across (this one among
    them); ``options`` holds check options by key, and three have keywords of their own: ``golden_dir`` and
    ``update_golden`` (the golden check's folder and mode) and ``train_capture`` (on by default: numerics' train
    stage captures the model in train mode too where the capture fixes the mode); ``cross_process(name, mode=...,
    static=...)`` supplies digests of the transform's result computed in another process (the determinism
    check's service, :class:`CrossProcessDigests` with the same ``capture``).

    >>> import fxverify
    >>> v = Verification(fxverify.examples.identity, "edge_conv_bn_head")
    >>> v.run("lint").ok, v.subject.changes
    (True, ['code', 'meta'])
    """

    def __init__(self, transform: TransformLike, case: CaseLike, *, timeout: float | None = DEFAULT_TIMEOUT,
                 capture: Capture | None = None, repro_dir: str | os.PathLike[str] | None = None,
                 settings: Settings | None = None, references: ReferenceStore | None = None,
                 captures: Sequence[str] = (), options: Mapping[str, Any] | None = None,
                 golden_dir: str | os.PathLike[str] | None = None, update_golden: bool = False,
                 train_capture: bool = True, cross_process: Callable[..., str] | None = None) -> None:
        keywords = (references, tuple(captures), options, golden_dir, update_golden, train_capture, cross_process)
        if settings is not None and keywords != (None, (), None, None, False, True, None):
            raise TypeError("Verification takes settings or the keywords that make them (references, captures, "
                            "options, golden_dir, update_golden, train_capture, cross_process), not both")
        if settings is None:
            given = {"golden_dir": golden_dir, "update_golden": update_golden, "train_capture": train_capture}
            settings = Settings(references=references, captures=tuple(captures), options={**given, **(options or {})},
                                services={determinism.NAME: cross_process} if cross_process is not None else {})
        super().__init__(transform, case, timeout=timeout, capture=capture, settings=settings,
                         after_failure=[ReproOnFailure(repro_dir)] if repro_dir else [])


def verify(
    transform: TransformLike, case: CaseLike, *, checks: Sequence[str] | None = None, timeout: float | None = DEFAULT_TIMEOUT,
    capture: str | None = None,
) -> list[CheckResult]:
    """Run every check (or the named ones) of ``transform`` on ``case``, captured as ``capture`` names (a registered
    capture, ``--fxverify-capture``'s names; default: the case's own).

    >>> import fxverify
    >>> [r.outcome.value for r in verify(fxverify.examples.identity, "edge_conv_bn_head", checks=["lint"])]
    ['passed']
    >>> verify(fxverify.examples.identity, "edge_conv_bn_head", checks=["opset"], capture="export")[0].outcome.value
    'passed'
    """
    transform, case = as_transform(transform), load_case(case) if isinstance(case, str) else case
    captured = None if capture is None else case.capture_named(capture)
    digests = CrossProcessDigests(transform, [case], timeout=timeout or DEFAULT_TIMEOUT, capture=captured)
    try:
        return Verification(transform, case, timeout=timeout, capture=captured, cross_process=digests).run_all(
            None if checks is None else list(checks))
    finally:
        digests.close()


def minimise_numerics(transform: TransformLike, case: CaseLike, *, budget_s: float = DEFAULT_BUDGET) -> Minimised:
    """The numerics failure of ``transform`` on ``case`` (a corpus name or a ``ModelCase``), minimised;
    then write it with :func:`fxverify.write_repro`::

        found = fxverify.minimise_numerics(my_pass, "resnet18")
        print(found.describe(), found.module.code)
        fxverify.write_repro(found, "repros", "resnet18-my_pass")
    """
    return minimise_failure(Subject(transform, case), budget_s=budget_s)


def assert_transform_ok(
    transform: TransformLike, case: CaseLike, *, checks: Sequence[str] | None = None, timeout: float | None = DEFAULT_TIMEOUT,
    capture: str | None = None,
) -> list[CheckResult]:
    """Run the checks and raise :class:`CheckFailed` listing every failure (and every check fxverify
    itself could not complete).

    Example, in your own test over the corpus::

        def test_my_pass(fx_model):
            fxverify.assert_transform_ok(my_pass, fx_model)
    """
    __tracebackhide__ = True
    results = verify(transform, case, checks=checks, timeout=timeout, capture=capture)
    failed = [r for r in results if not r.ok]
    if failed:
        raise CheckFailed("\n\n".join(r.message for r in failed))
    return results


def _pair(name: str) -> tuple[Callable[..., CheckResult], Callable[..., CheckResult]]:
    summary = registry.spec(name).summary

    def check_fn(transform: TransformLike, case: CaseLike, *, timeout: float | None = DEFAULT_TIMEOUT,
                 capture: str | None = None) -> CheckResult:
        return verify(transform, case, checks=[name], timeout=timeout, capture=capture)[0]

    def assert_fn(transform: TransformLike, case: CaseLike, *, timeout: float | None = DEFAULT_TIMEOUT,
                  capture: str | None = None) -> CheckResult:
        __tracebackhide__ = True
        return check_fn(transform, case, timeout=timeout, capture=capture).raise_for_failure()

    check_fn.__name__ = check_fn.__qualname__ = f"check_{name}"
    assert_fn.__name__ = assert_fn.__qualname__ = f"assert_{name}"
    check_fn.__doc__ = (
        f"Run the {name} check: {summary}.\n\n"
        f"Returns a CheckResult; ``.ok`` is False when it failed, ``.message`` says why::\n\n"
        f"    fxverify.check_{name}(my_pass, 'resnet18').outcome   # 'passed', 'failed', 'skipped', 'xfailed' or 'error'\n"
        f"    fxverify.check_{name}(my_pass, 'resnet18', capture='export')   # under another capture\n"
    )
    assert_fn.__doc__ = (
        f"Run the {name} check and raise CheckFailed with the finding when it fails.\n\n"
        f"    fxverify.assert_{name}(my_pass, 'resnet18')\n"
    )
    return check_fn, assert_fn


def _subject_pair(name: str) -> tuple[Callable[..., CheckResult], Callable[..., CheckResult]]:
    """The pair of a check taking another subject than a model: ``check_backend_outputs(backend, case)``,
    ``check_patterns_sound(patterns, name)``, ``check_graph_cache_stale(passes, model)``; keyword options go to
    the subject (:data:`fxverify.checks.KINDS` ``one``: ``timeout=``, ``dtype=``, ``hook=``, ``budget_s=`` ...)."""
    entry = registry.spec(name)
    taken = registry.kind(entry.subject)
    python = name.replace("-", "_")

    def check_fn(under_test: Any, subject: Any = None, **options: Any) -> CheckResult:
        return judge(name, registry.get(name), registry.one_subject(taken.name)(under_test, subject, **options))

    def assert_fn(under_test: Any, subject: Any = None, **options: Any) -> CheckResult:
        __tracebackhide__ = True
        return check_fn(under_test, subject, **options).raise_for_failure()

    check_fn.__name__ = check_fn.__qualname__ = f"check_{python}"
    assert_fn.__name__ = assert_fn.__qualname__ = f"assert_{python}"
    check_fn.__doc__ = (f"Run the {name} check on one {taken.name} (what --fxverify-{taken.option} runs): "
                        f"{entry.summary}.\n\nReturns a CheckResult, as every check_<name> does.\n")
    assert_fn.__doc__ = f"Run the {name} check and raise CheckFailed with the finding when it fails.\n"
    return check_fn, assert_fn


def pair_names(name: str) -> tuple[str, str]:
    """The public ``check_`` and ``assert_`` names of check ``name`` (hyphens made underscores).

    >>> pair_names("backend-outputs")
    ('check_backend_outputs', 'assert_backend_outputs')
    """
    return f"check_{name.replace('-', '_')}", f"assert_{name.replace('-', '_')}"


for _name in registry.names(None):  # check_lint, assert_lint, check_backend_outputs ...: one pair per registered check
    globals()[pair_names(_name)[0]], globals()[pair_names(_name)[1]] = (
        _pair(_name) if registry.spec(_name).subject == registry.MODEL else _subject_pair(_name))

__all__ = ["verify", "assert_transform_ok", "CheckFailed", *(n for name in registry.names(None) for n in pair_names(name))]
