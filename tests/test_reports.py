"""The JSON and HTML reports: records, graph pictures (cropping, highlighting,
escaping, Graphviz missing), the plugin end to end with and without xdist, and
the page rendered in headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from torch import fx, nn

import fxverify
from fxverify.core.results import CheckResult
from fxverify.core.transform import Transform
from fxverify.reports import records_from_results
from fxverify.reports.figures import failure_figures
from fxverify.reports.graph_picture import INSTALL_HINT, GraphvizMissing, crop, graph_dot, render_svg
from fxverify.reports.html import render_html
from fxverify.reports.records import FIGURES, json_report, record
from tests import mutations

MUTATIONS = Path(__file__).with_name("mutations.py")
BN_FOLD_BUG = f"{MUTATIONS}:bn_fold_ignores_running_mean"
RUN = ("-p", "no:cacheprovider", "--fxverify", BN_FOLD_BUG, "--fxverify-corpus=edge_conv_bn_head",
       "--fxverify-checks=lint,numerics,gradients,cuda")
HOSTILE = "<script>alert(1)</script>"
needs_graphviz = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")


class Chain(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(30):
            x = torch.relu(x) + 1
        return x


class HostileBuffer(nn.Module):
    """A buffer whose name is markup: it shows up in get_attr targets, labels and code."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer(HOSTILE, torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * getattr(self, HOSTILE)


def doubles_output(gm: fx.GraphModule) -> fx.GraphModule:
    output = next(iter(gm.graph.find_nodes(op="output")))
    with gm.graph.inserting_before(output):
        doubled = gm.graph.call_function(torch.mul, (output.args[0], 2.0))
    output.args = (doubled,)
    gm.recompile()
    return gm


# -- pictures ----------------------------------------------------------------
def test_a_large_graph_is_cropped_to_the_neighbourhood_of_the_focus():
    graph = fx.symbolic_trace(Chain()).graph
    shown = crop(graph, "relu_15", hops=2)
    assert shown.names == ["relu_14", "add_14", "relu_15", "add_15", "relu_16"]
    assert shown.boundary == {"relu_14", "relu_16"}
    assert shown.describe() == "5 of 62 nodes around %relu_15"
    assert len(crop(graph, "relu_15", hops=10, max_nodes=5).names) == 5
    assert crop(graph, None, max_nodes=4).names == ["x", "relu", "add", "relu_1"]


@needs_graphviz
def test_the_focus_node_is_highlighted_and_hostile_names_are_escaped():
    gm = fx.symbolic_trace(HostileBuffer())
    attr = next(n for n in gm.graph.nodes if n.op == "get_attr")
    svg = render_svg(graph_dot(gm, crop(gm.graph, "mul"), changed={attr.name}, name="p1"))
    assert re.search(r'<g id="p1_node\d+" class="node fxnode focus">\s*<title>mul</title>', svg)
    assert re.search(r'class="node fxnode changed">\s*<title>' + attr.name, svg)
    assert HOSTILE not in svg and "&lt;script&gt;alert(1)&lt;/script&gt;" in svg


def test_without_graphviz_the_figures_say_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` anywhere
    gm = fx.symbolic_trace(Chain())
    with pytest.raises(GraphvizMissing, match="apt-get install graphviz"):
        render_svg(graph_dot(gm))
    v = fxverify.Verification(mutations.bn_fold_ignores_running_mean, "edge_conv_bn_head")
    result = v.run("numerics")
    figures = failure_figures(v.subject, result)
    assert figures["note"] == INSTALL_HINT and figures["before_svg"] is None and figures["code_after"]
    page = render_html([record(result, figures=figures)])
    assert "<svg" not in page and "Graphviz&#x27;s `dot` program is not on PATH" in page
    assert "code before" in page  # the code diff does not need Graphviz


# -- records and JSON ---------------------------------------------------------
def test_records_carry_the_finding_as_fields_not_parsed_from_the_message():
    given = {"result_node": "relu", "original_node": "relu", "op": "call_function", "dtype": torch.float64}
    found = record(CheckResult("numerics", "m", "t", "failed", "x\n  first node: %conv2 ...", divergence=given,
                               finding="outputs differ", input="b2-3x8x8", where="output[0]"))
    assert found["divergence"] == {**given, "dtype": "torch.float64"}  # JSON-ready, from the field, not the text
    assert (found["finding"], found["input"], found["where"]) == ("outputs differ", "b2-3x8x8", "output[0]")
    assert record(CheckResult("lint", "m", "t", "failed", "no node here"))["divergence"] is None


def test_json_report_without_pytest_has_a_header_and_no_figures():
    results = [CheckResult("lint", "m", "t", "passed"), CheckResult("numerics", "m", "t", "failed", "bad",
                                                                     max_abs=2.5, max_rel=0.5, repro="r/x.py")]
    records = records_from_results(results)
    records[1][FIGURES] = {"before_svg": "<svg/>"}
    report = json.loads(json.dumps(json_report(records)))
    assert set(report["header"]["versions"]) == {"python", "fxverify", "torch", "torchvision", "timm"}
    assert report["header"]["versions"]["torch"] == torch.__version__.split("+")[0]
    assert [r["outcome"] for r in report["records"]] == ["passed", "failed"]
    assert report["records"][1]["max_abs"] == 2.5 and report["records"][1]["repro"] == "r/x.py"
    assert all(FIGURES not in r for r in report["records"])


# -- HTML -----------------------------------------------------------------------
def test_every_model_derived_string_is_escaped():
    case = fxverify.case_from_module(HOSTILE, HostileBuffer, [(2, 3)])
    transform = Transform.from_callable(doubles_output, spec='<img src=x onerror="alert(2)">')
    v = fxverify.Verification(transform, case)
    results = [v.run("lint"), v.run("numerics")]
    assert [r.outcome for r in results] == ["passed", "failed"]
    page = render_html(records_from_results(results, v.subject))
    assert HOSTILE not in page and "<img" not in page and "alert(2)\"" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    # self-contained: no scripts, nothing fetched
    assert "<script" not in page.lower() and not re.search(r'\b(src|href)="(?!#)', page)


# -- the plugin, end to end -------------------------------------------------------
def _check_report(json_path: Path, html_path: Path) -> None:
    report = json.loads(json_path.read_text())
    records = {r["check"]: r for r in report["records"]}
    assert list(records) == ["lint", "numerics", "gradients", "cuda"]
    assert {r["model"] for r in records.values()} == {"edge_conv_bn_head"}
    assert {c: r["outcome"] for c, r in records.items() if r["outcome"] != "passed"} == {
        "numerics": "failed", "gradients": "failed", "cuda": "failed" if torch.cuda.is_available() else "skipped"}
    numerics = records["numerics"]
    assert numerics["max_abs"] > 1e-3 and numerics["divergence"]["result_node"] == "relu"
    assert all(r["duration"] > 0 and r["nodeid"].endswith(f"-{c}]") for c, r in records.items())
    page = html_path.read_text()
    assert page.count('<section class="failure"') == 2 + torch.cuda.is_available()
    assert 'class="failed" data-model="edge_conv_bn_head" data-check="numerics"' in page
    if shutil.which("dot"):  # the figure, the first divergent node in focus
        assert re.search(r'class="node fxnode focus">\s*<title>relu</title>', page)
    else:  # no figure: the page says how to get one (test_the_focus_node_is_highlighted_... skips, saying why)
        assert "<svg" not in page and "Graphviz&#x27;s `dot` program is not on PATH" in page
    assert 'class="diff"' in page and "self.bn1(conv1)" in page  # the code diff


def test_reports_from_a_pytest_run(pytester):
    result = pytester.runpytest(*RUN, "--fxverify-json=out/r.json", "--fxverify-html=out/r.html")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["fxverify: wrote */out/r.json", "fxverify: wrote */out/r.html"])
    _check_report(pytester.path / "out/r.json", pytester.path / "out/r.html")


@pytest.mark.slow
def test_reports_under_xdist_are_written_once_by_the_controller(pytester):
    pytester.makeini("[pytest]\nfxverify_json = ini/r.json\nfxverify_html = ini/r.html\n")
    result = pytester.runpytest(*RUN, "-n", "2")
    assert result.ret == 1
    assert len([line for line in result.stdout.lines if line.startswith("fxverify: wrote")]) == 2
    _check_report(pytester.path / "ini/r.json", pytester.path / "ini/r.html")


# -- in a real browser --------------------------------------------------------------
class _Elements(HTMLParser):
    """Start tags with their attributes, from Chromium's serialised DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))


@pytest.fixture(scope="module")
def failure_page(tmp_path_factory) -> Path:
    v = fxverify.Verification(mutations.bn_fold_ignores_running_mean, "edge_conv_bn_head")
    results = v.run_all(["lint", "numerics", "purity"])
    page = tmp_path_factory.mktemp("report") / "report.html"
    page.write_text(render_html(records_from_results(results, v.subject)))
    return page


@needs_graphviz
@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed (apt-get install chromium)")
def test_the_report_renders_in_headless_chromium(failure_page):
    profile = failure_page.parent / "chromium-profile"
    browser = ["chromium", "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={profile}"]
    dom = subprocess.run([*browser, "--dump-dom", failure_page.as_uri()], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    parser = _Elements()
    parser.feed(dom)
    cells = {(a.get("data-model"), a.get("data-check")): a["class"] for t, a in parser.tags if t == "td" and "data-check" in a}
    assert cells == {("edge_conv_bn_head", "lint"): "passed", ("edge_conv_bn_head", "numerics"): "failed",
                     ("edge_conv_bn_head", "purity"): "passed"}
    assert sum(t == "svg" for t, _ in parser.tags) == 2
    assert [a["class"] for t, a in parser.tags if "focus" in a.get("class", "")] == ["node fxnode focus"] * 2
    assert any(t == "table" and a.get("class") == "diff" for t, a in parser.tags)
    screenshot = failure_page.with_suffix(".png")
    subprocess.run([*browser, f"--screenshot={screenshot}", "--window-size=1400,2200", failure_page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    assert screenshot.stat().st_size > 10_000
    print(f"\nreport: {failure_page}\nscreenshot: {screenshot}")  # for a person to look at (pytest -s)


def test_every_report_option_has_a_writer_and_every_writer_an_option():
    """A report format is one row of fxverify.reports.FORMATS and one REPORT row of the options table."""
    from fxverify.plugin.options import OPTIONS, REPORT
    from fxverify.reports import FORMATS

    assert {o.name.removeprefix("fxverify_") for o in OPTIONS if o.kind == REPORT} == set(FORMATS) == {"json", "html"}
