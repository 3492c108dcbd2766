"""The FX edge-case corpus (``corpus/edge_cases.py``, ``corpus/edge.toml``): every
entry builds and runs, traces to what it computes eagerly (or honestly fails to,
when marked ``xfail``), and each module really exercises its hazard."""

from __future__ import annotations

import dataclasses
import inspect
import math
import re

import pytest
import torch
import torch.ao.quantization.fx._decomposed  # at collection: pytester's sys.modules snapshots would forget it
import torch.nn.functional as F
from fxverify.corpus import edge_cases
from torch import fx, nn
from torch.utils import _pytree as pytree

import fxverify
from fxverify.cases import catalogue

EDGE = catalogue.select("edge")
TRACEABLE = [e for e in EDGE if not e.xfail]
XFAIL = [e for e in EDGE if e.xfail]
HELPERS = {"ChannelGate"}  # modules that only serve as parts of an entry


def names(entries):
    return [e.name for e in entries]


def trace_and_inputs(name, **kwargs):
    case = fxverify.load_case(name)
    return case, case.captured(**kwargs), case.example_inputs()


def nodes(gm, op):
    return [n for n in gm.graph.nodes if n.op == op]


# -- the catalogue ---------------------------------------------------------------


def test_edge_profile_is_large_and_well_formed():
    assert len(EDGE) >= 20
    assert len(XFAIL) >= 3
    for entry in EDGE:
        assert entry.source == "edge" and entry.name.startswith("edge_"), entry.name
        assert "edge" in entry.tags, entry.name
        assert isinstance(entry.factory, str) and entry.factory.startswith("fxverify.corpus.edge_cases:"), entry.name


def test_every_edge_module_has_one_entry_and_a_docstring():
    classes = {
        name for name, obj in vars(edge_cases).items()
        if inspect.isclass(obj) and issubclass(obj, nn.Module) and obj.__module__ == edge_cases.__name__
    }
    listed = [e.factory.partition(":")[2] for e in EDGE if e.dtype is None]
    assert sorted(listed) == sorted(set(listed)), "a module is listed twice"
    assert classes - HELPERS == set(listed)
    for name in classes:
        assert len((getattr(edge_cases, name).__doc__ or "").split()) >= 10, f"{name} needs a docstring"


def test_each_entry_in_another_dtype_is_a_tagged_twin_of_a_float32_entry():
    twins = [e for e in EDGE if e.dtype is not None]
    assert {e.dtype for e in twins} == {"bfloat16"}
    for entry in twins:
        twin = catalogue.find(entry.name.removesuffix("_bf16"))
        assert "bf16" in entry.tags and set(entry.tags) - {"bf16"} == set(twin.tags), entry.name
        assert dataclasses.replace(twin, name=entry.name, dtype=entry.dtype, tags=entry.tags,
                                   profiles=entry.profiles) == entry, entry.name


def test_integer_inputs_have_bounds():
    for entry in EDGE:
        for spec in entry.inputs:
            if not getattr(torch, spec.dtype).is_floating_point and spec.dtype != "bool":
                assert spec.low is not None and spec.high is not None, entry.name


# -- every entry ---------------------------------------------------------------


@pytest.mark.parametrize("name", names(EDGE))
def test_builds_and_runs_eagerly_on_every_config(name):
    case = fxverify.load_case(name)
    module = case.build()
    with torch.no_grad():
        for config in case.configs:
            outputs = pytree.tree_leaves(module(*config.make(case.seed)))
            assert any(isinstance(out, torch.Tensor) for out in outputs), (config.describe(), outputs)


# traced wrong by design, as its docstring says: symbolic tracing runs the counter's update once, while tracing
TRACED_AS_FIRST_CALL = {"edge_counter_buffer"}


@pytest.mark.parametrize("name", sorted(set(names(TRACEABLE)) - TRACED_AS_FIRST_CALL))
def test_traced_equals_eager_on_every_config(name):
    case = fxverify.load_case(name)
    module, gm = case.build(), case.captured()
    assert isinstance(gm, fx.GraphModule)
    with torch.no_grad():
        for config in case.configs:
            torch.testing.assert_close(gm(*config.make(case.seed)), module(*config.make(case.seed)), equal_nan=True)


@pytest.mark.parametrize("name", names(TRACEABLE))
def test_traced_state_all_moves_with_to(name):
    """No plain tensor attributes (``_tensor_constant*`` from eager work on a buffer at
    trace time): everything the graph reads follows ``.to(device)``."""
    gm = fxverify.load_case(name).captured()
    plain = [f"{q}.{a}" for q, sub in gm.named_modules() for a, v in vars(sub).items() if isinstance(v, torch.Tensor)]
    assert not plain


# what each expected failure raises, tracing or running the trace: the failure its xfail reason gives
XFAIL_RAISES = {
    "edge_data_dependent_flow": (fx.proxy.TraceError, "cannot be used as inputs to control flow"),
    "edge_len_of_proxy": (RuntimeError, "'len' is not supported in symbolic tracing"),
    "edge_optional_mask_unspecialised": (TypeError, "masked_fill"),  # the mask applied, and None given
    "edge_slice_assignment": (TypeError, "does not support item assignment"),
    "edge_buffer_written_through_view": (TypeError, "does not support item assignment"),
    "edge_kv_cache_attention": (TypeError, "does not support item assignment"),
}


def test_every_expected_failure_says_what_it_raises():
    assert sorted(XFAIL_RAISES) == sorted(names(XFAIL))


@pytest.mark.parametrize("name", names(XFAIL))
def test_expected_failures_really_fail_to_trace_or_run(name):
    case = fxverify.load_case(name)
    kind, phrase = XFAIL_RAISES[name]
    with pytest.raises(kind, match=re.escape(phrase)):
        case.captured()(*case.example_inputs())


# -- hazard by hazard --------------------------------------------------------------


def test_static_config_flow_keeps_only_the_configured_structure():
    _, gm, _ = trace_and_inputs("edge_static_config_flow")
    targets = [n.target for n in nodes(gm, "call_module")]
    assert targets.count("acts.gelu") == 3 and "acts.relu" not in targets
    assert "norm" in targets and "unused" not in targets


def test_concrete_args_specialise_without_a_branch():
    entry = catalogue.find("edge_concrete_flag")
    assert entry.concrete_args == {"residual": True, "pool": "mean"}
    _, gm, (x,) = trace_and_inputs("edge_concrete_flag")
    placeholders = {str(n.target): n for n in nodes(gm, "placeholder")}
    for flag in ("residual_1", "pool_1"):
        (guard,) = placeholders[flag].users  # only torch.fx's specialisation guard reads it
        assert guard.target.__name__ == "eq" and {u.target for u in guard.users} == {torch._assert}
    assert "amax" not in gm.code  # the pool branch not taken is gone
    with pytest.raises(AssertionError, match="specialized"):
        gm(x, False)


def test_wrapped_function_stays_one_opaque_node():
    _, gm, _ = trace_and_inputs("edge_wrapped_function")
    assert [n.target for n in nodes(gm, "call_function")] == [torch.nn.functional.relu, edge_cases.pad_to_multiple]
    with torch.no_grad():
        assert gm(torch.randn(1, 3, 8, 6)).shape[-1] == gm(torch.randn(1, 3, 8, 8)).shape[-1] == 8
        assert gm(torch.randn(1, 3, 8, 9)).shape[-1] == 12


def test_custom_leaf_is_a_call_module_only_under_its_tracer():
    _, gm, _ = trace_and_inputs("edge_custom_leaf")
    leaves = [n for n in nodes(gm, "call_module") if n.target == "gate"]
    assert len(leaves) == 1 and isinstance(gm.get_submodule("gate"), edge_cases.ChannelGate)
    plain = fx.symbolic_trace(edge_cases.CustomLeaf())
    assert "gate" not in [n.target for n in nodes(plain, "call_module")]


def test_nested_sequential_flattens_to_dotted_targets():
    _, gm, _ = trace_and_inputs("edge_nested_sequential")
    targets = [n.target for n in nodes(gm, "call_module")]
    assert targets[:4] == ["features.0.0", "features.0.1", "features.1.0", "features.2.0.0"]
    assert "features.2.1" in targets  # the Identity
    assert not any(t.startswith("features.1.1") for t in targets)  # the empty Sequential


def test_shared_submodule_is_called_twice():
    _, gm, _ = trace_and_inputs("edge_shared_submodule")
    targets = [n.target for n in nodes(gm, "call_module")]
    assert targets.count("proj") == 2 and targets.count("act") == 2


def test_tied_weights_stay_one_parameter_after_tracing():
    _, gm, x = trace_and_inputs("edge_tied_weights")
    assert gm.a.weight is gm.b.weight
    assert len(list(gm.parameters())) == 3  # a.weight (shared), a.bias, b.bias
    assert [n.target for n in nodes(gm, "get_attr")] == ["a.weight"]
    gm.b.weight.data.zero_()  # writes through the shared tensor
    assert not gm.a.weight.any()


def test_functional_dropout_bakes_the_mode_at_trace_time():
    for training in (False, True):
        _, gm, _ = trace_and_inputs("edge_functional_dropout", training=training)
        dropouts = [n for n in nodes(gm, "call_function") if n.target is torch.nn.functional.dropout]
        assert len(dropouts) == 2
        assert [n.kwargs["training"] for n in dropouts] == [training, training]
        assert [n.target for n in nodes(gm, "call_module")].count("drop") == 1


def test_inplace_ops_with_unused_results_matter():
    case, gm, (x,) = trace_and_inputs("edge_inplace_ops")
    unused = [n for n in nodes(gm, "call_method") if n.target in ("copy_", "relu_")]
    assert len(unused) == 2 and all(not n.users for n in unused)
    with torch.no_grad():
        expected = gm(x)
        for node in unused:
            gm.graph.erase_node(node)
        gm.recompile()
        assert not torch.allclose(gm(x), expected)  # dropping them changes the numbers


def test_nested_outputs_keep_structure_and_pass_the_input_through():
    case, gm, (x,) = trace_and_inputs("edge_nested_outputs")
    with torch.no_grad():
        out, eager = gm(x), case.build()(x)
    assert pytree.tree_structure(out) == pytree.tree_structure(eager)
    assert list(out[0]) == ["logits", "parts", "stats"] and out[1] is x
    assert out[0]["stats"]["max"][1].dtype == torch.int64


def test_kwargs_survive_tracing_as_keywords():
    _, gm, _ = trace_and_inputs("edge_kwargs_heavy")
    kwargs = [(n.op, getattr(n.target, "__name__", n.target), n.kwargs) for n in gm.graph.nodes]
    assert ("call_function", "clamp", {"min": -1.0}) in kwargs
    assert ("call_method", "clamp", {"min": 0.0, "max": 50.0}) in kwargs
    assert ("call_method", "sum", {"dim": (2, 3), "keepdim": True}) in kwargs
    assert ("call_function", "flatten", {"start_dim": 1}) in kwargs
    assert any(name == "cat" and set(kw) == {"tensors", "dim"} for _, name, kw in kwargs)


def test_same_op_appears_as_module_function_and_method():
    _, gm, _ = trace_and_inputs("edge_same_op_three_ways")
    kinds = {(n.op, getattr(n.target, "__name__", n.target)) for n in gm.graph.nodes}
    assert {("call_module", "relu"), ("call_function", "relu"), ("call_method", "relu")} <= kinds
    assert {("call_module", "flatten"), ("call_function", "flatten"), ("call_method", "flatten")} <= kinds
    assert {("call_module", "softmax"), ("call_function", "softmax"), ("call_method", "softmax")} <= kinds


def test_tuple_results_are_read_through_getitem():
    _, gm, (x,) = trace_and_inputs("edge_tuple_getitem")
    getitems = [n for n in nodes(gm, "call_function") if getattr(n.target, "__name__", "") == "getitem"]
    assert len(getitems) >= 6
    _, indices, top = gm(x)
    assert indices.dtype == top.dtype == torch.int64
    torch.testing.assert_close(indices, x.argmax(dim=1))


def test_buffers_keep_integer_and_bool_dtypes_through_float64():
    _, gm, _ = trace_and_inputs("edge_buffers_and_constants")
    assert sorted(n.target for n in nodes(gm, "get_attr")) == ["keep", "perm", "scale", "shift"]
    assert "shift" not in gm.state_dict()  # non-persistent
    gm.to(torch.float64)
    assert (gm.scale.dtype, gm.shift.dtype, gm.perm.dtype, gm.keep.dtype) == (
        torch.float64, torch.float64, torch.int64, torch.bool)
    gm(torch.randn(2, 8, dtype=torch.float64))


def test_integer_and_bool_inputs_are_never_scaled_or_cast():
    for name, dtype in (("edge_integer_inputs", torch.int64), ("edge_bool_mask_inputs", torch.bool)):
        case = fxverify.load_case(name)
        index = next(i for i, s in enumerate(case.entry.inputs) if getattr(torch, s.dtype) == dtype)
        assert any(config.scale != 1.0 for config in case.configs)  # a large-magnitude set exists
        for config in case.configs:
            for cast in (None, torch.float64):
                inputs = config.make(case.seed, dtype=cast)
                assert inputs[index].dtype == dtype
                assert all(t.dtype == (cast or torch.float32) for i, t in enumerate(inputs) if i != index)
                if dtype == torch.int64:  # within [low, high) even in the large set: not scaled
                    assert int(inputs[index].min()) >= 0 and int(inputs[index].max()) < 8


@pytest.mark.parametrize(("name", "axis"), [("edge_shape_factories", -1), ("edge_multi_head_attention", -2)])
def test_traced_shapes_follow_the_input_length(name, axis):
    case = fxverify.load_case(name)
    gm = case.captured()
    assert len({config.specs[0].shape[axis] for config in case.configs}) >= 2
    with torch.no_grad():
        for config in case.configs:
            (x,) = config.make(case.seed)
            out = gm(x)
            out = out[0] if isinstance(out, tuple) else out
            assert out.shape[1] == x.shape[axis]


def test_shape_factories_take_device_and_dtype_from_the_input():
    _, gm, (x,) = trace_and_inputs("edge_shape_factories")
    factories = [n for n in nodes(gm, "call_function") if n.target in (torch.arange, torch.zeros)]
    assert len(factories) == 2
    assert all(isinstance(n.kwargs["device"], fx.Node) and isinstance(n.kwargs["dtype"], fx.Node) for n in factories)
    out, size = gm.to(torch.float64)(x.double())
    assert out.dtype == torch.float64 and size == x.shape[1] * x.shape[2]
    assert gm.to("meta")(x.to("meta"))[0].device.type == "meta"


def test_scalar_output_is_zero_dim():
    _, gm, (x,) = trace_and_inputs("edge_scalar_output")
    assert gm(x).shape == ()


def test_custom_op_stays_one_opaque_call_under_every_capture_and_has_a_right_backward():
    case, gm, (x,) = trace_and_inputs("edge_custom_op")
    op = torch.ops.fxverify_edge.scaled_softsign
    assert [n.target for n in nodes(gm, "call_function")] == [op]
    for capture in ("export", "export_core", "make_fx"):
        captured = case.capture_named(capture).capture(case.build(training=False), training=False, inputs=(x,))
        targets = [n.target for n in captured.graph.nodes if n.op == "call_function"]
        assert targets.count(op.default) == 1, capture  # not decomposed, described by its register_fake
        assert next(n for n in captured.graph.nodes if n.target == op.default).meta["val"].shape == x.shape
    inputs = (torch.randn(3, 8, dtype=torch.float64, requires_grad=True),
              torch.rand(8, dtype=torch.float64, requires_grad=True))
    assert torch.autograd.gradcheck(op, inputs)


def test_fusion_targets_are_fused_by_torch_fuse():
    from torch.fx.experimental.optimization import fuse

    for name, bns in (("edge_linear_bn", 2), ("edge_conv_variants", 2), ("edge_nested_sequential", 2)):
        _, gm, inputs = trace_and_inputs(name)
        assert sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in gm.modules()) == bns
        fused = fuse(gm)
        assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in fused.modules()), name
        with torch.no_grad():
            torch.testing.assert_close(fused(*inputs), gm(*inputs), rtol=1e-4, atol=1e-5)


# -- structures today's passes target (issue 35) ----------------------------------------------------------


def exported(name: str):
    case = fxverify.load_case(name)
    module = case.build(training=False)
    return case, module, torch.export.export(case.build(training=False), case.example_inputs())


@pytest.mark.parametrize("name", ["edge_buffer_written_through_view", "edge_counter_buffer", "edge_kv_cache_attention",
                                  "edge_final_buffer_copy"])
def test_buffers_written_in_forward_feed_the_output_and_export_keeps_every_call_right(name):
    case, eager, ep = exported(name)
    program = ep.module()
    (x,) = case.example_inputs()
    with torch.no_grad():
        outputs = [eager(x) for _ in range(5)]  # five calls: the KV cache's ring of 4 wraps around
        for expected in outputs:
            torch.testing.assert_close(program(x), expected)
    assert not torch.allclose(outputs[0], outputs[1])  # the state the call wrote is read by the output
    written = [n for n in ep.graph.nodes if isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable]
    assert written or ep.graph_signature.buffers_to_mutate  # export records the update, in place or written back


def test_buffer_written_through_view_is_read_twice_around_the_write_by_the_same_node():
    _, _, ep = exported("edge_buffer_written_through_view")
    graph = ep.module().graph
    sums = [n for n in graph.nodes if n.target == torch.ops.aten.sum.dim_IntList]
    assert len(sums) == 2 and sums[0].args == sums[1].args  # CSE's bait: same target, same arguments
    writes = [n for n in graph.nodes if n.target in (torch.ops.aten.add_.Tensor, torch.ops.aten.copy_.default)]
    order = list(graph.nodes)
    assert writes and all(order.index(sums[0]) < order.index(w) < order.index(sums[1]) for w in writes)
    assert all(w.args[0].target == torch.ops.aten.slice.Tensor for w in writes)  # through a view of the cache


def test_counter_is_traced_as_its_first_call_and_exported_with_its_update():
    case, gm, (x,) = trace_and_inputs("edge_counter_buffer")
    assert int(gm.count) == 1  # the update ran once, while tracing
    assert not [n for n in gm.graph.nodes if n.op == "call_method" and n.target.endswith("_")]
    eager = case.build()
    with torch.no_grad():
        first = eager(x)
        torch.testing.assert_close(gm(x), first)
        assert not torch.allclose(gm(x), eager(x))  # the second call: the trace stays at the first one's scale
    _, _, ep = exported("edge_counter_buffer")
    update = next(n for n in ep.graph.nodes if n.target == torch.ops.aten.add_.Tensor)
    assert update.args[1:] == (1,) and update.args[0].name == "b_count"  # from the count alone


def test_hand_written_activations_are_the_patterns_and_compute_the_fused_ops():
    _, gm, (x,) = trace_and_inputs("edge_hand_written_activations")
    sigmoid = next(n for n in gm.graph.nodes if n.target is torch.sigmoid)
    (mul,) = sigmoid.users
    assert mul.args == (sigmoid.args[0], sigmoid)  # x * sigmoid(x)
    assert {torch.tanh, torch.exp, torch.pow} <= {n.target for n in gm.graph.nodes}
    module = edge_cases.HandWrittenActivations()
    h = torch.randn(4, 8, dtype=torch.float64) * 3
    g = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3))))
    torch.testing.assert_close(g, F.gelu(h, approximate="tanh"))
    assert not torch.allclose(g, F.gelu(h), rtol=0, atol=1e-6)  # the tanh formula is not exact GELU
    with torch.no_grad():
        torch.testing.assert_close(module(x).sum(-1), torch.ones(x.shape[0]))  # a softmax's rows


def test_attention_by_hand_equals_sdpa_and_the_decoder_block_is_causal():
    module = edge_cases.AttentionTwoWays().double()
    q, k, v = torch.randn(3, 2, 2, 5, 8, dtype=torch.float64).unbind(0)
    by_hand = (q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(-1) @ v
    torch.testing.assert_close(by_hand, F.scaled_dot_product_attention(q, k, v))
    _, gm, _ = trace_and_inputs("edge_attention_two_ways")
    assert F.scaled_dot_product_attention in {n.target for n in gm.graph.nodes}
    block = edge_cases.TinyDecoderBlock().eval()
    x = torch.randn(2, 6, 16)
    changed = x.clone()
    changed[:, 4:] += 1.0
    with torch.no_grad():
        torch.testing.assert_close(block(x)[:, :4], block(changed)[:, :4])  # later tokens do not reach earlier ones
        assert not torch.allclose(block(x)[:, 4:], block(changed)[:, 4:])
    assert block.kv.out_features == 2 * block.kv_heads * block.head_dim < 2 * 16  # fewer key/value heads
    del module


def test_tied_embedding_head_shares_one_parameter_through_the_trace_and_the_export():
    _, gm, _ = trace_and_inputs("edge_tied_embedding_head")
    assert gm.head.weight is gm.embed.weight
    _, _, ep = exported("edge_tied_embedding_head")
    program = ep.module()
    assert program.head.weight is program.embed.weight


# -- what quantization and ExecuTorch Edge passes mishandle ------------------------------------------------------

QUANTIZED_EDGE = ["edge_cat_ranges", "edge_channels_last_clone", "edge_size_one_dims", "edge_final_buffer_copy"]


@pytest.mark.parametrize("name", QUANTIZED_EDGE)
def test_entries_meant_to_be_quantized_declare_their_input_domain_and_capture_under_pt2e(name):
    entry = catalogue.find(name)
    assert "quantization" in entry.profiles
    assert all(spec.low is not None and spec.high is not None for spec in entry.inputs)
    case = fxverify.load_case(name)
    assert [c for c in case.configs if c.scale != 1.0] == []  # a declared domain: no large-magnitude set
    gm = case.captured(capture=case.capture_named("pt2e"))
    assert any("quantize_per_tensor" in str(n.target) for n in gm.graph.nodes)
    with torch.no_grad():
        assert all(torch.isfinite(t).all() for t in pytree.tree_leaves(gm(*case.example_inputs())))


def test_cat_ranges_concatenates_branches_a_hundredfold_apart():
    case = fxverify.load_case("edge_cat_ranges")
    module, (x,) = case.build(), case.example_inputs()
    seen = {}
    module.mix.register_forward_pre_hook(lambda _, args: seen.setdefault("cat", args[0]))
    with torch.no_grad():
        module(x)
    small, large = seen["cat"].split(4, dim=1)
    assert large.abs().max() > 30 * small.abs().max()
    _, _, ep = exported("edge_cat_ranges")
    (cat,) = [n for n in ep.graph.nodes if n.target == torch.ops.aten.cat.default]
    assert [a.target for a in cat.args[0]] == [torch.ops.aten.max_pool2d.default] * 2
    assert [n.target for n in cat.users] == [torch.ops.aten.conv2d.default]


def channels_last(t: torch.Tensor) -> bool:
    return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def test_channels_last_clone_keeps_the_input_layout_in_every_output_eager_traced_and_exported():
    case = fxverify.load_case("edge_channels_last_clone")
    module, gm = case.build(), case.captured()
    program = case.captured(capture=case.capture_named("export"))  # a dynamic batch
    with torch.no_grad():
        for config in case.configs:
            (x,) = config.make(case.seed)
            assert channels_last(x), config.name
            same_size = x.shape[1:] == case.example_inputs()[0].shape[1:]  # the export's batch alone is dynamic
            for outputs in (module(x), gm(x), program(x) if same_size else ()):
                assert all(channels_last(t) for t in outputs), config.name
    assert [n.target for n in gm.graph.nodes if n.op == "call_method"] == ["clone", "to"]
    contiguous = x.clone(memory_format=torch.contiguous_format)  # what a pass making clone contiguous gives
    assert torch.equal(contiguous, x) and contiguous.stride() != x.stride()


def test_size_one_dims_make_contiguous_and_channels_last_strides_the_same():
    case = fxverify.load_case("edge_size_one_dims")
    module = case.build()
    assert module.conv.in_channels == 1
    for config in case.configs:
        (x,) = config.make(case.seed)
        assert x.shape[1] == 1 and x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)
        moved = x.permute(0, 2, 3, 1)  # moves only the size-1 dim: the same strides read as either order
        assert moved.is_contiguous()
        with torch.no_grad():
            assert module(x).shape == (x.shape[0], 1, 12)
    _, _, ep = exported("edge_size_one_dims")
    assert [n.target for n in ep.graph.nodes if n.target == torch.ops.aten.permute.default] == \
        [torch.ops.aten.permute.default] * 2


def test_final_buffer_copy_is_the_last_op_under_every_capture_and_changes_the_state_at_every_call():
    case, gm, (x,) = trace_and_inputs("edge_final_buffer_copy")
    last = list(gm.graph.nodes)[-2]
    assert (last.op, last.target) == ("call_method", "copy_") and not last.users
    _, eager, ep = exported("edge_final_buffer_copy")
    ops = [n for n in ep.graph.nodes if n.op == "call_function"]
    assert ops[-1].target == torch.ops.aten.copy_.default or ep.graph_signature.buffers_to_mutate
    states = []
    with torch.no_grad():
        for _ in range(3):
            eager(x)
            states.append(eager.total.clone())
    assert not torch.allclose(states[0], states[1]) and not torch.allclose(states[1], states[2])  # same input
