"""make_fx of models that update buffers in forward (issue 35): the buffers lifted to graph inputs while
tracing, read back as the module's own get_attr tensors, their updates written back with copy_ at the end."""

from __future__ import annotations

import copy

import torch
from torch import fx, nn
from torch.fx.experimental.proxy_tensor import make_fx

import fxverify
from fxverify.capture import MakeFx
from fxverify.capture.lifted_buffers import write_backs
from fxverify.core.results import FAILED, PASSED
from tests import aten_passes

COPY_ = torch.ops.aten.copy_.default


class Ema(nn.Module):
    """A user's own model keeping an exponential moving average of its input in a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("ema", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.ema.mul_(0.9).add_(x.mean())
        return self.fc(x) + self.ema


def _mutating(node: fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return schema is not None and any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def test_a_buffer_updated_from_the_input_is_lifted_and_written_back_like_eager():
    torch.manual_seed(0)
    eager = Ema()
    model = copy.deepcopy(eager)
    gm = MakeFx().capture(model, training=False, inputs=(torch.randn(2, 4),))
    assert torch.equal(model.ema, torch.zeros(())), "tracing (in fake mode) does not update the buffer"
    assert {"ema", "fc.weight", "fc.bias"} <= set(gm.state_dict())
    for _ in range(2):
        x = torch.randn(2, 4)
        with torch.no_grad():
            assert torch.allclose(gm(x), eager(x))
        assert torch.allclose(gm.ema, eager.ema) and not torch.equal(gm.ema, torch.zeros(()))
    nodes = list(gm.graph.nodes)
    copies = write_backs(gm)
    assert [n.args[0].target for n in copies] == ["ema"]
    assert nodes[-1 - len(copies):-1] == copies, "the write-backs are the last nodes before the output"
    assert not [n for n in nodes if _mutating(n) and n not in copies], "functional ATen but the write-backs"
    assert {n.target for n in nodes if n.op == "get_attr"} == {"ema", "fc.weight", "fc.bias"}
    assert all(n.meta.get("val") is not None for n in nodes if n.op in ("call_function", "get_attr", "placeholder"))
    assert len(gm.graph.find_nodes(op="placeholder")) == 1 and gm.graph.output_node().args[0].op == "call_function"


def test_batch_norm_in_train_mode_writes_its_counter_back_and_updates_its_statistics_like_eager():
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).train()
    gm = MakeFx().capture(copy.deepcopy(eager), training=True, inputs=(torch.randn(3, 4),))
    assert [n.args[0].target for n in write_backs(gm)] == ["1.num_batches_tracked"]
    for _ in range(2):
        x = torch.randn(3, 4)
        with torch.no_grad():
            assert torch.allclose(gm(x), eager(x), atol=1e-6)
    for name, buffer in eager.named_buffers():
        assert torch.allclose(gm.get_buffer(name).double(), buffer.double(), atol=1e-6), name


def test_a_pass_dropping_the_update_is_caught_by_stateful_under_make_fx():
    case = fxverify.case_from_module("my_ema", Ema, [(2, 4)])
    assert fxverify.Verification(aten_passes.identity, case, capture=MakeFx()).run("stateful").outcome == PASSED
    dropped = fxverify.Verification(aten_passes.erase_unused_nodes, case, capture=MakeFx()).run("stateful")
    assert dropped.outcome == FAILED and "buffer 'ema'" in dropped.message, dropped.message
    assert "aten.copy_.default" in dropped.message, dropped.message  # names the write-back the pass erased


def test_a_model_updating_no_buffer_gets_the_plain_make_fx_graph():
    case = fxverify.load_case("edge_conv_bn_head")
    inputs = case.example_inputs()
    plain = make_fx(torch.func.functionalize(case.build()), tracing_mode="fake", _allow_non_fake_inputs=True)(*inputs)
    gm = MakeFx().capture(case.build(), training=False, inputs=inputs)
    assert gm.code == plain.code
    assert not write_backs(gm) and not gm.graph.find_nodes(op="call_function", target=COPY_)
    assert all(n.target.startswith(("_param_constant", "_tensor_constant")) for n in gm.graph.find_nodes(op="get_attr"))
