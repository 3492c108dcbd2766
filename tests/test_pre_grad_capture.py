"""The ``inductor_pre_grad`` capture (issue 42, item 1): the graph Inductor's ``pre_grad_custom_pass`` receives,
Dynamo's torch-level graph before AOTAutograd, checked against a real ``torch.compile``; what torch does after the
hook; passes written for that hook, correct and buggy (``tests/pre_grad_passes.py``)."""

from __future__ import annotations

import copy
import operator
from typing import Any

import pytest
import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

import fxverify
from fxverify.analysis.graph_text import canonical_text
from fxverify.capture.pre_grad import PreGrad, PreGradModule
from fxverify.core.results import FAILED, PASSED
from fxverify.core.transform import Transform
from fxverify.errors import TransformFailed
from tests import pre_grad_passes


class _ConvBn(torch.nn.Module):
    """A convolution with a bias, a BatchNorm, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


class _Structured(torch.nn.Module):
    """Two inputs read out of order, one not read at all, and a dict of a tuple holding an input and a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.bn = torch.nn.BatchNorm1d(4)
        self.register_buffer("unused", torch.ones(1))

    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> dict[str, Any]:
        return {"out": self.bn(self.fc(y)) + x, "extra": (x, 3)}


def _verification(transform: Any, training: bool = False) -> fxverify.Verification:
    from fxverify.cases.case import case_from_module

    case = case_from_module("conv_bn", _ConvBn, [(2, 3, 8, 8)])
    return fxverify.Verification(transform, case, capture=case.capture_named("inductor_pre_grad"))


# -- after the hook (no Dynamo) ---------------------------------------------------------------------
def _returning_tuple() -> torch.fx.GraphModule:
    return torch.fx.symbolic_trace(lambda x: (torch.relu(x) + 1,))


def _relu_read_by_a_later_node(graph: torch.fx.Graph) -> None:
    """Puts a ``neg`` of relu's input at the end of the graph and makes relu read it: out of order."""
    relu = next(n for n in graph.nodes if n.target is torch.relu)
    with graph.inserting_before(graph.output_node()):
        negated = graph.call_function(operator.neg, (relu.args[0],))
    relu.args = (negated,)


def test_a_pass_leaving_nodes_out_of_order_is_sorted_as_torch_sorts_them_after_the_hook():
    gm = _returning_tuple()
    result, in_place = PreGrad().apply(Transform.from_callable(_relu_read_by_a_later_node), gm, timeout=30)
    assert in_place and isinstance(result, torch.fx.GraphModule)
    order = [n.name for n in result.graph.nodes]
    assert order.index("neg") < order.index("relu")  # stable_topological_sort moved it, as pre_grad_passes does
    x = torch.randn(5)
    torch.testing.assert_close(result(x), (torch.relu(-x) + 1,))


def _cycle(graph: torch.fx.Graph) -> None:
    relu = next(n for n in graph.nodes if n.target is torch.relu)
    add = next(iter(relu.users))
    relu.args = (add,)


def _bare_output(graph: torch.fx.Graph) -> None:
    output = graph.output_node()
    returned = output.args[0]
    assert isinstance(returned, tuple)
    output.args = (returned[0],)


@pytest.mark.parametrize(("graph_pass", "said"), [
    (_cycle, "topological sort did not consume all nodes"),
    (_bare_output, "Graph output must be a ()"),
], ids=["cycle", "bare_output"])
def test_a_graph_torch_still_refuses_after_the_hook_fails_the_transform(graph_pass, said):
    with pytest.raises(TransformFailed, match=r"as torch.compile would refuse|AOTAutograd refuses") as raised:
        PreGrad().apply(Transform.from_callable(graph_pass), _returning_tuple(), timeout=30)
    assert said in str(raised.value)


def _relu_given(x: torch.Tensor, convolution: Any) -> torch.Tensor:
    return torch.relu(x)


def test_code_python_cannot_compile_runs_the_graph_as_aotautograd_does():
    module = PreGradModule(torch.nn.Module(), _returning_tuple().graph)
    relu = next(n for n in module.graph.nodes if n.target is torch.relu)
    relu.target, relu.kwargs = _relu_given, {"convolution": torch.conv2d}  # a builtin's repr is no Python
    module.recompile()
    assert "its generated code is no Python" in str(module.uncompiled)
    x = torch.randn(3)
    torch.testing.assert_close(module(x), (torch.relu(x) + 1,))
    torch.testing.assert_close(copy.deepcopy(module)(x), (torch.relu(x) + 1,))


# -- the capture -----------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_the_capture_takes_the_models_inputs_and_returns_its_outputs(training):
    model = _Structured().train(training)
    inputs = (torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4))
    gm = PreGrad().capture(model, training=training, inputs=inputs)
    assert [n.target for n in gm.graph.find_nodes(op="placeholder")][2] == "z"  # not read: named after forward's
    assert isinstance(gm.graph.output_node().args[0], tuple)  # Dynamo's output, a flat tuple
    reference = copy.deepcopy(model)
    found, expected = gm(*inputs), reference(*inputs)
    torch.testing.assert_close(found, expected)
    torch.testing.assert_close(gm.get_buffer("bn.running_mean"), reference.bn.running_mean)  # updated in train mode
    assert dict(gm.named_parameters()).keys() == dict(model.named_parameters()).keys()
    assert "unused" not in dict(gm.named_buffers())  # what the graph reads, as torch.fx keeps it
    again, twin = copy.deepcopy(gm), copy.deepcopy(reference)  # in the same state
    torch.testing.assert_close(torch.fx.Interpreter(again).run(*inputs), twin(*inputs))


class _Recorded(CustomGraphPass):
    """A ``pre_grad_custom_pass`` recording the canonical text of each graph it receives, and which of ``model``'s
    parameters and buffers each placeholder is (by the tensor Dynamo read for it)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.state = {id(t): name for name, t in [*model.named_parameters(), *model.named_buffers()]}
        self.graphs: list[tuple[str, dict[str, str]]] = []

    def __call__(self, graph: torch.fx.Graph) -> None:
        names = {str(node.target): self.state[id(node.meta["grapharg"].example)]
                 for node in graph.find_nodes(op="placeholder") if id(node.meta["grapharg"].example) in self.state}
        self.graphs.append((canonical_text(graph), names))

    def uuid(self) -> Any:
        return "recorded"


def _as_attributes(text: str, names: dict[str, str]) -> str:
    """``text`` with each placeholder Dynamo made of a parameter or buffer read as the capture reads it: a
    ``get_attr`` of its own name, the node's name kept."""
    lines = []
    for line in text.splitlines():
        op, name, target, rest = line.split(" ", 3)
        if op == "placeholder" and target.removeprefix("target=") in names:
            line = f"get_attr {name} target={names[target.removeprefix('target=')]} {rest}"
        lines.append(line)
    return "\n".join(lines)


@pytest.mark.slow
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_the_capture_is_the_graph_torch_compile_hands_pre_grad_custom_pass(training):
    from torch._inductor import config

    x = torch.randn(2, 3, 8, 8)
    torch.manual_seed(0)
    compiled_model = _ConvBn().train(training)
    hook = _Recorded(compiled_model)
    torch._dynamo.reset()
    with config.patch({"pre_grad_custom_pass": hook, "force_disable_caches": True}):
        compiled = torch.compile(compiled_model)
        if training:
            compiled(x).sum().backward()
        else:
            with torch.no_grad():
                compiled(x)
    torch._dynamo.reset()
    torch.manual_seed(0)
    gm = PreGrad().capture(_ConvBn(), training=training, inputs=(x,))
    [(text, names)] = hook.graphs
    assert canonical_text(gm.graph) == _as_attributes(text, names)
    assert ("num_batches_tracked" in text) == training  # the mode is traced in


@pytest.mark.slow
def test_a_model_dynamo_splits_is_refused_naming_the_graph_break():
    class Broken(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(x)
            torch._dynamo.graph_break()
            return y + 1

    with pytest.raises(NotImplementedError, match=r"Dynamo splits this model into 2 graphs \(graph breaks: .+\)") as raised:
        PreGrad().capture(Broken(), training=False, inputs=(torch.randn(3),))
    assert f"{__file__}:" in str(raised.value)  # where it breaks


# -- passes at the hook ----------------------------------------------------------------------------
_CHECKS = ("lint", "determinism", "numerics", "gradients", "devices", "purity", "recompile", "interpreter")


@pytest.mark.slow
@pytest.mark.parametrize("transform", [
    pre_grad_passes.NOTHING, "fxverify.examples:identity", pre_grad_passes.FOLD_CONV_BN,
    pre_grad_passes.inductor_efficient_conv_bn_eval,
], ids=["nothing", "identity", "fold_conv_bn", "inductor_efficient_conv_bn_eval"])
def test_correct_pre_grad_passes_pass_every_check_that_applies(transform):
    v = _verification(transform)
    assert [v.run(check).outcome for check in _CHECKS] == [PASSED] * len(_CHECKS), \
        [(check, v.run(check).message) for check in _CHECKS if v.run(check).outcome != PASSED]
    folds = transform in (pre_grad_passes.FOLD_CONV_BN, pre_grad_passes.inductor_efficient_conv_bn_eval)
    result = v.subject.applied().result
    assert any(n.target is torch.nn.functional.batch_norm for n in result.graph.nodes) != folds
    # Inductor's pass passes the builtin torch.conv2d as an argument: code Python cannot compile, which
    # torch.compile never runs (AOTAutograd interprets the graph); neither does the capture's module
    assert (getattr(result, "uncompiled", None) is not None) == (transform is pre_grad_passes.inductor_efficient_conv_bn_eval)


@pytest.mark.slow
def test_a_fold_dropping_the_conv_bias_fails_numerics_and_gradients():
    v = _verification(pre_grad_passes.fold_conv_bn_dropping_bias)
    found = v.run("numerics")
    assert found.outcome == FAILED and "eval mode" in found.message, found.message
    gradients = v.run("gradients")
    assert gradients.outcome == FAILED and "gradients differ" in gradients.message, gradients.message


@pytest.mark.slow
def test_a_fold_rewriting_train_graphs_fails_numerics_in_train_mode_only():
    found = _verification(pre_grad_passes.fold_conv_bn_in_train_mode_too).run("numerics")
    assert found.outcome == FAILED and "train mode" in found.message, found.message
    assert "eval mode" not in found.message.split("input:")[1].splitlines()[0]


class _AutocastToParamDevice(torch.nn.Module):
    """Dynamo's graph of it holds what it bakes: the parameter's device as a constant (``x.to(device(type='cpu'))``,
    as timm's dinov3 ViT has) and the handles of an autocast region (efficientvit's), objects without value
    equality, one in each run."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", enabled=False):
            y = x.to(self.w.device) * self.w
        return y.relu()


def test_what_dynamo_bakes_into_its_graph_is_no_finding_against_the_identity():
    from fxverify.cases.case import case_from_module

    case = case_from_module("autocast_to_device", _AutocastToParamDevice, [(2, 4)])
    v = fxverify.Verification("fxverify.examples:identity", case, capture=case.capture_named("inductor_pre_grad"))
    code = v.subject.applied().result.code
    assert "_enter_autocast" in code and "device(type='cpu')" in code, code
    assert [v.run(check).outcome for check in ("devices", "numerics")] == [PASSED, PASSED], \
        [v.run(check).message for check in ("devices", "numerics")]
