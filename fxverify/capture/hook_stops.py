"""Stopping Inductor where a custom pass runs: each Inductor capture puts :func:`stop_at_hook` in the place of the
pass its hook runs, and takes the graph Inductor's passes have made when :class:`HookReached` comes back.

>>> try:
...     stop_at_hook(None)
... except HookReached:
...     print("stopped")
stopped
"""

from __future__ import annotations

from typing import Any


class HookReached(Exception):
    """Raised by :func:`stop_at_hook` to stop Inductor's passes where a custom pass runs."""


def stop_at_hook(graph: Any) -> None:
    """A stand-in for the pass a hook runs, stopping Inductor's passes there (:class:`HookReached`)."""
    raise HookReached
