"""The forms a pass registered with ``torch.compile`` takes, resolved to what Inductor runs.

Inductor's hooks (``post_grad_custom_pre_pass``, ``post_grad_custom_post_pass``,
``joint_custom_pre_pass``, ``joint_custom_post_pass``) call a pass on a ``torch.fx.Graph``, not a
``GraphModule``. Users hand one of four things:

- a ``CustomGraphPass`` (``__call__(graph)`` plus ``uuid()``), or any callable whose first parameter
  is annotated ``torch.fx.Graph``;
- a ``PatternMatcherPass`` (Inductor runs its ``.apply(graph)``);
- a function that registers replacements into the ``PatternMatcherPass`` it is given (first parameter
  annotated ``PatternMatcherPass``, or named ``pass_dict`` / ``patterns``);
- an object holding ``PatternMatcherPass`` attributes (for :func:`pattern_passes`).

:func:`graph_pass` gives the callable on a Graph for each, :func:`pattern_passes` the pattern
passes, and :class:`GraphPassRunner` is a graph pass as fxverify calls a transform: on a
``GraphModule``, whose graph it changes in place before ``gm.recompile()``. Torch is imported
inside the functions only (the plugin reads this module at start-up).

An inference-aware pass (``CustomInferenceAwareGraphPass``) is told ``is_inference`` at the post-grad hooks
(:func:`training_graph` says it runs on a training graph); the joint-graph hooks call every pass on the graph
alone, and so does a runner inside :func:`at_joint_hook`.

>>> import torch
>>> def double_to_mul(graph: torch.fx.Graph) -> None:
...     for node in graph.find_nodes(op="call_function", target=torch.ops.aten.add.Tensor):
...         if node.args[0] is node.args[1]:
...             with graph.inserting_before(node):
...                 mul = graph.call_function(torch.ops.aten.mul.Tensor, (node.args[0], 2))
...             node.replace_all_uses_with(mul)
...             graph.erase_node(node)
>>> takes_graph(double_to_mul), takes_graph(lambda gm: gm)
(True, False)
>>> gm = torch.fx.symbolic_trace(lambda x: torch.ops.aten.add.Tensor(x, x))
>>> GraphPassRunner.of(double_to_mul, "double_to_mul")(gm)
>>> gm(torch.tensor([1.5]))
tensor([3.])
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import inspect
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from fxverify.core.results import exception_summary, short_repr
from fxverify.errors import TransformLoadError

if TYPE_CHECKING:
    import torch
    from torch._inductor.pattern_matcher import PatternMatcherPass

REGISTERING_NAMES = ("pass_dict", "patterns")  # a registering function's first parameter, when not annotated
_PATTERN_MODULE = "torch._inductor.pattern_matcher"
_CUSTOM_MODULE = "torch._inductor.custom_graph_pass"
# what a pass is told: is_inference=True or False (the post-grad hooks), or nothing (None: the joint-graph hooks)
_IS_INFERENCE: contextvars.ContextVar[bool | None] = contextvars.ContextVar("fxverify_is_inference", default=True)


def pattern_passes(obj: Any, spec: str) -> tuple[PatternMatcherPass, ...]:
    """The ``PatternMatcherPass`` (or passes) of what a user registers: the pass itself; a registering
    function, called with a fresh pass; an object (a ``CustomGraphPass``...) holding passes as attributes;
    a list or tuple of those. :class:`~fxverify.errors.TransformLoadError` naming ``spec`` when none is found.

    >>> from torch._inductor.pattern_matcher import PatternMatcherPass
    >>> class Fusions:
    ...     def __init__(self):
    ...         self.patterns = PatternMatcherPass()
    >>> [type(p).__name__ for p in pattern_passes([Fusions(), PatternMatcherPass()], "my:fusions")]
    ['PatternMatcherPass', 'PatternMatcherPass']
    >>> pattern_passes(len, "builtins:len")
    Traceback (most recent call last):
    ...
    fxverify.errors.TransformLoadError: builtins:len holds no PatternMatcherPass: found a builtin_function_or_method ...
    """
    found = _pattern_passes(obj)
    if not found:
        raise TransformLoadError(
            f"{spec} holds no PatternMatcherPass: found a {type(obj).__name__} ({short_repr(obj, 60)}). Give a "
            "PatternMatcherPass, a function registering replacements into the one it is given (first parameter "
            f"annotated PatternMatcherPass or named {' or '.join(REGISTERING_NAMES)}), an object holding "
            "PatternMatcherPass attributes, or a list of those")
    return found


def graph_pass(obj: Any, spec: str, *, is_inference: bool = True) -> Callable[[torch.fx.Graph], Any]:
    """The callable Inductor would run on a ``torch.fx.Graph`` for ``obj``: a ``CustomGraphPass`` or any
    callable taking a Graph as it is (an inference-aware pass told ``is_inference``, as Inductor tells it), a
    ``PatternMatcherPass``'s ``apply``, a registering function's fresh pass's ``apply``.
    :class:`~fxverify.errors.TransformLoadError` naming ``spec`` for anything else.

    >>> from torch._inductor.pattern_matcher import PatternMatcherPass
    >>> patterns = PatternMatcherPass()
    >>> graph_pass(patterns, "my:patterns") == patterns.apply
    True
    >>> graph_pass(3, "my:three")
    Traceback (most recent call last):
    ...
    fxverify.errors.TransformLoadError: my:three is a int (3), not a graph pass: ...
    """
    import functools

    if _is_pattern_pass(obj):
        return obj.apply
    if registers_patterns(obj):
        return _registered(obj, spec).apply
    if inference_aware(obj):
        return functools.partial(obj, is_inference=is_inference)
    if callable(obj):
        return obj
    raise TransformLoadError(
        f"{spec} is a {type(obj).__name__} ({short_repr(obj, 60)}), not a graph pass: give a CustomGraphPass, a function "
        "taking a torch.fx.Graph, a PatternMatcherPass or a function registering replacements into one")


def takes_graph(obj: Any) -> bool:
    """Whether ``obj`` is a pass Inductor calls on a Graph (a ``CustomGraphPass``, a ``PatternMatcherPass``, a
    registering function, a callable whose first parameter is annotated ``torch.fx.Graph``), as opposed to a
    transform of a GraphModule; a ``CustomGraphModulePass`` takes a GraphModule."""
    return (_is_pattern_pass(obj) or _is_instance(obj, _CUSTOM_MODULE, "CustomGraphPass")
            or _first_annotation(obj) == "Graph" or registers_patterns(obj))


@dataclasses.dataclass(frozen=True)
class GraphPassRunner:
    """A graph pass called as fxverify calls a transform: ``runner(gm)`` runs the pass on ``gm.graph``, as
    Inductor does, then ``gm.recompile()``, and returns None (``gm`` changed in place). What the pass returns is
    ignored, as Inductor ignores it. Under :func:`training_graph` an inference-aware pass is told
    ``is_inference=False``; under :func:`at_joint_hook` it is called on the graph alone, as torch's
    ``joint_graph_passes`` calls it (and fails, as it does there)."""

    inference: Callable[[torch.fx.Graph], Any]
    training: Callable[[torch.fx.Graph], Any]
    untold: Callable[[torch.fx.Graph], Any]

    @classmethod
    def of(cls, obj: Any, spec: str) -> GraphPassRunner:
        """The runner of ``obj`` (any form :func:`graph_pass` takes; a registering function registers once)."""
        if inference_aware(obj):
            return cls(graph_pass(obj, spec, is_inference=True), graph_pass(obj, spec, is_inference=False), obj)
        found = graph_pass(obj, spec)
        return cls(found, found, found)

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        told = _IS_INFERENCE.get()
        (self.untold if told is None else self.inference if told else self.training)(gm.graph)
        gm.recompile()


@contextlib.contextmanager
def training_graph() -> Iterator[None]:
    """Graph passes run inside this block are run on a training graph (``is_inference=False``)."""
    with _told(False):
        yield


@contextlib.contextmanager
def at_joint_hook() -> Iterator[None]:
    """Graph passes run inside this block are called as a joint-graph hook calls them: on the graph alone."""
    with _told(None):
        yield


@contextlib.contextmanager
def _told(is_inference: bool | None) -> Iterator[None]:
    token = _IS_INFERENCE.set(is_inference)
    try:
        yield
    finally:
        _IS_INFERENCE.reset(token)


def _pattern_passes(obj: Any) -> tuple[Any, ...]:
    if _is_pattern_pass(obj):
        return (obj,)
    if isinstance(obj, (list, tuple)):
        return tuple(found for item in obj for found in _pattern_passes(item))
    if registers_patterns(obj):
        return (_registered(obj, repr(obj)),)
    if inspect.isroutine(obj) or not hasattr(obj, "__dict__"):
        return ()
    owners = [obj, *type(obj).__mro__[:-1]]  # the instance's attributes, then its classes' (not object's)
    held = {id(value): value for owner in owners for value in vars(owner).values() if _is_pattern_pass(value)}
    return tuple(held.values())


def register_into(register: Callable[..., Any], fresh: Any, spec: str) -> None:
    """Call the registering function ``register`` with the ``PatternMatcherPass`` ``fresh``;
    :class:`TransformLoadError` naming ``spec`` when it raises."""
    try:
        register(fresh)
    except Exception as exc:
        raise TransformLoadError(f"{spec}: registering its replacements into a fresh PatternMatcherPass raised "
                                 f"{exception_summary(exc)}") from exc


def _registered(register: Callable[..., Any], spec: str) -> Any:
    """A fresh ``PatternMatcherPass`` with ``register``'s replacements in it."""
    from torch._inductor.pattern_matcher import PatternMatcherPass

    fresh = PatternMatcherPass()
    register_into(register, fresh, spec)
    if not fresh.patterns:
        raise TransformLoadError(f"{spec} registered no replacement into the PatternMatcherPass it was given")
    return fresh


def inference_aware(obj: Any) -> bool:
    """Whether ``obj`` is a ``CustomInferenceAwareGraphPass``, which Inductor's post-grad hooks call with
    ``is_inference``, as it is or wrapped (``@fxverify.contract`` on an instance wraps it, ``functools.wraps``).

    >>> from torch._inductor.custom_graph_pass import CustomInferenceAwareGraphPass
    >>> class Aware(CustomInferenceAwareGraphPass):
    ...     def __call__(self, graph, is_inference): ...
    ...     def uuid(self): ...
    >>> import fxverify
    >>> inference_aware(Aware()), inference_aware(fxverify.contract(fires_in=("inference",))(Aware())), inference_aware(len)
    (True, True, False)
    """
    return _is_instance(inspect.unwrap(obj) if callable(obj) else obj, _CUSTOM_MODULE, "CustomInferenceAwareGraphPass")


def _is_instance(obj: Any, module: str, name: str) -> bool:
    """``isinstance(obj, module.name)``, without importing ``module`` (an instance means it is imported)."""
    loaded = sys.modules.get(module)
    return loaded is not None and isinstance(obj, getattr(loaded, name))


def _is_pattern_pass(obj: Any) -> bool:
    return _is_instance(obj, _PATTERN_MODULE, "PatternMatcherPass")


def registers_patterns(obj: Any) -> bool:
    """Whether ``obj`` is a function registering replacements into the ``PatternMatcherPass`` it is given (its first
    parameter annotated ``PatternMatcherPass`` or named as :data:`REGISTERING_NAMES`)."""
    if isinstance(obj, type) or not callable(obj):
        return False
    first = _first_parameter(obj)
    return first is not None and (_first_annotation(obj) == "PatternMatcherPass" or first.name in REGISTERING_NAMES)


def _first_parameter(obj: Any) -> inspect.Parameter | None:
    try:
        return next(iter(inspect.signature(obj).parameters.values()), None)
    except (TypeError, ValueError):
        return None


def _first_annotation(obj: Any) -> str:
    """The last dotted part of the annotation of ``obj``'s first parameter (``Graph`` for ``torch.fx.Graph``,
    ``"fx.Graph"`` or ``torch.fx.graph.Graph``), or ``""``."""
    if not callable(obj):
        return ""
    first = _first_parameter(obj)
    annotation = None if first is None else first.annotation
    named = annotation if isinstance(annotation, str) else getattr(annotation, "__qualname__", "")
    return str(named).strip("'\"").rpartition(".")[2]


