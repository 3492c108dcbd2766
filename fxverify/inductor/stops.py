"""Stopping Inductor where a custom pass runs: a capture puts :func:`stop_at_hook` in the place of the pass its
hook runs, and takes the graph Inductor's passes have made when :class:`HookReached` comes back
(:func:`stopped_at` for the hooks ``torch._inductor.config`` holds in pairs, the joint-graph and post-grad ones).

>>> try:
...     stop_at_hook(None)
... except HookReached:
...     print("stopped")
stopped
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fxverify.inductor.hooks import GRAPH_HOOKS, Hook


class HookReached(Exception):
    """Raised by :func:`stop_at_hook` to stop Inductor's passes where a custom pass runs."""


def stop_at_hook(graph: Any) -> None:
    """A stand-in for the pass a hook runs, stopping Inductor's passes there (:class:`HookReached`)."""
    raise HookReached


def stopped_at(hook: Hook, run: Callable[[], Any]) -> None:
    """``run()`` with ``hook`` (one of :data:`~fxverify.inductor.hooks.GRAPH_HOOKS`) stopping it, the other hook of its
    stage unset; AssertionError where it never calls the hook.

    >>> from fxverify.inductor.hooks import JOINT_PRE
    >>> stopped_at(JOINT_PRE, lambda: None)
    Traceback (most recent call last):
    AssertionError: Inductor's passes did not call joint_custom_pre_pass
    """
    from torch._inductor import config

    with config.patch({other.name: stop_at_hook if other == hook else None
                       for other in GRAPH_HOOKS if other.stage == hook.stage}):
        try:
            run()
        except HookReached:
            return
    raise AssertionError(f"Inductor's passes did not call {hook.name}")
