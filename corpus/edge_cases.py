"""Small hand-written modules that exercise what breaks FX passes.

Each is cheap to build and run (a few milliseconds), so the project's own
tests and quick local runs use them; the catalogue (``edge.toml``) lists them
as ``edge`` entries. The last few cannot be traced or run once traced; their
entries carry ``xfail`` with the reason.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn


class ConvBnHead(nn.Module):
    """conv -> BN -> relu twice, dropout, flatten, linear: a conv/BN fusion target
    with a classifier head, in 2 ms."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.adaptive_avg_pool2d(x, 1)
        return self.fc(self.drop(torch.flatten(x, 1)))


# -- static structure -------------------------------------------------------------


class StaticConfigFlow(nn.Module):
    """Python control flow on hyper-parameters, resolved at trace time: a loop over a
    config list of widths, a residual only at configured depths, an activation picked
    from an ``nn.ModuleDict`` by a string, an ``if self.use_norm:`` branch and a
    built-in ``sum()`` over a list of Proxies (``0 + proxy``). The graph holds only
    the branch taken; a pass that re-derives structure from the module's attributes,
    or expects one node per submodule, sees a different model than the graph."""

    def __init__(self, widths: tuple[int, ...] = (16, 12, 12), residual_at: tuple[int, ...] = (2,),
                 use_norm: bool = True, activation: str = "gelu") -> None:
        super().__init__()
        self.residual_at = residual_at
        self.use_norm = use_norm
        self.activation = activation
        ins = (16,) + tuple(widths[:-1])
        self.blocks = nn.ModuleList(nn.Linear(a, b) for a, b in zip(ins, widths))
        self.acts = nn.ModuleDict({"gelu": nn.GELU(), "relu": nn.ReLU()})
        self.norm = nn.LayerNorm(widths[-1]) if use_norm else nn.Identity()
        self.unused = nn.Linear(4, 4)  # configured away: never called

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        taps = []
        for i, block in enumerate(self.blocks):
            y = self.acts[self.activation](block(x))
            x = x + y if i in self.residual_at else y
            taps.append(x)
        if self.use_norm:
            x = self.norm(x)
        return x + sum(t.mean(dim=-1, keepdim=True) for t in taps)


class ConcreteFlag(nn.Module):
    """Optional arguments specialised with ``concrete_args``: ``residual: bool`` and
    ``pool: str`` are fixed at trace time, so the graph has no branch on them, only
    torch.fx's guard (``residual_1 == True`` then ``torch._assert``) on placeholders
    that keep their defaults. A pass must keep those placeholders and guards; the
    specialised value must equal the default, since the traced module is called
    with the tensors alone. (``mask=None`` specialisation is covered by
    ``hiera_tiny_224`` in the default zoo; see ``fxverify.capture.symbolic.forget_unpatchable_wraps``
    for the torch bug that retracing such a GraphModule triggers.)"""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.proj = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor, residual: bool = True, pool: str = "mean") -> torch.Tensor:
        y = F.relu(self.conv(x))
        if residual:
            y = y + self.proj(x)
        if pool == "mean":
            return y.mean(dim=(2, 3))
        return y.amax(dim=(2, 3))


def pad_to_multiple(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """Right-pad the last dimension to a multiple: Python control flow on a shape value,
    which symbolic tracing cannot follow, hence ``torch.fx.wrap`` below."""
    pad = -x.shape[-1] % multiple
    if pad:
        x = F.pad(x, (0, pad))
    return x


torch.fx.wrap("pad_to_multiple")


class WrappedFunction(nn.Module):
    """A ``torch.fx.wrap``-ed module-level function (``pad_to_multiple``, which branches
    on a shape value) stays one opaque ``call_function`` node, decided anew at every
    call: the output width depends on the input width. A pass that retraces the
    GraphModule must keep it wrapped (the generated code re-registers the wrap), and
    one that specialises shapes at trace time would pad the wrong amount."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, (1, 3), padding=(0, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv1(x))
        return self.conv2(pad_to_multiple(h, 4))


class ChannelGate(nn.Module):
    """A custom op kept opaque by :class:`EdgeLeafTracer`: x * sigmoid(logit) per channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.logit = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.logit).view(1, -1, 1, 1)


class EdgeLeafTracer(fx.Tracer):
    """Keeps :class:`ChannelGate` a leaf: one ``call_module`` node."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, ChannelGate) or super().is_leaf_module(m, module_qualified_name)


class CustomLeaf(nn.Module):
    """A custom leaf module: traced with :class:`EdgeLeafTracer`, the ``ChannelGate``
    stays a ``call_module`` node whose target is not a ``torch.nn`` class, holding its
    own parameter. Passes that only know torch.nn modules must leave it alone, and
    passes that retrace with the default tracer (torch's ``fuse`` and
    ``remove_dropout`` do) inline it, which must not change the numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.gate = ChannelGate(4)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(F.relu(self.gate(self.bn1(self.conv1(x)))))


class NestedSequential(nn.Module):
    """``nn.Sequential`` flattening: Sequentials nested three deep, an empty one and an
    ``nn.Identity`` trace to ``call_module`` targets such as ``features.2.0.1``; a
    conv/BN pair inside a nested Sequential is a fusion target whose modules must be
    replaced by dotted path, and the empty Sequential leaves no node at all."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)),
            nn.Sequential(nn.ReLU(), nn.Sequential()),
            nn.Sequential(
                nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)),
                nn.Identity(),
                nn.ReLU(),
            ),
        )
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class SharedSubmodule(nn.Module):
    """One submodule called twice: two ``call_module`` nodes with the same target and
    the same parameters. A pass that rewrites the module behind one call (a fusion,
    a quantisation observer) changes the other call too; one that numbers modules by
    node, or assumes a target has one user, miscounts."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.act = nn.GELU()
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.proj(x))
        h = self.act(self.proj(h)) + x
        return self.out(h)


class TiedWeights(nn.Module):
    """Tied weights: two ``nn.Linear`` layers share one weight ``Parameter``, which the
    root forward also reads directly (a ``get_attr`` of ``a.weight``). ``parameters()``
    lists it once; a pass that copies or replaces one layer's weight silently unties
    them, and gradients of the shared weight sum over all three uses."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        return self.b(h) + F.linear(x, self.a.weight) * 0.5


class FunctionalDropout(nn.Module):
    """Dropout three ways: ``F.dropout(x, p, training=self.training)`` (the mode is
    read at trace time and baked into the call's keyword), positional
    ``F.dropout(x, 0.1, self.training)``, and an ``nn.Dropout`` module. A dropout
    remover that only looks for ``nn.Dropout`` modules leaves the functional ones;
    one that removes them in a train-mode graph changes the numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.p = 0.25
        self.fc1 = nn.Linear(16, 16)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.dropout(self.fc1(x), p=self.p, training=self.training)
        h = self.drop(F.relu(h))
        h = F.dropout(h, 0.1, self.training)
        return self.fc2(h)


# -- in-place ops, outputs, calls ----------------------------------------------------------------------


class InplaceOps(nn.Module):
    """In-place ops: a write through a view, ``y[:, 0].copy_(...)`` (the traceable
    spelling of slice assignment: a ``getitem`` view and a ``copy_`` node with no
    users, while later readers of ``y`` do not depend on it in the graph),
    ``relu_()`` whose result is unused, ``add_`` whose result is used,
    ``nn.ReLU(inplace=True)`` after a conv/BN fusion target and
    ``F.relu(inplace=True)``. Dead-code elimination that drops unused nodes, or a
    reordering that moves a read past a write, changes the numbers; all mutations
    hit intermediate tensors, so autograd is fine."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(4)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(x)
        y[:, 0].copy_(y[:, 1] * 0.5)
        y.relu_()
        z = (x[:, :1] * 0.5).add_(1.0)
        y = self.act(self.bn2(self.conv2(y)))
        return F.relu(y - z, inplace=True)


class NestedOutputs(nn.Module):
    """Several outputs in a nested structure: a tuple holding a dict (with a list and a
    nested dict), a 0-dim tensor, chunk views and the input itself passed through
    unchanged (an output that is a placeholder). A pass must keep the output
    structure (pytree spec), the key order, and the pass-through."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 6)

    def forward(self, x: torch.Tensor) -> tuple[dict[str, object], torch.Tensor]:
        h = self.fc(x)
        a, b = h.chunk(2, dim=-1)
        out = {
            "logits": h,
            "parts": [a, b.relu()],
            "stats": {"mean": h.mean(), "max": (h.amax(dim=-1), h.argmax(dim=-1))},
        }
        return out, x


class KwargsHeavy(nn.Module):
    """Keyword-heavy calls: ``sum(dim=..., keepdim=...)``, ``clamp(min=...)``,
    ``flatten(start_dim=1)``, ``cat(tensors=..., dim=...)``, ``interpolate`` with
    ``scale_factor``/``mode``/``align_corners``, ``softmax(dim=)``. Argument
    normalisation must map each keyword to the right schema slot, and a pattern
    matcher that reads ``node.args[1]`` misses the keyword form."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, stride=2)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.clamp(self.conv(x), min=-1.0)
        h = F.interpolate(h, scale_factor=2.0, mode="bilinear", align_corners=False)
        s = h.sum(dim=(2, 3), keepdim=True)
        h = torch.cat(tensors=(h.mean(dim=[2, 3], keepdim=True), s.clamp(min=0.0, max=50.0)), dim=1)
        h = torch.flatten(h, start_dim=1)
        return F.softmax(self.fc(h), dim=-1)


class SameOpThreeWays(nn.Module):
    """The same op as ``call_module``, ``call_function`` and ``call_method`` nodes:
    ``nn.ReLU()``, ``F.relu``/``torch.relu`` and ``x.relu()``; likewise flatten and
    softmax. A pass that matches only one spelling misses the others; one that
    rewrites them must keep each node's kind of target consistent."""

    def __init__(self) -> None:
        super().__init__()
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.relu(x) + F.relu(x - 0.5) + torch.relu(x * 2.0) + (x + 0.5).relu()
        f = self.flatten(a) + torch.flatten(a, 1) + a.flatten(1)
        return self.softmax(f) + F.softmax(f, dim=-1) + f.softmax(-1)


class TupleGetitem(nn.Module):
    """``getitem`` on op results: tuple unpacking of ``max(dim=)`` (a named tuple),
    attribute access ``topk(...).values``/``.indices`` (a ``getattr`` node),
    ``torch.split`` with sizes and ``chunk``. Integer index outputs are taken on the
    raw input, so they are exact. A pass that treats every node as one tensor, or
    drops ``getitem`` users when rewriting the producer, breaks these."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values, indices = x.max(dim=1)
        top = torch.topk(x, 2, dim=-1)
        h = self.fc(x)
        first, rest = torch.split(h, [3, 5], dim=1)
        left, right = rest.chunk(2, dim=1)
        mixed = first.sum(1) + left.mean(1) * right[:, 0] + values + top.values[:, 1]
        return mixed, indices, top.indices


# -- state and dtypes --------------------------------------------------------------


class BuffersAndConstants(nn.Module):
    """State read through ``get_attr``: a persistent float buffer, a non-persistent one
    (absent from ``state_dict``), an int64 permutation buffer (``index_select``), a bool
    buffer (``torch.where``), and a Python float constant baked into the code. The
    buffers must move with ``.to(device)``; only the float ones change with
    ``.to(float64)``, the integer and bool ones keep their dtypes. (Buffers are real
    tensors while tracing: ``~self.keep`` would be computed then and stored as a plain
    ``_tensor_constant`` attribute that ``.to(device)`` leaves behind, so each buffer
    is used directly in a traced op.)"""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 8))
        self.register_buffer("shift", torch.full((8,), 0.1), persistent=False)
        self.register_buffer("perm", torch.randperm(8))
        self.register_buffer("keep", torch.arange(8) % 3 != 0)
        self.eps = 1e-3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x) * self.scale + self.shift
        h = torch.where(self.keep, h.index_select(1, self.perm), 0.0)
        return h / (h.abs().mean(dim=-1, keepdim=True) + self.eps)


class RunningStatistics(nn.Module):
    """Buffers that change in every forward pass, in eval mode too, as an observer or a calibration
    hook keeps them: a running mean of the features (``lerp_`` on the buffer) and a call counter
    (int64 ``add_``). The output does not read them, so only the buffers show a pass that drops the
    updates (an exported program writes them back with ``copy_``). Each update takes a traced value:
    symbolic tracing runs an update by constants alone (``self.calls += 1``) once, while tracing, and
    leaves it out of the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("running_mean", torch.zeros(8))
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        self.running_mean.lerp_(y.detach().mean(dim=0), 0.1)
        self.calls.add_(x.new_ones((), dtype=torch.int64))
        return torch.relu(y)


class IntegerInputs(nn.Module):
    """An int64 index input first, a float input second: ``nn.Embedding`` lookup,
    ``gather`` and ``index_select`` by the indices, and the indices floor-divided
    (``torch.div(..., rounding_mode="floor")``: a normaliser that drops the keyword
    makes it a true division) and cast with ``.to(x.dtype)``. Inputs must not be
    scaled or cast to float64 when they are integers, nor have gradients; the
    sequence length (trailing size of the first input) varies between configurations."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(8, 4)
        self.fc = nn.Linear(4, 1)

    def forward(self, tokens: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        emb = self.fc(self.embed(tokens)).squeeze(-1)
        g = torch.gather(x, 1, tokens)
        sel = x.index_select(1, tokens[0])
        return emb + g * sel + torch.div(tokens, 3, rounding_mode="floor").to(x.dtype) * 0.1


class BoolMaskInputs(nn.Module):
    """A bool mask input: ``masked_fill`` with a large negative before ``softmax``,
    ``torch.where``, logical not (``~``) and a ``sum`` of the mask, returned as an int64
    output. A bool input must not be scaled, cast to float or asked for gradients."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = self.fc(x).masked_fill(mask.unsqueeze(1), -1e4).softmax(dim=-1)
        mixed = torch.where(~mask.unsqueeze(1), x, -x)
        return scores + mixed, mask.sum(dim=-1)


class ShapeFactories(nn.Module):
    """Tensors created from traced shapes: ``b, c, n = x.shape`` (a Proxy unpacked),
    ``torch.arange``/``torch.zeros`` with ``device=x.device, dtype=x.dtype`` (sizes as
    one tuple: varargs sizes holding Proxies do not trace), ``new_ones`` and a Python
    int output computed from a size. Nothing may bake the shape, device or dtype seen
    at trace time; the length varies between configurations."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        b, c, n = x.shape
        pos = torch.arange(n, device=x.device, dtype=x.dtype) / n
        zeros = torch.zeros((b, 1, n), device=x.device, dtype=x.dtype)
        h = torch.cat([x + pos, zeros + x.new_ones((b, 1, n))], dim=1)
        return self.fc(h.transpose(1, 2)), c * n


class ScalarOutput(nn.Module):
    """Returns a single 0-dim tensor (a loss-like mean of squares): no batch dimension,
    no strides to keep, and the gradient seed is a scalar."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).pow(2).mean()


def _define_scaled_softsign() -> None:
    """``fxverify_edge::scaled_softsign(x, scale) = x * scale / (1 + |x|)``, a ``torch.library`` custom op
    with a FakeTensor implementation and a backward; defined once a process."""
    if hasattr(torch.ops.fxverify_edge, "scaled_softsign"):
        return

    def kernel(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return x * scale / (1 + x.abs())

    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, scale = ctx.saved_tensors
        denominator = 1 + x.abs()
        grad_scale = (grad * x / denominator).sum_to_size(scale.shape)
        return grad * scale / denominator**2, grad_scale

    op = torch.library.custom_op("fxverify_edge::scaled_softsign", kernel, mutates_args=())
    op.register_fake(lambda x, scale: torch.empty_like(x))
    op.register_autograd(backward, setup_context=lambda ctx, inputs, output: ctx.save_for_backward(*inputs))


_define_scaled_softsign()


class CustomOp(nn.Module):
    """A ``torch.library`` custom op (a backend's kernel, as ExecuTorch and TensorRT users register them)
    between two Linears, reading a parameter: symbolic tracing records it as a ``call_function`` of
    ``torch.ops.fxverify_edge.scaled_softsign.default``, export keeps it opaque (not core ATen, so
    ``run_decompositions`` leaves it alone), and FakeTensors run through it by its ``register_fake``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 8))
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.ops.fxverify_edge.scaled_softsign(self.fc(x), self.scale))


# -- layers that fusion and rewriting passes target -------------------------------------------------


class LinearBn(nn.Module):
    """``BatchNorm1d`` after ``nn.Linear`` twice (one Linear without bias): the
    linear/BN fusion target, whose fold must use the running statistics and the
    missing bias correctly; in train mode the running statistics update."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 12)
        self.bn1 = nn.BatchNorm1d(12)
        self.fc2 = nn.Linear(12, 6, bias=False)
        self.bn2 = nn.BatchNorm1d(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn2(self.fc2(F.relu(self.bn1(self.fc1(x)))))


class ConvVariants(nn.Module):
    """Convolutions with non-default arguments, each before a BN or a stride: circular
    ``padding_mode`` (padding done outside the conv op), grouped and dilated, depthwise
    with ``padding="same"`` and reflect padding, and a strided conv on odd sizes. A
    fold or rewrite that rebuilds the conv from weight and bias alone loses these."""

    def __init__(self) -> None:
        super().__init__()
        self.circular = nn.Conv2d(4, 8, 3, padding=1, padding_mode="circular")
        self.bn1 = nn.BatchNorm2d(8)
        self.grouped = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=4, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.depthwise = nn.Conv2d(8, 8, 3, padding="same", padding_mode="reflect", groups=8)
        self.strided = nn.Conv2d(8, 4, 2, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.circular(x)))
        h = F.relu(self.bn2(self.grouped(h)))
        return self.strided(self.depthwise(h) + h)


class MultiHeadAttention(nn.Module):
    """Self-attention by hand: q/k/v ``nn.Linear``, a multi-head reshape with sizes
    unpacked from ``x.shape`` and ``-1``, ``transpose``/``permute``, ``@`` and
    ``torch.matmul``, a scale from ``math.sqrt``, a causal bool buffer cut to the
    traced length with ``narrow`` (slicing a buffer, a real tensor while tracing, by
    a Proxy does not trace) and ``masked_fill(-inf)``, ``softmax``. The sequence
    length varies between configurations, so no size may be baked in."""

    def __init__(self, dim: int = 16, heads: int = 2, max_len: int = 16) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.register_buffer("causal", torch.ones(max_len, max_len).tril().bool(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).reshape(b, t, self.heads, -1).permute(0, 2, 3, 1)
        v = self.v(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        attn = (q @ k) * self.scale
        causal = self.causal.narrow(0, 0, t).narrow(1, 0, t)
        attn = attn.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, t, c)
        return self.o(out)


class HeadViewAttention(nn.Module):
    """Multi-head self-attention as most hand-written and older model code writes it: q, k and v ``nn.Linear``,
    heads from ``view(b, t, heads, d).transpose(1, 2)``, ``softmax(q @ k.transpose(-2, -1) / sqrt(d)) @ v``, the
    heads merged with ``transpose(1, 2).reshape``. Inductor's own attention fusion (``_sfdp_pattern_1``, among
    its joint-graph patterns) rewrites it into ``scaled_dot_product_attention``, so a pass at the joint-graph
    hooks meets the graph as that fusion leaves it; the sequence length varies between configurations."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        d = c // self.heads
        q, k, v = (proj(x).view(b, t, self.heads, d).transpose(1, 2) for proj in (self.q, self.k, self.v))
        attn = (q @ k.transpose(-2, -1) / math.sqrt(d)).softmax(dim=-1)
        return self.o((attn @ v).transpose(1, 2).reshape(b, t, c))


# -- structures today's passes target: buffers written in forward, activations and attention by hand --------


class BufferProxyTracer(fx.Tracer):
    """A tracer that records buffers read as ``self.<name>`` as ``get_attr`` nodes (``proxy_buffer_attributes``,
    as Hugging Face's tracer sets it), so that every use of a buffer is a node of the graph. Slice or index
    assignment into such a buffer (``self.cache[:2] += ...``, ``self.k_cache[pos] = k``: how KV caches are
    written) then raises ``TypeError: 'Proxy' object does not support item assignment``. torch.fx's default
    tracer gets such models wrong without raising: it treats the buffer as a plain tensor, stores the slice
    written as a ``_tensor_constant`` and bakes reads of the buffer that take no traced value into
    constants."""

    proxy_buffer_attributes = True


class BufferWrittenThroughView(nn.Module):
    """A buffer written through a view and read again, as a KV cache or a ring buffer is updated: the sum of
    ``self.cache`` is read, then its first two rows are updated in place through a slice
    (``self.cache[:2] += ...``: an in-place ``add_`` of a slice, a write into the buffer's storage that no
    node of the buffer's own records), then ``self.cache`` is read again into the output. The two reads have
    the same target and the same arguments in the training-IR export (``sum(cache, [0])`` twice, the
    ``add_`` and ``copy_`` of the slice between them): a common-subexpression elimination that ignores writes
    through views merges them, and a pass that moves a read past the write, or drops the unused in-place
    nodes, changes the numbers. The written value is detached (a buffer holds no autograd history). Symbolic
    tracing cannot take it (see :class:`BufferProxyTracer`); ``make_fx``'s functionalization refuses a buffer
    written from the input."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("cache", torch.linspace(-1.0, 1.0, 48).reshape(6, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        before = self.cache.sum(dim=0)
        self.cache[:2] += h.detach().mean(dim=0) * 0.5
        after = self.cache.sum(dim=0)
        return h * torch.sigmoid(before) + after


class CounterBuffer(nn.Module):
    """A call counter updated from itself alone, ``self.count.add_(1)``, whose value scales the output (as a
    step count scales a warm-up or a decay): no input flows into the update, so a constant folder that takes
    every computation on buffers alone for a constant folds the counter's new value and freezes it, and a
    dead-code elimination that drops the unused ``add_`` leaves the output at the first call's scale.
    torch.export records the update (an ``aten.add_`` of the buffer, read by the output, and the write-back
    ``copy_``), and so does ``make_fx``. Symbolic tracing with torch.fx's default tracer does not: the update
    takes no traced value, so it runs once, while tracing, on the buffer the trace then holds (the count is 1
    there), and the graph only reads the buffer (``x * count``, where a traced value meets it): the traced
    module computes the first call's output at every call. The entry is for the ATen captures; under
    ``symbolic_trace`` it checks that graph, as traced."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        h = self.fc(x)
        return h + h * self.count * 0.25


class KVCacheAttention(nn.Module):
    """One decoding step of attention over a ring-buffer KV cache: the step's key and value (averaged over the
    batch: one cache shared by the batch, so the batch stays dynamic) are written into the cache rows at
    ``self.pos`` (positions read from a buffer, not baked in), the position advanced in
    place modulo the cache length, then every query attends to the whole updated cache (``q @ k^T / sqrt(d)``,
    softmax, ``@ v``). Three buffers change in forward; a pass that reads the cache before the write, freezes
    the position or drops an in-place update computes the next step's attention over stale rows. The cache
    is written by index assignment (``self.k_cache[self.pos] = k``, an ``index_put_``), which symbolic
    tracing cannot take (see :class:`BufferProxyTracer`); ``make_fx``'s functionalization refuses a buffer
    written from the input."""

    def __init__(self, dim: int = 8, slots: int = 4) -> None:
        super().__init__()
        self.scale = 1.0 / math.sqrt(dim)
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.o = nn.Linear(dim, dim)
        self.register_buffer("k_cache", torch.linspace(-0.5, 0.5, slots * dim).reshape(slots, dim))
        self.register_buffer("v_cache", torch.linspace(0.5, -0.5, slots * dim).reshape(slots, dim))
        self.register_buffer("pos", torch.zeros(1, dtype=torch.int64))
        self.slots = slots

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, v = self.kv(x).detach().mean(dim=0, keepdim=True).chunk(2, dim=-1)
        self.k_cache[self.pos] = k
        self.v_cache[self.pos] = v
        self.pos.add_(1).remainder_(self.slots)
        attn = (self.q(x) @ self.k_cache.transpose(0, 1) * self.scale).softmax(dim=-1)
        return self.o(attn @ self.v_cache)


class HandWrittenActivations(nn.Module):
    """Activations spelled out as pattern-matching passes find them: swish ``x * torch.sigmoid(x)`` (a
    ``replace_pattern`` target for ``silu``), GELU by its tanh formula (``0.5 * x * (1 + tanh(sqrt(2 / pi) *
    (x + 0.044715 * x ** 3)))``, a target for ``gelu(approximate="tanh")``), and softmax as ``exp`` over its
    ``sum`` (after subtracting the row maximum). A rewrite must match all of the pattern and no more, keep
    the value (the tanh GELU is not the exact one) and give its new nodes their metadata."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 8)
        self.fc3 = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        swish = h * torch.sigmoid(h)
        g = self.fc2(swish)
        gelu = 0.5 * g * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * torch.pow(g, 3))))
        s = self.fc3(gelu)
        e = torch.exp(s - s.amax(dim=-1, keepdim=True))
        return e / e.sum(dim=-1, keepdim=True)


class AttentionTwoWays(nn.Module):
    """Attention written out by hand, ``softmax(q @ k^T / sqrt(d)) @ v``, and the same heads through
    ``F.scaled_dot_product_attention`` (an ``aten.scaled_dot_product_attention`` call, decomposed by core
    ATen): the pattern an attention-fusion pass rewrites into the fused op, and the fused op such a pass
    must leave alone. The sequence length varies between configurations."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.o = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        scores = q @ k.transpose(-2, -1) / math.sqrt(c // self.heads)
        by_hand = scores.softmax(dim=-1) @ v
        fused = F.scaled_dot_product_attention(q, k, v)
        out = torch.cat([by_hand, fused], dim=-1).transpose(1, 2).reshape(b, t, 2 * c)
        return self.o(out)


class TinyDecoderBlock(nn.Module):
    """A decoder block as today's language models write it: RMSNorm by hand (``x * rsqrt(mean(x ** 2) + eps)
    * weight``), rotary position embeddings (cos and sin of the positions, computed from ``arange`` of the
    traced length and a non-persistent ``inv_freq`` buffer, the halves rotated with ``cat``), grouped-query
    attention (four query heads sharing two key/value heads through ``repeat_interleave``) through causal
    ``F.scaled_dot_product_attention``, and a SwiGLU MLP (``down(silu(gate(x)) * up(x))``), each behind a
    residual. Fusion passes target each piece; the sequence length varies between configurations."""

    def __init__(self, dim: int = 16, heads: int = 4, kv_heads: int = 2, hidden: int = 24) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.eps = 1e-6
        self.norm1 = nn.Parameter(torch.linspace(0.5, 1.5, dim))
        self.norm2 = nn.Parameter(torch.linspace(1.5, 0.5, dim))
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * weight

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        first, second = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-second, first], dim=-1) * sin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.rms_norm(x, self.norm1)
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).view(b, t, 2 * self.kv_heads, self.head_dim).transpose(1, 2).chunk(2, dim=1)
        angles = torch.arange(t, device=x.device, dtype=x.dtype).unsqueeze(-1) * self.inv_freq
        angles = torch.cat([angles, angles], dim=-1)
        cos, sin = angles.cos(), angles.sin()
        q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(attn.transpose(1, 2).reshape(b, t, c))
        h = self.rms_norm(x, self.norm2)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class TiedEmbeddingHead(nn.Module):
    """A language model's tied embedding and head: int64 token input, ``nn.Embedding`` lookup, one
    RMSNorm'd ``nn.Linear`` in between, and a head ``nn.Linear`` whose ``weight`` is the embedding's own
    ``Parameter``. Passes that copy, fold or quantize the head's weight untie it from the embedding (the
    gradients of the shared weight sum over both uses); a pass that sees one parameter per module counts it
    twice."""

    def __init__(self, vocab: int = 12, dim: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.norm = nn.RMSNorm(dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        h = h + F.gelu(self.mix(self.norm(h)))
        return self.head(h)


# -- what quantization and ExecuTorch Edge passes mishandle: shared q/dq ranges, layouts, dim order, state --------


class CatRanges(nn.Module):
    """``torch.cat`` of two branches whose value ranges differ about a hundredfold (a conv's ReLU'd output, and a
    second conv's output times 100, each through a max pool: an op quantizers keep in int8, so each branch ends
    quantized), then a conv over the concatenation. The cat's inputs come with quantization parameters a hundredfold
    apart (XNNPACK's quantizer gives each its own; one that shares them gives the large branch's to both): a
    quantizer or lowering that assumes the inputs of a cat share one quantization, and drops the q/dq around it or
    takes one input's scale for the whole cat, crushes the small branch to zero or clips the large one
    (pytorch#106760)."""

    def __init__(self) -> None:
        super().__init__()
        self.small = nn.Conv2d(3, 4, 3, padding=1)
        self.large = nn.Conv2d(3, 4, 3, padding=1)
        self.mix = nn.Conv2d(8, 6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        small = F.max_pool2d(F.relu(self.small(x)), 3, stride=1, padding=1)
        large = F.max_pool2d(self.large(x) * 100.0, 3, stride=1, padding=1)
        return self.mix(torch.cat([small, large], dim=1))


class ChannelsLastClone(nn.Module):
    """A conv net on a channels-last input whose forward copies tensors without naming a layout: ``x.clone()`` of
    the input (``aten.clone`` with no ``memory_format``: ``preserve_format``, so the copy keeps the input's
    channels-last strides) and, after a conv, a copy that keeps the dtype, ``h.to(h.dtype, copy=True)``
    (``aten._to_copy`` once decomposed, also ``preserve_format``). Each copy is an output too. A pass that makes
    ``clone`` / ``_to_copy`` contiguous instead of preserving the format (as ExecuTorch's dim-order passes did,
    executorch#16032) returns tensors in other strides than eager's, and the convs after them run in another
    layout."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        kept = x.clone()
        h = F.relu(self.conv1(kept))
        copied = h.to(h.dtype, copy=True)
        return self.conv2(copied), copied, kept


class SizeOneDims(nn.Module):
    """A keyword-spotting front end on an input with a size-1 dimension past the batch (``[2, 1, 49, 10]``: one
    channel of 49 frames of 10 coefficients; at batch 1 two of its dimensions are 1): a conv with
    ``in_channels=1``, its output permuted and flattened to frames, the input itself permuted to
    ``[b, 49, 10, 1]`` (a permute that moves only a size-1 dimension: the same strides are contiguous and
    channels-last at once) and flattened, a Linear over both, and an output with a size-1 dimension. A pass that
    derives a dim order from strides, where size-1 dimensions make it ambiguous, picks another order than the
    graph's (executorch#22520, executorch#19153); the number of frames varies between configurations."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 10 + 10, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv(x)).permute(0, 2, 1, 3).flatten(2)
        frames = x.permute(0, 2, 3, 1).flatten(2)
        out = self.fc(torch.cat([h, frames], dim=-1))
        return out.mean(dim=1, keepdim=True)


class FinalBufferCopy(nn.Module):
    """A buffer overwritten by ``self.total.copy_(...)`` as the last op of forward: the state a streaming model
    carries to its next call, here a running sum of the features' batch means, which the next call subtracts from
    its features (read with a traced value, so that symbolic tracing reads the buffer rather than baking it in). The
    sum changes at every call, even one on the same inputs as the last (a quantizer's calibration call included).
    Nothing in the graph reads the ``copy_``'s result, and it comes after the output's last computation: a dead-code
    elimination, a pass that rebuilds the graph up to the output, or ExecuTorch's lowering of a mutated buffer
    (executorch#7515) can drop it or move it, and the model forgets its state. The value copied is detached (a
    buffer holds no autograd history)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("total", torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        out = torch.tanh(h - self.total)
        self.total.copy_(self.total + h.detach().mean(dim=0))
        return out


# -- expected failures: untraceable, or wrong once traced --------------------------------------------


class DataDependentFlow(nn.Module):
    """Data-dependent control flow, ``if x.sum() > 0:``: the condition is a Proxy, so
    symbolic tracing raises ``TraceError`` (expected failure)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.fc(x)
        return -x


class LenOfProxy(nn.Module):
    """``len()`` on a Proxy: ``len(x)`` needs a concrete size, so symbolic tracing raises
    (``'len' is not supported in symbolic tracing by default``; expected failure)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) / len(x)


class SliceAssignment(nn.Module):
    """Slice assignment ``y[:, 0] = ...`` on a traced value: a Proxy has no
    ``__setitem__``, so symbolic tracing raises ``TypeError`` (expected failure;
    :class:`InplaceOps` writes through a view with ``copy_`` instead)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        y[:, 0] = 0.0
        return y


class OptionalMaskUnspecialised(nn.Module):
    """An optional ``mask=None`` traced without ``concrete_args``: the mask placeholder
    is a Proxy, never ``None``, so ``if mask is not None`` is taken at trace time and
    the traced module always applies the mask; called without one it raises
    (expected failure at run time, not at trace time)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.fc(x)
        if mask is not None:
            h = h.masked_fill(mask, 0.0)
        return h
