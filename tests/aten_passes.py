"""ATen-level passes, correct and buggy, for the ``export``, ``export_core`` and ``make_fx`` captures:
most take ``ep.module()`` (a GraphModule of ``torch.ops.aten`` calls, parameters as ``get_attr``
nodes, a ``meta['val']`` FakeTensor on every node), as PT2E-style passes do; the ``*_on_program``
ones take the ``ExportedProgram`` and ``lifted_*`` ones its lifted graph_module. Each buggy one
carries a defect found in real ATen passes, and the check meant to catch it; every one is written
the way its author would write it, not to trip fxverify.
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any

import torch
from torch import fx, nn
from torch.export.passes import move_to_device_pass
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.fx.passes.infra.pass_manager import PassManager, pass_result_wrapper
from torch.utils import _pytree as pytree

import fxverify

aten = torch.ops.aten


# -- helpers -------------------------------------------------------------------------------------
def _attr(gm: fx.GraphModule, target: str) -> torch.Tensor:
    owner, _, name = target.rpartition(".")
    return getattr(gm.get_submodule(owner) if owner else gm, name)


def _replace(gm: fx.GraphModule, node: fx.Node, target: Any, args: tuple[Any, ...], *, meta: bool = True,
             kwargs: dict[str, Any] | None = None) -> fx.Node:
    """A ``target(*args)`` node in place of ``node``, its meta copied unless ``meta=False``."""
    with gm.graph.inserting_before(node):
        new = gm.graph.call_function(target, args, kwargs or {})
    if meta:
        new.meta.update(node.meta)
    node.replace_all_uses_with(new)
    gm.graph.erase_node(node)
    return new


_TO_CLAMP_MIN = {aten.relu.default: aten.clamp_min.default, aten.relu_.default: aten.clamp_min_.default}
_TO_CLAMP = {aten.relu.default: aten.clamp.default, aten.relu_.default: aten.clamp_.default}


def _swap_relu(gm: fx.GraphModule, *, meta: bool, swaps: dict[Any, Any] = _TO_CLAMP_MIN) -> None:
    """Each relu / relu_ node replaced by its entry in ``swaps`` applied to (x, 0), its meta copied unless ``meta=False``."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in swaps:
            _replace(gm, node, swaps[node.target], (node.args[0], 0.0), meta=meta)


def _fake_value(node: fx.Node, *, record_guards: bool = False) -> Any:
    """What ``node`` computes, as its target run on its inputs' ``meta['val']`` (FakeTensors) gives it: a new
    or changed node's ``meta['val']``, as ExecuTorch's spec propagation computes it, with the guards the op's
    FakeTensor implementation takes kept out of the ShapeEnv every copy of the program shares (a depthwise
    convolution's asks whether its batch is below 16, which would make the caller's program reject larger
    ones), unless ``record_guards``."""
    args, kwargs = pytree.tree_map_only(fx.Node, lambda n: n.meta["val"], (node.args, node.kwargs))
    fake = next(v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor))
    shape_env = fake.fake_mode.shape_env
    quiet = shape_env.suppress_guards() if shape_env is not None and not record_guards else contextlib.nullcontext()
    with fake.fake_mode, quiet:
        return node.target(*args, **kwargs)


_CONVOLUTIONS = (aten.conv2d.default, aten.convolution.default)


def _channels_last_inputs(gm: fx.GraphModule, *, meta: bool, record_guards: bool = False) -> None:
    """Each 4-d convolution given its input cloned to channels-last (for a backend whose kernels want NHWC),
    the clone given its input's meta, or with ``meta`` its own: a clone back to the layout the convolution
    gave before after it, and the convolution's meta['val'] computed again (it follows its input's layout)."""
    for conv in list(gm.graph.nodes):
        if conv.op != "call_function" or conv.target not in _CONVOLUTIONS or conv.args[0].meta["val"].dim() != 4:
            continue
        x = conv.args[0]
        with gm.graph.inserting_before(conv):
            nhwc = gm.graph.call_function(aten.clone.default, (x,), {"memory_format": torch.channels_last})
        conv.replace_input_with(x, nhwc)
        if not meta:
            nhwc.meta.update(x.meta)
            continue
        gave = conv.meta["val"]  # channels innermost: channels-last already (a permuted input, say)
        layout = torch.channels_last if statically_known_true(gave.stride(1) == 1) else torch.contiguous_format
        with gm.graph.inserting_after(conv):
            back = gm.graph.call_function(aten.clone.default, (conv,), {"memory_format": layout})
        conv.replace_all_uses_with(back, delete_user_cb=lambda user, new=back: user is not new)
        for node in (nhwc, conv, back):
            node.meta["val"] = _fake_value(node, record_guards=record_guards)


def _batch_hint(size: Any) -> int:
    """The example value of a (maybe symbolic) size, as a lowering reading meta would take it."""
    return int(size.node.hint) if isinstance(size, torch.SymInt) else int(size)


# -- correct ---------------------------------------------------------------------------------------
def identity(gm: fx.GraphModule) -> fx.GraphModule:
    """Nothing changed; the code regenerated."""
    gm.recompile()
    return gm


def _relu_to_clamp_min_pass(gm: fx.GraphModule) -> fx.GraphModule:
    """relu -> clamp_min(x, 0) and relu_ -> clamp_min_(x, 0) (the training IR keeps in-place relu_),
    meta copied: the value is the same. clamp_min is not core ATen (run_decompositions turns it into
    clamp), so it is declared for the other captures: see ``clamp_min_in_core``."""
    _swap_relu(gm, meta=True)
    gm.recompile()
    return gm


relu_to_clamp_min = fxverify.contract(captures=("export", "make_fx"))(_relu_to_clamp_min_pass)


def relu_to_clamp(gm: fx.GraphModule) -> fx.GraphModule:
    """relu -> clamp(x, 0) and relu_ -> clamp_(x, 0), meta copied: core ATen on every capture."""
    _swap_relu(gm, meta=True, swaps=_TO_CLAMP)
    gm.recompile()
    return gm


lifted_relu_to_clamp = fxverify.contract(form="lifted")(relu_to_clamp)  # through ep._transform_do_not_use


def relu_to_clamp_on_program(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """relu -> clamp on the program's own graph, in place, the signature kept in step by torch's
    replace hook (the way torch's decompositions rewrite a program)."""
    with ep.graph_module._set_replace_hook(ep.graph_signature.get_replace_hook()):
        _swap_relu(ep.graph_module, meta=True, swaps=_TO_CLAMP)
    ep.graph_module.recompile()
    return ep


def swap_add_operands(gm: fx.GraphModule) -> fx.GraphModule:
    """add(a, b) -> add(b, a) for two tensors without alpha: commutative, same promotion and shape."""
    for node in list(gm.graph.nodes):
        if node.target == aten.add.Tensor and not node.kwargs and len(node.args) == 2 and \
                all(isinstance(a, fx.Node) for a in node.args):
            _replace(gm, node, aten.add.Tensor, (node.args[1], node.args[0]))
    gm.recompile()
    return gm


def decompose_hardtanh(gm: fx.GraphModule) -> fx.GraphModule:
    """hardtanh(x, lo, hi) -> clamp(x, lo, hi), meta copied."""
    for node in list(gm.graph.nodes):
        if node.target == aten.hardtanh.default:
            x, low, high = (*node.args, *(None, -1.0, 1.0)[len(node.args):])
            _replace(gm, node, aten.clamp.default, (x, low, high))
    gm.recompile()
    return gm


def to_channels_last(gm: fx.GraphModule) -> fx.GraphModule:
    """Each 4-d convolution run in channels-last, its output cloned back to the layout it had; the new nodes' and
    the convolution's meta['val'] computed by their ops on their inputs' FakeTensors."""
    _channels_last_inputs(gm, meta=True)
    gm.recompile()
    return gm


def _fast_relu(fake: str) -> Any:
    """A backend's relu kernel, a ``torch.library`` custom op, with a FakeTensor implementation and a
    backward (``exact``),
    one that picks a tile size by branching on the batch (``branching``: it guards the batch), one that says
    float16 where the kernel gives its input's dtype (``float16``), or none (``none``); defined once a process
    (a module imported again finds it registered). With ``rounding``, the FakeTensor implementation is exact and the
    kernel picks another algorithm above a batch of 4, as oneDNN picks convolution algorithms by shape: one that
    rounds float32 values to multiples of 2**-7 (exact in float64)."""
    name = f"fast_relu_{fake}_fake"
    try:
        return getattr(torch.ops.fxverify_tests, name).default
    except AttributeError:
        pass

    def kernel(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)

    def size_dependent(x: torch.Tensor) -> torch.Tensor:
        return torch.relu((x + 65536.0) - 65536.0) if x.dtype == torch.float32 and x.shape[0] > 4 else torch.relu(x)

    def tiled(x: torch.Tensor) -> torch.Tensor:
        tile = 4 if x.shape[0] > 4 else 1  # the tile the kernel would use: a branch on a symbolic size
        return torch.empty_like(x) if tile else x

    op = torch.library.custom_op(f"fxverify_tests::{name}", size_dependent if fake == "rounding" else kernel,
                                 mutates_args=())
    fakes = {"exact": torch.empty_like, "rounding": torch.empty_like, "branching": tiled,
             "float16": lambda x: torch.empty_like(x, dtype=torch.float16)}
    if fake in fakes:
        op.register_fake(fakes[fake])
    if fake == "exact":
        op.register_autograd(lambda ctx, grad: grad * (ctx.saved_tensors[0] > 0),
                             setup_context=lambda ctx, inputs, output: ctx.save_for_backward(output))
    return getattr(torch.ops.fxverify_tests, name).default


def _relu_as(gm: fx.GraphModule, kernel: Any) -> fx.GraphModule:
    """Each relu swapped for ``kernel``, meta copied (the same value)."""
    for node in list(gm.graph.nodes):
        if node.target == aten.relu.default:
            _replace(gm, node, kernel, node.args)
    gm.recompile()
    return gm


@fxverify.contract(captures=("export", "make_fx"))  # a custom op is not core ATen
def relu_as_custom_kernel(gm: fx.GraphModule) -> fx.GraphModule:
    """Each relu swapped for a backend's kernel, a custom op with a FakeTensor implementation, meta copied."""
    return _relu_as(gm, _fast_relu("exact"))


def dead_code_elimination(gm: fx.GraphModule) -> fx.GraphModule:
    """torch.fx's own DCE, which keeps nodes with side effects (in-place updates of buffers)."""
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


@fxverify.contract(modes=("eval",), changes_parameters=True)
def conv_bn_fold(gm: fx.GraphModule) -> fx.GraphModule:
    """Fold an eval-mode batch_norm into the convolution before it, new parameters with their meta."""
    _fold_conv_bn(gm, mean_in_bias=True)
    return gm


def move_to_cpu(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """torch's own move_to_device_pass, to the CPU the program is on (it writes meta['val'] = None on
    nodes that had none)."""
    return move_to_device_pass(ep, "cpu")


# weight-only int8 fake quantization: the outputs move by design, within the declared tolerance
_WEIGHT_ONLY_INT8 = fxverify.contract(modes=("eval",), changes_parameters=True, range_tol=0.05,
                                      captures=("export", "export_core"))


@_WEIGHT_ONLY_INT8
def fake_quantize_conv_weights(gm: fx.GraphModule) -> fx.GraphModule:
    """Each convolution weight rounded to int8 per output channel and back, under both spellings:
    aten.conv2d (training IR) and aten.convolution (core ATen). (A linear weight takes three spellings
    in core ATen: addmm, mm without a bias, and an expanded weight into bmm for some 3-d inputs; the
    agreement check caught a first version of this pass that knew addmm only.)"""
    _fake_quantize_weights(gm, {aten.conv2d.default, aten.convolution.default})
    return gm


# -- buggy ---------------------------------------------------------------------------------------
@_WEIGHT_ONLY_INT8
def fake_quantize_training_ir_weights(gm: fx.GraphModule) -> fx.GraphModule:
    """agreement: written against the training IR only (aten.conv2d, aten.linear): under core ATen,
    where they are aten.convolution and aten.addmm, it quantizes nothing, and numerics passes on both."""
    _fake_quantize_weights(gm, {aten.conv2d.default, aten.linear.default})
    return gm


def relu_to_clamp_min_without_meta(gm: fx.GraphModule) -> fx.GraphModule:
    """meta: the new nodes get no meta['val'] (the export Verifier would reject them; make_fx and
    ep.module() say nothing)."""
    _swap_relu(gm, meta=False)
    gm.recompile()
    return gm


def rebuilt_with_transformer(gm: fx.GraphModule) -> fx.GraphModule:
    """meta: an identity written with torch.fx.Transformer, which does not carry meta['val'] over."""
    return fx.Transformer(gm).transform()


def relu_in_float64_with_stale_meta(gm: fx.GraphModule) -> fx.GraphModule:
    """meta: relu computed in float64 for accuracy, the casts and the relu given the float32 input's
    meta (the values are right; every later pass reads float32 where there is float64)."""
    for node in list(gm.graph.nodes):
        if node.target == aten.relu.default:
            x = node.args[0]
            dtype = x.meta["val"].dtype
            with gm.graph.inserting_before(node):
                up = gm.graph.call_function(aten._to_copy.default, (x,), {"dtype": torch.float64})
                relu = gm.graph.call_function(aten.relu.default, (up,))
                down = gm.graph.call_function(aten._to_copy.default, (relu,), {"dtype": dtype})
            for new in (up, relu, down):
                new.meta.update(node.meta)
            node.replace_all_uses_with(down)
            gm.graph.erase_node(node)
    gm.recompile()
    return gm


def linear_as_addmm_with_weight_meta(gm: fx.GraphModule) -> fx.GraphModule:
    """meta: linear(x, w, b) -> addmm(b, x, t(w)), the transpose given the weight's meta (out x in,
    where it gives in x out)."""
    for node in list(gm.graph.nodes):
        if node.target == aten.linear.default and len(node.args) == 3 and node.args[0].meta["val"].dim() == 2:
            x, w, b = node.args
            with gm.graph.inserting_before(node):
                transposed = gm.graph.call_function(aten.t.default, (w,))
            transposed.meta.update(w.meta)
            _replace(gm, node, aten.addmm.default, (b, x, transposed))
    gm.recompile()
    return gm


def to_channels_last_recording_guards(gm: fx.GraphModule) -> fx.GraphModule:
    """dynamic: to_channels_last with each new meta['val'] computed by running the op on FakeTensors as they come,
    in the program's fake mode: a depthwise convolution's FakeTensor implementation asks whether its batch is
    below 16, and the caller's own program, whose ShapeEnv records the answer, then rejects larger batches."""
    _channels_last_inputs(gm, meta=True, record_guards=True)
    gm.recompile()
    return gm


def to_channels_last_with_copied_meta(gm: fx.GraphModule) -> fx.GraphModule:
    """meta: each 4-d convolution's input cloned to channels-last, the clone given its input's meta: it and
    the convolution (whose output follows the new layout) say contiguous strides; the values are right, and
    what reads strides from meta['val'] (ExecuTorch's dim order and memory planning) is wrong."""
    _channels_last_inputs(gm, meta=False)
    gm.recompile()
    return gm


def relu_as_custom_kernel_without_fake(gm: fx.GraphModule) -> fx.GraphModule:
    """meta: each relu swapped for a backend's kernel, a custom op registered without a FakeTensor
    implementation (no register_fake), meta copied: the module runs right, and whatever traces the program
    with FakeTensors (run_decompositions, to_edge, export) stops at it."""
    return _relu_as(gm, _fast_relu("none"))


def relu_of_shifted_input(gm: fx.GraphModule) -> fx.GraphModule:
    """numerics: each relu's input shifted by a constant and back, relu((x + 1e4) - 1e4), as a pass folding a bias
    into a following op might leave it: exact in real arithmetic and right in float64, off by up to 5e-4 in float32."""
    for node in list(gm.graph.nodes):
        if node.target == aten.relu.default:
            x = node.args[0]
            with gm.graph.inserting_before(node):
                up = gm.graph.call_function(aten.add.Tensor, (x, 1e4))
                back = gm.graph.call_function(aten.sub.Tensor, (up, 1e4))
            for new in (up, back):
                new.meta["val"] = _fake_value(new)
            node.replace_input_with(x, back)
    gm.recompile()
    return gm


def relu_as_custom_kernel_with_float16_fake(gm: fx.GraphModule) -> fx.GraphModule:
    """meta: each relu swapped for a backend's kernel whose FakeTensor implementation says float16 (written for
    a half-precision build) where the kernel gives float32; meta copied from the relu, so it says float32 as
    the real run does, and every tool that traces the program with FakeTensors sees float16."""
    return _relu_as(gm, _fast_relu("float16"))


def relu_as_size_dependent_kernel(gm: fx.GraphModule) -> fx.GraphModule:
    """Correct for dynamic: each relu swapped for a backend's kernel that, above a batch of 4, runs an algorithm less
    accurate in float32 (exact in float64): the float32 outputs differ there beyond the default tolerance, and no
    size is written into the graph."""
    return _relu_as(gm, _fast_relu("rounding"))


def relu_as_custom_kernel_with_branching_fake(gm: fx.GraphModule) -> fx.GraphModule:
    """dynamic: each relu swapped for a backend's kernel whose FakeTensor implementation picks a tile size
    with ``if x.shape[0] > 4``: the module runs right at every batch, and re-propagating FakeTensors through
    it guards the batch (s <= 4 at the example batch 2), so that whatever traces it again with a dynamic
    batch specialises it."""
    return _relu_as(gm, _fast_relu("branching"))


def flatten_as_view_of_example_batch(gm: fx.GraphModule) -> fx.GraphModule:
    """dynamic: flatten(x, 1) -> view(x, [B, -1]) and sym_size(x, 0) -> B, with B the batch read from
    meta['val'] (the example's): right at the example batch, wrong at every other."""
    for node in list(gm.graph.nodes):
        if node.target == aten.flatten.using_ints and node.args[1:2] == (1,) and len(node.args) <= 2:
            batch = _batch_hint(node.args[0].meta["val"].shape[0])
            _replace(gm, node, aten.view.default, (node.args[0], [batch, -1]))
        elif node.target == aten.sym_size.int and node.args[1] == 0:
            node.replace_all_uses_with(_batch_hint(node.meta["val"]))  # type: ignore[arg-type]
            gm.graph.erase_node(node)
    gm.recompile()
    return gm


def flatten_as_view_of_symbolic_batch(gm: fx.GraphModule) -> fx.GraphModule:
    """dynamic: flatten(x, 1) -> view(x, [s, -1]) with s the SymInt of meta['val'] itself, written into
    the arguments (bound while exporting only)."""
    for node in list(gm.graph.nodes):
        if node.target == aten.flatten.using_ints and node.args[1:2] == (1,) and len(node.args) <= 2:
            size = node.args[0].meta["val"].shape[0]
            _replace(gm, node, aten.view.default, (node.args[0], [size, -1]))
    gm.recompile()
    return gm


def erase_unused_nodes(gm: fx.GraphModule) -> fx.GraphModule:
    """stateful: a hand-written dead-code elimination that erases every call without users, in-place
    updates of buffers (add_, the write-back copy_) included."""
    for node in reversed(list(gm.graph.nodes)):
        if node.op == "call_function" and not node.users:
            gm.graph.erase_node(node)
    gm.recompile()
    return gm


def gelu_without_approximate(gm: fx.GraphModule) -> fx.GraphModule:
    """numerics: gelu rewritten as gelu(x), its approximate='tanh' lost."""
    for node in list(gm.graph.nodes):
        if node.target == aten.gelu.default:
            _replace(gm, node, aten.gelu.default, (node.args[0],))
    gm.recompile()
    return gm


@fxverify.contract(modes=("eval",), changes_parameters=True)
def conv_bn_fold_forgets_mean(gm: fx.GraphModule) -> fx.GraphModule:
    """numerics: the fold leaves the running mean out of the bias."""
    _fold_conv_bn(gm, mean_in_bias=False)
    return gm


@fxverify.contract(changes_parameters=True)
def conv_bn_fold_in_any_mode(gm: fx.GraphModule) -> fx.GraphModule:
    """numerics (train stage): folds batch_norm without reading its training flag, so a model exported in
    train mode computes with the running statistics instead of the batch's; its contract covers both
    modes (the default)."""
    _fold_conv_bn(gm, mean_in_bias=True, any_mode=True)
    return gm


@fxverify.contract(modes=("eval",), changes_parameters=True)
def conv_bn_fold_to_plain_attributes(gm: fx.GraphModule) -> fx.GraphModule:
    """devices: the folded weight and bias are set as plain tensor attributes (setattr), which
    ``module.to(device)`` and ``.to(dtype)`` leave behind: ``ep.module()`` then ``.to("cuda")`` fails."""
    _fold_conv_bn(gm, mean_in_bias=True, plain=True)
    return gm


def hoist_parameters_in_name_set_order(gm: fx.GraphModule) -> fx.GraphModule:
    """determinism: get_attr nodes moved to the top in the order of a set of their names (by PYTHONHASHSEED)."""
    first, named = next(iter(gm.graph.nodes)), {n.name: n for n in gm.graph.nodes if n.op == "get_attr"}
    for name in set(named):
        first.prepend(named[name])
    gm.recompile()
    return gm


def hoist_parameters_in_set_order(gm: fx.GraphModule) -> fx.GraphModule:
    """determinism: get_attr nodes moved to the top in the order of a set of nodes (hashed by id)."""
    first = next(iter(gm.graph.nodes))
    for node in {n for n in gm.graph.nodes if n.op == "get_attr"}:
        first.prepend(node)
    gm.recompile()
    return gm


def relu_to_clamp_on_program_stale_signature(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """verifier: the program's graph rewritten in place and its signature left naming the erased relu
    (ep.module() still runs; torch.export.save and to_edge reject the program)."""
    _swap_relu(ep.graph_module, meta=True, swaps=_TO_CLAMP)
    ep.graph_module.recompile()
    return ep


def relu_to_clamp_on_program_changing_the_given(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """purity: _transform_do_not_use called on the program the pass was given, which it changes too (the
    caller's program is rewritten behind its back)."""
    return ep._transform_do_not_use(pass_result_wrapper(relu_to_clamp))


def relu_times_tensor_literal_on_program(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """serde: relu(x) * 1, the 1 a tensor written straight into the node's arguments instead of a lifted
    constant (signature kept by the replace hook): torch.export.save cannot write it."""
    graph = ep.graph_module.graph
    with ep.graph_module._set_replace_hook(ep.graph_signature.get_replace_hook()):
        for node in list(graph.nodes):
            if node.target == aten.relu.default:
                with graph.inserting_after(node):
                    scaled = graph.call_function(aten.mul.Tensor, (node, torch.tensor(1.0)))
                scaled.meta.update(node.meta)
                node.replace_all_uses_with(scaled, delete_user_cb=lambda user, new=scaled: user is not new)
    ep.graph_module.recompile()
    return ep


clamp_min_in_core = fxverify.contract(captures=("export_core",))(_relu_to_clamp_min_pass)  # opset: not core ATen
forgets_meta_in_make_fx = fxverify.contract(captures=("make_fx",))(relu_to_clamp_min_without_meta)  # meta


@fxverify.contract(captures=("export",))
def gelu_as_torch_function(gm: fx.GraphModule) -> fx.GraphModule:
    """opset: aten.gelu rewritten as a call of torch.nn.functional.gelu (right values, meta copied; a
    torch-level function the Verifier and lowerings reject)."""
    for node in list(gm.graph.nodes):
        if node.target == aten.gelu.default:
            _replace(gm, node, torch.nn.functional.gelu, node.args, kwargs=dict(node.kwargs))
    gm.recompile()
    return gm


def _pass_manager() -> PassManager:
    """meta, in step 2 of 3: a PassManager whose second pass forgets meta['val']."""
    return PassManager([pass_result_wrapper(p) for p in (identity, relu_to_clamp_min_without_meta, swap_add_operands)])


pass_manager_losing_meta = fxverify.contract(captures=("export",))(_pass_manager())


class _RangeObserver(nn.Module):
    """An observer as PT2E's prepare step inserts one: it records the lowest value that flows through, with
    a data-dependent branch (torch.export cannot export it; convert_pt2e replaces it later)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("low", torch.tensor(float("inf")))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.min() < self.low:
            self.low.copy_(x.min().detach())
        return x


def insert_observer(gm: fx.GraphModule) -> fx.GraphModule:
    """reexport (under the strict contract): an observer module after the first relu; what prepare_pt2e
    does, and declares with keeps_opset=False."""
    relu = next(n for n in gm.graph.nodes if n.target in (aten.relu.default, aten.relu_.default))
    gm.add_submodule("observer_0", _RangeObserver())
    with gm.graph.inserting_after(relu):
        observed = gm.graph.call_module("observer_0", (relu,))
    relu.replace_all_uses_with(observed, delete_user_cb=lambda user: user is not observed)
    observed.meta["val"] = relu.meta["val"]
    gm.recompile()
    return gm


def reads_batch_as_int(gm: fx.GraphModule) -> fx.GraphModule:
    """dynamic: the input's batch read from meta['val'] with int() (to size a buffer, say), the graph left as it
    is: the ShapeEnv that every copy of the program shares now says the batch is the example's."""
    (x,) = gm.graph.find_nodes(op="placeholder")
    int(x.meta["val"].shape[0])
    return gm


def tests_batch_parity_with_bool(gm: fx.GraphModule) -> fx.GraphModule:
    """dynamic: the pass asks whether the batch is even (to pick a kernel that packs pairs of rows, say) with
    bool() of a size read from meta['val'], and leaves the graph as it is: the ShapeEnv every copy of the
    program shares now holds the guard Eq(Mod(s, 2), 0), and the caller's own program rejects odd batches."""
    (x,) = gm.graph.find_nodes(op="placeholder")
    if bool(x.meta["val"].shape[0] % 2 == 0):
        gm.meta["packs_row_pairs"] = True
    return gm


def _recompute_meta(gm: fx.GraphModule) -> None:
    """Every node's meta['val'] computed again with torch's FakeTensorProp, in the program's own fake mode."""
    from torch._guards import detect_fake_mode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    values = [p.meta["val"] for p in gm.graph.find_nodes(op="placeholder")]
    FakeTensorProp(gm, detect_fake_mode(values)).propagate_dont_convert_inputs(*values)


def meta_recomputed_with_fake_tensor_prop(gm: fx.GraphModule) -> fx.GraphModule:
    """dynamic: meta['val'] recomputed after a rewrite the way passes commonly do it, with torch's
    FakeTensorProp in the program's fake mode: without the Python dispatcher, aten.upsample_bilinear2d's C++
    meta kernel specialises the batch in the ShapeEnv every copy of the program shares."""
    _recompute_meta(gm)
    return gm


def meta_recomputed_with_the_python_dispatcher(gm: fx.GraphModule) -> fx.GraphModule:
    """meta['val'] recomputed with torch's FakeTensorProp inside enable_python_dispatcher(), as torch.export traces."""
    from torch._dispatch.python import enable_python_dispatcher

    with enable_python_dispatcher():
        _recompute_meta(gm)
    return gm


def fill_missing_meta(gm: fx.GraphModule) -> fx.GraphModule:
    """A meta repair step (as ExecuTorch's spec propagation): a node without meta['val'] gets its target run
    on its inputs' FakeTensors."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.meta.get("val") is None:
            node.meta["val"] = _fake_value(node)
    return gm


def _losing_then_repairing_meta() -> PassManager:
    return PassManager([pass_result_wrapper(p) for p in (relu_to_clamp_min_without_meta, fill_missing_meta)])


# meta is lost by step 1 and repaired by step 2: correct as a pipeline; verify-each names step 1
repairing_pipeline = fxverify.contract(captures=("export",))(_losing_then_repairing_meta())
repairing_pipeline_verified_each = fxverify.contract(captures=("export",), verify_each=True)(
    _losing_then_repairing_meta())


def copied_into_a_new_graph(gm: fx.GraphModule) -> fx.GraphModule:
    """lint: the graph copied node by node into a new fx.Graph (as CSE passes rebuild it), without
    ep.module()'s pytree code generator: the result returns a tuple where the original returns a tensor."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return fx.GraphModule(gm, graph)


def relu_to_clamp_min_without_recompile(gm: fx.GraphModule) -> fx.GraphModule:
    """lint: the graph is rewritten and gm.recompile() forgotten."""
    _swap_relu(gm, meta=True)
    return gm


# -- the fold, right and wrong ------------------------------------------------------------------------
def _fold_conv_bn(gm: fx.GraphModule, *, mean_in_bias: bool, plain: bool = False, any_mode: bool = False) -> None:
    """Fold eval-mode batch_norm into the convolution feeding it: training IR (conv2d, batch_norm with
    training=False) and core ATen (convolution, _native_batch_norm_legit_no_training + getitem 0); the
    new weight and bias as parameters, or with ``plain`` as plain tensor attributes; with ``any_mode``
    a training-IR batch_norm whatever its training flag."""
    graph = gm.graph
    for index, bn in enumerate(list(graph.nodes)):
        if bn.target == aten.batch_norm.default and (any_mode or not bn.args[5]):
            conv, weight, bias, mean, var, eps, outputs = *bn.args[:5], bn.args[7], [bn]
        elif bn.target == aten._native_batch_norm_legit_no_training.default:
            conv, weight, bias, mean, var, eps = *bn.args[:5], bn.args[6]
            outputs = [u for u in bn.users if u.target is operator.getitem and u.args[1] == 0]
            if len(outputs) != len(bn.users):
                continue
        else:
            continue
        if not isinstance(conv, fx.Node) or conv.target not in (aten.conv2d.default, aten.convolution.default) \
                or len(conv.users) != 1 or any(not isinstance(a, fx.Node) for a in (weight, bias, mean, var)):
            continue
        if conv.target == aten.convolution.default and conv.args[6]:
            continue  # transposed: its weight is (in, out / groups, ...), scaled along dim 1 (fxverify caught that)
        conv_weight = _attr(gm, conv.args[1].target)
        conv_bias = conv.args[2] if len(conv.args) > 2 else None
        scale = _attr(gm, weight.target) / torch.sqrt(_attr(gm, var.target) + eps)
        folded_bias = _attr(gm, bias.target) + (_attr(gm, conv_bias.target) if conv_bias is not None else 0.0) * scale
        if mean_in_bias:
            folded_bias = folded_bias - _attr(gm, mean.target) * scale
        folded = {"weight": (conv_weight * scale.reshape(-1, *[1] * (conv_weight.dim() - 1))).detach(),
                  "bias": folded_bias.detach()}
        for name, value in folded.items():
            if plain:
                setattr(gm, f"folded{index}_{name}", value)
            else:
                gm.register_parameter(f"folded{index}_{name}", nn.Parameter(value))
        with graph.inserting_before(conv):
            new_weight = graph.get_attr(f"folded{index}_weight")
            new_bias = graph.get_attr(f"folded{index}_bias")
        new_weight.meta["val"] = conv.args[1].meta["val"]
        new_bias.meta["val"] = weight.meta["val"]
        args = list(conv.args) + [None] * (3 - len(conv.args))
        args[1], args[2] = new_weight, new_bias
        conv.args = tuple(args)
        for output in outputs:
            output.replace_all_uses_with(conv)
        for output in outputs:
            graph.erase_node(output)
        if bn not in outputs:
            graph.erase_node(bn)
    graph.eliminate_dead_code()
    gm.recompile()


def _fake_quantize_weights(gm: fx.GraphModule, targets: set[Any]) -> None:
    """The weight (second argument) of each node of ``targets`` rounded to symmetric int8 per output
    channel (its dim 0) and back, in place of the parameter."""
    for node in gm.graph.nodes:
        weight = node.args[1] if node.op == "call_function" and node.target in targets else None
        if not isinstance(weight, fx.Node) or weight.op != "get_attr":
            continue
        w = _attr(gm, weight.target).detach()
        scale = w.abs().amax(dim=tuple(range(1, w.dim())), keepdim=True).clamp_min(1e-12) / 127
        owner, _, name = weight.target.rpartition(".")
        setattr(gm.get_submodule(owner) if owner else gm, name,
                nn.Parameter(torch.round(w / scale).clamp(-127, 127) * scale, requires_grad=False))


# -- issue 35: passes on today's structures (buffers written in forward, hand-written activations) --------
def _is_in_place(node: fx.Node) -> bool:
    """Whether the node's op writes into an argument: a mutable schema argument (``add_``, ``copy_``, ``index_put_``)."""
    schema = getattr(node.target, "_schema", None)
    return schema is not None and any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def cse_ignoring_view_writes(gm: fx.GraphModule) -> fx.GraphModule:
    """numerics: common-subexpression elimination keyed on (target, arguments): it keeps in-place nodes and
    random ops as they are, but takes a read of a buffer for the same value wherever it happens, so two
    ``sum(cache, [0])`` around an in-place write through a slice of ``cache`` (``slice``, ``add_``,
    ``copy_``: none of them names ``cache`` as written) are merged, and the output reads the cache as it was
    before the write."""
    seen: dict[Any, fx.Node] = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or _is_in_place(node) or \
                torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
            continue
        key = (node.target, *pytree.tree_leaves((node.args, node.kwargs)), repr((node.args, node.kwargs)))
        try:
            hash(key)
        except TypeError:
            continue
        if key in seen:
            node.replace_all_uses_with(seen[key])
            gm.graph.erase_node(node)
        else:
            seen[key] = node
    gm.recompile()
    return gm


def _swish(x: torch.Tensor) -> torch.Tensor:
    return aten.mul.Tensor(x, aten.sigmoid.default(x))


def _silu(x: torch.Tensor) -> torch.Tensor:
    return aten.silu.default(x)


def swish_to_silu_without_meta(gm: fx.GraphModule) -> fx.GraphModule:
    """meta: hand-written swish, ``mul(x, sigmoid(x))``, rewritten to ``aten.silu`` with torch.fx's
    ``replace_pattern``, which gives the nodes it inserts no ``meta['val']`` (the values are right)."""
    fx.subgraph_rewriter.replace_pattern(gm, _swish, _silu)
    gm.recompile()
    return gm


def fold_buffer_computations(gm: fx.GraphModule) -> fx.GraphModule:
    """stateful: constant folding of every computation on parameters and buffers alone (no input reaches it),
    each run once on copies of the attributes and stored as a new buffer: it never asks whether forward
    writes a buffer, so a counter's ``add_(count, 1)`` is folded to its first value and the write-back
    ``copy_`` keeps the count there."""
    constant: dict[fx.Node, torch.Tensor] = {}
    for node in list(gm.graph.nodes):
        if node.op == "get_attr":
            value = _attr(gm, node.target)
            if isinstance(value, torch.Tensor):
                constant[node] = value.detach().clone()
            continue
        inputs = [a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, fx.Node)]
        if node.op != "call_function" or not inputs or not node.users or any(a not in constant for a in inputs):
            continue
        args, kwargs = pytree.tree_map_only(fx.Node, lambda a: constant[a].clone(), (node.args, node.kwargs))
        value = node.target(*args, **kwargs)
        if not isinstance(value, torch.Tensor):
            continue
        name = f"_folded_{len([n for n, _ in gm.named_buffers() if n.startswith('_folded_')])}"
        gm.register_buffer(name, value)
        with gm.graph.inserting_before(node):
            folded = gm.graph.get_attr(name)
        folded.meta.update(node.meta)
        node.replace_all_uses_with(folded)
        constant[folded] = value
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def _relu_default_to_clamp_min(gm: fx.GraphModule) -> fx.GraphModule:
    """A ReLU rewrite keyed on ``aten.relu.default`` only, meta copied: exact wherever it fires, but it never
    meets ``aten.relu_.default``, which the training IR keeps for ``nn.ReLU(inplace=True)`` (resnet18: 17, all
    left). The op-variant warning names the twin and its count; the variants check fails it only under the
    promise to rewrite every occurrence (``relu_default_only_every_occurrence``)."""
    _swap_relu(gm, meta=True, swaps={aten.relu.default: aten.clamp_min.default})
    gm.recompile()
    return gm


relu_default_only = fxverify.contract(captures=("export", "make_fx"))(_relu_default_to_clamp_min)
relu_default_only_every_occurrence = fxverify.contract(captures=("export", "make_fx"), rewrites_every_occurrence=True)(
    _relu_default_to_clamp_min)


def swish_to_silu(gm: fx.GraphModule) -> fx.GraphModule:
    """The correct twin of ``swish_to_silu_without_meta``: the same ``replace_pattern`` rule, then each node
    it inserted given its ``meta['val']`` (its target run on its inputs' FakeTensors, as ``fill_missing_meta``
    does)."""
    fx.subgraph_rewriter.replace_pattern(gm, _swish, _silu)
    fill_missing_meta(gm)
    gm.recompile()
    return gm
