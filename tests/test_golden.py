"""Golden files: created, byte-stable across processes and hash seeds, a changed transform caught with
a readable diff and an .obtained file, the update flag, atomic writes, sanitised names; and the
project's own trace baseline in ``corpus/golden``.

The baseline test compares the smoke and edge profiles; ``FXVERIFY_GOLDEN_PROFILES=default``
compares the whole default corpus. Regenerate the baseline after an intended change (a new torch,
torchvision or timm) from the repository root with::

    pytest -p no:cacheprovider --fxverify fxverify.examples:identity --fxverify-corpus default \\
        --fxverify-checks golden --fxverify-golden-dir corpus/golden --fxverify-update-golden
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch
from torch import fx

from fxverify.analysis import golden
from fxverify.api import Verification
from fxverify.cases import catalogue
from fxverify.cases.case import load_case
from fxverify.core.transform import Transform
from tests import aten_passes, mutations
from tests.pinned import pins, tied_to_pins

CORPUS_GOLDEN = Path(__file__).parents[1] / "corpus" / "golden"
BASELINE = "fxverify.examples:identity"
ATEN_PASSES = Path(__file__).with_name("aten_passes.py")
SPEC = "my_project.passes:rewrite"  # the name the golden files are kept under in these tests


def run_golden(fn, model, root, *, update=False):
    transform = Transform.from_callable(fn, spec=SPEC)
    return Verification(transform, model, golden_dir=root, update_golden=update).run("golden")


def unchanged(gm: fx.GraphModule) -> fx.GraphModule:
    return gm


def relu_to_clamp(gm: fx.GraphModule) -> fx.GraphModule:
    mutations.relu_to_clamp_in_place(gm)
    return gm


def test_a_changed_transform_fails_with_a_readable_diff_and_an_obtained_file(tmp_path):
    assert run_golden(unchanged, "edge_conv_bn_head", tmp_path, update=True).details["golden"] == "created"
    path = golden.golden_path(tmp_path, SPEC, "edge_conv_bn_head")
    written = path.read_bytes()

    result = run_golden(relu_to_clamp, "edge_conv_bn_head", tmp_path)
    assert result.outcome == "failed"
    message = result.message
    assert "first diff: section 'code after the transform', line 24 of the file" in message
    assert f"golden:   {path}" in message and "--fxverify-update-golden" in message
    assert "-    relu = torch.nn.functional.relu(bn1, inplace = False);  bn1 = None" in message
    assert "+    relu = torch.clamp(bn1, min = 0.0);  bn1 = None" in message
    assert "library versions differ" not in message
    obtained = golden.obtained_path(path).read_text()
    assert "relu = torch.clamp(bn1, min = 0.0)" in obtained
    assert path.read_bytes() == written  # the golden file is left alone

    assert run_golden(relu_to_clamp, "edge_conv_bn_head", tmp_path, update=True).details["golden"] == "changed"
    assert path.read_text() == obtained
    assert not golden.obtained_path(path).exists()  # accepted: the stale .obtained goes
    assert run_golden(relu_to_clamp, "edge_conv_bn_head", tmp_path).outcome == "passed"


def test_a_missing_file_fails_and_a_missing_folder_skips(tmp_path):
    skipped = run_golden(mutations.normalize_args, "edge_conv_bn_head", tmp_path)
    assert skipped.outcome == "skipped" and "--fxverify-update-golden" in skipped.message
    run_golden(mutations.normalize_args, "edge_nested_outputs", tmp_path, update=True)
    missing = run_golden(mutations.normalize_args, "edge_conv_bn_head", tmp_path)
    assert missing.outcome == "failed"
    assert "edge_conv_bn_head.golden is missing: create it with --fxverify-update-golden" in missing.message


def test_random_graphs_skip_and_get_no_golden_file(tmp_path):
    from fxverify.cases.case import ModelCase
    from fxverify.strategies import graph_from_seed
    from fxverify.strategies.corpus import entry_for

    run_golden(unchanged, "edge_conv_bn_head", tmp_path, update=True)  # the transform has a golden folder
    for case in (graph_from_seed(3, max_nodes=3), ModelCase(entry_for(5))):
        for update in (False, True):
            result = run_golden(unchanged, case, tmp_path, update=update)
            assert result.outcome == "skipped", result.message
            assert "is a random graph" in result.message and "no stable golden file" in result.message
    folder = golden.golden_path(tmp_path, SPEC, "edge_conv_bn_head").parent
    assert [p.name for p in folder.iterdir()] == ["edge_conv_bn_head.golden"]  # nothing written for the graphs


def test_a_version_change_is_said_first_and_alone_it_is_no_failure(tmp_path):
    run_golden(mutations.normalize_args, "edge_conv_bn_head", tmp_path, update=True)
    path = golden.golden_path(tmp_path, SPEC, "edge_conv_bn_head")
    path.write_text(path.read_text().replace(f"torch {torch.__version__.split('+')[0]}", "torch 2.0.0", 1))
    assert "torch 2.0.0" in path.read_text()
    same = run_golden(mutations.normalize_args, "edge_conv_bn_head", tmp_path)
    assert same.outcome == "passed" and "written with torch 2.0.0" in same.details["golden"]
    changed = run_golden(relu_to_clamp, "edge_conv_bn_head", tmp_path)
    finding = changed.message.split("finding:", 1)[1].strip()
    assert finding.startswith("library versions differ from those the golden file was written with: torch 2.0.0 -> ")


def test_long_diffs_are_trimmed(tmp_path):
    path = tmp_path / "t" / "m.golden"
    golden.update_golden(path, "# model: m\n\n" + "".join(f"line {i}\n" for i in range(200)))
    with pytest.raises(golden.GoldenMismatch) as raised:
        golden.check_golden(path, "# model: m\n\n" + "".join(f"LINE {i}\n" for i in range(200)))
    message = str(raised.value)
    assert "more diff lines: diff the two files" in message
    assert len(message.splitlines()) < golden.MAX_DIFF_LINES + 10
    assert raised.value.where == "section 'header', line 3 of the file"


def test_an_interrupted_write_leaves_the_old_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "t" / "m.golden"
    golden.update_golden(path, "old\n")

    def interrupted(*args):
        raise KeyboardInterrupt  # Ctrl-C, or the machine going down, between writing and renaming

    monkeypatch.setattr(golden.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        golden.update_golden(path, "new\n" * 1000)
    monkeypatch.undo()

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(golden.os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        golden.update_golden(path, "new\n" * 1000)
    assert path.read_text() == "old\n"
    assert [p.name for p in path.parent.iterdir()] == ["m.golden"]  # no temporary file left behind


def test_names_are_sanitised_and_never_collide(tmp_path):
    names = ["resnet18", "vit/b:16", "vit_b_16", "a b", "a_b", "CON", "..", "ünïcode"]
    files = [golden.golden_path(tmp_path, "x.py:t", n) for n in names]
    assert len(set(files)) == len(names)
    assert files[0].name == "resnet18.golden"
    for path in files:
        assert path.parent == tmp_path / "x.t"
        assert all(c.isascii() and (c.isalnum() or c in "._-") for c in path.name), path.name
        golden.atomic_write(path, "ok\n")  # a valid file name here
    assert golden.golden_path(tmp_path, "/home/me/x.py:t", "m") == golden.golden_path(tmp_path, "x.py:t", "m")


def test_volatile_content_is_normalised():
    text = (
        "f = <function <lambda> at 0x7f1e2d3c4b50>; obj = <Foo object at 0x55d0c0ffee00>\n"
        '  File "/home/ci/venv/lib/python3.11/site-packages/torch/nn/modules/conv.py", line 554, in forward\n'
        "# File: /work/proj/models/net.py:12 in forward, code: return self.fc(x)\n"
        "x = fxverify_user_passes_0badc0de_helper(y, {'b', 'c', 'a'})\n"
    )
    assert golden.normalise(text) == (
        "f = <function <lambda> at 0x?>; obj = <Foo object at 0x?>\n"
        '  File "torch/nn/modules/conv.py", line ?, in forward\n'
        "# File: net.py:? in forward, code: return self.fc(x)\n"
        "x = fxverify_user_passes_helper(y, {'a', 'b', 'c'})\n"
    )


SET_ARG_TRANSFORM = '''
import operator
import torch


def tag_output(gm):
    """Passes a set of strings to a function: printed in hash-seed order unless normalised."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(out):
        tagged = gm.graph.call_function(operator.getitem, ((out.args[0], {"alpha", "beta", "gamma", "delta"}), 0))
    out.args = (tagged,)
    gm.recompile()
    return gm
'''


@pytest.mark.slow
def test_golden_files_are_created_then_byte_stable_across_processes_and_hash_seeds(pytester, monkeypatch):
    pytester.makepyfile(tagging=SET_ARG_TRANSFORM)
    args = ["-p", "no:cacheprovider", "--fxverify", "tagging.py:tag_output", "--fxverify-checks=golden",
            "--fxverify-corpus=edge_conv_bn_head,edge_wrapped_function,edge_nested_outputs"]
    monkeypatch.setenv("PYTHONHASHSEED", "1")
    created = pytester.runpytest_subprocess(*args, "--fxverify-update-golden")
    assert created.ret == 0
    created.stdout.fnmatch_lines([
        "golden files: 3 created, 0 changed, 0 unchanged",
        "  created fxverify_golden/tagging.tag_output/edge_conv_bn_head.golden",
    ])
    files = sorted((pytester.path / "fxverify_golden" / "tagging.tag_output").iterdir())
    first = {p.name: p.read_bytes() for p in files}
    assert "{'alpha', 'beta', 'delta', 'gamma'}" in first["edge_conv_bn_head.golden"].decode()

    monkeypatch.setenv("PYTHONHASHSEED", "2")
    again = pytester.runpytest_subprocess(*args, "--fxverify-update-golden")
    again.stdout.fnmatch_lines(["golden files: 0 created, 0 changed, 3 unchanged"])
    assert {p.name: p.read_bytes() for p in files} == first


def test_export_golden_files_hold_the_signature_and_are_byte_stable_across_processes_and_hash_seeds(
        pytester, monkeypatch):
    args = ["-p", "no:cacheprovider", "--fxverify", f"{ATEN_PASSES}:identity", "--fxverify-checks=golden",
            "--fxverify-corpus=edge_conv_bn_head,edge_running_statistics", "--fxverify-capture=export,export_core"]
    monkeypatch.setenv("PYTHONHASHSEED", "1")
    created = pytester.runpytest_subprocess(*args, "--fxverify-update-golden")
    created.stdout.fnmatch_lines(["golden files: 4 created, 0 changed, 0 unchanged"])
    files = sorted((pytester.path / "fxverify_golden" / "aten_passes.identity").iterdir())
    first = {p.name: p.read_text() for p in files}
    text = first["edge_conv_bn_head.export.golden"]
    assert "captured with export, then transformed" in text and "## code after export" in text
    assert "torch.ops.aten.conv2d.default(" in text  # the ATen graph, not a symbolic trace
    assert re.search(r"range constraints: s\d+ in \[2, 8\]", text), text  # the dynamic batch, as exported
    assert "aten._native_batch_norm_legit_no_training.default" in first["edge_conv_bn_head.export_core.golden"]
    assert "inputs: TreeSpec(tuple" in text and "outputs: *" in text  # ep.module()'s pytree specs

    monkeypatch.setenv("PYTHONHASHSEED", "2")
    again = pytester.runpytest_subprocess(*args, "--fxverify-update-golden")
    again.stdout.fnmatch_lines(["golden files: 0 created, 0 changed, 4 unchanged"])
    assert {p.name: p.read_text() for p in files} == first


def test_an_export_golden_file_catches_a_changed_aten_pass(tmp_path):
    case = load_case("edge_conv_bn_head")
    for fn, update in ((aten_passes.identity, True), (aten_passes.relu_to_clamp, False)):
        transform = Transform.from_callable(fn, spec=SPEC)
        found = Verification(transform, case, capture=case.capture_named("export"), golden_dir=tmp_path,
                             update_golden=update).run("golden")
    assert found.outcome == "failed" and "edge_conv_bn_head.export.golden" in found.message
    assert re.search(r"\+    clamp\w* = torch\.ops\.aten\.clamp", found.message), found.message


def test_golden_dir_option_ini_and_summary_of_changes(pytester):
    common = ["-p", "no:cacheprovider", "--fxverify", f"{Path(mutations.__file__)}:normalize_args",
              "--fxverify-checks=golden", "--fxverify-corpus=edge_conv_bn_head"]
    first = pytester.runpytest(*common, "--fxverify-golden-dir=snapshots", "--fxverify-update-golden")
    assert first.ret == 0
    assert (pytester.path / "snapshots" / "mutations.normalize_args" / "edge_conv_bn_head.golden").is_file()
    pytester.makeini("[pytest]\nfxverify_golden_dir = snapshots\n")
    assert pytester.runpytest(*common).ret == 0
    other = pytester.runpytest(*common[:3], f"{Path(mutations.__file__)}:relu_to_clamp_in_place", *common[4:])
    other.assert_outcomes(skipped=1)  # no golden folder for that transform yet
    other.stdout.fnmatch_lines(["model * golden * changed", "edge_conv_bn_head * skip * graph+code"])


def test_the_update_flag_without_the_golden_check_is_a_usage_error(pytester):
    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", "fxverify.examples:identity",
                                "--fxverify-checks=lint", "--fxverify-update-golden")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*leaves out the golden check: add golden to it*"])


def _baseline_cases() -> list:
    profiles = os.environ.get("FXVERIFY_GOLDEN_PROFILES", "smoke,edge")
    return [entry.name for entry in catalogue.choose(profiles) if not entry.xfail]


REGENERATE = ("check the new code is right, then regenerate corpus/golden with the command in tests/test_golden.py's "
              "docstring and move the pins in .ci/constraints.txt")


def test_the_project_golden_files_were_written_with_the_pinned_versions():
    """The baseline below runs only on the pinned versions: the two must name the same ones."""
    pinned = {name: pins()[name] for name in golden.LIBRARIES}
    written = {path.name: golden._versions(path.read_text()) for path in CORPUS_GOLDEN.rglob("*.golden")}
    assert len(written) > 100, CORPUS_GOLDEN
    assert {name: found for name, found in written.items() if found != pinned} == {}


@tied_to_pins(*golden.LIBRARIES, regenerate=REGENERATE)
@pytest.mark.parametrize("model", _baseline_cases())
def test_corpus_traces_match_the_project_golden_files(model):
    """torch's codegen for a corpus model changed unexpectedly when this fails: see the diff; if the change is
    intended, regenerate corpus/golden as the module docstring says."""
    result = Verification(BASELINE, model, golden_dir=CORPUS_GOLDEN).run("golden")
    assert result.outcome == "passed", result.message
