"""What a transform promises: the modes it supports, whether it may change
parameters, the dtypes and devices its result is meant for, whether its result
can be saved, and the tolerances its numerics are judged with.

A transform without a declared contract gets the strictest one
(:data:`STRICT`): it must keep every parameter, match the original model in
both eval and train mode within the default tolerances of the dtype, and give
a result that moves to any dtype and device and can be saved.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from fxverify.core.captures import capture_names
from fxverify.errors import FxVerifyError

Mode = Literal["eval", "train"]  # a module mode, as contracts and checks name it
MODES: tuple[Mode, ...] = ("eval", "train")
FORMS = ("module", "program", "lifted", "graph", "quantizer")  # what a transform takes (see Contract.form)
PROGRAM_FORMS = ("program", "lifted")  # the forms that take an ExportedProgram (export captures only)
QUANTIZER_CAPTURES = ("pt2e",)  # where a PT2E Quantizer is judged as the transform (see Contract.form)
DTYPES = ("float32", "float64", "bfloat16")  # the floating dtypes the checks run a result in (a model's, float64)
DEVICES = ("cpu", "cuda", "meta")  # the device types the checks run a result on
GRAPHS = ("inference", "forward", "backward", "joint")  # the graphs Inductor hands a pass (see Contract.fires_in)
# the families of spellings a registering function may promise its patterns fire on (see Contract.rewrites_spellings)
SPELLING_FAMILIES = ("sizes", "operand_orders", "late_inputs", "declared")
_ATTRIBUTE = "__fxverify_contract__"

F = TypeVar("F", bound=Callable[..., Any])


@dataclasses.dataclass(frozen=True)
class Contract:
    """The promises a transform makes, used to judge its results.

    ``modes``: the module modes the transform supports ("eval", "train").
    ``changes_parameters``: whether the transform may replace, remove or
    rewrite parameters (a conv/BN fusion does).
    ``dtypes``: the floating dtypes its result is meant to run in (None: any; a
    float32-only result, such as mkldnn layouts, declares ``("float32",)`` and
    its float64 stages skip).
    ``devices``: the device types its result is meant for, "cpu" among them
    (None: any; a backend-specific result declares ``("cpu",)`` and its meta and
    CUDA stages skip).
    ``serializable``: whether its result can be saved (False: a run-time
    optimisation whose result ``torch.save`` cannot write; the pickle and
    to_folder round trips skip).
    ``rtol`` / ``atol``: tolerances that loosen the dtype defaults.
    ``range_tol``: an absolute tolerance relative to each output's scale:
    differences up to ``range_tol * max(max - min, max(|x|))`` of the expected
    output ``x`` are accepted (a quantizing pass: "within 1e-3 of the output range").
    ``captures``: the graphs the transform is written for (None: any; an ATen pass
    declares ``("export", "export_core")``): under another capture its items skip,
    saying so, whatever the transform would do there. On a registering function, the Inductor captures it names
    are the hooks its patterns are for (``("inductor_post",)``: ``post_grad_custom_post_pass``): pattern fuzzing
    traces each variant as that hook receives graphs and fails a pattern that cannot fire there.
    ``keeps_opset``: whether its result stays in the capture's operator set (False: it
    leaves it by design, as ``prepare_pt2e`` inserts observer modules for a later step to
    convert; the ``opset`` and ``reexport`` checks skip).
    ``form``: what the transform takes, where the capture makes an ``ExportedProgram``
    (None: read from the annotation of its first parameter, ``module`` unless it is
    ``ExportedProgram``): ``module``, a ``GraphModule`` (``ep.module()`` under export, as
    ``prepare_pt2e`` takes it); ``program``, the ``ExportedProgram`` itself (it returns one,
    or None when it changed it in place); ``lifted``, the program's own ``graph_module``
    (parameters as placeholders), called through ``ep._transform_do_not_use``. A
    ``program`` or ``lifted`` transform runs under the export captures only. ``graph``: the
    ``torch.fx.Graph`` of the capture, as Inductor's hooks call a pass (a ``CustomGraphPass``, a
    ``PatternMatcherPass``, a function registering replacements into one, a function whose first
    parameter is annotated ``torch.fx.Graph``: read from the object, see
    :mod:`fxverify.core.graph_passes`); the graph is changed in place, then the module recompiled.
    ``quantizer``: a PT2E ``Quantizer`` (a subclass or an instance: read from the object) under test, under the
    ``pt2e`` capture only: it is given the float exported model and fxverify quantizes with it as its users do
    (``prepare_pt2e``, calibration on the entry's inputs, ``convert_pt2e``); its contract, unless declared, is
    :data:`QUANTIZING` (eval only, parameters rewritten, float32 only).
    ``verify_each``: for a pipeline (a decorated ``PassManager``), that every step leaves a graph
    the structural checks (``verify_each`` in the check registry) pass, not only the last one: a step breaking what a
    later step repairs then fails (as LLVM's ``-verify-each``). Off by default: pipelines commonly
    leave meta or node order to a later pass that propagates or sorts again.
    ``rewrites_every_occurrence``: that the transform rewrites every occurrence of each op it rewrites,
    whatever its spelling (the in-place twin, other overloads, the function, method and module
    spellings): the ``variants`` check then fails on a model where it rewrote an op and left a variant
    of it. Off by default: many correct passes rewrite only where a pattern holds, and the run's summary
    only warns about the variants they left. It is no promise about pattern fuzzing (a fusion rewriting
    four ``mul`` nodes of an RMSNorm rightly leaves six others): a registering function declaring it
    without ``rewrites_spellings`` is refused by pattern fuzzing, which asks for ``rewrites_spellings``.
    ``rewrites_spellings``: for pattern fuzzing (``patterns-complete``), the families of spellings every
    pattern a registering function registers fires on (a family missed fails; what is not promised stays
    in the matrix as a warning; None: nothing promised, ``()`` said explicitly): ``sizes`` (the program at
    other sizes, two example sizes made equal), ``operand_orders`` (each operand order of each commutative
    op the search function writes, not those inside one op's decomposition), ``late_inputs`` (an input
    computed just before its first use), ``declared`` (the spellings declared with
    ``fxverify.also_spelled``). The contract's ``dtypes`` are promised too: a pattern not firing on its
    program with every floating input in one of them fails (a pattern traced in float32 misses bfloat16
    graphs, where decompositions insert upcasts).
    ``idempotent``: that running the transform again on its own result changes nothing more (the ``idempotence``
    check, on ExecuTorch Edge programs, where a pass manager with ``steps`` runs its passes until they change
    nothing and ExecuTorch's pass tests check it). False: a pass meant to change its result again each run (one
    adding a level of partitioning, say).
    ``fires_in``: the graphs Inductor hands the pass where it may change anything (``inference``,
    ``forward``, ``backward``, ``joint``: the training joint graph; None: any). Under the ``inductor``
    captures a transform that changes another graph fails, naming it (an inference-only fusion that also
    rewrites the training forward).

    >>> Contract(modes=("eval",), dtypes=("float32",)).describe()
    'declared: modes=eval changes_parameters=no dtypes=float32'
    """

    modes: tuple[Mode, ...] = MODES
    changes_parameters: bool = False
    dtypes: tuple[str, ...] | None = None
    devices: tuple[str, ...] | None = None
    serializable: bool = True
    rtol: float | None = None
    atol: float | None = None
    range_tol: float | None = None
    captures: tuple[str, ...] | None = None
    keeps_opset: bool = True
    form: str | None = None
    verify_each: bool = False
    rewrites_every_occurrence: bool = False
    fires_in: tuple[str, ...] | None = None
    rewrites_spellings: tuple[str, ...] | None = None
    idempotent: bool = True

    def __post_init__(self) -> None:
        if self.form is not None and self.form not in FORMS:
            raise FxVerifyError(f"contract form must be one of {FORMS}, got form={self.form!r}")
        object.__setattr__(self, "modes", _subset("modes", self.modes, MODES))
        for name, allowed in (("dtypes", DTYPES), ("devices", DEVICES), ("captures", capture_names()),
                              ("fires_in", GRAPHS)):
            value = getattr(self, name)
            if value is not None:
                names = tuple(str(v).removeprefix("torch.") for v in _as_tuple(value))
                object.__setattr__(self, name, _subset(name, names, allowed))
        if self.rewrites_spellings is not None:  # () is allowed: nothing promised, said explicitly
            given = _as_tuple(self.rewrites_spellings)
            if given:
                given = _subset("rewrites_spellings", given, SPELLING_FAMILIES)
            object.__setattr__(self, "rewrites_spellings", given)
        if self.devices is not None and "cpu" not in self.devices:
            raise FxVerifyError(f"contract devices must include 'cpu' (fxverify runs its checks on the CPU), "
                                f"got devices={self.devices!r}")
        for name in ("rtol", "atol", "range_tol"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0):
                raise FxVerifyError(
                    f"contract {name} must be a non-negative number, got {name}={value!r}"
                )
        for name in ("changes_parameters", "serializable", "keeps_opset", "verify_each", "rewrites_every_occurrence",
                     "idempotent"):
            if not isinstance(getattr(self, name), bool):
                raise FxVerifyError(f"contract {name} must be True or False, got {name}={getattr(self, name)!r}")

    @property
    def primary_mode(self) -> Mode:
        """The mode most checks run in: eval when supported, else the first mode."""
        return "eval" if "eval" in self.modes else self.modes[0]

    def supports_dtype(self, dtype: str) -> bool:
        """Whether the result is meant to run in ``dtype`` (``"float64"``)."""
        return self.dtypes is None or dtype in self.dtypes

    def supports_capture(self, capture: str) -> bool:
        """Whether the transform is written for graphs of ``capture`` (``"export_core"``)."""
        return self.captures is None or capture in self.captures

    def supports_device(self, device: str) -> bool:
        """Whether the result is meant to run on devices of type ``device`` (``"meta"``, ``"cuda"``)."""
        return self.devices is None or device in self.devices

    @property
    def moves(self) -> bool:
        """Whether the result is meant to move off the CPU (to another device), so that
        what stays behind on a move is a defect."""
        return self.supports_device("cuda") or self.supports_device("meta")

    def describe(self) -> str:
        """One line for summaries, e.g. ``modes=eval changes_parameters=yes``."""
        parts = [f"modes={'+'.join(self.modes)}"]
        parts.append(f"changes_parameters={'yes' if self.changes_parameters else 'no'}")
        for name in ("dtypes", "devices", "captures", "fires_in"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name}={'+'.join(value)}")
        if self.form is not None:
            parts.append(f"form={self.form}")
        if not self.serializable:
            parts.append("serializable=no")
        if not self.keeps_opset:
            parts.append("keeps_opset=no")
        if self.verify_each:
            parts.append("verify_each=yes")
        if self.rewrites_every_occurrence:
            parts.append("rewrites_every_occurrence=yes")
        if not self.idempotent:
            parts.append("idempotent=no")
        if self.rewrites_spellings is not None:
            parts.append(f"rewrites_spellings={'+'.join(self.rewrites_spellings) or 'none'}")
        for name in ("rtol", "atol", "range_tol"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name}={value:g}")
        label = "strict (default)" if self == STRICT else "declared"
        return f"{label}: {' '.join(parts)}"


def _as_tuple(value: Any) -> tuple[Any, ...]:
    return (value,) if isinstance(value, str) or not hasattr(value, "__iter__") else tuple(value)


def _subset(name: str, value: Any, allowed: tuple[str, ...]) -> tuple[str, ...]:
    chosen = _as_tuple(value)
    if not chosen or any(v not in allowed for v in chosen):
        raise FxVerifyError(f"contract {name} must be a non-empty subset of {allowed}, got {name}={value!r}")
    return tuple(dict.fromkeys(chosen))


STRICT = Contract()
# a quantizer's, unless it declares one: PT2E is for inference, weights become integer, q/dq ops take float32 only
QUANTIZING = Contract(modes=("eval",), changes_parameters=True, dtypes=("float32",))


def contract(
    *,
    modes: tuple[Mode, ...] = MODES,
    changes_parameters: bool = False,
    dtypes: tuple[Any, ...] | None = None,
    devices: tuple[str, ...] | None = None,
    serializable: bool = True,
    rtol: float | None = None,
    atol: float | None = None,
    range_tol: float | None = None,
    captures: tuple[str, ...] | None = None,
    keeps_opset: bool = True,
    form: str | None = None,
    verify_each: bool = False,
    rewrites_every_occurrence: bool = False,
    fires_in: tuple[str, ...] | None = None,
    rewrites_spellings: tuple[str, ...] | None = None,
    idempotent: bool = True,
) -> Callable[[F], F]:
    """Declare a transform's contract (see :class:`Contract` for each promise).

    The decorated callable is wrapped, never modified, so it is safe on
    functions you do not own::

        @fxverify.contract(modes=("eval",), changes_parameters=True)
        def fuse_conv_bn(gm):
            ...

        inference_only = fxverify.contract(modes=("eval",))(remove_dropout)
        mkldnn = fxverify.contract(modes=("eval",), changes_parameters=True, dtypes=("float32",),
                                   devices=("cpu",), serializable=False)(optimize_for_inference)

        @fxverify.contract(modes=("eval",), captures=("export", "export_core"))  # an ATen-level pass
        def relu_to_clamp_min(gm):
            ...

        @fxverify.contract(modes=("eval",), form="program")  # takes and returns an ExportedProgram
        def fold_constants(ep):
            ...

        lowering = fxverify.contract(verify_each=True)(PassManager([fold, relu_to_clamp_min]))  # every step checked

        @fxverify.contract(rewrites_every_occurrence=True)  # relu, relu_, every spelling: none may be left
        def relu_to_clamp_min(gm):
            ...

        @fxverify.contract(fires_in=("inference",))  # an inference-only fusion: the training graphs untouched
        def fuse_attention(graph: torch.fx.Graph):
            ...

        @fxverify.contract(idempotent=False)  # each run nests the partitions once more
        def partition(gm):
            ...

        @fxverify.contract(rewrites_spellings=("operand_orders",), dtypes=("float32", "bfloat16"))
        def register_silu_and_mul(pass_dict):  # pattern fuzzing: both orders of the gate product, in both dtypes
            ...
    """
    declared = Contract(modes=modes, changes_parameters=changes_parameters, dtypes=dtypes, devices=devices,
                        serializable=serializable, rtol=rtol, atol=atol, range_tol=range_tol, captures=captures,
                        keeps_opset=keeps_opset, form=form, verify_each=verify_each,
                        rewrites_every_occurrence=rewrites_every_occurrence, fires_in=fires_in,
                        rewrites_spellings=rewrites_spellings, idempotent=idempotent)

    def decorate(fn: F) -> F:
        if not callable(fn):
            raise FxVerifyError(f"@fxverify.contract decorates a callable, got {fn!r}")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        setattr(wrapper, _ATTRIBUTE, declared)
        return wrapper  # type: ignore[return-value]

    return decorate


def contract_of(fn: Callable[..., Any]) -> Contract:
    """The contract declared on ``fn``, or :data:`STRICT` when none was.

    >>> contract_of(lambda gm: gm) == STRICT
    True
    """
    found = getattr(fn, _ATTRIBUTE, None)
    return found if isinstance(found, Contract) else STRICT
