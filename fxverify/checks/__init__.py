"""The checks: one registry, in the order they run and are reported.

Importing this package imports no check and no torch (the pytest plugin reads
:data:`NAMES` at start-up); :func:`get` imports a check when it is first run.
Each check is ``check(subject) -> dict | None``: it returns details on success and
raises :class:`~fxverify.core.results.Finding` to fail or :class:`~fxverify.core.results.Skip`
when it does not apply. The public ``fxverify.check_<name>`` / ``assert_<name>``
pairs and the ``--fxverify-checks`` help come from :data:`REGISTRY`; the check tables of
README.md, docs/checks.md and docs/options.md are held to it by tests/test_docs.py.

>>> NAMES[:3]
('lint', 'determinism', 'numerics')
>>> get("lint").__module__
'fxverify.checks.lint'
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

from fxverify.core import captures
from fxverify.core.captures import CaptureTraits


@dataclasses.dataclass(frozen=True)
class CheckSpec:
    """Where a check lives: ``fxverify.checks.<module>.<function>``, what it is for in one line, and the
    traits of a capture's graphs it needs (fields of :class:`~fxverify.core.captures.CaptureTraits`): under a
    capture without them it is not collected, and run through the API it skips saying which is missing."""

    name: str
    module: str
    function: str
    summary: str
    requires: tuple[str, ...] = ()
    verify_each: bool = False  # structural: run after every step of a pipeline whose contract declares verify_each


REGISTRY: tuple[CheckSpec, ...] = (
    CheckSpec("lint", "lint", "check", "the result is a well-formed GraphModule that runs", verify_each=True),
    CheckSpec("determinism", "determinism", "check", "the transform gives the same graph and code every time"),
    CheckSpec("numerics", "numerics", "check", "the result computes what the original computes"),
    CheckSpec("gradients", "gradients", "check", "backward through the result matches backward through the original"),
    CheckSpec("devices", "devices", "check", "every tensor the result reads moves with .to(device) and .to(dtype)"),
    CheckSpec("cuda", "cuda", "check", "on a GPU, the result on CUDA computes what the original computes on CPU",
              requires=("moves_device",)),
    CheckSpec("purity", "purity", "check", "the transform leaves its input alone and its outputs behave like the "
                                           "original's"),
    CheckSpec("stateful", "stateful", "check", "a model whose buffers change in forward leaves the same buffers "
                                               "after each call"),
    CheckSpec("meta", "meta", "check", "on ATen graphs, every node's meta['val'] exists and says what a real run "
                                       "computes", requires=("carries_meta_val",), verify_each=True),
    CheckSpec("dynamic", "dynamic", "check", "on a dynamic-batch capture, the result takes and computes right "
                                             "every batch size the capture takes", requires=("dynamic_batch",)),
    CheckSpec("agreement", "agreement", "check", "with several captures selected, the transform changes the "
                                                 "outputs alike under each"),
    CheckSpec("verifier", "verifier", "check", "a program the transform returns still validates: its dialect's "
                                               "rules, and a signature naming the graph's nodes",
              requires=("has_program",), verify_each=True),
    CheckSpec("opset", "opset", "check", "on ATen graphs, the result keeps the capture's operator set (ATen, "
                                         "functional, core ATen)", requires=("opset",), verify_each=True),
    CheckSpec("variants", "variants", "check", "the ops the transform rewrote, and the variants of them it left "
                                               "untouched (a warning; a failure under rewrites_every_occurrence)"),
    CheckSpec("recompile", "roundtrips", "check_recompile", "a copy recompiled gives the same code and outputs"),
    CheckSpec("retrace", "roundtrips", "check_retrace", "re-capturing the generated code gives an isomorphic graph",
              requires=("recaptures",)),
    CheckSpec("reexport", "roundtrips", "check_reexport", "on export captures, exporting the result again gives the "
                                                          "same operators and outputs", requires=("has_program",)),
    CheckSpec("to_folder", "roundtrips", "check_to_folder", "gm.to_folder() exported and imported again computes "
                                                            "the same", requires=("pickles",)),
    CheckSpec("pickle", "roundtrips", "check_pickle", "copy.deepcopy and a pickle round trip give the same graph "
                                                      "and outputs", requires=("pickles",)),
    CheckSpec("serde", "roundtrips", "check_serde", "a program the transform returns saved with torch.export.save "
                                                    "and loaded again computes the same",
              requires=("has_program",)),
    CheckSpec("interpreter", "roundtrips", "check_interpreter", "torch.fx.Interpreter running the graph equals the "
                                                                "generated forward"),
    CheckSpec("golden", "golden", "check", "the generated code and graph match the committed golden file"),
)
NAMES: tuple[str, ...] = tuple(spec.name for spec in REGISTRY)
_BY_NAME = {spec.name: spec for spec in REGISTRY}


def spec(name: str) -> CheckSpec:
    """The registry entry of check ``name``; KeyError for an unknown name."""
    return _BY_NAME[name]


def not_applicable(name: str, traits: CaptureTraits, capture: str) -> str | None:
    """Why check ``name`` does not apply to graphs of ``capture`` with these ``traits`` (the trait it needs
    that they lack), or None.

    >>> from fxverify.core import captures
    >>> print(not_applicable("retrace", captures.spec("export").traits, "export"))
    export graphs are not captured again from a result's code here (captures whose graphs are: symbolic_trace)
    """
    return captures.lacking(traits, _BY_NAME[name].requires, capture)


def get(name: str) -> Callable[[Any], dict[str, Any] | None]:
    """The check function called ``name`` (imported now, with torch)."""
    entry = _BY_NAME[name]
    return getattr(importlib.import_module(f"fxverify.checks.{entry.module}"), entry.function)
