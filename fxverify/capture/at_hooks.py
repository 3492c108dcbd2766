"""The base of the captures the Inductor hooks table lists (:data:`fxverify.inductor.hooks.CAPTURES`): each is one
row of it, by name (its registry row makes it so: ``CaptureSpec.by_name``), and reads its hook and graphs there.

>>> import dataclasses
>>> @dataclasses.dataclass(frozen=True)
... class AtPreGrad(AtHook):
...     name: str = "inductor_pre_grad"
...     stages = ("pre_grad",)
>>> AtPreGrad().at.hook.name
'pre_grad_custom_pass'
>>> AtPreGrad("inductor")
Traceback (most recent call last):
ValueError: inductor is a capture of post_grad_custom_pre_pass in a plain compile: not an AtPreGrad
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from fxverify.capture.base import Capture
from fxverify.inductor import hooks


@dataclasses.dataclass(frozen=True)
class AtHook(Capture):
    """A capture of the graphs a hook receives: the row ``name`` of the hooks table (:attr:`at`), which must be at one of
    the ``stages`` the class reaches, in a frozen compile where it ``freezes``, else in a plain one. A subclass
    declares the field ``name: str`` with the capture it makes by default (a dataclass field shadowing
    :attr:`Capture.name`)."""

    stages: ClassVar[tuple[hooks.Stage, ...]] = ("pre_grad", "joint", "freezing", "post_grad")  # those it reaches
    freezes: ClassVar[bool] = False  # whether it captures a frozen compile (config.freezing=True)

    def __post_init__(self) -> None:
        if self.at.hook.stage not in self.stages or self.at.frozen != self.freezes:
            raise ValueError(f"{self.name} is a capture of {self.at.hook.name} in a "
                             f"{'frozen' if self.at.frozen else 'plain'} compile: not an {type(self).__name__}")

    @property
    def at(self) -> hooks.HookCapture:
        """Its row of the hooks table: the hook, whether it takes the training graphs, whether the compile freezes."""
        return hooks.capture(self.name)
