"""Passes inside torch.compile (issue 34, point 1): the forms Inductor's hooks take (a ``CustomGraphPass``,
a function on a ``torch.fx.Graph``, a ``PatternMatcherPass``, a registering function) as transforms of form
``graph``, and the ``inductor`` captures of the graphs those hooks receive (post-grad and joint, inference and
training)."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from fxverify.corpus.edge_cases import HeadViewAttention
from torch._inductor.pattern_matcher import PatternMatcherPass

import fxverify
from fxverify.capture.inductor import Inductor, fired_in
from fxverify.cases.case import load_case
from fxverify.core.graph_passes import graph_pass, pattern_passes
from fxverify.core.results import FAILED, PASSED, SKIPPED
from fxverify.core.transform import Transform
from fxverify.errors import TransformLoadError
from fxverify.inductor import hooks
from tests import inductor_passes

aten = torch.ops.aten


def _doubling_graph() -> torch.fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(lambda x: aten.relu.default(aten.add.Tensor(x, x)))(torch.randn(4))


def _targets(gm: torch.fx.GraphModule) -> list[object]:
    return [node.target for node in gm.graph.nodes if node.op == "call_function"]


def _inductor(hook: str, position: str, *, training: bool = False) -> Inductor:
    """The Inductor capture of the graph (``training``: the training graphs) ``<hook>_custom_<position>_pass``
    receives, named as the captures are named."""
    return Inductor("inductor" + ("_train" if training else "") + ("_joint" if hook == "joint" else "")
                    + ("_post" if position == "post" else ""))


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


def _on_entry(transform, name: str, capture: str) -> fxverify.Verification:
    case = load_case(name)
    return fxverify.Verification(transform, case, capture=case.capture_named(capture))


@pytest.mark.slow
@pytest.mark.parametrize("hook", ["post_grad", "joint"])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_the_training_capture_runs_forward_then_backward_and_returns_outputs_and_gradients(position, hook):
    model, x = _Gated(), torch.randn(3, 6)
    gm = _inductor(hook, position, training=True).capture(model, training=True, inputs=(x,))
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
    torch.testing.assert_close(pickle.loads(pickle.dumps(gm))(x), found)  # the package holds nothing local


@pytest.mark.slow
def test_the_training_joint_capture_writes_back_the_buffers_the_model_updates():
    model, x = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)), torch.randn(3, 4)
    gm = Inductor("inductor_train_joint").capture(copy.deepcopy(model), training=True, inputs=(x,))
    gm(x)
    model.train()(x)
    torch.testing.assert_close(gm.get_buffer("1.running_mean").detach(), model[1].running_mean)
    assert int(gm.get_buffer("1.num_batches_tracked")) == int(model[1].num_batches_tracked) == 1


@pytest.mark.slow
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_the_joint_captures_are_the_graph_torch_compile_hands_the_joint_hook(position, training):
    from benchmarks.inductor_capture_fidelity import captured, compiled

    x, capture = torch.randn(3, 6), _inductor("joint", position, training=training)
    received = compiled(_Gated().train(training), (x,), capture.name)
    gm = capture.capture(_Gated(), training=training, inputs=(x,))
    assert received == captured(gm, capture.name)
    assert f"joint_custom_{position}_pass" in capture.describe()


class _Decomposed(torch.nn.Module):
    """Ops whose decompositions ``make_fx(functionalize(f))`` leaves other than AOTAutograd does: BatchNorm (dead
    outputs, a running-statistics update), a circular convolution (a padded copy), bilinear upsampling, RMSNorm
    (``add_``); it returns a dict, which AOTAutograd's graph returns as a flat tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1, padding_mode="circular")
        self.bn = torch.nn.BatchNorm2d(4)
        self.norm = torch.nn.RMSNorm(16)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = torch.nn.functional.interpolate(self.bn(self.conv(x)), scale_factor=2, mode="bilinear")
        return {"out": self.norm(h)}


@pytest.mark.slow
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("hook", ["post_grad", "joint"])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_the_inference_capture_is_the_graph_torch_compile_hands_the_hook(position, hook, training):
    """Placeholders, output and every call as a real ``torch.compile`` hands them (a capture made with
    ``make_fx(functionalize(f))`` had BatchNorm's dead ``empty``, RMSNorm's ``add_``, the padded ``copy_``, no
    decomposed upsampling, the dict as the graph's output), and the captured module still returns the dict."""
    from benchmarks.inductor_capture_fidelity import captured, compiled

    x, capture = torch.randn(2, 3, 8, 8), _inductor(hook, position)
    received = compiled(_Decomposed().train(training), (x,), capture.name)
    model = _Decomposed().train(training)
    gm = capture.capture(model, training=training, inputs=(x,))
    assert received == captured(gm, capture.name)
    expected = _Decomposed().train(training)
    expected.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(gm(x), expected(x))


@pytest.mark.slow
@pytest.mark.parametrize("hook", ["post_grad", "joint"])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_the_training_capture_is_the_graphs_torch_compile_hands_the_hook(position, hook):
    """Placeholders in Dynamo's order, output and every call of each training graph as a real ``torch.compile``
    hands them (a capture traced without Dynamo's order, ``keep_inference_input_mutations`` and its static inputs
    had the input before the parameters, BatchNorm's running statistics as forward outputs instead of ``copy_``
    into the buffers, and other tensors saved for the backward), and the captured module updates the buffers."""
    from benchmarks.inductor_capture_fidelity import captured, compiled

    x, capture = torch.randn(2, 3, 8, 8), _inductor(hook, position, training=True)
    received = compiled(_Decomposed().train(), (x,), capture.name)
    model = _Decomposed().train()
    expected = copy.deepcopy(model)
    gm = capture.capture(model, training=True, inputs=(x,))
    assert received == captured(gm, capture.name)
    assert any(line.endswith("aten.copy_.default") for graph in received for line in graph)
    torch.testing.assert_close(gm(x)["outputs"], (expected(x)["out"].detach(),))
    torch.testing.assert_close(gm.get_buffer("bn.running_var"), expected.bn.running_var)


@pytest.mark.slow
@pytest.mark.parametrize("capture", ["inductor", "inductor_train_joint"])
def test_inputs_read_between_parameters_keep_dynamos_order(capture):
    """``edge_integer_inputs`` reads its tokens, the embedding, then ``x``: Dynamo's graph inputs interleave the
    model's inputs and parameters in that order, and so must the capture's (it had both inputs first)."""
    from benchmarks.inductor_capture_fidelity import captured, compiled
    from fxverify.core.captures import for_model

    case = load_case("edge_integer_inputs")
    inputs = case.example_inputs()
    received = compiled(case.build(training=True), inputs, capture)
    gm = for_model(capture, case.facts).capture(case.build(training=True), training=True, inputs=inputs)
    assert received == captured(gm, capture)
    assert received[0][0].startswith("[(8, 4), (2, 5), (1, 4), (1,), (2, 8)")  # embedding, tokens, fc, x


def _rebuilt_anew(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A correct pass that copies the graph into a new ``fx.Graph`` (the generated code's return is lost)."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return torch.fx.GraphModule(gm, graph)


def _adds_an_output(graph: torch.fx.Graph) -> None:
    """BUG: returns one more value than AOTAutograd's graph."""
    output = graph.output_node()
    output.args = ((*output.args[0], output.args[0][0]),)


@pytest.mark.slow
@pytest.mark.parametrize("capture", ["inductor", "inductor_joint"])
def test_a_pass_building_the_graph_anew_still_returns_the_models_dict_and_one_adding_an_output_fails(capture):
    correct = _verification(_rebuilt_anew, _Decomposed, (2, 3, 8, 8), capture)
    assert [correct.run(check).outcome for check in ("numerics", "lint")] == [PASSED] * 2
    assert isinstance(correct.subject.applied().result(torch.randn(2, 3, 8, 8)), dict)
    found = _verification(_adds_an_output, _Decomposed, (2, 3, 8, 8), capture).run("lint")
    assert found.outcome == FAILED and "the graph returns 2 values where AOTAutograd's graph returned 1" in found.message


@pytest.mark.slow
@pytest.mark.parametrize("hook", ["post_grad", "joint"])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_the_inference_capture_is_the_graph_the_hook_receives_and_computes_the_model(position, hook):
    model, x = _Gated().eval(), torch.randn(3, 6)
    capture = _inductor(hook, position)
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


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["tests.inductor_passes:inductor_joint_patterns",
                                  "torch._inductor.fx_passes.joint_graph:early_patterns"])
def test_inductors_own_joint_patterns_leave_attention_in_order_at_the_joint_pre_hook(spec):
    """Inductor's attention patterns (``_sfdp_*``, multi-output replacements: pytorch issue 148751's class) fuse
    ``edge_attention_two_ways``'s inference graph; on no attention of the corpus do they leave a graph out of order,
    which ``joint_custom_pre_pass`` refuses (constant folding interprets it before torch sorts it)."""
    for name in ("edge_multi_head_attention", "edge_attention_two_ways"):
        for capture in ("inductor_joint", "inductor_train_joint"):
            v = _on_entry(Transform.load(spec), name, capture)
            assert [v.run(check).outcome for check in ("lint", "numerics")] == [PASSED] * 2, (name, capture)
    fused = _on_entry(Transform.load(spec), "edge_attention_two_ways", "inductor_joint")  # early_patterns: no attention
    assert fired_in(fused.subject.applied().result) == (() if spec.endswith("early_patterns") else ("inference",))


@pytest.mark.slow
def test_inductors_attention_fusion_on_head_views_passes_meta_and_the_joint_post_captures_take_its_graph():
    """edge_head_view_attention: Inductor's attention fusion rewrites it at its joint-graph patterns, leaving the
    permute after the fused op with stale strides, as torch leaves it: ``meta`` fails only what a pass made or
    changed at the joint hooks, listing the rest. Torch hands ``joint_custom_post_pass`` that graph out of order
    (it sorts it right after the hook): the post captures take it, and the identity passes there."""
    fused = _on_entry(inductor_passes.inductor_joint_patterns, "edge_head_view_attention", "inductor_joint")
    assert [fused.run(check).outcome for check in ("numerics", "lint")] == [PASSED] * 2
    meta = fused.run("meta")
    assert meta.outcome == PASSED, meta.message
    assert meta.details["stale_strides_left_alone"][0].startswith("%permute"), meta.details
    assert fired_in(fused.subject.applied().result) == ("inference",)
    for capture in ("inductor_joint_post", "inductor_train_joint_post"):
        v = _on_entry(Transform.load("tests.aten_passes:identity"), "edge_head_view_attention", capture)
        assert [v.run(check).outcome for check in ("lint", "numerics", "meta")] == [PASSED] * 3, capture
        attention = [n for n in v.subject.applied().original.graph.nodes if "scaled_dot_product" in str(n.target)]
        assert attention, capture  # the fused graph


@pytest.mark.slow
@pytest.mark.parametrize("capture", ["inductor_joint", "inductor_train_joint"])
def test_a_joint_pass_giving_a_node_it_made_stale_strides_fails_meta_and_its_twin_passes(capture):
    stale = _on_entry(inductor_passes.contiguous_after_permutes_stale_meta, "edge_head_view_attention", capture)
    found = stale.run("meta")
    assert found.outcome == FAILED and "%clone" in found.message and "strides" in found.message, found.message
    twin = _on_entry(inductor_passes.contiguous_after_permutes, "edge_head_view_attention", capture)
    assert [twin.run(check).outcome for check in ("numerics", "meta")] == [PASSED] * 2


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
    assert "left the joint graph at joint_custom_pre_pass where torch.compile would refuse it" in result.message
    assert "reads %where, which is no longer in the graph (erased)" in result.message
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


# -- what torch does after a hook (issue 41, class 8) ----------------------------------------------------
def _linear_graph() -> torch.fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx

    linear = torch.nn.Linear(4, 4)

    def doubled_linear(x: torch.Tensor) -> torch.Tensor:
        h = linear(x)
        return aten.relu.default(aten.add.Tensor(h, h))

    return make_fx(doubled_linear)(torch.randn(3, 4))


def test_ordering_problem_names_a_cycle_an_erased_read_and_nodes_out_of_order():
    from fxverify.inductor.order import ordering_problem

    gm = _linear_graph()
    assert ordering_problem(gm.graph) is None
    inductor_passes.add_to_mul_out_of_order(gm.graph)
    assert ordering_problem(gm.graph) == "%mul_tensor reads %addmm before it is defined (acyclic: nodes out of order)"
    gm = _linear_graph()
    inductor_passes.copy_addmm_outputs_cyclic(gm.graph)
    assert ordering_problem(gm.graph) == "a cycle: %clone_default -> %clone_default (each reads the next)"
    gm = _linear_graph()
    relu = gm.graph.find_nodes(op="call_function", target=aten.relu.default)[0]
    add = relu.args[0]
    with gm.graph.inserting_before(relu):
        doubled = gm.graph.call_function(aten.mul.Tensor, (add.args[0], 2))
    add.replace_all_uses_with(doubled)
    gm.graph.erase_node(add)
    with gm.graph.inserting_before(relu):
        gm.graph.call_function(aten.neg.default, (add,))  # a match collected before the rewrite, read after it
    assert ordering_problem(gm.graph) == "%neg_default reads %add, which is no longer in the graph (erased)"


@pytest.mark.parametrize("hook", [hooks.JOINT_POST, hooks.POST_GRAD_PRE, hooks.POST_GRAD_POST], ids=lambda h: h.name)
def test_an_out_of_order_graph_is_sorted_as_torch_sorts_it_after_the_hook(hook):
    from fxverify.inductor.graph_hooks import after_graph_hook

    gm, x = _linear_graph(), torch.randn(3, 4)
    expected = gm(x)
    transform = Transform.from_callable(inductor_passes.add_to_mul_out_of_order)
    transform.apply(gm)
    with pytest.raises(RuntimeError, match="used before it has been defined"):
        gm.graph.lint()
    after_graph_hook(transform.spec, gm, hook, None, graph="inference")
    gm.graph.lint()
    torch.testing.assert_close(gm(x), expected)


@pytest.mark.parametrize(("given", "hook", "refused"), [
    (inductor_passes.add_to_mul_out_of_order, hooks.JOINT_PRE,
     "%mul_tensor reads %addmm before it is defined (acyclic: nodes out of order); joint_graph_passes runs "
     "constant_fold_uniform_value"),
    (inductor_passes.copy_addmm_outputs_cyclic, hooks.JOINT_POST,
     "a cycle: %clone_default -> %clone_default (each reads the next); stable_topological_sort, which torch runs "
     "after the hook, asserts"),
    (inductor_passes.copy_addmm_outputs_cyclic, hooks.POST_GRAD_PRE, "a cycle: %clone_default -> %clone_default"),
], ids=["out_of_order_at_joint_pre", "cycle_at_joint_post", "cycle_at_post_grad_pre"])
def test_what_torch_cannot_repair_after_the_hook_is_the_transforms_failure(given, hook, refused):
    from fxverify.errors import TransformFailed
    from fxverify.inductor.graph_hooks import after_graph_hook

    gm, transform = _linear_graph(), Transform.from_callable(given, "my:pass")
    transform.apply(gm)
    with pytest.raises(TransformFailed) as failed:
        after_graph_hook(transform.spec, gm, hook, None, graph="inference")
    assert f"transform my:pass left the inference graph at {hook.name} where torch.compile would refuse it" in str(
        failed.value)
    assert refused in str(failed.value)


EIGHT = ("inductor", "inductor_post", "inductor_train", "inductor_train_post",
         "inductor_joint", "inductor_joint_post", "inductor_train_joint", "inductor_train_joint_post")


@pytest.mark.slow
def test_a_pass_leaving_nodes_out_of_order_passes_where_torch_sorts_them_first():
    for capture in EIGHT:  # the joint pre hook: constant folding interprets the graph before torch sorts it
        v = _verification(inductor_passes.add_to_mul_out_of_order, _Doubling, (3, 4), capture)
        outcomes = [v.run(check) for check in ("numerics", "lint", "meta")]
        if capture in ("inductor_joint", "inductor_train_joint"):
            assert [found.outcome for found in outcomes] == [FAILED] * 3, capture
            assert "at joint_custom_pre_pass where torch.compile would refuse it: %mul_tensor reads" in outcomes[0].message
            assert "constant_fold_uniform_value" in outcomes[0].message
        else:
            assert [found.outcome for found in outcomes] == [PASSED] * 3, (capture, [f.message for f in outcomes])
            assert fired_in(v.subject.applied().result), capture


@pytest.mark.slow
def test_a_pass_making_a_cycle_fails_naming_it_and_its_twin_passes():
    for capture in ("inductor", "inductor_train_post", "inductor_joint_post", "inductor_train_joint"):
        found = _verification(inductor_passes.copy_addmm_outputs_cyclic, _Doubling, (3, 4), capture).run("numerics")
        assert found.outcome == FAILED, capture
        assert "where torch.compile would refuse it: a cycle: %clone_default -> %clone_default" in found.message
        twin = _verification(inductor_passes.copy_addmm_outputs, _Doubling, (3, 4), capture)
        assert [twin.run(check).outcome for check in ("numerics", "lint", "meta")] == [PASSED] * 3, capture


@pytest.mark.slow
def test_meta_a_pass_leaves_out_is_computed_at_the_post_grad_hooks_as_torch_does_and_fails_at_the_joint_hooks():
    for capture in ("inductor", "inductor_post", "inductor_train", "inductor_train_post"):  # FakeTensorUpdater
        v = _verification(inductor_passes.add_to_mul_without_meta, _Doubling, (3, 4), capture)
        assert [v.run(check).outcome for check in ("meta", "numerics")] == [PASSED] * 2, capture
        assert fired_in(v.subject.applied().result), capture
    for capture in ("inductor_joint_post", "inductor_train_joint"):  # the partitioner reads it before anything computes it
        found = _verification(inductor_passes.add_to_mul_without_meta, _Doubling, (3, 4), capture).run("meta")
        assert found.outcome == FAILED and "have no meta['val'] (%mul_tensor" in found.message, capture


class _SwiGLU(torch.nn.Module):
    """``down(silu(gate(x)) * up(x))``, differentiable twice (no attention kernel)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.up, self.down = torch.nn.Linear(6, 8), torch.nn.Linear(6, 8), torch.nn.Linear(8, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


@pytest.mark.slow
@pytest.mark.parametrize(("hook", "given", "model", "raises"), [
    ("joint_custom_post_pass", inductor_passes.add_to_mul_out_of_order, _Doubling, None),
    ("post_grad_custom_pre_pass", inductor_passes.add_to_mul_out_of_order, _Doubling, None),
    ("joint_custom_pre_pass", inductor_passes.add_to_mul_out_of_order, _Doubling, "referenced nonexistent value"),
    ("post_grad_custom_post_pass", inductor_passes.copy_addmm_outputs_cyclic, _Doubling,
     "topological sort did not consume all nodes"),
    ("post_grad_custom_pre_pass", inductor_passes.add_to_mul_without_meta, _Doubling, None),
    ("joint_custom_post_pass", inductor_passes.add_to_mul_without_meta, _Doubling, "didn't have `val` metadata"),
    ("post_grad_custom_pre_pass", inductor_passes.register_silu_and_mul_fusion, _SwiGLU, None),
    ("joint_custom_pre_pass", inductor_passes.inductor_joint_patterns, HeadViewAttention, None),
    ("joint_custom_pre_pass", inductor_passes.contiguous_after_permutes, HeadViewAttention, None),
], ids=["out_of_order_joint_post", "out_of_order_post_grad_pre", "out_of_order_joint_pre", "cycle_post_grad_post",
        "without_meta_post_grad_pre", "without_meta_joint_post", "fused_kernel_without_autograd_post_grad_pre",
        "attention_fusion_stale_strides_joint_pre", "contiguous_copies_stale_strides_joint_pre"])
def test_a_real_torch_compile_with_the_pass_in_the_hook_agrees_with_the_captures(hook, given, model, raises):
    """What the captures judge, proved by ``torch.compile`` (Inductor, training: the joint graph, then the forward and
    backward graphs) with the pass installed: it runs and computes the model's outputs and gradients, or it raises."""
    from torch._inductor import config

    torch.manual_seed(0)
    module, x = model(), torch.randn({_SwiGLU: (3, 6), HeadViewAttention: (2, 8, 32)}.get(model, (3, 4)))
    torch._dynamo.reset()
    try:
        with config.patch({hook: graph_pass(given, "given"), "force_disable_caches": True, "fallback_random": True}):
            compiled = torch.compile(module)
            if raises is not None:
                with pytest.raises(Exception, match=raises):
                    compiled(x).sum().backward()
                return
            out = compiled(x)
            out.sum().backward()
    finally:
        torch._dynamo.reset()
    grads = {name: parameter.grad.clone() for name, parameter in module.named_parameters()}
    module.zero_grad()
    expected = module(x)
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    for name, parameter in module.named_parameters():
        torch.testing.assert_close(grads[name], parameter.grad)


# -- fused kernels as vLLM and torchao write them (issue 41, class 1) -------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("capture", ["inductor", "inductor_joint"])
def test_a_fused_kernel_without_autograd_passes_the_inference_graphs_and_its_buggy_twin_fails_numerics(capture):
    v = _on_entry(inductor_passes.register_rms_norm_fusion, "edge_tiny_decoder_block", capture)
    assert [v.run(check).outcome for check in ("numerics", "meta", "lint", "opset")] == [PASSED] * 4
    assert "torch.ops.fxverify_tests.rms_norm.default" in v.subject.applied().result.code
    gradients = v.run("gradients")  # backward through an inference graph is nothing the pass promises
    assert gradients.outcome == SKIPPED and "an inference graph is compiled only where no gradient is needed" in gradients.message
    found = _on_entry(inductor_passes.register_rms_norm_fusion_by_variance, "edge_tiny_decoder_block", capture)
    result = found.run("numerics")
    assert result.outcome == FAILED
    assert "reads nodes the transform changed: %rms_norm_by_variance_default" in str(result.node), result.node


@pytest.mark.slow
def test_a_vllm_style_inference_pass_declares_where_it_fires_and_passes_all_eight_captures():
    """A ``CustomInferenceAwareGraphPass`` fusing inference graphs only, declared ``fires_in=("inference",)`` and for
    the post-grad captures (the joint hooks pass no ``is_inference``: ``torch.compile`` raises there)."""
    for capture in EIGHT:
        v = _on_entry(inductor_passes.SILU_AND_MUL_INFERENCE, "edge_tiny_decoder_block", capture)
        found = v.run("numerics")
        if capture in inductor_passes.POST_GRAD_CAPTURES:
            assert found.outcome == PASSED, (capture, found.message)
            assert fired_in(v.subject.applied().result) == (() if "train" in capture else ("inference",)), capture
        else:
            assert found.outcome == SKIPPED and f"not run on {capture}" in found.message, (capture, found.message)
    unguarded = _on_entry(inductor_passes.register_silu_and_mul_fusion, "edge_tiny_decoder_block", "inductor_train")
    assert unguarded.run("numerics").outcome == PASSED  # fused in the forward graph, right there: its backward is made
    assert fired_in(unguarded.subject.applied().result) == ("forward",)


@pytest.mark.slow
def test_a_fused_kernel_without_autograd_in_a_training_forward_graph_is_no_gradients_finding():
    v = _verification(inductor_passes.register_silu_and_mul_fusion, _SwiGLU, (3, 6), "inductor_train")
    assert v.run("numerics").outcome == PASSED and fired_in(v.subject.applied().result) == ("forward",)
    found = v.run("gradients")  # torch.compile runs the captured backward graph, never autograd through the forward
    assert found.outcome == SKIPPED and "runs its own backward graph" in found.message, found.message


def _nodes(graph: torch.fx.Graph) -> list[tuple[str, str]]:
    """Each node's op and, for a call, its target: what a pass sees of a graph, beside the names."""
    return [(node.op, str(node.target) if node.op == "call_function" else "") for node in graph.nodes]


@pytest.mark.slow
@pytest.mark.parametrize("hook", ["post_grad", "joint"])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_an_inference_hook_gets_parameters_and_buffers_as_placeholders_and_a_counter_keeps_counting(hook, position):
    """As torch.compile hands them: Inductor's constant folders fold what they read through get_attr, so a counter
    updated from itself alone (``count.add_(1)``) would be frozen at its first value by the capture itself."""
    from torch._inductor import config
    from torch._inductor.fx_passes.joint_graph import constant_fold_uniform_value

    from corpus.edge_cases import CounterBuffer

    x, handed = torch.randn(2, 8), []
    torch._dynamo.reset()
    with config.patch({f"{hook}_custom_{position}_pass": lambda graph: handed.append(_nodes(graph)),
                       "force_disable_caches": True}), torch.no_grad():
        torch.compile(CounterBuffer().eval())(x)
    torch._dynamo.reset()
    capture, model, given = _inductor(hook, position), CounterBuffer().eval(), []
    gm = capture.capture(model, training=False, inputs=(x,))
    result, _ = capture.apply(Transform.from_callable(lambda gm: given.append(_nodes(gm.graph)), "t:recorded"), gm,
                              timeout=None)
    assert given == handed and [op for op, _ in given[0]].count("placeholder") == 4  # fc.weight, fc.bias, count, x
    folded, _ = capture.apply(Transform.from_callable(constant_fold_uniform_value, "t:folded"),
                              capture.capture(model, training=False, inputs=(x,)), timeout=None)
    for module in (gm, result, folded):
        counts = []
        for _ in range(3):
            module(x)
            counts.append(int(model.count))
        assert counts[1:] == [counts[0] + 1, counts[0] + 2]


class _Pooling(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.max_pool2d(x, 2)


@pytest.mark.parametrize("capture", ["inductor_train", "inductor_train_post", "inductor_train_joint",
                                     "inductor_train_joint_post"])
def test_a_training_capture_of_a_model_nothing_requires_grad_in_skips_naming_the_inference_capture(capture):
    v = _verification(inductor_passes.inductor_joint_patterns, _Pooling, (2, 3, 8, 8), capture)
    for check in ("numerics", "lint"):
        skipped = v.run(check)
        assert skipped.outcome == SKIPPED, skipped.message
        assert "nothing in the model requires grad" in skipped.message
        assert f"the {capture.replace('_train', '')} capture gives" in skipped.message


class _CatRelu(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.cat([x, y], dim=1))


@pytest.mark.slow
def test_the_inference_capture_holds_what_inductors_pre_grad_passes_leave():
    """The Inductor captures start from Dynamo's graph after Inductor's pre-grad passes, as AOTAutograd receives it
    (here sink_cat_after_pointwise: torch.compile hands relu, relu, cat; a capture made from the module held cat,
    relu)."""
    from benchmarks.inductor_capture_fidelity import captured, compiled

    x, y = torch.randn(2, 3), torch.randn(2, 3)
    received = compiled(_CatRelu().eval(), (x, y), "inductor")
    assert received == captured(Inductor().capture(_CatRelu().eval(), training=False, inputs=(x, y)), "inductor")
    assert received[0][2:] == ["aten.relu.default", "aten.relu.default", "aten.cat.default"]


class _TemperatureSoftmax(torch.nn.Module):
    """edgenext's channel attention: the logits scaled by a learned per-head temperature, then softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.temperature = torch.nn.Parameter(torch.full((4, 1, 1), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * self.temperature, dim=-1)


@pytest.mark.slow
@pytest.mark.parametrize("capture", ["inductor_joint", "inductor_train_joint", "inductor", "inductor_train",
                                     "inductor_freezing"])
def test_inductors_joint_patterns_trace_their_replacements_under_the_graphs_fake_mode(capture: str) -> None:
    """Inductor's mul_softmax_pattern builds its replacement with ``torch.scalar_tensor``: under ``V.fake_mode``,
    which compile_fx sets around AOTAutograd, that is a FakeTensor; without it the replacement mixed a real tensor
    with FakeTensors, and the joint-graph patterns raised: as a transform at the joint hooks, inside the capture
    after them (false alarms on edgenext_xx_small under inductor_train_joint and inductor)."""
    joint = capture.endswith("joint")
    transform = inductor_passes.inductor_joint_patterns if joint else "tests.aten_passes:identity"
    verification = _verification(transform, _TemperatureSoftmax, (2, 4, 8, 8), capture)
    found = verification.run("numerics")
    assert found.outcome == PASSED, found.message
    assert bool(fired_in(verification.subject.applied().result)) == joint  # the pattern replaced the softmax
