"""Keep torch's own debug logging out of what pytest captures while a check item runs.

torch's loggers do not propagate to the root logger as torch sets them up, but a setup that makes
them propagate (a logging configuration routing ``torch`` to the application's handlers; with
``TORCH_TRACE`` set, ``torch.__trace`` keeps its handler and logs every ``trace_structured`` call
at DEBUG) puts dozens of ``DEBUG torch.__trace`` lines under "Captured log call" after each
finding: torch.fx's Interpreter logs one when a node raises, with every file name of the stack.

The filter sits on the root logger's handlers (pytest's capture handlers among them) for the
duration of the item only, and drops records of the ``torch`` logger tree below WARNING there. It
changes no logger's level or propagation: torch's own handlers (the trace file) still get every
record, torch's warnings still reach the report, and the user's own loggers keep what
``--log-level`` and ``caplog`` give them. Raising the level of the ``torch`` loggers instead would
also silence the trace file, and a filter on a logger applies only to records logged there, not to
those propagated from its children.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


class _BelowWarningFromTorch(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        from_torch = record.name == "torch" or record.name.startswith("torch.")
        return not from_torch or record.levelno >= logging.WARNING


_FILTER = _BelowWarningFromTorch()


@contextlib.contextmanager
def torch_debug_kept_out() -> Iterator[None]:
    """While it lasts, the root logger's handlers drop torch's records below WARNING."""
    handlers = list(logging.getLogger().handlers)
    for handler in handlers:
        handler.addFilter(_FILTER)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(_FILTER)
