"""Generate ``corpus/full.toml``, the ``full`` profile of the catalogue: every
torchvision and timm model of at most 150M parameters, each surveyed on this machine.

Rerun it after upgrading torch, torchvision or timm (models appear and disappear,
start or stop tracing), and after adding zoo models to ``models.toml`` or
``edge.toml`` (models listed there are left out)::

    python -m fxverify.corpus.generate_full [--out PATH] [--limit N] [--only GLOB] [--jobs N]

Each model is established, not guessed, on a fresh instance per trace: the first
tracer that works (plain ``symbolic_trace``, else timm's leaf tracer, else
``concrete_args`` setting the optional forward arguments to their ``None``
defaults), the smallest input size at which the traced module runs in eval and in
train mode (64, 96, 128, 160, else the model's own size), and whether the other
batch size (1 or 2) and the next larger size run too. Runs use the meta device
(shapes only, fast); an attempt that fails there is repeated on CPU. A model no
attempt handles becomes an ``xfail`` entry with its error's first line. Every model
is surveyed in its own forked process under a time limit. The output is sorted and
stable: a rerun with nothing changed writes the same bytes. The whole zoo takes
about 25 minutes on 2 idle cores (40 on a loaded machine).
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import inspect
import json
import multiprocessing
import os
import re
import sys
import time
import warnings
from collections import Counter
from collections.abc import Iterator, Mapping
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import timm
import tomllib
import torch
import torchvision
from torch import nn

from fxverify.capture import for_entry
from fxverify.cases.case import factory_of
from fxverify.cases.catalogue import NONE, CorpusEntry, InputSpec

MAX_PARAMS = 150_000_000
REDUCED_SIZES = (64, 96, 128, 160)
VIDEO_FRAMES = 4  # at the reduced sizes; at their own size video models get VIDEO_OWN_FRAMES
VIDEO_OWN_FRAMES = 16
DETECTION_SIZE = 320  # SSD needs about 300 pixels; the other detection backbones take any size
MAX_REASON = 160
LARGE_INPUT, LARGE_INPUT_PIXELS = "large_input", 224 * 224
TIME_LIMIT_S = 300
HERE = Path(__file__).resolve().parent
ATTENTION = re.compile(r"attention|attn|transformer|GPSA|MHSA|SHSA|LambdaLayer", re.IGNORECASE)
TV_KIND_TAGS = {"segmentation": "segmentation", "video": "video", "quantization": "quantizable"}
TRACER_OUTCOMES = ("plain", "timm", "concrete_args")
FIELD_ORDER = ("name", "source", "factory", "kwargs", "inputs", "batch_sizes", "spatial_sizes", "tracer",
               "concrete_args", "tags", "profiles", "xfail")


@dataclasses.dataclass(frozen=True)
class Survey:
    """What surveying one model found: its entry and how it got there.

    ``outcome`` is the tracer kind that worked ("plain", "timm", "concrete_args"),
    "xfail", "large" (over ``MAX_PARAMS``, no entry) or "failed" (could not be
    surveyed, no entry; ``note`` says why). ``device`` is where the entry was validated.
    """

    entry: CorpusEntry
    outcome: str
    params: int | None = None
    nodes: int | None = None
    device: str = "meta"
    note: str = ""


# -- the models --------------------------------------------------------------------


def draft(name: str, source: str, family: str, shape: tuple[int, ...], *tags: str, images: int = 1,
          **fields: Any) -> CorpusEntry:
    """An entry before its survey: ``shape`` is the model's own input size, tags start with family and source."""
    return CorpusEntry(name=name, source=source, inputs=(InputSpec(shape),) * images, tags=(family, source, *tags),
                       profiles=("full",), **fields)


def torchvision_drafts() -> list[CorpusEntry]:
    """Every torchvision model; detection models also as their backbone alone."""
    drafts = []
    for name in torchvision.models.list_models():
        parts = torchvision.models.get_model_builder(name).__module__.split(".")
        kind, family = (parts[2] if len(parts) > 3 else "classification"), parts[-1]
        tags = [TV_KIND_TAGS[kind]] if kind in TV_KIND_TAGS else []
        size = DETECTION_SIZE if kind == "detection" else preset_size(name)
        shape = (1, 3, VIDEO_OWN_FRAMES, size, size) if kind == "video" else (2, 3, size, size)
        kwargs = {"quantize": False} if kind == "quantization" else {}
        drafts.append(draft(name, "torchvision", family, shape, *tags, kwargs=kwargs,
                            images=2 if kind == "optical_flow" else 1))
        if kind == "detection":
            drafts.append(draft(f"{name}_backbone", "torchvision", family, shape, "detection-backbone",
                                factory="fxverify.corpus.factories:detection_backbone", kwargs={"name": name}))
    return drafts


def preset_size(name: str) -> int:
    """The crop size of the preset transforms of the model's first weights (224 if they have none)."""
    weights = next(iter(torchvision.models.get_model_weights(name)))
    crop = getattr(weights.transforms, "keywords", {}).get("crop_size", 224)
    return crop[0] if isinstance(crop, (tuple, list)) else crop


def timm_drafts(taken: set[str]) -> list[CorpusEntry]:
    """Every timm model (its own input size is read from its pretrained_cfg when surveyed);
    one whose name is ``taken`` (by torchvision) is named ``timm_<name>``."""
    drafts = []
    for name in timm.list_models():
        family = timm.models.model_entrypoint(name).__module__.rpartition(".")[2]
        if name in taken:
            drafts.append(draft(f"timm_{name}", "timm", family, (2, 3, 224, 224),
                                factory="fxverify.corpus.factories:timm_model", kwargs={"model_name": name}))
        else:
            drafts.append(draft(name, "timm", family, (2, 3, 224, 224)))
    return drafts


def catalogued() -> dict[str, str]:
    """Name -> source of every entry in ``models.toml`` and ``edge.toml``."""
    names = {}
    for filename in ("models.toml", "edge.toml"):
        path = HERE / filename
        if path.is_file():
            for model in tomllib.loads(path.read_text(encoding="utf-8")).get("model", []):
                names[model["name"]] = model["source"]
    return names


# -- surveying one model (in a child process) ----------------------------------------


def survey(entry: CorpusEntry) -> Survey:
    """Count parameters, then find the first tracer attempt that traces and runs."""
    module, device = first_instance(entry)
    params = sum(p.numel() for p in module.parameters())
    if params > MAX_PARAMS:
        return Survey(entry, "large", params)
    own_size = getattr(module, "pretrained_cfg", {}).get("input_size")
    if own_size:
        entry = dataclasses.replace(entry, inputs=(InputSpec((2, *own_size)),))
    entry = tagged(entry, *module_tags(entry, module))
    errors: dict[tuple[str, bool], Exception] = {}
    fresh: nn.Module | None = module
    for tracer, concrete_args in tracer_attempts(entry, module):
        attempt = dataclasses.replace(entry, tracer=tracer, concrete_args=concrete_args)
        for dev in dict.fromkeys((device, "cpu")):
            try:
                return verify(attempt, dev, fresh if fresh is not None else build(attempt, dev), params)
            except Exception as exc:  # any failure to build, trace or run means: try the next one
                errors[tracer, bool(concrete_args)] = exc
            fresh = None
    tracer = "timm" if entry.source == "timm" else "plain"
    return Survey(dataclasses.replace(entry, tracer=tracer, xfail=first_line(errors[tracer, False])), "xfail", params)


def build(entry: CorpusEntry, device: str) -> nn.Module:
    """A fresh instance in eval mode, built as the harness builds it, on ``device``."""
    torch.manual_seed(0)
    with torch.device(device):
        return factory_of(entry)().eval()


def first_instance(entry: CorpusEntry) -> tuple[nn.Module, str]:
    """A fresh instance on the meta device, or on CPU where it cannot be built on meta."""
    try:
        return build(entry, "meta"), "meta"
    except Exception:
        return build(entry, "cpu"), "cpu"


def module_tags(entry: CorpusEntry, module: nn.Module) -> list[str]:
    """"attention" where the family or a layer's class name suggests it, "batchnorm" where a layer is one."""
    tags = []
    if ATTENTION.search(entry.tags[0]) or any(ATTENTION.search(type(m).__name__) for m in module.modules()):
        tags.append("attention")
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules()):
        tags.append("batchnorm")
    return tags


def tagged(entry: CorpusEntry, *tags: str) -> CorpusEntry:
    """``entry`` with ``tags`` added: family and source first, the rest sorted."""
    return dataclasses.replace(entry, tags=entry.tags[:2] + tuple(sorted({*entry.tags[2:], *tags})))


def tracer_attempts(entry: CorpusEntry, module: nn.Module) -> list[tuple[str, dict[str, Any]]]:
    """(tracer, concrete_args) in order of preference; concrete_args fix the
    optional forward arguments whose default is None."""
    optional = list(inspect.signature(module.forward).parameters.values())[len(entry.inputs):]
    defaults = {p.name: None for p in optional if p.default is None}
    attempts: list[tuple[str, dict[str, Any]]] = [("plain", {}), ("timm", {})]
    return attempts + [(tracer, defaults) for tracer, _ in attempts] if defaults else attempts


def verify(entry: CorpusEntry, device: str, module: nn.Module, params: int) -> Survey:
    """Trace ``module`` and a fresh train-mode instance with ``entry``'s tracer and settle the
    inputs they run at; raises if there are none."""
    eval_gm, train_gm = traced(entry, module, False), traced(entry, build(entry, device), True)
    entry, output = choose_inputs(entry, device, eval_gm, train_gm)
    if isinstance(output, Mapping):
        entry = tagged(entry, "dict-output")
    outcome = "concrete_args" if entry.concrete_args else entry.tracer
    return Survey(entry, outcome, params, len(eval_gm.graph.nodes), device)


def traced(entry: CorpusEntry, module: nn.Module, training: bool) -> nn.Module:
    """``module`` traced as ``entry`` says, in train or eval mode."""
    return for_entry(entry.tracer, entry.concrete_args).capture(module, training=training)


def choose_inputs(entry: CorpusEntry, device: str, eval_gm: nn.Module, train_gm: nn.Module) -> tuple[CorpusEntry, Any]:
    """``entry`` at the first candidate size both modules run at (its own batch, else batch 1),
    with the batch sizes and the second spatial size that run too in eval mode (the harness
    checks train mode at the primary inputs only); and the eval output."""
    candidates = candidate_inputs(entry)
    error: Exception | None = None
    for batch in dict.fromkeys((entry.primary_batch, 1)):
        for i, inputs in enumerate(candidates):
            inputs = with_batch(inputs, batch)
            try:
                output = run(eval_gm, inputs, device)
                run(train_gm, inputs, device)
            except Exception as exc:
                error = exc
                continue
            other = 2 if batch == 1 else 1
            batch_sizes = sorted({batch, other}) if runs(eval_gm, with_batch(inputs, other), device) else [batch]
            spatial_sizes: tuple[tuple[int, ...], ...] = ()
            if i + 1 < len(candidates):
                size = candidates[i + 1][0].shape[-2:]
                second = (dataclasses.replace(inputs[0], shape=inputs[0].shape[:-2] + size), *inputs[1:])
                if runs(eval_gm, second, device):
                    spatial_sizes = (inputs[0].shape[-2:], size)
            return dataclasses.replace(entry, inputs=inputs, batch_sizes=tuple(batch_sizes),
                                       spatial_sizes=spatial_sizes), output
    assert error is not None
    raise error


def candidate_inputs(entry: CorpusEntry) -> list[tuple[InputSpec, ...]]:
    """Inputs to try, smallest first: each reduced size (video: 4 frames), then the model's own."""
    def reduced(spec: InputSpec, size: int) -> InputSpec:
        lead = spec.shape[:2] + ((VIDEO_FRAMES,) if len(spec.shape) == 5 else ())
        return dataclasses.replace(spec, shape=lead + (size, size))

    candidates = [tuple(reduced(spec, size) for spec in entry.inputs) for size in REDUCED_SIZES]
    return candidates + ([entry.inputs] if entry.inputs not in candidates else [])


def with_batch(inputs: tuple[InputSpec, ...], batch: int) -> tuple[InputSpec, ...]:
    return tuple(dataclasses.replace(spec, shape=(batch, *spec.shape[1:])) for spec in inputs)


def run(gm: nn.Module, inputs: tuple[InputSpec, ...], device: str) -> Any:
    """``gm``'s output on random inputs of these shapes."""
    with torch.no_grad():
        return gm(*(torch.randn(spec.shape, device=device) for spec in inputs))


def runs(gm: nn.Module, inputs: tuple[InputSpec, ...], device: str) -> bool:
    try:
        run(gm, inputs, device)
    except Exception:
        return False
    return True


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message``, its first sentences if long, without memory
    addresses (they change per run)."""
    lines = str(exc).strip().splitlines()
    text = re.sub(r"0x[0-9a-fA-F]+", "0x...", f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__)
    if len(text) > MAX_REASON:
        text = text[:MAX_REASON].rpartition(". ")[0] + "." if ". " in text[:MAX_REASON] else text[:MAX_REASON] + "..."
    return text


# -- running the survey --------------------------------------------------------------


def _child(entry: CorpusEntry, conn: Connection) -> None:
    """Body of a child process: survey ``entry`` with one thread, quietly, and send the Survey.
    (Quietly: warnings off, and ``sys.stderr`` closed to FX's report of each failed run.)"""
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115  (for the life of this survey process)
    try:
        result = survey(entry)
    except Exception as exc:
        result = Survey(entry, "failed", note=first_line(exc))
    conn.send(result)


def survey_isolated(entries: list[CorpusEntry], jobs: int, time_limit: float) -> Iterator[tuple[Survey, float]]:
    """Survey each entry in its own forked process, ``jobs`` at a time; yields (survey, seconds)
    as they finish. A child that overruns ``time_limit`` is killed; one that dies is reported."""
    context = multiprocessing.get_context("fork")
    queue = list(reversed(entries))
    running: dict[Connection, tuple[Any, CorpusEntry, float]] = {}
    while queue or running:
        while queue and len(running) < jobs:
            entry = queue.pop()
            reader, writer = context.Pipe(duplex=False)
            process = context.Process(target=_child, args=(entry, writer), daemon=True)
            process.start()
            writer.close()
            running[reader] = (process, entry, time.monotonic())
        deadline = min(started for _, _, started in running.values()) + time_limit
        ready = wait(list(running), timeout=max(0.0, deadline - time.monotonic()))
        for reader, (process, entry, started) in list(running.items()):
            if reader in ready:
                try:
                    result = reader.recv()
                except EOFError:
                    process.join()
                    result = Survey(entry, "failed", note=f"the survey process died (exit code {process.exitcode})")
            elif time.monotonic() - started >= time_limit:
                process.kill()
                result = Survey(entry, "failed", note=f"no result within {time_limit:.0f} s")
            else:
                continue
            process.join()
            reader.close()
            del running[reader]
            yield result, time.monotonic() - started


# -- writing ------------------------------------------------------------------------


def toml_value(value: Any) -> str:
    """``value`` as TOML: inline tables and arrays on one line; None as the string "None"."""
    if value is None:
        return json.dumps(NONE)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return json.dumps(value)
    if isinstance(value, InputSpec):
        return toml_value({"shape": value.shape})
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    return "[" + ", ".join(toml_value(v) for v in value) + "]"


def sized(entry: CorpusEntry) -> CorpusEntry:
    """``entry``, also in the ``large_input`` profile when its images are larger than
    :data:`LARGE_INPUT_PIXELS` (models that only run at their own size of 256-518 pixels: several
    times the time and memory of the others; a nightly run can leave them out)."""
    shape = entry.inputs[0].shape
    if len(shape) >= 4 and shape[-1] * shape[-2] > LARGE_INPUT_PIXELS:
        return dataclasses.replace(entry, profiles=(*entry.profiles, LARGE_INPUT))
    return entry


def entry_toml(result: Survey) -> str:
    """One ``[[model]]`` table, its comment giving parameter and node counts."""
    entry = sized(result.entry)
    nodes = f"{result.nodes} nodes" if result.nodes is not None else "no graph"
    lines = ["[[model]]", f"# {result.params / 1e6:.1f}M params, {nodes}"]
    for field in FIELD_ORDER:
        value = getattr(entry, field)
        if value or field in ("batch_sizes", "tracer"):
            lines.append(f"{field} = {toml_value(value)}")
    return "\n".join(lines) + "\n"


def catalogue_toml(results: list[Survey]) -> str:
    """The whole file: a header, then the entries sorted by source and name."""
    header = (
        "# The full zoo: every torchvision and timm model of at most 150M parameters (profile \"full\"; those\n"
        "# whose images are larger than 224x224 also in profile \"large_input\").\n"
        "# Generated by `python -m fxverify.corpus.generate_full`; do not edit by hand, rerun it after\n"
        "# upgrading torch, torchvision or timm. Fields as in models.toml; each entry's comment gives its\n"
        "# parameter count and the node count of its traced graph.\n"
        f"# torch {torch.__version__}, torchvision {torchvision.__version__}, timm {timm.__version__}\n"
    )
    ordered = sorted(results, key=lambda r: (r.entry.source, r.entry.name))
    return header + "".join("\n" + entry_toml(r) for r in ordered)


def progress(i: int, total: int, result: Survey, seconds: float) -> None:
    entry = result.entry
    detail = {
        "large": f"{(result.params or 0) / 1e6:.0f}M params, skipped",
        "failed": f"FAILED: {result.note}",
        "xfail": f"xfail: {entry.xfail}",
    }.get(result.outcome, f"{result.outcome} {'x'.join(map(str, entry.inputs[0].shape))}, {result.nodes} nodes"
                          f" on {result.device}")
    print(f"[{i}/{total}] {entry.name}: {detail} ({seconds:.1f} s)", file=sys.stderr, flush=True)


def summary(counts: Counter[str], seconds: float) -> str:
    entries = sum(counts[k] for k in (*TRACER_OUTCOMES, "xfail"))
    return (
        f"{entries} entries: {counts['plain']} traced plain, {counts['timm']} timm tracer, "
        f"{counts['concrete_args']} concrete_args, {counts['xfail']} xfail; skipped: {counts['large']} >150M params, "
        f"{counts['catalogued']} already in the catalogue, {counts['failed']} failed to survey; "
        f"{counts['cpu']} validated on CPU (not meta); {seconds / 60:.1f} min"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "full.toml", help="file to write (default: %(default)s)")
    parser.add_argument("--limit", type=int, help="survey only the first N models (by source, then name)")
    parser.add_argument("--only", metavar="GLOB", help="survey only models whose entry name matches GLOB")
    parser.add_argument("--jobs", type=int, default=2, help="models surveyed in parallel (default: %(default)s)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    known = catalogued()
    candidates = torchvision_drafts()
    candidates += timm_drafts({e.name for e in candidates} | {n for n, source in known.items() if source != "timm"})
    candidates = sorted(candidates, key=lambda e: (e.source, e.name))
    drafts = [e for e in candidates if known.get(e.name) != e.source]
    counts = Counter(catalogued=len(candidates) - len(drafts))
    drafts = [e for e in drafts if fnmatch.fnmatchcase(e.name, args.only or "*")][: args.limit]
    results = []
    for i, (result, seconds) in enumerate(survey_isolated(drafts, args.jobs, TIME_LIMIT_S), 1):
        progress(i, len(drafts), result, seconds)
        counts[result.outcome] += 1
        counts["cpu"] += result.outcome in TRACER_OUTCOMES and result.device == "cpu"
        if result.outcome not in ("large", "failed"):
            results.append(result)
    args.out.write_text(catalogue_toml(results), encoding="utf-8")
    for model in tomllib.loads(args.out.read_text(encoding="utf-8")).get("model", []):
        CorpusEntry.from_data(model)  # the file must load as the catalogue loads it
    print(f"wrote {args.out}: {summary(counts, time.monotonic() - start)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
