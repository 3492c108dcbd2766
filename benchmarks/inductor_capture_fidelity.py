"""Whether the Inductor captures hand a pass what ``torch.compile`` hands it: for each model, mode and hook, a
real ``torch.compile`` with a recording pass at the hook beside the capture, compared in placeholder shapes, the
output node and every call target, in order. An inference capture is one graph (the compile stops at the hook: no
code generation); a training capture is the joint graph, or the forward and the backward graph (the compile
generates the forward's code, then stops at the backward's hook).

    python benchmarks/inductor_capture_fidelity.py [--corpus smoke,edge,layers] [--captures inductor,...]
        [--modes eval,train]

Prints one line per differing graph (the first lines of the difference) and the count of graphs that are the
same. A capture that raises is printed with its error (an expected failure of the corpus says why).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

import torch
from torch import fx
from torch._inductor.custom_graph_pass import CustomGraphPass

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fxverify.capture.lifted_buffers import state_as_placeholders
from fxverify.cases.case import load_case
from fxverify.cases.catalogue import choose
from fxverify.core.captures import for_model
from fxverify.inductor.aot import backward_on_zeros
from fxverify.inductor.hooks import GRAPH_HOOKS, plain_captures

AT_HOOK = plain_captures(GRAPH_HOOKS)  # the captures of a plain compile's joint-graph and post-grad hooks, by name


class _Stop(Exception):
    """Raised by the recording pass: the compile stops at the hook."""


class _Recording(CustomGraphPass):
    def __init__(self, count: int) -> None:
        self.graphs: list[list[str]] = []
        self.count = count  # the graphs to record before stopping the compile

    def __call__(self, graph: fx.Graph) -> None:
        self.graphs.append(described(graph))
        if len(self.graphs) == self.count:
            raise _Stop

    def uuid(self) -> None:
        return None


def described(graph: fx.Graph) -> list[str]:
    """Placeholder shapes, the output node and each call target, in order."""
    shapes = [tuple(node.meta["val"].shape) for node in graph.find_nodes(op="placeholder")]
    return [str(shapes), graph.output_node().format_node(),
            *[str(node.target) for node in graph.nodes if node.op == "call_function"]]


def compiled(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], capture: str) -> list[list[str]]:
    """What ``torch.compile`` hands the hook of ``capture``, graph by graph (none: it calls no hook): the inference
    graph under ``no_grad``, else the training graphs (the backward's compiled by a backward on zero gradients)."""
    from torch._inductor import config

    training = AT_HOOK[capture].training_graphs
    recording = _Recording(len(parts(capture)))
    torch._dynamo.reset()
    try:
        with config.patch({AT_HOOK[capture].hook.name: recording, "force_disable_caches": True, "fallback_random": True}), \
                torch.set_grad_enabled(training):
            outputs = torch.compile(module)(*inputs)
            if training:
                backward_on_zeros(outputs)
    except Exception:  # the recording pass stops the compile
        if len(recording.graphs) < recording.count:
            raise
    finally:
        torch._dynamo.reset()
    return recording.graphs


def captured(gm: fx.GraphModule, capture: str) -> list[list[str]]:
    """The graphs ``gm`` (made by the capture ``capture``) hands a pass, each as :func:`described` gives it."""
    if not AT_HOOK[capture].training_graphs:
        return [described(state_as_placeholders(gm).graph)]
    return [described(gm.get_submodule(part).graph) for part in parts(capture)]


def parts(capture: str) -> tuple[str, ...]:
    """The graphs ``capture`` hands a pass: the inference graph, the joint graph, or the forward and backward."""
    at = AT_HOOK[capture]
    if not at.training_graphs:
        return ("inference",)
    return ("joint_graph",) if at.hook.stage == "joint" else ("forward_graph", "backward_graph")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="smoke,edge,layers")
    parser.add_argument("--captures", default=",".join(AT_HOOK))
    parser.add_argument("--modes", default="eval,train", help="the modes the model is built in")
    args = parser.parse_args()
    same = total = 0
    for entry in choose(args.corpus):
        case = load_case(entry.name)
        for training in [mode == "train" for mode in args.modes.split(",")]:
            for capture in args.captures.split(","):
                total += len(parts(capture))
                where = f"{entry.name} {'train' if training else 'eval'} {capture}"
                inputs = case.example_inputs()
                try:
                    real = compiled(case.build(training=training), inputs, capture)
                    gm = for_model(capture, case.facts).capture(case.build(training=training), training=training,
                                                                inputs=inputs)
                except Exception as error:  # printed, as the corpus says why a capture fails
                    print(f"{where}: raised {type(error).__name__}: {str(error).splitlines()[0][:150]}", flush=True)
                    continue
                if not real:
                    print(f"{where}: torch.compile calls no hook (the graph has no op)", flush=True)
                    continue
                for index, (theirs, mine) in enumerate(zip(real, captured(gm, capture), strict=True)):
                    if mine == theirs:
                        same += 1
                        continue
                    diff = [line for line in difflib.unified_diff(theirs, mine, lineterm="", n=0)
                            if line[:1] in "+-" and line[:3] not in ("+++", "---")]
                    print(f"{where} graph {index}: differs (- torch.compile, + capture): {diff[:4]}", flush=True)
    print(f"{same} of {total} graphs the same as torch.compile's")


if __name__ == "__main__":
    main()
