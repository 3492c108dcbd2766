"""``graph_modules()``: a Hypothesis strategy for random, valid ``torch.fx.GraphModule`` s.

>>> from hypothesis import given
>>> @given(graph_modules(max_nodes=6))
... def test_runs(case):
...     case.check_predictions()
>>> test_runs()
"""

from __future__ import annotations

import contextlib
import copy
import difflib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from torch import fx
from torch.utils import _pytree as pytree

from fxverify.cases.case import ModelCase
from fxverify.cases.catalogue import RANDOM_GRAPH_TAG, CorpusEntry, InputSpec
from fxverify.strategies.builder import INT_RANGE, Builder, Choices, DrawnChoices, Limits, SeededChoices, Value
from fxverify.strategies.meta import ANY, DTYPE_NAMES, Meta
from fxverify.strategies.ops import CATALOGUE, Op, ops_named
from fxverify.strategies.source import module_source

DEFAULT_DTYPES = (torch.float32,)
MAX_COST = max(op.cost for op in CATALOGUE)
GO_ON = 7  # after min_nodes, another op follows unless a draw from 0..GO_ON is 0


class GraphCase(ModelCase):
    """A drawn graph, usable wherever fxverify takes a model (``fxverify.assert_transform_ok(my_pass,
    case)``): ``module`` (the ``GraphModule``, eval mode), ``inputs`` (its input specs),
    ``predicted`` (the output shapes and dtypes the builder predicted, a tree of ``Meta``) and
    ``ops`` (the catalogue ops applied). Checked at its one batch size: its shapes are fixed.
    Tagged ``"random_graph"``: the golden check skips it (a drawn graph has no stable golden file).

    Its ``repr`` is runnable Python that rebuilds the module (parameters included) and
    its inputs, which is what Hypothesis prints in a falsifying example.
    """

    def __init__(self, module: fx.GraphModule, inputs: tuple[InputSpec, ...], predicted: Any,
                 ops: tuple[str, ...], *, name: str = "random_graph") -> None:
        self.module, self.inputs, self.predicted, self.ops = module, inputs, predicted, ops
        entry = CorpusEntry(name=name, source="user", factory=lambda: copy.deepcopy(module), inputs=inputs,
                            batch_sizes=(inputs[0].shape[0],), tags=(RANDOM_GRAPH_TAG,))
        super().__init__(entry)

    def check_predictions(self, inputs: Sequence[torch.Tensor] | None = None) -> Any:
        """Run the module and assert every output has the predicted shape and dtype.
        Returns the outputs.

        Raises ``AssertionError`` naming the output that differs.
        """
        outputs = self.module(*(self.example_inputs() if inputs is None else inputs))
        got, got_spec = pytree.tree_flatten(outputs)
        want, want_spec = pytree.tree_flatten(self.predicted)
        assert got_spec == want_spec, f"output structure {got_spec} != predicted {want_spec}"
        for i, (tensor, meta) in enumerate(zip(got, want)):
            seen = Meta(tuple(tensor.shape), tensor.dtype)
            assert seen == meta, f"output {i}: got {seen}, predicted {meta}\n{self.module.code}"
        return outputs

    def __repr__(self) -> str:
        return module_source(self.module, self.inputs)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # Hypothesis prints examples with this
        printer.text(repr(self))


def _validate_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"Expected an int for {name}, but got {name}={value!r} (type={type(value).__name__})")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise InvalidArgument(f"{name} must be {bound}, but got {name}={value!r}")
    return value


def _validate_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"Expected a bool for {name}, but got {name}={value!r} (type={type(value).__name__})")
    return value


def validate_dtypes(dtypes: Any) -> tuple[torch.dtype, ...]:
    """``dtypes`` as a tuple of supported torch dtypes (names like ``"float32"`` accepted)."""
    names = {name: dtype for dtype, name in DTYPE_NAMES.items()}
    if isinstance(dtypes, (str, torch.dtype)) or not isinstance(dtypes, Iterable):
        raise InvalidArgument(f"dtypes must be a sequence of dtypes, e.g. (torch.float32,), but got dtypes={dtypes!r}")
    chosen = []
    for dtype in dtypes:
        dtype = names.get(dtype, dtype) if isinstance(dtype, str) else dtype
        if dtype not in ANY:
            raise InvalidArgument(
                f"dtypes={dtypes!r} contains {dtype!r}, which is not supported; choose from {', '.join(names)}"
            )
        chosen.append(dtype)
    if not chosen:
        raise InvalidArgument("dtypes must not be empty; e.g. dtypes=(torch.float32,)")
    return tuple(dict.fromkeys(chosen))


def select_ops(ops: Sequence[str] | None, *, limits: Limits) -> list[Op]:
    """The catalogue entries the options allow; InvalidArgument naming unknown ops."""
    if isinstance(ops, str):
        raise InvalidArgument(f"ops must be a sequence of op names, e.g. ops=['add', 'F.relu'], but got ops={ops!r}")
    try:
        chosen = ops_named(ops, allow_modules=limits.allow_modules, allow_inplace=limits.allow_inplace)
    except KeyError as exc:
        unknown = exc.args[0]
        close = difflib.get_close_matches(unknown[0], [op.name for op in CATALOGUE], n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise InvalidArgument(
            f"ops={ops!r} names {unknown}, which the catalogue does not have.{hint} "
            "See fxverify.strategies.OPS for the names."
        ) from None
    wanted = set(limits.dtypes)
    usable = [op for op in chosen if not wanted.isdisjoint(op.dtypes) and op.ranks[0] <= limits.max_rank - op.grows]
    if not usable:
        raise InvalidArgument(
            f"no op of ops={ops!r} accepts any of dtypes={tuple(DTYPE_NAMES[d] for d in limits.dtypes)} "
            f"at rank <= {limits.max_rank}{'' if limits.allow_modules else ' without modules (allow_modules=False)'}; "
            "add ops or dtypes, or raise max_rank"
        )
    fitting = [op for op in usable if op.cost <= limits.max_nodes]  # a composition emits several nodes
    if limits.max_nodes == 0:  # no node is drawn (a pattern alone, no surroundings): any op is as good
        return usable
    if not fitting:
        fewest = min(op.cost for op in usable)
        raise InvalidArgument(f"no op of ops={ops!r} fits in max_nodes={limits.max_nodes} (the fewest nodes one "
                              f"emits is {fewest}); raise max_nodes to {fewest} or add ops")
    return fitting


def graph_modules(
    *,
    ops: Sequence[str] | None = None,
    min_nodes: int = 1,
    max_nodes: int = 12,
    dtypes: Sequence[torch.dtype | str] = DEFAULT_DTYPES,
    max_side: int = 4,
    max_rank: int = 5,
    allow_modules: bool = True,
    allow_inplace: bool = False,
) -> st.SearchStrategy[GraphCase]:
    """Random valid GraphModules, with input specs and predicted output shapes and dtypes.

    ``ops``: catalogue names to draw from (default: all; see ``fxverify.strategies.OPS``);
    ``min_nodes`` / ``max_nodes``: bounds on computation nodes (get_attr and call_*);
    ``dtypes``: dtypes of the inputs and attributes (intermediate values may have
    others: comparisons give bool, argmax int64); ``max_side``: largest drawn dim size;
    ``max_rank``: largest rank; ``allow_modules``: nn layers as call_module;
    ``allow_inplace``: in-place ops on values the graph owns.

    Every graph passes ``graph.lint()``, runs, and produces the predicted shapes and
    dtypes; nothing is rejected::

        @given(graph_modules(ops=["add", "F.relu", "matmul"], max_nodes=8))
        def test_my_pass(case):
            fxverify.assert_transform_ok(my_pass, case)

    Graph sizes spread over ``min_nodes..max_nodes`` (about 8 ops on average when room allows).
    Shrinks towards fewer nodes, earlier catalogue ops (``exp``, ``add``), chains
    (each op consuming the previous value), size-1 dims, a single output, seed 0.
    """
    return _graphs(_plan(ops=ops, min_nodes=min_nodes, max_nodes=max_nodes, dtypes=dtypes, max_side=max_side,
                         max_rank=max_rank, allow_modules=allow_modules, allow_inplace=allow_inplace))


def graph_from_seed(
    seed: int,
    *,
    ops: Sequence[str] | None = None,
    min_nodes: int = 1,
    max_nodes: int = 12,
    dtypes: Sequence[torch.dtype | str] = DEFAULT_DTYPES,
    max_side: int = 4,
    max_rank: int = 5,
    allow_modules: bool = True,
    allow_inplace: bool = False,
) -> GraphCase:
    """A graph built like ``graph_modules(**options)``'s, with choices from ``random.Random(seed)``
    instead of Hypothesis.

    The same seed and options give the same graph in every process, which is how
    ``pytest --fxverify-random-graphs`` names, distributes and replays its graphs. The
    choices are not recorded, so there is nothing to shrink (fxverify's minimiser shrinks
    a failing graph instead) and a graph costs about half what it costs under ``@given``.
    Options and validation are ``graph_modules``'s.

    >>> case = graph_from_seed(7, max_nodes=6)
    >>> again = graph_from_seed(7, max_nodes=6)
    >>> case.module.code == again.module.code and case.module is not again.module
    True
    """
    plan = _plan(ops=ops, min_nodes=min_nodes, max_nodes=max_nodes, dtypes=dtypes, max_side=max_side,
                 max_rank=max_rank, allow_modules=allow_modules, allow_inplace=allow_inplace)
    return build_graph(plan, SeededChoices(_validate_int("seed", seed, 0)))


def _plan(*, ops: Sequence[str] | None, min_nodes: int, max_nodes: int, dtypes: Sequence[torch.dtype | str],
          max_side: int, max_rank: int, allow_modules: bool, allow_inplace: bool) -> Plan:
    """The options of ``graph_modules`` / ``graph_from_seed``, validated (InvalidArgument naming the bad one)."""
    limits = Limits(
        dtypes=validate_dtypes(dtypes),
        max_nodes=_validate_int("max_nodes", max_nodes, 1, 200),
        max_side=_validate_int("max_side", max_side, 1, 64),
        max_rank=_validate_int("max_rank", max_rank, 1, 6),
        allow_modules=_validate_bool("allow_modules", allow_modules),
        allow_inplace=_validate_bool("allow_inplace", allow_inplace),
    )
    _validate_int("min_nodes", min_nodes, 1, max_nodes)
    chosen = select_ops(ops, limits=limits)
    return Plan(tuple(chosen), limits, min_nodes)


class Plan:
    """What ``graph_modules`` was asked for (a short repr: Hypothesis prints it in errors)."""

    def __init__(self, ops: tuple[Op, ...], limits: Limits, min_nodes: int) -> None:
        self.ops, self.limits, self.min_nodes = ops, limits, min_nodes

    def __repr__(self) -> str:
        return f"Plan({len(self.ops)} ops, {self.limits}, min_nodes={self.min_nodes})"


@st.composite
def _graphs(draw: Any, plan: Plan) -> GraphCase:
    return build_graph(plan, DrawnChoices(draw))


def build_graph(plan: Plan, choices: Choices) -> GraphCase:
    """A graph built as ``plan`` says from ``choices`` (whose first choice seeds torch's
    generator for the graph's parameters and constants)."""
    seed = choices.integer(0, 2**16 - 1)
    with seeded(seed):
        builder = Builder(choices, plan.limits)
        used_ops = grow(builder, plan.ops, plan.min_nodes, plan.limits.max_nodes)
        module, predicted = builder.finish()
    inputs = tuple(_input_spec(meta) for meta in builder.inputs)
    return GraphCase(module, inputs, predicted, tuple(used_ops))


def grow(builder: Builder, chosen: Sequence[Op], minimum: int, maximum: int) -> list[str]:
    """Apply drawn ops until at least ``minimum`` computation nodes exist, then keep going
    while a drawn "go on" says so (7 in 8), up to ``maximum`` or while some op fits the room.
    Returns the names of the ops applied. Each op is one block of choices, preceded by its
    "go on": shrinking stops early or deletes whole ops."""
    used = []
    by_room: dict[int, list[Op]] = {}
    while builder.used < maximum:
        go_on = builder.integer(0, GO_ON)  # drawn even below minimum: every op's block starts alike
        if go_on == 0 and builder.used >= minimum:
            break
        room = min(builder.room, maximum - builder.used, MAX_COST)
        if room not in by_room:
            by_room[room] = [op for op in chosen if op.cost <= room]
        fitting = by_room[room]
        if not fitting:
            break
        op = fitting[builder.index(len(fitting))]  # an index, not sampled_from: cheaper, shrinks the same
        apply(builder, op)
        used.append(op.name)
    return used


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed torch's CPU generator (parameters and constants of the graph) and restore it after.
    Cheaper than ``torch.random.fork_rng`` + ``torch.manual_seed``, which also seed lazy devices."""
    generator = torch.default_generator
    state = generator.get_state()
    generator.manual_seed(seed)
    try:
        yield
    finally:
        generator.set_state(state)


def apply(builder: Builder, op: Op) -> Value:
    """Apply ``op`` to a drawn value it accepts (preferring recent ones) or to a new input."""
    found = builder.candidates(lambda v: op.accepts(v, builder.limits.max_rank))
    pick = builder.integer(0, len(found))
    if pick < len(found):
        x = found[pick]
    else:
        x = builder.new_input(op.input_meta(builder), reserve=op.cost)
        if op.inplace:  # in-place ops write only into values the graph owns
            x = builder.call(torch.clone, x, meta=x.meta)
    return op.emit(builder, x)


def _input_spec(meta: Meta) -> InputSpec:
    name = DTYPE_NAMES[meta.dtype]
    if meta.dtype.is_floating_point:
        return InputSpec(meta.shape, name)
    if meta.dtype == torch.bool:
        return InputSpec(meta.shape, name)
    return InputSpec(meta.shape, name, low=INT_RANGE[0], high=INT_RANGE[1])
