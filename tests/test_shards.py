"""A nightly across machines: shards balanced by the durations of an earlier run's JSON report, and
the shards' reports merged into the report and summary one run of the whole selection gives."""

from __future__ import annotations

import copy
import json
import random
import re
from pathlib import Path
from typing import Any

import pytest

from fxverify.cases.catalogue import CorpusEntry, InputSpec, select, shard
from fxverify.plugin.order import balanced_shards, estimated_seconds, recorded_seconds
from fxverify.reports.merge import main, merge_reports, summary
from fxverify.reports.records import ReportError, read_json

BN_FOLD_BUG = f"{Path(__file__).with_name('mutations.py')}:bn_fold_ignores_running_mean"  # fails numerics on BN models
CORPUS = "edge_conv_bn_head,edge_static_config_flow,edge_custom_leaf,edge_nested_outputs,edge_data_dependent_flow"


def _loads(parts: list[list[CorpusEntry]], seconds: dict[str, float]) -> list[float]:
    return [sum(seconds[e.name] for e in part) for part in parts]


# -- balancing ----------------------------------------------------------------------
@pytest.mark.parametrize("count", [2, 3, 8])
def test_balanced_shards_partition_the_selection_exactly_in_catalogue_order_and_agree_everywhere(count):
    entries = select("full")
    rng = random.Random(count)
    seconds = {e.name: rng.lognormvariate(0, 1.5) for e in entries}
    parts = balanced_shards(entries, count, seconds)
    names = [e.name for part in parts for e in part]
    assert sorted(names) == sorted(e.name for e in entries) and len(names) == len(set(names))
    position = {e.name: i for i, e in enumerate(entries)}
    assert all([position[e.name] for e in part] == sorted(position[e.name] for e in part) for part in parts)
    shuffled = dict(sorted(seconds.items(), key=lambda _: rng.random()))  # another machine read the file otherwise
    assert balanced_shards(entries, count, shuffled) == parts
    ties = balanced_shards(entries, count, dict.fromkeys(seconds, 1.0))  # equal durations: ties by catalogue order
    assert ties == balanced_shards(entries, count, dict.fromkeys(seconds, 1.0))
    assert max(map(len, ties)) - min(map(len, ties)) <= 1


def test_balanced_shards_beat_round_robin_on_skewed_durations():
    entries = select("default")
    # every third model is a slow one: round-robin over three shards piles them all onto one
    seconds = {e.name: 300.0 if i % 3 == 0 else 5.0 for i, e in enumerate(entries)}
    balanced = _loads(balanced_shards(entries, 3, seconds), seconds)
    round_robin = _loads([shard(entries, i, 3) for i in (1, 2, 3)], seconds)
    assert max(round_robin) > 3 * min(round_robin)
    assert max(balanced) - min(balanced) <= max(seconds.values())  # greedy's bound: one model apart at most
    assert max(balanced) < 0.5 * max(round_robin)


def test_models_without_a_duration_get_the_median_of_their_source_and_still_partition():
    entries = [CorpusEntry(name, source=source, factory="torch.nn:Identity", inputs=(InputSpec((2, 4)),))
               for name, source in [("a", "timm"), ("b", "timm"), ("c", "timm"), ("e1", "edge"), ("e2", "edge")]]
    report = {"records": [{"model": "a", "duration": 10.0}, {"model": "a@export", "duration": 20.0},
                          {"model": "b", "duration": 50.0}, {"model": "e1", "duration": 0.5},
                          {"model": "gone_from_the_catalogue", "duration": 99.0}, {"model": "b", "duration": None}]}
    seconds = recorded_seconds(report)
    assert seconds == {"a": 30.0, "b": 50.0, "e1": 0.5, "gone_from_the_catalogue": 99.0}
    assert estimated_seconds(entries, seconds) == {"a": 30.0, "b": 50.0, "c": 40.0, "e1": 0.5, "e2": 0.5}
    assert estimated_seconds(entries, {}) == dict.fromkeys([e.name for e in entries], 1.0)
    parts = balanced_shards(entries, 2, seconds)
    assert [[e.name for e in part] for part in parts] == [["b", "e1", "e2"], ["a", "c"]]  # 51 s and 70 s


def _collected(pytester: pytest.Pytester, *args: str) -> list[str]:
    result = pytester.runpytest("-p", "no:cacheprovider", "--collect-only", "-q", "--fxverify", "fxverify.examples:identity",
                                "--fxverify-checks=lint", "--fxverify-order=catalogue", *args)
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    return [m.group(1) for line in result.outlines if (m := re.search(r"fxverify\[(\w+)-lint\]", line))]


def test_the_durations_file_balances_the_shards_and_without_it_they_stay_round_robin(pytester):
    entries = select("smoke,edge")
    seconds = {e.name: 60.0 if e.source != "edge" else 0.1 for e in entries}
    pytester.path.joinpath("last.json").write_text(json.dumps({
        "header": {"schema": 1}, "records": [{"model": name, "duration": s} for name, s in seconds.items()]}))
    for i in (1, 2):
        plain = _collected(pytester, "--fxverify-corpus=smoke,edge", f"--fxverify-shard={i}/2")
        assert plain == [e.name for e in shard(entries, i, 2)]
        balanced = _collected(pytester, "--fxverify-corpus=smoke,edge", f"--fxverify-shard={i}/2",
                              "--fxverify-durations=last.json")
        assert balanced == [e.name for e in balanced_shards(entries, 2, seconds)[i - 1]] != plain
    result = pytester.runpytest("-p", "no:cacheprovider", "--fxverify", "fxverify.examples:identity",
                                "--fxverify-shard=1/2", "--fxverify-durations=missing.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--fxverify-durations (ini fxverify_durations): cannot read */missing.json*"
                                 "give a report --fxverify-json wrote*"])


# -- merging: refusals ------------------------------------------------------------------
def _shard(index: int, count: int, models: list[str], selection: list[str]) -> dict[str, Any]:
    run = {"checks": ["lint"], "contracts": {"my:pass": "strict (default)"}, "shard": f"{index}/{count}",
           "selection": selection, "models": models}
    return {"header": {"schema": 1, "created": "", "versions": {"fxverify": "0.1.0", "torch": "2.4.0"},
                       "random_graphs": [], "run": run},
            "records": [{"transform": "my:pass", "model": m, "check": "lint", "outcome": "passed", "changed": []}
                        for m in models]}


def _two_shards() -> dict[str, dict[str, Any]]:
    return {"s1.json": _shard(1, 2, ["a", "c"], ["a", "b", "c"]), "s2.json": _shard(2, 2, ["b"], ["a", "b", "c"])}


def test_merging_two_shards_gives_the_records_and_summary_of_the_whole_selection():
    merged = merge_reports(_two_shards())
    assert [r["model"] for r in merged["records"]] == ["a", "b", "c"]
    assert merged["header"]["run"]["shard"] is None and merged["header"]["run"]["models"] == ["a", "b", "c"]
    assert merged["header"]["versions"] == {"fxverify": "0.1.0", "torch": "2.4.0"}  # the shards', not this machine's
    table = summary(merged)
    assert table.splitlines()[2:5] == ["a      pass  no-op", "b      pass  no-op", "c      pass  no-op"]
    assert "WARNING: my:pass changed the graph or parameters of none of the 3 models" in table


def test_a_merged_summary_gives_a_backends_items_their_own_block():
    reports = _two_shards()
    for path, report in reports.items():
        report["header"]["run"]["checks"] = ["lint", "backend-outputs"]
        report["header"]["run"]["contracts"]["my:backend"] = "backend"
        report["records"] += [{"transform": "my:backend", "model": "b", "check": "backend-outputs",
                               "outcome": "failed", "changed": None}] if path == "s2.json" else []
    blocks = summary(merge_reports(reports)).split("\n\n")
    assert blocks[1].splitlines() == ["backend my:backend", "subject  backend-outputs", "b        FAIL"]


def _altered(path: str, change) -> dict[str, dict[str, Any]]:
    reports = copy.deepcopy(_two_shards())
    change(reports[path])
    return reports


@pytest.mark.parametrize(("reports", "error"), [
    (_altered("s2.json", lambda r: r["header"]["versions"].update(torch="2.5.0")),
     "s1.json and s2.json are of different versions (torch: '2.4.0' against '2.5.0'): run every shard with the same"),
    (_altered("s2.json", lambda r: r["header"]["versions"].update(fxverify="0.2.0")),
     "different versions (fxverify: '0.1.0' against '0.2.0')"),
    (_altered("s2.json", lambda r: r["header"]["run"].update(contracts={"other:pass": "strict (default)"})),
     "are of different transforms (my:pass: 'strict (default)' against None; other:pass: None against"),
    (_altered("s2.json", lambda r: r["header"]["run"].update(checks=["numerics"])), "different checks"),
    (_altered("s2.json", lambda r: r["header"]["run"].update(shard="1/2")),
     r"shard 1/2 is given twice (s1.json and s2.json): give each shard once"),
    (_altered("s2.json", lambda r: r["header"]["run"].update(shard="2/3")), "shards of different counts (2, 3)"),
    (_altered("s2.json", lambda r: r["header"]["run"].update(models=["b", "c"])),
     "the shards overlap: 1 models in two shards (c in s1.json and s2.json), 0 in none (): they were sharded "
     "differently. Give every shard the same --fxverify-durations file"),
    (_altered("s2.json", lambda r: r["header"].update(run=None)), "s2.json is not the report of a shard"),
    (_altered("s2.json", lambda r: r["records"].append({**r["records"][0], "model": "a"})),
     "the item a-lint of my:pass is in two of s1.json, s2.json"),
])
def test_merging_refuses_reports_that_are_not_the_shards_of_one_run(reports, error):
    with pytest.raises(ReportError) as raised:
        merge_reports(reports)
    assert error in str(raised.value)


def test_merging_refuses_a_missing_shard_and_a_file_that_is_no_report(tmp_path, capsys):
    with pytest.raises(ReportError, match="shard 2/2 is missing: give the reports of all 2 shards"):
        merge_reports({"s1.json": _two_shards()["s1.json"]})
    (tmp_path / "junit.json").write_text("[1, 2]")
    with pytest.raises(SystemExit) as raised:
        main([str(tmp_path / "junit.json"), "--json", str(tmp_path / "all.json")])
    assert raised.value.code == 2 and not (tmp_path / "all.json").exists()
    assert "junit.json is not an fxverify report (no header and records)" in capsys.readouterr().err
    (tmp_path / "old.json").write_text(json.dumps({"header": {"schema": 0}, "records": []}))
    with pytest.raises(ReportError, match="has schema 0, this fxverify reads 1: write it again"):
        read_json(tmp_path / "old.json")


# -- end to end ---------------------------------------------------------------------------
def _terminal_summary(result: pytest.RunResult) -> str:
    lines = result.outlines
    start = next(i for i, line in enumerate(lines) if "fxverify summary" in line) + 1
    end = next(i for i, line in enumerate(lines) if line.startswith("fxverify: wrote"))
    return "\n".join(lines[start:end]).strip()


def _matrices(page: str) -> list[str]:
    """The HTML's summary: each transform's warning and matrix (not its failures' pictures)."""
    return re.findall(r'<h2>transform .*?</table>', page, re.DOTALL)


def _without_durations(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "duration"} for r in records]


def test_two_shards_run_apart_and_merged_give_the_summary_and_failures_of_one_run(pytester, capsys):
    args = ["-p", "no:cacheprovider", "--fxverify", BN_FOLD_BUG, "--fxverify", "fxverify.examples:identity",
            f"--fxverify-corpus={CORPUS}", "--fxverify-checks=lint,numerics"]
    one = pytester.runpytest(*args, "--fxverify-json=one.json", "--fxverify-html=one.html")
    one.assert_outcomes(passed=14, failed=2, xfailed=4)
    for i in (1, 2):
        pytester.runpytest(*args, f"--fxverify-shard={i}/2", "--fxverify-durations=one.json", f"--fxverify-json=s{i}.json")
    shards = [read_json(pytester.path / f"s{i}.json") for i in (1, 2)]
    assert all(s["records"] for s in shards)  # both shards ran something

    capsys.readouterr()  # the runs' own output
    assert main([str(pytester.path / "s1.json"), str(pytester.path / "s2.json"), "--json", str(pytester.path / "all.json"),
                 "--html", str(pytester.path / "all.html")]) == 1  # some items failed
    printed = capsys.readouterr().out
    assert printed.split("fxverify: wrote")[0].strip() == _terminal_summary(one)
    assert "WARNING: fxverify.examples:identity changed the graph or parameters of none of the 4 models" in printed

    single, merged = read_json(pytester.path / "one.json"), read_json(pytester.path / "all.json")
    assert _without_durations(merged["records"]) == _without_durations(single["records"])
    failed = {(r["model"], r["check"]) for r in merged["records"] if r["outcome"] == "failed"}
    assert failed == {("edge_conv_bn_head", "numerics"), ("edge_custom_leaf", "numerics")}
    assert merged["header"]["run"] == single["header"]["run"]
    assert _matrices((pytester.path / "all.html").read_text()) == _matrices((pytester.path / "one.html").read_text())
