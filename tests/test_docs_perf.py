"""docs/performance.md as a reference: one row a benchmark script, each with its command and date, and no
cell too long to read (the page once kept every past figure in its table, 5,000 characters a cell)."""

from __future__ import annotations

import re

from tests.test_docs import ROOT, page, table

PERFORMANCE = "docs/performance.md"
CELL_LIMIT = 400  # characters
BENCHMARKS = ROOT / "benchmarks"
PARTS = {"strategies_nnsmith.py": "strategies.py"}  # a script another benchmark runs, its figures in that row


def benchmark_rows() -> list[list[str]]:
    return table(page(PERFORMANCE), "# Performance")


def scripts() -> set[str]:
    """The benchmark scripts: files of benchmarks/ that run as a program."""
    return {path.name for path in BENCHMARKS.glob("*.py") if '__name__ == "__main__"' in path.read_text()}


def test_no_cell_of_the_performance_page_is_longer_than_its_limit():
    cells = [cell for line in page(PERFORMANCE).splitlines() if line.startswith("|")
             for cell in line.strip().strip("|").split("|")]
    long = [cell.strip()[:80] + "..." for cell in cells if len(cell.strip()) > CELL_LIMIT]
    assert cells and not long, long


def test_each_benchmark_script_has_one_row_with_its_command_and_date():
    rows = benchmark_rows()
    named = [row[0].strip("`") for row in rows]
    assert len(named) == len(set(named)), named
    for part, runner in PARTS.items():
        assert part in (BENCHMARKS / runner).read_text(), (part, runner)
    assert set(named) == scripts() - set(PARTS)
    for row in rows:
        assert len(row) == 5 and all(row), row
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", row[4]) and "`" in row[4], row  # a command and a date
