"""What an fxverify item's node id holds: ``<transform spec>::fxverify[<model>-<check>]``, made
and read here only. Under a capture other than the default, the model is labelled with it,
``resnet18@export``: the summary, the run history and xdist's scheduling keep one row, one timing
and one worker per model and capture.

>>> nodeid = f"my.mod:fn::{item_name(model_label('resnet18', 'export'), 'numerics')}"
>>> parse_nodeid(nodeid)
('my.mod:fn', 'resnet18@export', 'numerics')
>>> parse_nodeid("tests/test_x.py::test_y[resnet18]") is None
True
"""

from __future__ import annotations

from fxverify.cases.catalogue import model_label

__all__ = ["item_name", "model_label", "parse_nodeid"]

ITEM_PREFIX = "fxverify["
ITEM_SUFFIX = "]"


def item_name(model: str, check: str) -> str:
    """The name of the item of ``check`` on ``model`` (its transform is its parent)."""
    return f"{ITEM_PREFIX}{model}-{check}{ITEM_SUFFIX}"


def parse_nodeid(nodeid: str) -> tuple[str, str, str] | None:
    """``(transform spec, model, check)`` from an fxverify item's node id, else None."""
    spec, sep, name = nodeid.rpartition("::")
    if not sep or not name.startswith(ITEM_PREFIX) or not name.endswith(ITEM_SUFFIX):
        return None
    model, _, check = name[len(ITEM_PREFIX):-len(ITEM_SUFFIX)].rpartition("-")
    return spec, model, check
