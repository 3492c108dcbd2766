"""Passes inside torch.compile (issue 34, point 1): the forms Inductor's hooks take (a ``CustomGraphPass``,
a function on a ``torch.fx.Graph``, a ``PatternMatcherPass``, a registering function) as transforms of form
``graph``, and the ``inductor`` captures of the graphs those hooks receive (post-grad and joint, inference and
training)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.pattern_matcher import PatternMatcherPass

import fxverify
from fxverify.capture.inductor import fired_in
from fxverify.core.graph_passes import graph_pass, pattern_passes
from fxverify.core.results import FAILED, PASSED
from fxverify.core.transform import Transform
from fxverify.errors import TransformLoadError
from tests import inductor_passes

aten = torch.ops.aten


def _doubling_graph() -> torch.fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(lambda x: aten.relu.default(aten.add.Tensor(x, x)))(torch.randn(4))


def _targets(gm: torch.fx.GraphModule) -> list[object]:
    return [node.target for node in gm.graph.nodes if node.op == "call_function"]


# -- the forms -----------------------------------------------------------------------------------
@pytest.mark.parametrize("given", [
    inductor_passes.add_to_mul, inductor_passes.AddToMul(), inductor_passes.ADD_TO_MUL_PATTERNS,
    inductor_passes.register_add_to_mul, inductor_passes.Fusions(),
], ids=["graph_function", "custom_graph_pass", "pattern_matcher_pass", "registering_function", "holder"])
def test_each_form_inductor_takes_is_a_graph_transform_run_on_the_graph(given):
    transform = Transform.from_callable(given)
    gm = _doubling_graph()
    x = torch.randn(4)
    expected = gm(x)
    result, in_place = transform.apply(gm)
    assert transform.form == "graph" and in_place and result is gm
    assert _targets(gm) == [aten.mul.Tensor, aten.relu.default]
    torch.testing.assert_close(gm(x), expected)  # recompiled: the code runs the new graph


def test_a_module_pass_and_a_graph_module_pass_keep_the_module_form():
    assert Transform.from_callable(lambda gm: gm).form == "module"
    assert fxverify.Transform.load("fxverify.examples:fuse_conv_bn").form == "module"


def test_a_custom_graph_pass_gets_the_graph_not_the_module():
    seen = []

    class Records(inductor_passes.AddToMul):
        def __call__(self, graph: torch.fx.Graph) -> None:
            seen.append(type(graph))

    Transform.from_callable(Records()).apply(_doubling_graph())
    assert seen == [torch.fx.Graph]


def test_a_pattern_matcher_pass_loads_from_a_spec_though_it_is_not_callable():
    transform = Transform.load("tests.inductor_passes:ADD_TO_MUL_PATTERNS")
    assert transform.form == "graph" and transform.reloadable
    gm = _doubling_graph()
    transform.apply(gm)
    assert aten.mul.Tensor in _targets(gm)


def test_pattern_passes_finds_the_passes_of_every_form_and_names_the_spec_when_none():
    holder = inductor_passes.Fusions()
    assert pattern_passes(holder, "h") == (holder.patterns,)
    assert pattern_passes([inductor_passes.ADD_TO_MUL_PATTERNS, holder], "l") == (
        inductor_passes.ADD_TO_MUL_PATTERNS, holder.patterns)
    (registered,) = pattern_passes(inductor_passes.register_add_to_mul, "r")
    assert isinstance(registered, PatternMatcherPass) and registered.patterns
    with pytest.raises(TransformLoadError, match="my:fold holds no PatternMatcherPass: found a function"):
        pattern_passes(inductor_passes.add_to_mul, "my:fold")


def test_a_registering_function_that_registers_nothing_is_a_load_error():
    def registers_nothing(patterns: PatternMatcherPass) -> None:
        pass

    with pytest.raises(TransformLoadError, match="registered no replacement"):
        graph_pass(registers_nothing, "my:nothing")


def test_an_inference_aware_pass_is_told_which_graph_it_runs_on():
    from torch._inductor.custom_graph_pass import CustomInferenceAwareGraphPass

    from fxverify.core.graph_passes import training_graph

    told = []

    class Aware(CustomInferenceAwareGraphPass):
        def __call__(self, graph: torch.fx.Graph, is_inference: bool) -> None:
            told.append(is_inference)

        def uuid(self) -> None:
            return None

    transform = Transform.from_callable(Aware())
    transform.apply(_doubling_graph())
    with training_graph():
        transform.apply(_doubling_graph(), timeout=30)
    assert transform.form == "graph" and told == [True, False]


# -- the captures ---------------------------------------------------------------------------------
class _Gated(torch.nn.Module):
    """``swish(fc(x)) * sigmoid(gate(x))``: one ``x * sigmoid(x)`` and one gate ``a * sigmoid(b)``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)
        self.gate = torch.nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return h * torch.sigmoid(h) * torch.sigmoid(self.gate(x))


class _Doubling(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return torch.relu(h + h)


def _verification(transform, factory, shape, capture: str) -> fxverify.Verification:
    from fxverify.cases.case import case_from_module

    case = case_from_module(factory.__name__.strip("_").lower(), factory, [shape])
    return fxverify.Verification(transform, case, capture=case.capture_named(capture))


@pytest.mark.slow
@pytest.mark.parametrize("hook", ["post_grad", "joint"])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_the_training_capture_runs_forward_then_backward_and_returns_outputs_and_gradients(position, hook):
    from fxverify.capture.inductor import Inductor

    model, x = _Gated(), torch.randn(3, 6)
    gm = Inductor(training_graphs=True, position=position, hook=hook).capture(model, training=True, inputs=(x,))
    tangent = gm.get_buffer("tangent_0")
    found = gm(x)
    out = model(x)
    out.backward(tangent)
    torch.testing.assert_close(found["outputs"], (out.detach(),))
    assert found["grads"].keys() == dict(model.named_parameters()).keys()
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(found["grads"][name], parameter.grad)
    graphs = {"joint_graph"} if hook == "joint" else {"forward_graph", "backward_graph"}
    assert {name for name, _ in gm.named_children() if name.endswith("_graph")} == graphs


@pytest.mark.slow
def test_the_training_joint_capture_writes_back_the_buffers_the_model_updates():
    from fxverify.capture.inductor import Inductor

    model, x = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)), torch.randn(3, 4)
    gm = Inductor(training_graphs=True, hook="joint").capture(copy.deepcopy(model), training=True, inputs=(x,))
    gm(x)
    model.train()(x)
    torch.testing.assert_close(gm.get_buffer("1.running_mean").detach(), model[1].running_mean)
    assert int(gm.get_buffer("1.num_batches_tracked")) == int(model[1].num_batches_tracked) == 1


class _Recorded(CustomGraphPass):
    """A hook that records the call targets of each graph it receives and changes nothing."""

    def __init__(self) -> None:
        self.graphs: list[list[str]] = []

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.graphs.append(_called(graph))

    def uuid(self) -> None:
        return None


def _called(graph: torch.fx.Graph) -> list[str]:
    return [str(node.target) for node in graph.nodes if node.op == "call_function"]


@pytest.mark.slow
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_the_joint_captures_are_the_graph_torch_compile_hands_the_joint_hook(position, training):
    from torch._inductor import config

    from fxverify.capture.inductor import Inductor

    x, hook = torch.randn(3, 6), _Recorded()
    torch._dynamo.reset()
    with config.patch({f"joint_custom_{position}_pass": hook, "force_disable_caches": True, "fallback_random": True}):
        compiled = torch.compile(_Gated().train(training))
        if training:
            compiled(x).sum().backward()
        else:
            with torch.no_grad():
                compiled(x)
    torch._dynamo.reset()
    capture = Inductor(training_graphs=training, hook="joint", position=position)
    gm = capture.capture(_Gated(), training=training, inputs=(x,))
    assert hook.graphs == [_called(gm.get_submodule("joint_graph").graph if training else gm.graph)]
    assert f"joint_custom_{position}_pass" in capture.describe()


@pytest.mark.slow
@pytest.mark.parametrize("hook", ["post_grad", "joint"])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_the_inference_capture_is_the_graph_the_hook_receives_and_computes_the_model(position, hook):
    from fxverify.capture.inductor import Inductor

    model, x = _Gated().eval(), torch.randn(3, 6)
    capture = Inductor(position=position, hook=hook)
    gm = capture.capture(model, training=False, inputs=(x,))
    torch.testing.assert_close(gm(x), model(x))
    assert all("val" in node.meta for node in gm.graph.nodes if node.op == "call_function")
    assert {name for name, _ in gm.named_parameters()} == {name for name, _ in model.named_parameters()}
    assert f"{hook}_custom_{position}_pass" in capture.describe()


@pytest.mark.slow
@pytest.mark.parametrize("capture", ["inductor", "inductor_train", "inductor_train_post"])
def test_an_unpinned_fusion_fails_numerics_naming_the_node_and_its_twin_passes(capture):
    v = _verification(inductor_passes.fuse_silu_unpinned, _Gated, (3, 6), capture)
    found = v.run("numerics")
    assert found.outcome == FAILED, found.message
    assert "silu" in str(found.node), (found.node, found.message)
    where = ("inference",) if capture == "inductor" else ("forward", "backward")  # the backward has gates too
    assert fired_in(v.subject.applied().result) == where
    assert f"in {','.join(where)}" in v.subject.changes  # the summary's changed column says where it fired
    twin = _verification(inductor_passes.fuse_silu, _Gated, (3, 6), capture)
    assert [twin.run(check).outcome for check in ("numerics", "lint", "meta", "opset")] == [PASSED] * 4


@pytest.mark.slow
def test_a_pass_firing_where_its_contract_excludes_fails_naming_the_graph():
    inference_only = fxverify.contract(fires_in=("inference",))(inductor_passes.add_to_mul)
    found = _verification(inference_only, _Doubling, (3, 4), "inductor_train").run("numerics")
    assert found.outcome == FAILED
    assert "changed the forward and backward graph, which its contract excludes (fires_in=inference)" in found.message
    for capture in ("inductor", "inductor_post"):  # the inference graph, at the pre and the post hook
        passed = _verification(inference_only, _Doubling, (3, 4), capture)
        assert passed.run("numerics").outcome == PASSED
        assert fired_in(passed.subject.applied().result) == ("inference",)


@pytest.mark.slow
def test_a_pass_returning_another_module_is_judged_not_an_error_of_fxverify():
    class Wrapped(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: torch.Tensor) -> torch.Tensor:
            return self.inner(*args)

    found = _verification(lambda gm: Wrapped(gm), _Gated, (3, 6), "inductor").run("numerics")
    assert found.outcome == PASSED, found.message


@pytest.mark.slow
def test_a_joint_pass_wrong_only_in_the_backward_fails_on_the_gradients_and_its_twin_passes():
    v = _verification(inductor_passes.relu_gradient_as_mask_inclusive, _Doubling, (3, 4), "inductor_train_joint")
    found = v.run("numerics")
    assert found.outcome == FAILED, found.message
    assert "reads nodes the transform changed: %ge_scalar" in found.message  # the first bad node, and what it reads
    assert fired_in(v.subject.applied().result) == ("joint",)
    for capture in ("inductor_joint", "inductor_train"):  # no relu gradient there: the inference graph, partitioned
        unchanged = _verification(inductor_passes.relu_gradient_as_mask_inclusive, _Doubling, (3, 4), capture)
        assert unchanged.run("numerics").outcome == PASSED and fired_in(unchanged.subject.applied().result) == ()
    twin = _verification(inductor_passes.relu_gradient_as_mask, _Doubling, (3, 4), "inductor_train_joint")
    assert [twin.run(check).outcome for check in ("numerics", "lint", "meta", "opset", "determinism")] == [PASSED] * 5
    assert fired_in(twin.subject.applied().result) == ("joint",)


@pytest.mark.slow
def test_a_pass_declared_for_the_inference_graph_fails_where_it_changes_the_joint_graph():
    inference_only = fxverify.contract(fires_in=("inference",))(inductor_passes.add_to_mul)
    found = _verification(inference_only, _Doubling, (3, 4), "inductor_train_joint").run("numerics")
    assert found.outcome == FAILED
    assert "changed the joint graph, which its contract excludes (fires_in=inference)" in found.message
    joint_only = fxverify.contract(fires_in=("joint",))(inductor_passes.add_to_mul)
    assert _verification(joint_only, _Doubling, (3, 4), "inductor_train_joint").run("numerics").outcome == PASSED
    found = _verification(joint_only, _Doubling, (3, 4), "inductor_joint").run("numerics")
    assert "changed the inference graph, which its contract excludes (fires_in=joint)" in found.message


def test_fires_in_names_the_joint_graph_and_refuses_another_name():
    assert fxverify.Contract(fires_in=("joint", "inference")).fires_in == ("joint", "inference")
    with pytest.raises(fxverify.FxVerifyError, match="fires_in"):
        fxverify.Contract(fires_in=("joined",))


@pytest.mark.slow
def test_an_inference_aware_pass_at_a_joint_hook_is_called_as_torch_calls_it_and_fails_there():
    from torch._inductor.custom_graph_pass import CustomInferenceAwareGraphPass

    class Aware(CustomInferenceAwareGraphPass):  # torch.compile raises here: joint hooks pass no is_inference
        def __call__(self, graph: torch.fx.Graph, is_inference: bool) -> None:
            pass

        def uuid(self) -> None:
            return None

    for capture in ("inductor_joint", "inductor_train_joint"):
        found = _verification(Aware(), _Doubling, (3, 4), capture).run("numerics")
        assert found.outcome == FAILED and "missing 1 required positional argument: 'is_inference'" in found.message
    assert _verification(Aware(), _Doubling, (3, 4), "inductor_train").run("numerics").outcome == PASSED


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["tests.inductor_passes:inductor_joint_patterns",
                                  "torch._inductor.fx_passes.joint_graph:early_patterns"])
def test_inductors_own_joint_patterns_fire_in_the_joint_graph_and_pass(spec):
    v = _verification(Transform.load(spec), _Gated, (3, 6), "inductor_train_joint")
    assert [v.run(check).outcome for check in ("numerics", "lint", "meta", "opset")] == [PASSED] * 4
    assert fired_in(v.subject.applied().result) == ("joint",)


class _ReluOfRelu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.relu(self.fc(x)))


@pytest.mark.slow
def test_a_joint_pass_leaving_a_malformed_graph_fails_naming_it_and_its_twin_passes():
    found = _verification(inductor_passes.relu_gradient_as_mask_stale, _ReluOfRelu, (3, 4), "inductor_train_joint")
    result = found.run("numerics")
    assert result.outcome == FAILED, result.message
    assert "left the joint graph malformed" in result.message and "Argument 'where' of Node" in result.message
    twin = _verification(inductor_passes.relu_gradient_as_mask, _ReluOfRelu, (3, 4), "inductor_train_joint")
    assert [twin.run(check).outcome for check in ("numerics", "lint")] == [PASSED] * 2
    assert fired_in(twin.subject.applied().result) == ("joint",)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["inductor", "inductor_joint"])
def test_an_inference_capture_made_first_in_a_fresh_process_decomposes_max_pool(name):
    import subprocess
    import sys

    code = ("import torch\nfrom fxverify.core.captures import for_model, ModelFacts\n"  # max_pool's decomposition
            f"capture = for_model({name!r}, ModelFacts())\n"                           # reads torch._inductor.lowering
            "gm = capture.capture(torch.nn.MaxPool2d(2), training=False, inputs=(torch.randn(1, 2, 4, 4),))\n"
            "print(isinstance(gm, torch.fx.GraphModule))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-2000:]
