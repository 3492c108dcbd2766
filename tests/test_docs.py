"""The docs against the code: the check tables against the check registry, the options page against the
options table, and the counts the pages quote against the catalogue, so that none of them drifts."""

from __future__ import annotations

import re
from itertools import takewhile
from pathlib import Path

import pytest

import fxverify.strategies as fxs
from fxverify.cases.catalogue import select
from fxverify.checks import MODEL, NAMES, REGISTRY, names, not_applicable
from fxverify.core import captures
from fxverify.plugin.options import FLAG, OPTIONS

ROOT = Path(__file__).parents[1]
README_LIMIT = 8000  # characters


def page(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def words(name: str) -> str:
    """The page with every run of whitespace as one space: a quoted phrase may wrap anywhere."""
    return " ".join(page(name).split())


def table(text: str, after: str) -> list[list[str]]:
    """The cells of each body row of the first Markdown table after the line ``after``."""
    lines = text.splitlines()
    first = next(i for i in range(lines.index(after), len(lines)) if lines[i].startswith("|"))
    rows = list(takewhile(lambda line: line.startswith("|"), lines[first:]))[2:]  # less header and rule
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


@pytest.mark.parametrize(("name", "heading"), [("README.md", "## Checks"), ("docs/checks.md", "# What is checked")])
def test_each_check_table_lists_every_registered_check_in_order(name, heading):
    assert [row[0] for row in table(page(name), heading)] == [f"`{check}`" for check in NAMES]


def test_the_checks_page_lists_every_check_of_the_other_subjects_in_order():
    """docs/checks.md's second table holds the checks that take a pattern, a backend or a pass set, as registered."""
    others = [spec.name for spec in REGISTRY if spec.subject != MODEL]
    assert [row[0] for row in table(page("docs/checks.md"), "## Checks inside torch.compile")] == \
        [f"`{check}`" for check in others]


def test_the_options_page_lists_every_option_as_the_table_declares_it():
    """docs/options.md is kept in step with OPTIONS: flag, ini name and default of each option, in order."""
    rows = table(page("docs/options.md"), "# Options")
    assert [row[0].strip("`").split()[0] for row in rows] == [o.flag for o in OPTIONS]
    for row, option in zip(rows, OPTIONS):
        assert row[0].strip("`") == f"{option.flag} {option.metavar}".strip(), row
        assert row[1] == (f"`{option.name}`" if option.ini else "(command line only)"), row
        shown = option.describe_default()
        assert row[2] == (shown if option.kind == FLAG or not option.default else f"`{shown}`"), row


def test_the_checks_option_lists_every_registered_check():
    (row,) = [row for row in table(page("docs/options.md"), "# Options") if row[0] == "`--fxverify-checks CHECKS`"]
    assert re.findall(r"`([a-z_,-]+)`", row[3])[0] == ",".join(names(None))


def test_the_readme_quotes_the_catalogue_as_it_is_and_fits_its_limit():
    default, zoo = select("default"), select("default", exclude="edge,layers")
    edge, layers = select("edge"), select("layers")
    assert len(default) == len(zoo) + len(edge) + len(layers)  # the sentence adds them up
    traits = captures.spec(captures.DEFAULT_CAPTURE).traits  # the quick start's capture
    collected = [name for name in NAMES if not_applicable(name, traits, captures.DEFAULT_CAPTURE) is None]
    assert (f"{len(default)} entries: {len(zoo)} models, {len(edge)} edge cases and {len(layers)} layer variants, "
            f"each under the {len(collected)} of {len(NAMES)} checks that apply to symbolic traces") in words("README.md")
    assert len(page("README.md")) < README_LIMIT


def test_the_corpus_page_quotes_the_catalogue_as_it_is():
    text, zoo = words("docs/corpus.md"), select("default", exclude="edge,layers")
    by_source = {source: sum(e.source == source for e in zoo) for source in ("torchvision", "timm")}
    assert f"the {len(zoo)} models of the zoo survey ({by_source['torchvision']} torchvision, {by_source['timm']} timm:" \
        in text
    assert f"; {sum(e.tracer == 'timm' for e in zoo)} traced with timm's tracer" in text
    assert f"the {len(select('large_input'))} entries of `full`" in text
    smoke = re.search(r"at most (\d+) fast models", text)
    assert smoke and len(select("smoke")) <= int(smoke.group(1))


def test_the_strategies_page_counts_the_operator_catalogue():
    assert f"`fxs.OPS`, {len(fxs.OPS)} entries in {len(fxs.FAMILIES)} families" in words("docs/strategies.md")


def test_ci_installs_and_tests_as_the_readme_says():
    """README's test command is what `.ci/run` runs (its install quietly), so CI tests what a reader runs."""
    install, test = re.search(r"\n    (pip install -c .*) && (pytest .*)\n", page("README.md")).groups()
    script = page(".ci/run").splitlines()
    assert install.replace("pip install ", "pip install -q ") in script and test in script
