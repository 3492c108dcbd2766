"""The versions ``.ci/constraints.txt`` pins, for the few tests that hold on those versions only.

Golden files of generated code and torch's own message texts change with torch, torchvision or
timm releases while fxverify stays right. Such a test is marked :func:`tied_to_pins`: on other
versions it skips, saying which differ and what to regenerate, and nothing else in the suite does.

>>> sorted(pins())[:3]
['coremltools', 'execnet', 'executorch']
>>> off_pins("torch") in ([], [f"torch {metadata.version('torch')} (pinned {pins()['torch']})"])
True
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

CONSTRAINTS = Path(__file__).parents[1] / ".ci" / "constraints.txt"


def pins() -> dict[str, str]:
    """``{package: version}`` of every ``name==version`` line of the constraints file."""
    found = {}
    for line in CONSTRAINTS.read_text().splitlines():
        name, sep, version = line.split("#")[0].strip().partition("==")
        if sep:
            found[name.strip().lower()] = version.strip()
    return found


def off_pins(*packages: str) -> list[str]:
    """``"torch 2.15.0 (pinned 2.14.1)"`` for each of ``packages`` installed at another version."""
    pinned = pins()
    return [f"{name} {metadata.version(name)} (pinned {pinned[name]})" for name in packages
            if metadata.version(name) != pinned[name]]


def tied_to_pins(*packages: str, regenerate: str) -> pytest.MarkDecorator:
    """Skip the test where any of ``packages`` differs from its pin; ``regenerate`` says what to
    update once the new version's output is checked to be right."""
    differ = off_pins(*packages)
    return pytest.mark.skipif(bool(differ), reason=f"expects the output of the pinned {', '.join(packages)}; "
                                                   f"here {', '.join(differ)}: {regenerate}")
