"""fxverify on real compile passes written by others, under the captures of the hooks they run at.

    python benchmarks/real_compile_passes.py [--corpus smoke,edge] [--workers 1] [--only NAME,...]

The compile sibling of `benchmarks/real_passes.py`. Each pass below is Inductor's or a library's own, called as
the compiler calls it (a few lines where a spec cannot name it: a list of pattern passes, a config the pass
reads, an argument torch passes), with the contract its authors would declare. Each runs as one pytest subprocess
in a scratch directory: `--fxverify SPEC --fxverify-capture CAPTURES` over CORPUS plus the library's own models
(torchao's test models, quantized by its X86InductorQuantizer as its tests quantize them, added as user models by
a `pytest_fxverify_models` conftest written there), `--fxverify-patterns` for Inductor's attention patterns, and
`--fxverify-backend` over CORPUS for a library's backend. Failures are printed grouped by check and finding, with
the models that show each: read each group as the pass's author would.

torchao's int8 SDPA fusion (``prototype/inductor/fx_passes/qsdpa_fusion.py``) and its DA8W4 concat-linear fusion
are not among them: the ops they lower to or fuse (``torchao::qscaled_dot_product``, ``torchao::da8w4_linear_cpu``)
have no CPU kernel in torchao 0.18.0 (its own tests skip there, "cpp kernels not built");
``tests/test_real_compile_passes.py`` says when that changes.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import fxverify  # noqa: E402
from benchmarks.real_passes import print_groups  # noqa: E402

# -- Inductor's post-grad passes (post_grad_passes runs them on the graph post_grad_custom_pre_pass receives) ------


@fxverify.contract(keeps_opset=False)
def inductor_reinplace(graph: fx.Graph) -> None:
    """post_grad.reinplace_inplaceable_ops as post_grad_passes calls it (last: it brings mutation back, out of
    the functional opset), with the FakeTensorUpdater post_grad_passes makes for the graph at its start."""
    from torch._inductor.fx_passes.reinplace import reinplace_inplaceable_ops
    from torch._inductor.fx_utils import FakeTensorUpdater

    assert graph.owning_module is not None, "Inductor hands its post-grad passes a GraphModule's graph"
    reinplace_inplaceable_ops(FakeTensorUpdater(graph.owning_module), graph)


def inductor_decompose_mm(graph: fx.Graph) -> None:
    """POST_GRAD_PATTERNS['decompose_mm_pass'] (fx_passes/decompose_mem_bound_mm.py), as
    config.post_grad_fusion_options={'decompose_mm_pass': {}} runs it: on CPU, mm/addmm whose first dimension is
    at most CPU_MAX_FIRST_DIMENSION_DECOMPOSITION and bmm of batch 1 become broadcast multiplies and sums."""
    from torch._inductor import config
    from torch._inductor.fx_passes import decompose_mem_bound_mm  # noqa: F401  registers the patterns
    from torch._inductor.fx_passes.split_cat import POST_GRAD_PATTERNS

    with config.patch(post_grad_fusion_options={"decompose_mm_pass": {}}):  # its checks read their options there
        POST_GRAD_PATTERNS["decompose_mm_pass"].apply(graph)


POST_GRAD_BATCH_FUSIONS: dict[str, dict[str, Any]] = {
    name: {} for name in ("batch_aten_add", "batch_aten_mul", "batch_aten_sub", "batch_aten_div", "batch_aten_relu",
                          "batch_aten_sigmoid", "batch_aten_tanh", "batch_linear_post_grad")}


def inductor_post_grad_batch_fusion(graph: fx.Graph) -> None:
    """group_batch_fusion_passes(graph, pre_grad=False) with the post-grad batch fusions enabled in
    config.post_grad_fusion_options (off by default), as post_grad_passes runs it."""
    from torch._inductor import config
    from torch._inductor.fx_passes.group_batch_fusion import group_batch_fusion_passes

    with config.patch(post_grad_fusion_options=POST_GRAD_BATCH_FUSIONS):
        group_batch_fusion_passes(graph, pre_grad=False)


# -- Inductor's joint-graph passes (joint_graph_passes, at joint_custom_pre_pass's graph) ----------------------------


def inductor_constant_fold_uniform_value(gm: fx.GraphModule) -> fx.GraphModule:
    """joint_graph.constant_fold_uniform_value(gm): constants of one value (full, ones, zeros, their _like and
    folded expressions) become aten.full, as joint_graph_passes runs it."""
    from torch._inductor.fx_passes.joint_graph import constant_fold_uniform_value

    constant_fold_uniform_value(gm)
    return gm


ATTENTION_PATTERNS = 4  # of the 30 float32 inference ones: pattern fuzzing spends up to 60 s on each


def __getattr__(name: str) -> Any:
    """``INDUCTOR_ATTENTION_PATTERNS``, made when a spec names it (3 s): the first :data:`ATTENTION_PATTERNS` of
    Inductor's float32 inference attention fusions (fuse_attention._get_sfdp_patterns()) as
    `--fxverify-patterns` takes them, register_replacement's keyword arguments, registered as torch registers
    them."""
    if name != "INDUCTOR_ATTENTION_PATTERNS":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from torch._inductor.fx_passes import fuse_attention

    rows = [row for row in fuse_attention._get_sfdp_patterns()
            if row[0].endswith("_inference") and "_half" not in row[0] and "_bs1" not in row[0]]
    return rows[:ATTENTION_PATTERNS]


# -- Inductor's pre-grad passes (pre_grad_passes, before pre_grad_custom_pass) ---------------------------------------


def inductor_split_cat(graph: fx.Graph) -> None:
    """The pre-grad split/cat passes as pre_grad_passes runs them when config.pre_grad_fusion_options names them:
    normalization_pass first, then the others in pre_grad_pass_names' order."""
    from torch._inductor.fx_passes import split_cat

    for name in ("normalization_pass", "remove_split_with_size_one_pass", "merge_getitem_cat_pass",
                 "merge_stack_tahn_unbind_pass", "merge_splits_pass", "mutate_cat_pass", "split_cat_pass",
                 "unbind_stack_pass"):
        split_cat.PRE_GRAD_PATTERNS[name].apply(graph)


PRE_GRAD_BATCH_FUSIONS: dict[str, dict[str, Any]] = {
    name: {} for name in ("batch_linear_lhs", "batch_layernorm", "batch_tanh", "batch_relu", "batch_sigmoid",
                          "batch_detach", "batch_nan_to_num", "batch_clamp", "batch_dropout")}


def inductor_pre_grad_batch_fusion(graph: fx.Graph) -> None:
    """group_batch_fusion_passes(graph, pre_grad=True) with the pre-grad batch fusions that need no fbgemm, as
    pre_grad_passes runs them when config.pre_grad_fusion_options names them (after normalization_pass, which
    puts the calls in the keyword form they match)."""
    from torch._inductor.fx_passes import split_cat
    from torch._inductor.fx_passes.group_batch_fusion import group_batch_fusion_passes

    split_cat.PRE_GRAD_PATTERNS["normalization_pass"].apply(graph)
    group_batch_fusion_passes(graph, pre_grad=True, fusion_options=PRE_GRAD_BATCH_FUSIONS)


# -- torchao (its pre_grad_custom_pass) ------------------------------------------------------------------------------


def torchao_quant_lift_up(graph: fx.Graph) -> None:
    """torchao.quantization.pt2e.inductor_passes.x86.quant_lift_up, the CustomGraphPass importing torchao's
    X86InductorQuantizer installs as pre_grad_custom_pass: quantize_per_tensor moved up through view-like ops."""
    from torchao.quantization.pt2e.inductor_passes.x86 import quant_lift_up

    quant_lift_up(graph)


# -- Inductor's and torchao's freezing passes (freezing_passes' pattern loop, config.freezing=True) ----------------


def freezing_pattern_passes(library: str, *, replacements: bool = False) -> tuple[Any, ...]:
    """The passes of Inductor's ``freezing_patterns.pass_patterns`` as torch.compile applies them, in order, each a fresh
    ``PatternMatcherPass`` holding only the patterns ``library`` registered (``torch``, or ``torchao``: its x86
    quantization passes, registered by ``_register_quantization_weight_pack_pass``, which importing its
    X86InductorQuantizer calls), after Inductor's ``lazy_init`` has registered its own, as ``freezing_passes`` runs it;
    with ``replacements``, only its ``register_replacement`` patterns (Inductor's: ``addmm_patterns_init``'s).

    >>> [len(p.patterns) > 0 for p in freezing_pattern_passes("torch")][:3]
    [True, True, True]
    """
    from torch._inductor.fx_passes import freezing_patterns
    from torch._inductor.pattern_matcher import PatternMatcherPass, ReplacementPatternEntry

    freezing_patterns.lazy_init()
    if library == "torchao":
        from torchao.quantization.pt2e.inductor_passes.x86 import _register_quantization_weight_pack_pass

        _register_quantization_weight_pack_pass()
    fresh = []
    for registered in freezing_patterns.pass_patterns:
        kept = PatternMatcherPass(pass_name=registered.pass_name)
        for key, entries in registered.patterns.items():
            own = [entry for entry in entries if _registrant(entry) == library
                   and (not replacements or isinstance(entry, ReplacementPatternEntry))]
            if own:
                kept.patterns[key] = own
        fresh.append(kept)
    return tuple(fresh)


def _registrant(entry: Any) -> str:
    """The library that registered a pattern entry: its handler's top-level package (a replacement has none: torch)."""
    handler = getattr(entry, "handler", None)
    return getattr(handler, "__module__", "torch").partition(".")[0]


@fxverify.contract(devices=("cpu",), keeps_opset=False, changes_parameters=True)
def inductor_freezing_patterns(graph: fx.Graph) -> None:
    """Inductor's own freezing patterns as freezing_passes applies them with the default config: mkldnn weight
    packing of convolutions and linears (mkldnn._convolution_pointwise, _linear_pointwise on packed constants),
    _recover_linear, the unnecessary dtype conversion; the concat-linear patterns are off on CPU
    (config.cpp.enable_concat_linear). Its packed mkldnn constants cannot be pickled, and need not be: nothing
    saves the frozen graph (torch.compile's cache keys frozen constants by their metadata)."""
    for patterns in freezing_pattern_passes("torch"):
        patterns.apply(graph)


@fxverify.contract(keeps_opset=True, changes_parameters=True)
def inductor_freezing_concat_linear(graph: fx.Graph) -> None:
    """addmm_patterns_init's concat-linear replacements (in freezing_patterns.pass_patterns[0]) with
    config.cpp.enable_concat_linear=True, which turns them on on CPU: two or three matmuls or addmms of one input by
    constant weights of one shape become one over the concatenated weight, split after (the int8 weight-only one
    also multiplies by the concatenated scales)."""
    from torch._inductor import config

    with config.patch({"cpp.enable_concat_linear": True}):
        freezing_pattern_passes("torch", replacements=True)[0].apply(graph)


@fxverify.contract(modes=("eval",), devices=("cpu",), keeps_opset=False, changes_parameters=True, range_tol=1e-2)
def torchao_x86_freezing(graph: fx.Graph) -> None:
    """torchao's x86 quantization passes (quantization/pt2e/inductor_passes/x86.py: dequant promotion, quantized
    conv/linear weight prepacking into onednn.qconv_pointwise / qlinear_pointwise, their unary and binary post-op
    fusions, concat dequant/quant), applied by pass number as freezing_passes applies them. For PT2E-quantized
    models, which torchao's flow moves to eval mode (move_exported_model_to_eval). Within 1e-2 of the output range:
    onednn accumulates the int8 GEMM exactly where the reference graph sums dequantized floats, so a value next to a
    rounding boundary of the next quantization rounds one uint8 step (1/256 of its range) the other way."""
    for patterns in freezing_pattern_passes("torchao"):
        patterns.apply(graph)


@fxverify.contract(modes=("eval",), devices=("cpu",), keeps_opset=False, changes_parameters=True, range_tol=5e-2)
def torchao_quantized_concat_linear(graph: fx.Graph) -> None:
    """torchao's quantized concat-linear fusion (prototype/inductor/fx_passes/quantized_concat_linear_fusion_cpu.py),
    what ``register_quantized_concat_linear_cpu_pass()`` installs as ``post_grad_custom_post_pass``: three
    ``qlinear`` lowerings of one activation (q, k, v projections) become one of the concatenated weights, split. For
    PT2E-quantized models compiled with freezing. By design it requantizes the three uint8 outputs with one scale
    spanning their three ranges (and per-tensor weights likewise), so each moves by up to half a step of the merged
    scale: within 5e-2 of the output range. torchao's own test of it (test/prototype/inductor/test_qsdpa_fusion.py,
    ``_test_int8_sdpa_rewriter``) allows ``atol=1``; on ao_mha, fxverify's inputs move the output by 0.019 (range
    0.57), where the quantized model itself is 0.41 from the float model (2026-12-05)."""
    from torch._inductor import config
    from torchao.prototype.inductor.fx_passes import register_quantized_concat_linear_cpu_pass

    with config.patch(post_grad_custom_post_pass=None):
        register_quantized_concat_linear_cpu_pass()
        installed = config.post_grad_custom_post_pass
    installed(graph)


# -- a third-party backend (optional: installed only where its wheel is) ------------------------------------------


OPENVINO_OPTIONS = {"aot_autograd": True, "config": {"INFERENCE_PRECISION_HINT": "f32"}}


def openvino(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
    """OpenVINO's torch.compile backend (openvino.torch registers it as "openvino") as
    ``torch.compile(model, backend="openvino", options=OPENVINO_OPTIONS)`` calls it: through AOTAutograd (its own
    path fails in 2.14.1's guard creation), in float32 (it infers in bfloat16 on an AMX CPU unless told)."""
    from openvino.frontend.pytorch.torchdynamo.backend import openvino as openvino_backend

    return openvino_backend(gm, example_inputs, options=OPENVINO_OPTIONS)


# -- torchao's own models (test/quantization/pt2e/test_x86inductor_fusion.py, test/prototype/inductor/
# test_qsdpa_fusion.py), quantized as its tests do -------------------------------------------------------------------


class QConv(nn.Module):
    """test_qconv2d_cpu's M: three convolutions, the third grouped."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 128, kernel_size=3, stride=1)
        self.conv2 = nn.Conv2d(128, 128, kernel_size=3, stride=1)
        self.conv3 = nn.Conv2d(128, 128, kernel_size=3, stride=1, groups=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv3(self.conv2(self.conv(x)))


class QConvAdd(nn.Module):
    """_qconv2d_add_test_helper's M with use_relu=True and torch.add: relu(conv1(x) + conv2(x)), twice."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, kernel_size=3, stride=1)
        self.conv2 = nn.Conv2d(3, 6, kernel_size=3, stride=1)
        self.relu = nn.ReLU()
        self.conv3 = nn.Conv2d(6, 6, kernel_size=3, stride=1, bias=False)
        self.conv4 = nn.Conv2d(6, 6, kernel_size=3, stride=1, bias=False)
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tmp = self.relu(torch.add(self.conv1(x), self.conv2(x)))
        return self.relu2(torch.add(self.conv3(tmp), self.conv4(tmp)))


class QConvUnary(nn.Module):
    """_qconv2d_unary_test_helper's M with ReLU: convolution, relu, convolution, relu."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 128, kernel_size=3, stride=1)
        self.unary_fn = nn.ReLU()
        self.conv2 = nn.Conv2d(128, 128, kernel_size=3, stride=1)
        self.unary_fn2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.unary_fn2(self.conv2(self.unary_fn(self.conv(x))))


class QLinear(nn.Module):
    """_qlinear_test_helper's M (bias, 2-D input): linear, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.linear2 = nn.Linear(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.linear(x))


class QLinearUnary(nn.Module):
    """_qlinear_unary_test_helper's M with ReLU: linear, relu, linear, relu."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.unary_fn = nn.ReLU()
        self.linear2 = nn.Linear(4, 4)
        self.unary_fn2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.unary_fn2(self.linear2(self.unary_fn(self.linear(x))))


class MHA(nn.Module):
    """test/prototype/inductor/test_qsdpa_fusion.py's MHAModule without a mask (has_mask=False: its forward ignores
    it): q, k and v projections of one input, matmul attention scaled by 1/sqrt(input_dim), a dense projection."""

    def __init__(self, input_dim: int = 256, heads: int = 4, head_size: int = 64) -> None:
        super().__init__()
        self.heads, self.head_size, self.scale = heads, head_size, input_dim ** 0.5
        self.q_proj = nn.Linear(input_dim, input_dim, bias=False)
        self.k_proj = nn.Linear(input_dim, input_dim, bias=False)
        self.v_proj = nn.Linear(input_dim, input_dim, bias=False)
        self.dense = nn.Linear(heads * head_size, heads * head_size)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.size()[:-1] + (self.heads, self.head_size)).permute([0, 2, 1, 3])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (self._split(proj(x)) for proj in (self.q_proj, self.k_proj, self.v_proj))
        attention = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / self.scale, dim=-1)
        context = torch.matmul(attention, v).permute(0, 2, 1, 3).contiguous()
        return self.dense(context.reshape(context.size()[:-2] + (self.heads * self.head_size,)))


AO_MODELS: dict[str, tuple[type[nn.Module], tuple[int, ...]]] = {
    "ao_qconv": (QConv, (1, 3, 8, 8)), "ao_qconv_relu": (QConvUnary, (1, 3, 8, 8)),
    "ao_qconv_add": (QConvAdd, (1, 3, 8, 8)), "ao_qlinear": (QLinear, (2, 4)),
    "ao_qlinear_relu": (QLinearUnary, (2, 4)), "ao_mha": (MHA, (1, 100, 256))}
MATMUL_QUANTIZED = ("ao_mha",)  # its test quantizes torch.matmul too, with the global config


def ao_model(name: str) -> fx.GraphModule:
    """A user-model factory: ``AO_MODELS[name]`` quantized by torchao's X86InductorQuantizer as its tests do
    (export, prepare_pt2e, one calibration call, convert_pt2e), in a plain GraphModule (``export(...).module()``
    refuses ``.eval()``, which fxverify's captures call).

    torchao's default config quantizes activations to the full uint8 range: on a CPU without VNNI or AMX oneDNN's
    int8 GEMM overflows its 16-bit pair sums, and the frozen program computes otherwise than its q/dq program
    (docs/bugs-found.md row 35); numerics then says so, naming the CPU (:mod:`fxverify.analysis.cpu_kernels`).

    >>> [n.target for n in ao_model("ao_qlinear_relu").graph.nodes].count(torch.ops.aten.linear.default)
    2
    """
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
    from torchao.quantization.pt2e import move_exported_model_to_eval
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    cls, shape = AO_MODELS[name]
    example = (torch.randn(shape),)
    quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
    if name in MATMUL_QUANTIZED:
        quantizer.set_function_type_qconfig(torch.matmul, quantizer.get_global_quantization_config())
    with torch.no_grad():
        exported = torch.export.export(cls().eval(), example, strict=True).module()
        prepared = prepare_pt2e(exported, quantizer)
        prepared(*example)
        move_exported_model_to_eval(prepared)
        converted = convert_pt2e(prepared)
    return fx.GraphModule(converted, converted.graph).eval()


def ao_entries() -> list[fxverify.CorpusEntry]:
    """torchao's models as user corpus entries (tag ``torchao``), their inputs in the range :func:`ao_model`
    calibrated them on (``torch.randn``, about -4 to 4), a quantized model's domain."""
    return [fxverify.CorpusEntry(name=name, source="user", factory="benchmarks.real_compile_passes:ao_model",
                                 kwargs={"name": name}, inputs=(fxverify.InputSpec(shape, low=-3.0, high=3.0),),
                                 batch_sizes=(shape[0],),
                                 tags=("torchao",))
            for name, (_, shape) in AO_MODELS.items()]


# the programs Inductor's post-grad lowering patterns are written for (their docstrings' examples), from
# tests/test_lowering_replay.py: one lowering traces into ATen ops, the other builds Inductor IR (its items skip)
LOWERING_MODELS: dict[str, tuple[str, tuple[tuple[int, ...], ...]]] = {
    "inductor_split_cat": ("SplitCat", ((2, 8),)), "inductor_cat_slice_cat": ("CatSliceCat", ((2, 8), (2, 8)))}


def user_entries() -> list[fxverify.CorpusEntry]:
    """The libraries' own models the benchmark adds: torchao's, and the programs of Inductor's lowering patterns
    (tag ``inductor``)."""
    return [*ao_entries(), *(fxverify.CorpusEntry(
        name=name, source="user", factory=f"tests.test_lowering_replay:{factory}",
        inputs=tuple(fxverify.InputSpec(shape) for shape in shapes), tags=("inductor",))
        for name, (factory, shapes) in LOWERING_MODELS.items())]


CONFTEST = '''from benchmarks.real_compile_passes import user_entries


def pytest_fxverify_models(config):
    return user_entries()
'''

# -- the passes ----------------------------------------------------------------------------------------------------

POST_GRAD = ("inductor",)
FREEZING = ("inductor_freezing",)
FREEZING_POST = ("inductor_freezing_post",)
JOINT = ("inductor_joint",)
PRE_GRAD = ("inductor_pre_grad",)


@dataclasses.dataclass(frozen=True)
class RealPass:
    """One pass of the benchmark: ``spec`` as fxverify is given it, the library that wrote it, how it runs
    (``graph``: ``--fxverify`` under ``captures``; ``patterns``: ``--fxverify-patterns``; ``backend``:
    ``--fxverify-backend``), and the module it needs (None: torch alone). Every pass that takes a corpus runs on
    the libraries' own models beside it (:func:`user_entries`; torchao's where it is installed)."""

    name: str
    spec: str
    library: str
    kind: str = "graph"
    captures: tuple[str, ...] = ()
    needs: str | None = None

    def available(self) -> bool:
        return self.needs is None or importlib.util.find_spec(self.needs) is not None

    def args(self, corpus: str) -> list[str]:
        with_ao = importlib.util.find_spec("torchao") is not None
        selection = ",".join((corpus, *(AO_MODELS if with_ao else ()), *LOWERING_MODELS))
        if self.kind == "patterns":
            return ["--fxverify-patterns", self.spec]
        if self.kind == "backend":
            return ["--fxverify-backend", self.spec, f"--fxverify-corpus={selection}"]
        return ["--fxverify", self.spec, f"--fxverify-corpus={selection}", f"--fxverify-capture={','.join(self.captures)}"]


_HERE = "benchmarks.real_compile_passes"
_POST_GRAD = "torch._inductor.fx_passes.post_grad"

PASSES = (
    RealPass("remove_noop_ops", f"{_POST_GRAD}:remove_noop_ops", "inductor", captures=POST_GRAD),
    RealPass("remove_assert_ops", f"{_POST_GRAD}:remove_assert_ops", "inductor", captures=POST_GRAD),
    RealPass("post_grad_patterns", "tests.inductor_passes:inductor_post_grad_patterns", "inductor", captures=POST_GRAD),
    RealPass("reinplace", f"{_HERE}:inductor_reinplace", "inductor", captures=POST_GRAD),
    RealPass("decompose_mm", f"{_HERE}:inductor_decompose_mm", "inductor", captures=POST_GRAD),
    RealPass("post_grad_batch_fusion", f"{_HERE}:inductor_post_grad_batch_fusion", "inductor", captures=POST_GRAD),
    RealPass("joint_patterns", "tests.inductor_passes:inductor_joint_patterns", "inductor", captures=JOINT),
    RealPass("constant_fold_uniform_value", f"{_HERE}:inductor_constant_fold_uniform_value", "inductor",
             captures=JOINT),
    RealPass("attention_patterns", f"{_HERE}:INDUCTOR_ATTENTION_PATTERNS", "inductor", kind="patterns"),
    RealPass("split_cat", f"{_HERE}:inductor_split_cat", "inductor", captures=PRE_GRAD),
    RealPass("pre_grad_batch_fusion", f"{_HERE}:inductor_pre_grad_batch_fusion", "inductor", captures=PRE_GRAD),
    RealPass("efficient_conv_bn_eval", "tests.pre_grad_passes:inductor_efficient_conv_bn_eval", "inductor",
             captures=PRE_GRAD),
    RealPass("quant_lift_up", f"{_HERE}:torchao_quant_lift_up", "torchao", captures=PRE_GRAD, needs="torchao"),
    RealPass("freezing_patterns", f"{_HERE}:inductor_freezing_patterns", "inductor", captures=FREEZING),
    RealPass("freezing_concat_linear", f"{_HERE}:inductor_freezing_concat_linear", "inductor", captures=FREEZING),
    RealPass("x86_freezing", f"{_HERE}:torchao_x86_freezing", "torchao", captures=FREEZING, needs="torchao"),
    RealPass("quantized_concat_linear", f"{_HERE}:torchao_quantized_concat_linear", "torchao", captures=FREEZING_POST,
             needs="torchao"),
    RealPass("aot_eager", "torch._dynamo.backends.debugging:aot_eager", "torch", kind="backend"),
    RealPass("openvino", f"{_HERE}:openvino", "openvino", kind="backend", needs="openvino"),
)

# -- running them ----------------------------------------------------------------------------------------------------


def _records(tmp: Path, report: Path, junit: Path) -> list[dict[str, Any]]:
    """The run's items as ``{outcome, check, model, finding}``: fxverify's JSON report's records, and for the
    compile items (pattern fuzzing, backends), which that report does not hold, the JUnit file's test cases."""
    records = json.loads(report.read_text())["records"] if report.exists() else []
    if records or not junit.exists():
        return records
    from benchmarks.compile_detection import compile_item

    for case in ET.parse(junit).getroot().iter("testcase"):
        nodeid = f"{case.get('classname', '')}::{case.get('name', '')}"
        named = compile_item(nodeid) or ("?", case.get("name", "?"))
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        outcome = ("failed" if case.find("failure") is not None else "error" if case.find("error") is not None
                   else "skipped" if case.find("skipped") is not None else "passed")
        message = "" if bad is None else bad.get("message", "")
        records.append({"outcome": outcome, "check": named[0], "model": named[1], "message": message,
                        "finding": _compile_finding(message)})
    return records


def _compile_finding(message: str) -> str:
    """What a compile item's message says is wrong, on one line: its ``finding:`` line, else the lines after its
    first (a pattern's variant and how it was judged), without the subject the first line names."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    found = next((line.removeprefix("finding:").strip() for line in lines if line.startswith("finding:")), None)
    return found or " ".join(lines[1:3]) or (lines[0] if lines else "?")


def run(real: RealPass, corpus: str, workers: int) -> dict[str, Any]:
    """Verify ``real`` over ``corpus`` in a scratch directory holding the user-model conftest; its items and the
    run time."""
    with tempfile.TemporaryDirectory(prefix="fxverify-real-compile-") as tmp:
        report, junit = Path(tmp) / "report.json", Path(tmp) / "junit.xml"
        (Path(tmp) / "conftest.py").write_text(CONFTEST)
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *real.args(corpus),
                   f"--fxverify-json={report}", f"--junitxml={junit}"]
        command += ["-n", str(workers)] if workers > 1 else []
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        start = time.time()
        ran = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True)
        seconds = time.time() - start
        records = _records(Path(tmp), report, junit)
    if not records:  # pytest did not get to run the items: say why instead of printing empty counts
        raise SystemExit(f"{real.name}: pytest exited {ran.returncode} without results:\n"
                         f"{ran.stdout[-2000:]}{ran.stderr[-2000:]}")
    return {"records": records, "seconds": seconds}


def describe(real: RealPass) -> str:
    """The pass's library, option and captures, and its declared contract."""
    where = ",".join(real.captures) or f"--fxverify-{real.kind}"
    module, _, name = real.spec.partition(":")
    obj = getattr(importlib.import_module(module), name) if real.kind == "graph" else None
    contract = fxverify.contract_of(obj).describe() if obj is not None else ""
    return f"{real.library}, {where}" + (f", {contract}" if contract else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="smoke,edge", help="corpus selection (profiles, names, globs)")
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist workers (-n); 1 runs in-process")
    parser.add_argument("--only", default="", help="comma-separated pass names, run in that order")
    args = parser.parse_args()
    wanted = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(wanted) - {p.name for p in PASSES})
    if unknown:
        parser.error(f"unknown passes {unknown}; known: {', '.join(p.name for p in PASSES)}")
    print(f"corpus {args.corpus}, -n {args.workers}, torch {torch.__version__}", flush=True)
    by_name = {p.name: p for p in PASSES}
    for real in [by_name[name] for name in wanted] if wanted else PASSES:  # in the order --only names them
        if not real.available():
            print(f"\n== {real.name}: skipped, {real.needs} is not installed", flush=True)
            continue
        outcome = run(real, args.corpus, args.workers)
        counts = collections.Counter(r["outcome"] for r in outcome["records"])
        print(f"\n== {real.name} [{describe(real)}]: {', '.join(f'{n} {o}' for o, n in sorted(counts.items()))} "
              f"in {outcome['seconds']:.0f} s", flush=True)
        print_groups(outcome["records"])


if __name__ == "__main__":
    main()
