"""Shared setup of fxverify's own tests."""

# pytester's in-process runs drop modules first imported inside a run; import
# fxverify's modules up front so exception classes stay the same objects
# across runs (an `except FxVerifyError` must match what a check raised).
import fxverify.api  # noqa: F401
import fxverify.examples  # noqa: F401
import fxverify.pytest_items  # noqa: F401
