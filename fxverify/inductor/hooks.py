"""The table of Inductor's custom-pass hooks and of the captures of the graphs they receive, torch-free (the capture
registry, :mod:`fxverify.core.captures`, makes its Inductor rows from it at the plugin's start-up).

A :class:`Hook` is a place where ``torch.compile``'s Inductor calls a custom pass, named as torch names it, in a
stage of the compile (``pre_grad``: on Dynamo's graph; ``joint``: on AOTAutograd's graph before partitioning;
``freezing``: freezing's pattern loop; ``post_grad``: after partitioning). A :class:`HookCapture` is one capture: the
graph a hook receives in an inference compile, or the training graphs (``training_graphs``), of a plain compile or
a frozen one (``frozen``: ``config.freezing=True``).

>>> [hook.name for hook in GRAPH_HOOKS]
['joint_custom_pre_pass', 'joint_custom_post_pass', 'post_grad_custom_pre_pass', 'post_grad_custom_post_pass']
>>> row = capture("inductor_train_joint_post")
>>> row.hook.name, row.training_graphs, row.frozen
('joint_custom_post_pass', True, False)
>>> inference_at(POST_GRAD_POST).name
'inductor_post'
"""

from __future__ import annotations

import dataclasses
from typing import Literal

Stage = Literal["pre_grad", "joint", "freezing", "post_grad"]


@dataclasses.dataclass(frozen=True)
class Hook:
    """Where Inductor calls a custom pass: ``name``, its ``torch._inductor.config`` attribute (freezing's loop has
    none: the name says where it is), in ``stage`` of the compile."""

    name: str
    stage: Stage


PRE_GRAD = Hook("pre_grad_custom_pass", "pre_grad")
JOINT_PRE = Hook("joint_custom_pre_pass", "joint")  # after canonicalize_aten_ir_passes
JOINT_POST = Hook("joint_custom_post_pass", "joint")  # after Inductor's own joint-graph pattern passes
FREEZING_LOOP = Hook("freezing_passes' pattern loop", "freezing")  # for pattern in pass_patterns: pattern.apply(graph)
POST_GRAD_PRE = Hook("post_grad_custom_pre_pass", "post_grad")  # after dead-code elimination, reorder_for_locality
POST_GRAD_POST = Hook("post_grad_custom_post_pass", "post_grad")  # after Inductor's own post-grad pattern passes
HOOKS = (PRE_GRAD, JOINT_PRE, JOINT_POST, FREEZING_LOOP, POST_GRAD_PRE, POST_GRAD_POST)  # in the order a compile calls them
GRAPH_HOOKS = (JOINT_PRE, JOINT_POST, POST_GRAD_PRE, POST_GRAD_POST)  # called on AOTAutograd's graphs, configured alike


@dataclasses.dataclass(frozen=True)
class HookCapture:
    """A capture of what ``hook`` receives: its ``name``, a one-line ``summary`` (for ``--help``), whether it takes
    the training graphs (else the inference graph) and whether the compile freezes the model's state."""

    name: str
    hook: Hook
    summary: str
    training_graphs: bool = False
    frozen: bool = False


CAPTURES: tuple[HookCapture, ...] = (
    HookCapture("inductor", POST_GRAD_PRE,
                "the inference graph Inductor's post_grad_custom_pre_pass receives, made offline (no codegen)"),
    HookCapture("inductor_post", POST_GRAD_POST,
                "the same inference graph where post_grad_custom_post_pass receives it, after Inductor's own "
                "post-grad passes"),
    HookCapture("inductor_train", POST_GRAD_PRE,
                "Inductor's training forward and backward graphs at post_grad_custom_pre_pass, run as one module "
                "returning outputs and gradients", training_graphs=True),
    HookCapture("inductor_train_post", POST_GRAD_POST,
                "the same training graphs where post_grad_custom_post_pass receives them", training_graphs=True),
    HookCapture("inductor_joint", JOINT_PRE,
                "the inference graph Inductor's joint_custom_pre_pass receives, made offline (no codegen)"),
    HookCapture("inductor_joint_post", JOINT_POST,
                "the same inference graph where joint_custom_post_pass receives it, after Inductor's own "
                "joint-graph passes"),
    HookCapture("inductor_train_joint", JOINT_PRE,
                "AOTAutograd's training joint graph at joint_custom_pre_pass (before partitioning), run as one "
                "module returning outputs and gradients", training_graphs=True),
    HookCapture("inductor_train_joint_post", JOINT_POST,
                "the same training joint graph where joint_custom_post_pass receives it", training_graphs=True),
    HookCapture("inductor_pre_grad", PRE_GRAD,
                "Dynamo's torch-level graph where Inductor's pre_grad_custom_pass receives it, before AOTAutograd, "
                "parameters read as attributes (no codegen)"),
    HookCapture("inductor_freezing", FREEZING_LOOP,
                "the inference graph at Inductor's freezing pattern loop (config.freezing=True), where "
                "register_freezing_graph_pattern passes run: unmutated parameters and buffers frozen to constants "
                "(no codegen)", frozen=True),
    HookCapture("inductor_freezing_post", POST_GRAD_POST,
                "the same frozen compile's inference graph where post_grad_custom_post_pass receives it: the "
                "freezing patterns (torchao's x86 lowerings included) and Inductor's post-grad passes run (no codegen)",
                frozen=True),
)


def capture(name: str) -> HookCapture:
    """The row of the capture ``name``; KeyError for a name no row has.

    >>> capture("inductor_freezing").hook is FREEZING_LOOP
    True
    """
    for row in CAPTURES:
        if row.name == name:
            return row
    raise KeyError(name)


def plain_captures(at: tuple[Hook, ...]) -> dict[str, HookCapture]:
    """The captures of what the hooks ``at`` receive in a plain (unfrozen) compile, by name.

    >>> list(plain_captures((JOINT_POST,)))
    ['inductor_joint_post', 'inductor_train_joint_post']
    """
    return {row.name: row for row in CAPTURES if row.hook in at and not row.frozen}


def inference_at(hook: Hook) -> HookCapture:
    """The capture of the inference graph ``hook`` receives in a plain (unfrozen) compile.

    >>> inference_at(JOINT_PRE).name
    'inductor_joint'
    """
    return next(row for row in plain_captures((hook,)).values() if not row.training_graphs)
