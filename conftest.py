"""Project-wide pytest setup for fxverify's own tests."""

from fxverify.plugin import share_cores_between_workers

pytest_plugins = ["pytester"]


def pytest_configure(config):
    share_cores_between_workers(config)
