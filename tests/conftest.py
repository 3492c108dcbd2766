"""Shared setup of fxverify's own tests."""

# pytester's in-process runs drop the modules first imported inside a run, and
# torch cannot import some of its modules twice (operator libraries register
# once; dynamo and the meta device are imported lazily by the checks). Import
# fxverify's modules and run every check once up front, in this process only
# (no determinism server: cross_process is not set), so all of them are loaded
# before any in-process run, and exception classes stay the same objects across runs;
# under every capture too (torch.export imports inductor's caches, which register once).
import fxverify.api
import fxverify.cases.case
import fxverify.examples
import fxverify.plugin.items

fxverify.api.Verification(fxverify.examples.identity, "edge_conv_bn_head").run_all()
_CASE = fxverify.cases.case.load_case("edge_conv_bn_head")
# Not the Inductor captures: no in-process run uses them (the compile options' runs are subprocesses), and
# loading Inductor's passes costs every worker seconds; nor pt2e and the Edge captures, which need torchao and
# ExecuTorch (extras; their tests import them when collected, before any in-process run).
for _capture in fxverify.core.captures.capture_names()[1:]:
    if not _capture.startswith("inductor") and _capture not in ("pt2e", "edge", "edge_pt2e"):
        fxverify.api.Verification(lambda gm: gm, _CASE, capture=_CASE.capture_named(_capture)).run_all()
