"""The Hypothesis strategies: random graphs valid by construction, inputs, shrinking,
runnable reprs, and random graphs in ``pytest --fxverify`` with replay."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

import fxverify
import fxverify.strategies as fxs
import fxverify.strategies.corpus
from fxverify.cases.case import ModelCase
from fxverify.cases.catalogue import InputSpec
from fxverify.core.results import Outcome
from fxverify.strategies.meta import ANY
from fxverify.strategies.ops import CATALOGUE

ISSUE_FAMILIES = {"unary", "binary", "comparison", "reduction", "matmul", "conv", "pooling", "norm", "activation",
                  "view", "join", "indexing", "cast"}


FIND = settings(database=None, derandomize=True)  # find() the same examples on every run


def computation_nodes(case: fxs.GraphCase) -> int:
    return sum(1 for n in case.module.graph.nodes if n.op not in ("placeholder", "output"))


def test_catalogue_has_140_distinct_operations_in_every_family():
    functional = {name for name in fxs.OPS if not name.startswith("nn.")}  # nn layers repeat F ops
    assert len(functional) >= 140
    assert set(fxs.FAMILIES) >= ISSUE_FAMILIES
    for needed in ("F.conv1d", "F.conv_transpose3d", "F.max_pool2d", "F.batch_norm", "F.layer_norm",
                   "F.group_norm", "bmm", "F.linear", "where", "split", "chunk", "expand", "Tensor.to"):
        assert needed in fxs.OPS


@settings(max_examples=120, deadline=None)
@given(fxs.graph_modules(dtypes=ANY, max_nodes=13, allow_inplace=True))
def test_every_drawn_graph_lints_runs_and_matches_its_predictions(case):
    case.module.graph.lint()
    outputs = case.check_predictions()
    interpreted = torch.fx.Interpreter(case.module).run(*case.example_inputs())
    torch.testing.assert_close(interpreted, outputs, equal_nan=True, rtol=0, atol=0)
    assert computation_nodes(case) <= 13


class ValueRecorder(torch.fx.Interpreter):
    def run_node(self, n):
        self.values[n] = super().run_node(n)
        return self.values[n]


def check_claims(case, claims):
    """What the builder claimed of each value holds at run time: a ``fresh`` value (in-place
    ops may write to it) shares no memory with an input or attribute, a ``contiguous`` one is."""
    recorder = ValueRecorder(case.module)
    recorder.values = {}
    outputs = recorder.run(*case.example_inputs())
    tensors = {n: v for n, v in recorder.values.items() if isinstance(v, torch.Tensor) and v.numel()}
    outside = {v.untyped_storage().data_ptr() for n, v in tensors.items() if n.op in ("placeholder", "get_attr")}
    for node, value in tensors.items():
        claim = claims.get(node)
        if claim is not None:
            assert not (claim.fresh and value.untyped_storage().data_ptr() in outside), f"{node} claimed fresh"
            assert not claim.contiguous or value.is_contiguous(), f"{node} claimed contiguous"
    return outputs


def test_every_seeded_graph_lints_runs_and_matches_its_predictions(monkeypatch):
    from fxverify.strategies.builder import Builder

    claims = {}
    add = Builder.add
    monkeypatch.setattr(Builder, "add", lambda self, value: claims.setdefault(value.node, add(self, value)))
    # the choices of --fxverify-random-graphs (not Hypothesis's) over everything, then many more
    # graphs of the ops whose claims are easy to get wrong (layouts that modules keep, views)
    views = {"ops": ["transpose", "Tensor.view", "nn.ReLU", "nn.GELU", "nn.Identity", "nn.Flatten", "Tensor.float"]}
    runs = [(seed, {"dtypes": ANY, "allow_inplace": True}) for seed in range(300)]
    runs += [(seed, views) for seed in range(300)]
    for seed, options in runs:
        claims.clear()
        case = fxs.graph_from_seed(seed, max_nodes=13, **options)
        try:
            case.module.graph.lint()
            outputs = case.check_predictions()
            interpreted = check_claims(case, claims)
            torch.testing.assert_close(interpreted, outputs, equal_nan=True, rtol=0, atol=0)
        except Exception as exc:
            raise AssertionError(f"seed {seed}: {exc}\n{case.module.code}") from exc
        assert computation_nodes(case) <= 13


def test_a_correct_transform_passes_every_cpu_check_on_random_graphs_of_every_dtype():
    checks = ["lint", "numerics", "gradients", "purity", "recompile", "retrace", "pickle", "interpreter"]
    outcomes = set()
    for seed in range(25):
        case = fxs.graph_from_seed(seed, dtypes=ANY, allow_inplace=True, max_nodes=16)
        for result in fxverify.verify(fxverify.examples.identity, case, checks=checks):
            assert result.outcome in ("passed", "skipped"), f"seed {seed}: {result.message}"
            outcomes.add((result.check, result.outcome))
    assert {(check, "passed") for check in checks} <= outcomes


def built_from_seed(seed: int, **options) -> str:
    """Everything ``graph_from_seed`` builds: code, input specs, and a digest of the state's values."""
    case = fxs.graph_from_seed(seed, **{"dtypes": ANY, **options})
    values = hashlib.sha256()
    for name, tensor in case.module.state_dict().items():
        values.update(name.encode() + tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return f"{case.module.code}{case.inputs}\n{values.hexdigest()}"


# What graph_from_seed builds for seeds 0..9 with the default options, for each SEED_FORMAT.
SEEDED_GRAPHS = {3: "fb5b6e9df9fca412", 4: "8ce5c286c689243c"}


def test_what_seeds_build_changes_only_with_the_seed_format():
    from fxverify.strategies.corpus import SEED_FORMAT

    structure = hashlib.sha256()
    for seed in range(10):
        case = fxs.graph_from_seed(seed)
        nodes = [(n.op, getattr(n.target, "__name__", str(n.target)), len(n.args)) for n in case.module.graph.nodes]
        # an input field added since (memory_format) at its default leaves the inputs what they were
        structure.update(repr((nodes, case.inputs)).replace(", memory_format='contiguous_format'", "").encode())
    digest = structure.hexdigest()[:16]
    assert SEEDED_GRAPHS.get(SEED_FORMAT) == digest, (
        f"graph_from_seed builds other graphs than before (digest {digest}): the seeds saved by earlier runs would "
        "replay as other graphs. Raise SEED_FORMAT in fxverify/strategies/corpus.py and pin the new digest here")


def test_random_graphs_catch_torchs_normalize_operators_dropping_a_rounding_mode():
    from tests import mutations

    cases = [fxs.graph_from_seed(seed, ops=["div(rounding_mode=)", "exp", "add"], max_nodes=4) for seed in range(10)]
    outcomes = [fxverify.check_numerics(mutations.torch_normalize_operators, case).outcome for case in cases]
    assert "failed" in outcomes and set(outcomes) <= {"failed", "passed"}  # passed: the x.div(...) method form


@pytest.mark.slow
def test_a_seed_gives_the_same_graph_in_another_process_and_options_match_graph_modules():
    import inspect
    import subprocess
    import sys

    code = "import fxverify.strategies as fxs, tests.test_strategies as t; print(t.built_from_seed(11))"
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           cwd=Path(__file__).parents[1], env={**os.environ, "PYTHONHASHSEED": str(h)}).stdout
            for h in (0, 1)}
    assert runs == {built_from_seed(11) + "\n"}
    seeded = dict(inspect.signature(fxs.graph_from_seed).parameters)
    del seeded["seed"]
    assert seeded == dict(inspect.signature(fxs.graph_modules).parameters)  # same options, same defaults


@settings(max_examples=5, database=None)
@given(st.data())
def test_drawn_choices_also_work_through_a_plain_draw_function(data):
    from fxverify.strategies.builder import DrawnChoices

    choices = DrawnChoices(data.draw)  # st.data()'s draw: not ConjectureData's, so through the strategies
    assert choices._data is None
    assert 2 <= choices.integer(2, 300) <= 300 and isinstance(choices.flag(), bool)
    assert sorted(choices.permutation(4)) == [0, 1, 2, 3]


def test_every_op_runs_with_every_dtype_it_accepts():
    for i, op in enumerate(CATALOGUE):
        for dtype in op.dtypes:
            case = fxs.graph_from_seed(i, ops=[op.name], dtypes=(dtype,), max_nodes=max(4, op.cost), allow_inplace=True)
            try:
                case.check_predictions()
            except Exception as exc:  # name the op and dtype that broke
                raise AssertionError(f"{op.name} with {dtype}: {exc}\n{case.module.code}") from exc


def test_all_opcodes_output_forms_and_a_module_called_twice_appear():
    seen: set[str] = set()

    @settings(max_examples=80, deadline=None, database=None)
    @given(fxs.graph_modules(max_nodes=13))
    def record(case):
        nodes = list(case.module.graph.nodes)
        seen.update(n.op for n in nodes)
        for n in nodes:
            if n.op == "get_attr":
                seen.add("parameter" if n.target in dict(case.module.named_parameters()) else
                         "buffer" if n.target in dict(case.module.named_buffers()) else "constant")
        modules = [n.target for n in nodes if n.op == "call_module"]
        if len(modules) != len(set(modules)):
            seen.add("module called twice")
        out = nodes[-1].args[0]
        seen.add("dict output" if isinstance(out, dict) else "tuple output" if isinstance(out, tuple) else
                 "single output")

    record()
    assert seen >= {"placeholder", "get_attr", "call_function", "call_method", "call_module", "output",
                    "parameter", "buffer", "constant", "module called twice",
                    "single output", "tuple output", "dict output"}


def test_a_failing_property_shrinks_to_a_tiny_graph():
    ops = ["exp", "add", "F.relu", "matmul", "Tensor.view", "sum", "cat"]
    case = find(fxs.graph_modules(ops=ops, max_nodes=12),
                lambda c: any(n.target == "view" for n in c.module.graph.nodes), settings=FIND)
    assert computation_nodes(case) <= 3  # one op feeding contiguous() + view
    assert [s.shape for s in case.inputs] == [(1,)]  # one input, smallest shape


def test_repr_is_runnable_python_rebuilding_module_and_inputs():
    ops_seen = set()
    for seed in range(40):
        case = fxs.graph_from_seed(seed, dtypes=ANY)
        ops_seen.update(n.op for n in case.module.graph.nodes)
        namespace: dict = {}
        exec(repr(case), namespace)
        torch.testing.assert_close(namespace["outputs"], case.module(*case.example_inputs()), equal_nan=True,
                                   rtol=0, atol=0, msg=lambda m, case=case: f"{m}\n{case!r}")
    assert {"call_module", "get_attr"} <= ops_seen


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_nodes": 0}, "max_nodes must be between 1 and 200, but got max_nodes=0"),
    ({"max_nodes": "3"}, "Expected an int for max_nodes, but got max_nodes='3'"),
    ({"dtypes": (torch.float16,)}, "not supported"),
    ({"dtypes": torch.float32}, "dtypes must be a sequence"),
    ({"ops": ["relu"]}, "Did you mean"),
    ({"ops": ["F.conv3d"], "max_rank": 4}, "raise max_rank"),
    ({"allow_modules": 1}, "Expected a bool for allow_modules"),
    ({"min_nodes": 5, "max_nodes": 3}, "min_nodes must be between 1 and 3"),
    ({"ops": ["add", "hand.softmax"], "max_nodes": 1}, r"fits in max_nodes=1 \(the fewest nodes one emits is 2\)"),
])
def test_bad_options_raise_invalid_argument_naming_the_argument(kwargs, message):
    with pytest.raises(InvalidArgument, match=message):
        fxs.graph_modules(**kwargs)
    with pytest.raises(InvalidArgument, match=message):
        fxs.graph_from_seed(0, **kwargs)
    with pytest.raises(InvalidArgument, match="seed must be at least 0, but got seed=-1"):
        fxs.graph_from_seed(-1)


def test_options_restrict_ops_dtypes_and_modules():
    @settings(max_examples=30, deadline=None, database=None)
    @given(fxs.graph_modules(ops=["add", "F.relu", "nn.Linear"], dtypes=("float64",), allow_modules=False))
    def check(case):
        targets = {n.op for n in case.module.graph.nodes}
        assert "call_module" not in targets
        assert all(s.dtype == "float64" for s in case.inputs)

    check()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_tensors_layouts_hold_the_same_values(data):
    shape = data.draw(st.sampled_from([(3,), (2, 3), (1, 4, 2)]))
    dtype = data.draw(st.sampled_from(ANY))
    t = data.draw(fxs.tensors(shape=shape, dtype=dtype, non_contiguous=True))
    assert t.shape == shape and t.dtype == dtype
    assert torch.equal(t.contiguous(), fxs.in_layout(t, "contiguous"))


def test_special_values_and_non_contiguous_layouts_are_drawn_on_request():
    nan = find(fxs.tensors(shape=(4,), special_values=True), lambda t: bool(t.isnan().any()), settings=FIND)
    assert int(nan.isnan().sum()) == 1  # shrunk to one special element
    for _kind, test in (("inf", lambda t: bool(t.isinf().any())),
                       ("-0.0", lambda t: bool(((t == 0) & t.signbit()).any())),
                       ("subnormal", lambda t: bool(((t != 0) & (t.abs() < torch.finfo(t.dtype).tiny)).any()))):
        find(fxs.tensors(shape=(3,), dtype=torch.float32, special_values=True), test, settings=FIND)
    strided = find(fxs.tensors(shape=(2, 3), non_contiguous=True), lambda t: not t.is_contiguous(), settings=FIND)
    assert strided.shape == (2, 3)
    expanded = find(fxs.tensors(shape=(2, 3), non_contiguous=True), lambda t: 0 in t.stride(), settings=FIND)
    assert expanded.stride() == (0, 1) and torch.equal(expanded[0], expanded[1])  # a real stride-0 input
    plain = find(fxs.tensors(shape=(2, 3)), lambda t: True, settings=FIND)
    assert plain.is_contiguous() and bool(plain.isfinite().all())


def test_inputs_for_matches_the_graph_and_its_repr_rebuilds_them():
    specs = [InputSpec((2, 3), "float32"), InputSpec((4,), "bfloat16"), InputSpec((2, 2), "int64", low=0, high=3)]
    inputs = find(fxs.inputs_for(specs, special_values=True, non_contiguous=True),
                  lambda xs: not xs[0].is_contiguous() and bool(xs[1].isnan().any()), settings=FIND)
    assert [tuple(x.shape) for x in inputs] == [s.shape for s in specs]
    assert inputs[2].dtype == torch.int64 and int(inputs[2].min()) >= 0 and int(inputs[2].max()) < 3
    rebuilt = eval(repr(inputs), {"torch": torch, "fxverify": __import__("fxverify")})
    for a, b in zip(rebuilt, inputs):
        torch.testing.assert_close(a, b, equal_nan=True, rtol=0, atol=0)
        assert a.stride() == b.stride() or b.stride() == ()


BREAKABLE = """
import os

def rename_input(gm):
    if os.environ.get("BREAK") == "1":  # a placeholder renamed: the lint check fails on every graph
        next(iter(gm.graph.nodes)).target = "renamed"
        gm.recompile()
    return gm
"""


@pytest.mark.slow
def test_random_graphs_option_adds_graphs_and_replays_failures_from_the_database(pytester, monkeypatch):
    pytester.makepyfile(breakable=BREAKABLE)
    args = ("-p", "no:cacheprovider", "--fxverify", "breakable.py:rename_input", "--fxverify-corpus",
            "edge_conv_bn_head", "--fxverify-checks", "lint,numerics", "-v")
    monkeypatch.setenv("BREAK", "1")
    first = pytester.runpytest(*args, "--fxverify-random-graphs", "3")
    first.stdout.fnmatch_lines(["fxverify: 3 random graphs (0 replayed from the example database *, 3 new)*"])
    names = {line.split("[")[1].split("-")[0] for line in first.outlines if "random_graph_" in line and "FAILED" in line}
    assert len(names) == 3, first.outlines
    second = pytester.runpytest(*args, "--fxverify-random-graphs", "1")
    second.stdout.fnmatch_lines(["fxverify: 4 random graphs (3 replayed*, 1 new)*"])  # replayed, and still exploring
    for name in names:
        second.stdout.fnmatch_lines([f"*{name}-lint* FAILED*"])
    monkeypatch.setenv("BREAK", "0")
    fixed = pytester.runpytest(*args, "--fxverify-random-graphs", "1")
    fixed.stdout.fnmatch_lines(["fxverify: 5 random graphs (4 replayed*"])
    fixed.assert_outcomes(passed=2 * 6)
    after = pytester.runpytest(*args, "--fxverify-random-graphs", "1")
    after.stdout.fnmatch_lines(["fxverify: 1 random graphs (0 replayed*"])


def fake_config(root, workerinput=None):
    config = SimpleNamespace(rootpath=root)
    if workerinput is not None:
        config.workerinput = workerinput
    return config


UNGUIDED = {"ops": None}  # the whole catalogue: no probe of the (made-up) transform


def test_random_graph_seeds_go_to_xdist_workers_as_is_and_a_skip_keeps_a_seed(tmp_path):
    from fxverify.plugin.random_graphs import RandomGraphs
    from fxverify.strategies.corpus import PREFIX

    controller = RandomGraphs(fake_config(tmp_path), 2, ["my.pass"], UNGUIDED)
    controller.database.save(controller.key, b"11")  # a seed saved before graphs kept their options
    controller = RandomGraphs(fake_config(tmp_path), 2, ["my.pass"], UNGUIDED)
    assert controller.seeds[0] == 11 and len(controller.seeds) == 3  # the replayed seed plus 2 new ones
    node = SimpleNamespace(workerinput={})
    controller.pytest_configure_node(node)
    controller.database.save(controller.key, b"12")  # a worker starting later sees another database
    worker = RandomGraphs(fake_config(tmp_path, node.workerinput), 2, ["my.pass"], UNGUIDED)
    assert worker.seeds == controller.seeds and [e.name for e in worker.entries][0] == f"{PREFIX}11"

    controller.reported("my.pass", f"{PREFIX}11", "golden", Outcome.SKIPPED)
    controller.pytest_sessionfinish(SimpleNamespace(config=fake_config(tmp_path)))
    assert b"11" in set(controller.database.fetch(controller.key))  # a skip proves nothing: still replayed


def test_random_graphs_are_drawn_from_the_ops_the_transform_rewrites(tmp_path):
    """A pass that rewrites only relu: its random graphs are made of relus, and a failing one is saved
    with the ops it was drawn from, so it is the same graph when replayed whatever a later probe finds."""
    from fxverify.plugin.random_graphs import RandomGraphs
    from fxverify.strategies.corpus import PREFIX

    graphs = RandomGraphs(fake_config(tmp_path), 4, ["tests.mutations:relu_to_clamp_in_place"])
    assert graphs.drawn["ops"] == ["F.relu"] and graphs.probes[0].rewritten == ("F.relu",)
    assert all(set(e.kwargs["ops"]) == {"F.relu"} for e in graphs.entries)
    assert all("relu" in ModelCase(e).build().code for e in graphs.entries)
    header = graphs.pytest_report_header()
    assert header[1].endswith("it rewrote 1 (F.relu)") and header[2].endswith("drawn from the ops the probe found rewritten (1)")
    seed = graphs.seeds[0]
    graphs.reported("tests.mutations:relu_to_clamp_in_place", f"{PREFIX}{seed}", "lint", Outcome.FAILED)
    again = RandomGraphs(fake_config(tmp_path), 0, ["tests.mutations:relu_to_clamp_in_place"])
    assert again.graphs == {seed: {"ops": ["F.relu"]}}  # replayed as drawn


def test_random_graph_options_shape_the_graphs_and_key_their_saved_seeds(tmp_path):
    from fxverify.cases.case import ModelCase
    from fxverify.plugin.random_graphs import RandomGraphs

    options = {"dtypes": ["int64"], "max_nodes": 3, "allow_modules": False}
    graphs = RandomGraphs(fake_config(tmp_path), 6, ["my.pass"], {**options, **UNGUIDED})
    for entry in graphs.entries:
        module = ModelCase(entry).build()  # through the entry's factory and kwargs, as another process does
        assert {spec.dtype for spec in entry.inputs} == {"int64"}
        assert sum(1 for n in module.graph.nodes if n.op not in ("placeholder", "output")) <= 3
        assert all(n.op != "call_module" for n in module.graph.nodes)
    assert graphs.key != RandomGraphs(fake_config(tmp_path), 1, ["my.pass"], UNGUIDED).key  # replayed with their options


@pytest.mark.parametrize(("given", "message"), [
    ("max_nodes=3", "is not JSON"),
    ("[3]", "is not a JSON object"),
    ('{"dtype": ["int64"]}', "names dtype, which graph_modules() does not take; its options are ops, "),
    ('{"max_nodes": 0}', "max_nodes must be between 1 and 200, but got max_nodes=0"),
])
def test_bad_random_graph_options_are_a_usage_error_saying_what_is_wrong(pytester, given, message):
    for count in ("2", "0"):  # checked even when no graph is drawn: the ini file's typo shows at once
        result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", "fxverify.examples:identity",
                                    "--fxverify-random-graphs", count, "--fxverify-random-graph-options", given)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        errors = "\n".join(result.errlines)
        assert f"--fxverify-random-graph-options (ini fxverify_random_graph_options) {given!r}" in errors
        assert message in errors


def test_random_graphs_option_rejects_a_negative_count(pytester):
    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", "fxverify.examples:identity",
                                "--fxverify-random-graphs", "-2")
    result.stderr.fnmatch_lines(["*--fxverify-random-graphs (ini fxverify_random_graphs) must be a whole number >= 0, got '-2'*"])


@settings(max_examples=5, deadline=None, database=None)
@given(fxs.graph_modules(max_nodes=6))
def test_a_drawn_graph_is_a_model_case_for_every_check(case):
    results = fxverify.assert_transform_ok(fxverify.examples.identity, case)
    assert {r.check for r in results} >= {"lint", "numerics", "determinism", "gradients", "devices", "purity"}
