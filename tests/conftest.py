"""Shared setup of fxverify's own tests."""

# pytester's in-process runs drop the modules first imported inside a run, and
# torch cannot import some of its modules twice (operator libraries register
# once; dynamo and the meta device are imported lazily by the checks). Import
# fxverify's modules and run every check once up front, in this process only
# (no determinism server: cross_process is not set), so all of them are loaded
# before any in-process run, and exception classes stay the same objects across runs.
import fxverify.api
import fxverify.examples
import fxverify.plugin.items

fxverify.api.Verification(fxverify.examples.identity, "edge_conv_bn_head").run_all()
