"""The pytest plugin end to end, through pytester: items, exit codes, summary,
start-up errors, per-model failures, timeouts, ini options and fixtures."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch

MUTATIONS = Path(__file__).with_name("mutations.py")
EDGE = "--fxverify-corpus=edge_conv_bn_head"
GPU = torch.cuda.is_available()  # the cuda item runs and judges on a GPU machine; elsewhere it skips


def spec(name: str) -> str:
    return f"{MUTATIONS}:{name}"


def test_correct_transform_passes_with_readable_ids_and_summary(pytester):
    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", spec("torch_fuse"), EDGE, "-v")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "*::fxverify[[]edge_conv_bn_head-lint[]] PASSED*",
        f"*::fxverify[[]edge_conv_bn_head-cuda[]] {'PASSED' if GPU else 'SKIPPED'}*",
        "*fxverify summary*",
        "transform *mutations.py:torch_fuse  [[]contract declared: modes=eval changes_parameters=yes[]]",
        "model * lint * determinism * numerics * gradients * devices * cuda * purity * changed",
        f"edge_conv_bn_head * pass * pass * pass * pass * pass * {'pass' if GPU else 'skip'} * pass * "
        "state+graph+code+modules+meta",
    ])


def test_buggy_transform_fails_its_check_and_exits_1(pytester):
    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", spec("bn_fold_ignores_running_mean"), EDGE)
    assert result.ret == 1
    # wrong values also mean wrong gradients, and on a GPU wrong CUDA values
    # skipped: cuda without a GPU, to_folder (annotations), golden (no golden dir), stateful (no buffer changes in
    # forward), agreement (one capture); meta, dynamic, verifier, opset, reexport and serde need what symbolic_trace
    # graphs lack (meta['val'], a dynamic batch, a program, an operator set): not collected
    result.assert_outcomes(passed=9, failed=2 + GPU, skipped=5 - GPU)
    result.stdout.fnmatch_lines([
        "*fxverify numerics check failed*",
        "*model:      edge_conv_bn_head*",
        "*first node: %relu*",
        f"edge_conv_bn_head * pass * pass * FAIL * FAIL * pass * {'FAIL' if GPU else 'skip'} * pass * "
        "state+graph+code+meta",
    ])


def test_a_transform_that_changes_nothing_is_shown_as_verifying_nothing(pytester):
    pytester.makepyfile(passes="def untouched(gm):\n    return None\n")
    for transform, changed in (("passes.py:untouched", "no-op"), (spec("transformer_identity"), "code+meta")):
        result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", transform, EDGE, "--fxverify-checks=lint")
        assert result.ret == 0
        result.stdout.fnmatch_lines([f"edge_conv_bn_head * pass * {changed}",
                                     "WARNING: * changed the graph or parameters of none of the 1 models it ran on: "
                                     "nothing it rewrites was verified*"])


@pytest.mark.parametrize(
    ("transform", "message"),
    [
        ("not_a_module_zz:fn", "*cannot import module 'not_a_module_zz'*"),
        (f"{MUTATIONS}:no_such_function", "*has no attribute 'no_such_function'*"),
        (f"{MUTATIONS}:BUGGY", "*names a dict, not a callable*"),
        ("fxverify.examples:annotations", "*not a callable*"),
    ],
)
def test_bad_transforms_stop_at_start_up_with_one_message(pytester, transform, message):
    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", transform, EDGE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: fxverify: {message}"])
    assert "passed" not in result.stdout.str() and "failed" not in result.stdout.str()


def test_wrong_signature_stops_at_start_up(pytester):
    pytester.makepyfile(bad_sig="def t(a, b, c):\n    return a\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", "bad_sig.py:t", EDGE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*fxverify calls transform(gm) or transform(gm, tracer_class)*"])


def test_a_transform_raising_on_one_model_fails_that_model_only(pytester):
    pytester.makepyfile(picky="""
        def t(gm):
            if len(gm.graph.nodes) > 30:
                raise ValueError("too big for me")
            return gm
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", "picky.py:t",
                                "--fxverify-corpus=edge_conv_bn_head,resnet18", "--fxverify-checks=lint,purity")
    assert result.ret == 1
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines([
        "*model:      resnet18*",
        "*transform picky.py:t raised ValueError: too big for me*",
        "*Traceback*",
    ])


def test_wrong_return_type_says_what_was_returned(pytester):
    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", spec("returns_graph"), EDGE, "--fxverify-checks=lint")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*returned torch.fx.graph.Graph*accepted: an nn.Module*"])


def test_hanging_transform_fails_after_the_timeout(pytester):
    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", spec("hangs"), EDGE,
                                "--fxverify-checks=lint", "--fxverify-timeout=1")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*did not finish within 1 s*"])


def test_ini_options_and_k_selection(pytester):
    pytester.makeini(f"""
        [pytest]
        fxverify = {spec("normalize_args")}
        fxverify_corpus = edge_conv_bn_head
        fxverify_checks = lint,numerics,purity
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "-k", "numerics or purity")
    assert result.ret == 0
    result.assert_outcomes(passed=2, deselected=1)


def test_several_transforms_are_verified_separately(pytester):
    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", spec("normalize_args"), "--fxverify",
                                spec("forgets_recompile"), EDGE, "--fxverify-checks=lint")
    assert result.ret == 1
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*did not call gm.recompile()*"])


@pytest.mark.slow
def test_in_place_and_tracer_class_conventions(pytester):
    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", spec("relu_to_clamp_in_place"), "--fxverify",
                                spec("retrace_with_tracer_class"), EDGE)
    assert result.ret == 0, result.stdout.str()


@pytest.mark.slow
def test_xdist_runs_each_models_items_on_one_worker(pytester):
    result = pytester.runpytest("-p", "no:cacheprovider", "-n", "2", "--fxverify", spec("normalize_args"),
                                "--fxverify-corpus=edge_conv_bn_head,squeezenet1_1", "--fxverify-checks=lint,purity", "-v")
    assert result.ret == 0
    workers = {}
    for line in result.stdout.lines:
        if "PASSED" in line and "fxverify[" in line:
            worker = line.split("]")[0].strip("[ ")
            model = line.split("fxverify[")[1].split("-")[0]
            workers.setdefault(model, set()).add(worker)
    assert set(workers) == {"edge_conv_bn_head", "squeezenet1_1"}
    assert all(len(w) == 1 for w in workers.values()), workers
    result.stdout.fnmatch_lines(["*fxverify summary*", "squeezenet1_1 * pass * pass *"])


@pytest.mark.slow
def test_fx_model_fixture_is_parametrized_over_the_corpus(pytester, monkeypatch):
    pytester.makepyfile(test_mine="""
        import fxverify
        from tests import mutations

        def test_pass(fx_model):
            assert isinstance(fx_model, fxverify.ModelCase)
            gm = fx_model.captured()
            assert gm is not fx_model.captured()
            fxverify.assert_transform_ok(mutations.normalize_args, fx_model, checks=["lint", "numerics"])
    """)
    monkeypatch.setenv("PYTHONPATH", str(MUTATIONS.parent.parent))
    # in a subprocess: re-importing torch's operator libraries in-process is not allowed
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--fxverify-corpus=edge_conv_bn_head,squeezenet1_1", "-v")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*test_pass[[]squeezenet1_1[]] PASSED*", "*test_pass[[]edge_conv_bn_head[]] PASSED*"])


def test_a_run_without_fxverify_does_not_import_torch(pytester):
    pytester.makeconftest("""
        import sys

        def pytest_sessionfinish(session):
            loaded = session.config.pluginmanager.hasplugin("fxverify")
            print("FXVERIFY_LOADED=%s TORCH_IMPORTED=%s" % (loaded, "torch" in sys.modules))
    """)
    pytester.makepyfile(test_plain="def test_nothing():\n    assert 1 + 1 == 2\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s")
    assert result.ret == 0
    # the plugin was loaded, and stayed cheap
    result.stdout.fnmatch_lines(["*FXVERIFY_LOADED=True TORCH_IMPORTED=False*"])


def test_bad_corpus_selection_is_a_usage_error(pytester):
    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", spec("normalize_args"), "--fxverify-corpus=resnet81")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bad corpus selection (--fxverify-corpus 'resnet81')*"
                                 "matches no profile, model name or glob*Did you mean resnet18*"])


def _bug_cases():
    from tests import mutations
    from tests.test_checks import MODEL_FOR

    return [pytest.param(f.__name__, check, MODEL_FOR.get(f, "edge_conv_bn_head"), id=f.__name__)
            for f, check in mutations.BUGGY.items()]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "check", "model"), _bug_cases())
def test_every_bug_fails_its_item_through_the_plugin(pytester, name, check, model):
    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", spec(name), f"--fxverify-corpus={model}",
                                f"--fxverify-checks={check}")
    assert result.ret == 1
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*fxverify {check} check failed*", f"*model:      {model}*", f"{model} * FAIL *"])


def _once_false_alarms():
    from tests import mutations

    return [pytest.param(f.__name__, model, checks, id=f"{f.__name__}-{model}")
            for f, (models, checks) in mutations.ONCE_FALSE_ALARMS.items() for model in models]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "model", "checks"), _once_false_alarms())
def test_correct_transforms_that_once_raised_false_alarms_pass_through_the_plugin(pytester, name, model, checks):
    args = ["-p", "no:cacheprovider", "--fxverify", spec(name), f"--fxverify-corpus={model}"]
    result = pytester.runpytest(*args, *([f"--fxverify-checks={','.join(checks)}"] if checks else []))
    assert result.ret == 0, result.stdout.str()
    assert result.parseoutcomes().get("passed", 0) >= (len(checks) if checks else 3)  # not all skipped


def test_an_exception_inside_fxverify_is_reported_as_an_error_not_a_failure(pytester, monkeypatch):
    from fxverify.checks import lint

    monkeypatch.setattr(lint, "check", lambda v: 1 / 0)
    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", spec("normalize_args"), EDGE,
                                "--fxverify-checks=lint,purity", "--fxverify-json=out.json")
    assert result.ret == 1
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*fxverify error in the lint check (not a finding about the transform)*",
                                 "edge_conv_bn_head * ERR * pass *"])
    import json

    records = {r["check"]: r["outcome"] for r in json.loads((pytester.path / "out.json").read_text())["records"]}
    assert records == {"lint": "error", "purity": "passed"}


@pytest.mark.slow
def test_a_transform_that_kills_its_worker_fails_that_model_as_errors_and_the_run_goes_on(pytester):
    """Under -n, a model whose transform kills the process (os.abort()) has its items reported as errors
    naming the model; the other models are checked and the reports are written."""
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-n", "2", "--fxverify", spec("aborts_on_attention"),
        "--fxverify-corpus=layer_root_attention,edge_conv_bn_head", "--fxverify-checks=lint,purity,pickle",
        "--fxverify-json=out.json")
    assert result.ret == 1
    result.assert_outcomes(passed=3, errors=3)
    import json

    records = json.loads((pytester.path / "out.json").read_text())["records"]
    outcomes = {(r["model"], r["check"]): r["outcome"] for r in records}
    assert {k: v for k, v in outcomes.items() if k[0] == "edge_conv_bn_head"} == {
        ("edge_conv_bn_head", c): "passed" for c in ("lint", "purity", "pickle")}
    died = [r for r in records if r["model"] == "layer_root_attention"]
    assert [r["outcome"] for r in died] == ["error"] * 3
    assert all("died while running" in r["message"] and "'layer_root_attention'" in r["message"] for r in died)


class _Worker:
    """What xdist's scheduler uses of a worker: the items it was sent, and whether it was told to stop."""

    def __init__(self, name: str) -> None:
        self.gateway, self.sent, self.shutting_down = types.SimpleNamespace(id=name), [], False

    def send_runtest_some(self, indices):
        self.sent.extend(indices)

    def shutdown(self):
        self.shutting_down = True


def _scheduler(pytester, collection, workers):
    from fxverify.plugin.xdist import XdistGrouping

    config = pytester.parseconfig(f"--tx={len(workers)}*popen", "--dist", "load")
    sched = XdistGrouping().pytest_xdist_make_scheduler(config, None)
    for worker in workers:
        sched.add_node(worker)
        sched.add_node_collection(worker, collection)
    sched.schedule()
    return sched


def test_the_scheduler_requeues_only_what_a_dead_worker_left_to_run(pytester):
    collection = [f"p.py:t::fxverify[{model}-{check}]" for model in "abc" for check in ("lint", "numerics")]
    first, second = _Worker("gw0"), _Worker("gw1")
    sched = _scheduler(pytester, collection, [first, second])
    assert sorted(first.sent + second.sent) == list(range(6))  # every model handed out, two items each
    dying = first if 4 in first.sent else second  # the worker given model c has run a model before
    for index in [*(i for i in dying.sent if i < 4), 4]:
        sched.mark_test_complete(dying, index)
    crashed = sched.remove_node(dying)  # while running c's numerics
    assert crashed == collection[5]
    assert not sched.workqueue  # xdist 3.8 queues the finished model again: an empty list for some worker later
    assert sched.drop_scope(crashed) == []  # c's lint ran; nothing of c is run again


def test_the_scheduler_never_leaves_a_worker_holding_a_single_item_with_more_queued(pytester):
    collection = [f"p.py:t::fxverify[{model}-lint]" for model in "abcdefgh"]  # one item a model
    first, second = _Worker("gw0"), _Worker("gw1")
    sched = _scheduler(pytester, collection, [first, second])
    assert len(first.sent) == len(second.sent) == 2
    assert sched.remove_node(first) == collection[first.sent[0]]  # dies on its first item
    replacement = _Worker("gw2")
    sched.add_node(replacement)
    sched.add_node_collection(replacement, collection)
    sched.schedule()
    # it runs an item once it has the next (or is told to stop): xdist 3.8 sends it one and it waits for ever
    assert len(replacement.sent) == 2, replacement.sent


@pytest.mark.slow
def test_a_worker_dying_after_it_finished_other_models_does_not_hang_the_run(pytester):
    """xdist queues again every scope a dead worker was given, those it finished too, and hands each to a worker as
    an empty list: a worker holding its last item then waits for ever. The worker that dies here has finished
    other models first (catalogue order, the attention model last)."""
    finished = "edge_conv_bn_head,edge_static_config_flow,edge_concrete_flag,edge_wrapped_function,edge_nested_sequential"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-n", "2", "--fxverify", spec("aborts_on_attention"), "--fxverify-order=catalogue",
        f"--fxverify-corpus={finished},layer_root_attention", "--fxverify-checks=lint,purity,pickle", timeout=120)
    assert result.ret == 1
    result.assert_outcomes(passed=15, errors=3)


def test_a_bad_timeout_in_the_ini_file_is_a_usage_error(pytester):
    pytester.makeini(f"[pytest]\nfxverify = {spec('normalize_args')}\nfxverify_timeout = abc\n")
    result = pytester.runpytest("-p", "no:cacheprovider", EDGE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--fxverify-timeout (ini fxverify_timeout) must be a number of seconds > 0, got 'abc'*"])


def test_random_graphs_exercise_what_the_transform_rewrites(pytester):
    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", spec("relu_to_clamp_in_place"), EDGE,
                                "--fxverify-checks=lint", "--fxverify-random-graphs=3",
                                "--fxverify-json=report.json", "--fxverify-html=report.html")
    assert result.ret == 0
    said = "relu_to_clamp_in_place changed 3 of 3 random graphs (graph or parameters)"
    result.stdout.fnmatch_lines(["fxverify: probed *relu_to_clamp_in_place on graphs of each of * ops in * s; it "
                                 "rewrote 1 (F.relu)",
                                 "fxverify: new random graphs are drawn from the ops the probe found rewritten (1)",
                                 f"*{said}"])
    report = json.loads((pytester.path / "report.json").read_text())
    assert len(report["header"]["random_graphs"]) == 3
    assert set(report["header"]["random_graphs"]) == {r["model"] for r in report["records"]} - {"edge_conv_bn_head"}
    assert said in (pytester.path / "report.html").read_text()  # the page says what the terminal says
