"""What an fxverify item's node id holds: ``<spec>::fxverify[<subject>-<check>]``, made and read here only.
The spec is a transform's, or ``<option>:<spec>`` for passes inside torch.compile (``backend:my.mod:fn``); the
subject a model, a pattern or the pass set. Under a capture other than the default, the model is labelled with
it, ``resnet18@export``: the summary, the run history and xdist's scheduling keep one row, one timing and one
worker per subject (a model under a capture).

>>> nodeid = f"my.mod:fn::{item_name(model_label('resnet18', 'export'), 'numerics')}"
>>> parse_nodeid(nodeid)
('my.mod:fn', 'resnet18@export', 'numerics')
>>> parse_nodeid("backend:my.mod:fn::fxverify[edge-conv-backend-outputs]")
('backend:my.mod:fn', 'edge-conv', 'backend-outputs')
>>> parse_nodeid("tests/test_x.py::test_y[resnet18]") is None
True
"""

from __future__ import annotations

from fxverify.cases.catalogue import model_label
from fxverify.checks import names

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
    inner = name[len(ITEM_PREFIX):-len(ITEM_SUFFIX)]
    # a check's name may hold hyphens (backend-outputs): the longest registered one the name ends with
    check = max((c for c in names(None) if inner.endswith(f"-{c}")), key=len, default=None)
    if check is None:
        model, _, check = inner.rpartition("-")
        return spec, model, check
    return spec, inner[: -len(check) - 1], check
