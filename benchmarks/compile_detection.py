"""Detection rate of fxverify's compile checks over passes written as their real authors write them.

    python benchmarks/compile_detection.py [--corpus smoke,edge] [--workers 1] [--only NAME,...] [--kinds ...]

Each pass below is a buggy pass beside its correct twin, written the way serving, quantization and compiler
libraries write them (fused kernels as custom ops with fake kernels and no autograd, both operand orders
registered, attention on transposed head views, an `extra_check` guarding a dtype precondition, a backend on
models that update buffers, a `CustomGraphPass` whose state changes what it does to a matmul): the passes live in
`tests/compile_user_patterns.py`, `tests/compile_cache_passes.py`, `tests/compile_backends.py`,
`tests/inductor_passes.py` and `tests/pre_grad_passes.py`. Each runs as one pytest subprocess with the option of
its kind (`--fxverify-patterns`, `--fxverify-graph-cache` with the model it acts on, `--fxverify-backend` over
CORPUS, `--fxverify` under the captures of its hook over CORPUS), as `benchmarks/detection.py` runs the mutation
suite: a bug runs with -x and is caught when an item fails (printed: the first failing check@subject and the
seconds from starting pytest to its report); a correct pass runs whole, and every failed item is a false alarm.
The totals say how many bugs were caught, how many first by the check meant for them, and how many correct
passes were clean.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.detection import ROW, Outcome, print_row, print_totals, run_items  # noqa: E402

KINDS = ("patterns", "graph-cache", "backend", "inductor", "pre-grad")


@dataclasses.dataclass(frozen=True)
class Pass:
    """One pass of the benchmark: ``spec`` verified by the option of ``kind``; ``expected`` is the check meant
    to catch it ("-" for a correct pass)."""

    kind: str
    spec: str
    expected: str = "-"

    @property
    def bug(self) -> bool:
        return self.expected != "-"

    def args(self, corpus: str) -> list[str]:
        if self.kind == "patterns":
            return ["--fxverify-patterns", self.spec]
        if self.kind == "graph-cache":
            return ["--fxverify-graph-cache", self.spec, "--fxverify-graph-cache-model", "tests.compile_cache_passes:mlp"]
        if self.kind == "backend":
            return ["--fxverify-backend", self.spec, f"--fxverify-corpus={corpus}"]
        captures = "inductor_pre_grad" if self.kind == "pre-grad" else "inductor,inductor_post"
        return ["--fxverify", self.spec, f"--fxverify-corpus={corpus}", f"--fxverify-capture={captures}"]


def _patterns(name: str, expected: str = "-") -> Pass:
    return Pass("patterns", f"tests.compile_user_patterns:{name}", expected)


def _backend(name: str, expected: str = "-") -> Pass:
    return Pass("backend", name if ":" in name else f"tests.compile_backends:{name}", expected)


PASSES = (
    # pattern fuzzing: each buggy registration beside its twin
    _patterns("silu_and_mul_one_order", "patterns-complete"), _patterns("silu_and_mul_fusion"),
    _patterns("silu_and_mul_unguarded", "patterns-sound"),
    _patterns("rms_norm_float32_traced", "patterns-complete"), _patterns("rms_norm_fusion"),
    _patterns("linear_gelu_tanh_kernel", "patterns-sound"), _patterns("linear_gelu_fusion"),
    _patterns("attention_key_by_size", "patterns-sound"), _patterns("attention_fusion"),
    _patterns("tokens_silu_mul_view", "patterns-complete"), _patterns("tokens_silu_mul_reshape"),
    # the FX graph cache, on the model the passes act on
    Pass("graph-cache", "tests.compile_cache_passes:stale_matmuls", "graph-cache-stale"),
    Pass("graph-cache", "tests.compile_cache_passes:keyed_matmuls"),
    # backends
    _backend("relu_in_place", "backend-input-unchanged"), _backend("relu_on_copy"),
    _backend("runs_on_copies", "backend-outputs"), _backend("identity"),
    _backend("specialize_sizes_in_place", "backend-input-unchanged"), _backend("specialize_sizes_with_fallback"),
    _backend("lowering_cached_by_shapes", "backend-dtypes"), _backend("lowering_cached_by_shapes_and_dtypes"),
    _backend("reusing_output_buffers", "backend-dynamic-shapes"), _backend("copying_output_buffers"),
    _backend("lower_linear", "backend-gradients"), _backend("inference_linear"),
    _backend("warms_up_on_its_inputs", "backend-outputs"), _backend("warms_up_on_clones"),
    _backend("torch._dynamo.backends.debugging:aot_eager"),
    # graph passes under the captures of their hook: fused kernels as custom ops without autograd
    Pass("inductor", "tests.inductor_passes:register_rms_norm_fusion_by_variance", "numerics"),
    Pass("inductor", "tests.inductor_passes:register_rms_norm_fusion"),
    Pass("inductor", "tests.inductor_passes:SILU_AND_MUL_INFERENCE"),  # a custom op without autograd
    Pass("pre-grad", "tests.pre_grad_passes:fold_conv_bn_dropping_bias", "numerics"),
    Pass("pre-grad", "tests.pre_grad_passes:FOLD_CONV_BN"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="smoke,edge", help="the models backends and graph passes run over")
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist workers (-n); 1 runs in-process")
    parser.add_argument("--only", default="", help="comma-separated pass names (the part of the spec after ':')")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    args = parser.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    wanted = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(kinds) - set(KINDS)) + sorted(set(wanted) - {p.spec.rpartition(":")[2] for p in PASSES})
    if unknown:
        parser.error(f"unknown kinds or passes {unknown}")
    chosen = [p for p in PASSES if p.kind in kinds and (not wanted or p.spec.rpartition(":")[2] in wanted)]
    print(f"corpus {args.corpus} (backends, graph passes), -n {args.workers}, no pytest cache; first fail s: pytest "
          "start to the first failed item's report")
    print(ROW.format("pass", "kind", "option", "expected", "first failing check@subject", "first fail s", "run s",
                     "verdict"))
    outcomes: list[Outcome] = []
    for chosen_pass in chosen:
        outcome = run_items(chosen_pass.spec.rpartition(":")[2], "bug" if chosen_pass.bug else "correct",
                            chosen_pass.expected, chosen_pass.args(args.corpus), args.workers, chosen_pass.kind)
        print_row(outcome)
        outcomes.append(outcome)
    print_totals(outcomes)


if __name__ == "__main__":
    main()
