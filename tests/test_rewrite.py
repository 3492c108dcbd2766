"""Rewrite-rule fuzzing: patterns embedded in random graphs, wrong rules found and
shrunk, correct rules passing."""

from __future__ import annotations

import operator

import pytest
import torch
from hypothesis import given, settings
from hypothesis.errors import InvalidArgument
from torch.fx.passes.shape_prop import ShapeProp

import fxverify
from fxverify.rewrite import RewriteFailed
from fxverify.strategies import graphs_with_pattern

# small surroundings keep finding and shrinking (a few hundred runs of the checks) within seconds
SMALL = {"ops": ["exp", "neg", "add", "mul", "F.relu"], "max_nodes": 4, "checks": ("lint",), "derandomize": True}


@pytest.fixture
def replaced(monkeypatch):
    """How many pattern instances each call of torch.fx.replace_pattern replaced while the test ran: a rule
    that passes without replacing anything was never checked."""
    counts: list[int] = []
    real = torch.fx.replace_pattern

    def counting(gm, pattern, replacement):
        matches = real(gm, pattern, replacement)
        counts.append(len(matches))
        return matches

    monkeypatch.setattr(torch.fx, "replace_pattern", counting)
    return counts


def computation_nodes(case) -> int:
    return sum(1 for n in case.module.graph.nodes if n.op not in ("placeholder", "output"))


def add_relu(x, y):
    return torch.relu(x + y)


def add_clamp(x, y):
    return torch.clamp_min(x + y, 0.0)


def add_sum(x, y):
    return (x + y).sum(-1)


def sum_add(x, y):  # wrong when y broadcasts along the summed dim
    return x.sum(-1) + y.sum(-1)


def times_zero(x):
    return x * 0


def zeros(x):  # wrong for NaN and inf
    return torch.zeros_like(x)


@settings(max_examples=40, deadline=None, database=None)
@given(graphs_with_pattern(add_relu, max_instances=3))
def test_pattern_instances_are_embedded_with_producers_and_consumers(case):
    relus = [n for n in case.module.graph.nodes if n.target is torch.relu]
    assert len(relus) >= case.instances
    case.check_predictions()
    case.module.graph.lint()


def operand_shapes(case, node):
    """Shapes of ``node``'s tensor arguments when the case runs on its example inputs."""
    ShapeProp(case.module).propagate(*case.example_inputs())
    return [tuple(a.meta["tensor_meta"].shape) for a in node.args if isinstance(a, torch.fx.Node)]


def test_internal_nodes_get_outside_users_and_inputs_broadcast():
    seen = set()

    @settings(max_examples=60, deadline=None, database=None)
    @given(graphs_with_pattern(add_relu))
    def record(case):
        for relu in (n for n in case.module.graph.nodes if n.target is torch.relu):
            add = relu.args[0]
            if len(add.users) > 1:
                seen.add("internal node used outside")
            if len(set(operand_shapes(case, add))) > 1:
                seen.add("pattern inputs of different shapes")
        if case.instances > 1:
            seen.add("several instances")

    record()
    assert seen == {"internal node used outside", "pattern inputs of different shapes", "several instances"}


def test_a_correct_rule_passes(replaced):
    fxverify.check_rewrite(add_relu, add_clamp, max_examples=25)
    assert sum(replaced) > 0


@pytest.mark.slow
def test_a_rule_correct_only_for_equal_shapes_is_found_and_shrunk():
    with pytest.raises(RewriteFailed) as failure:
        fxverify.check_rewrite(add_sum, sum_add, max_examples=100, **SMALL)
    case = failure.value.case
    assert "values differ" in str(failure.value)
    assert computation_nodes(case) <= 4  # the pattern twice, or once with a producer
    adds = [n for n in case.module.graph.nodes if n.op == "call_function" and n.target in (torch.add, operator.add)]
    assert any(len(set(operand_shapes(case, add))) == 2 for add in adds)  # the broadcasting that breaks the rule
    assert "class RandomGraph" in repr(case)  # printed as runnable Python


@pytest.mark.slow
def test_a_rule_correct_only_for_finite_inputs_is_found_with_special_values():
    with pytest.raises(RewriteFailed, match="NaN positions differ|inf positions differ") as failure:
        fxverify.check_rewrite(times_zero, zeros, checks=("lint",), max_examples=100, derandomize=True)
    assert computation_nodes(failure.value.case) <= 2  # x * 0, perhaps after an op overflowing on large values


def test_finite_only_rule_passes_without_special_values(replaced):
    fxverify.check_rewrite(times_zero, zeros, checks=("lint",), special_values=False, max_examples=15, ops=["add"])
    assert sum(replaced) > 0


def relu_in_place(gm):
    """A hand-written fusion that forgets the add may have other users: relu_ overwrites it."""
    for node in gm.graph.nodes:
        if node.target is torch.relu and getattr(node.args[0], "target", None) in (operator.add, torch.add):
            node.target = torch.relu_
    gm.recompile()
    return gm


@pytest.mark.slow
def test_a_matcher_ignoring_outside_users_of_internal_nodes_is_found():
    with pytest.raises(RewriteFailed) as failure:
        fxverify.check_rewrite(add_relu, rewrite=relu_in_place, max_examples=300, **SMALL)  # found in 4 of 5 runs of 100
    adds = [n for n in failure.value.case.module.graph.nodes if n.target in (operator.add, torch.add)]
    assert any(len(n.users) > 1 for n in adds)  # the shrunk case has the add used outside the pattern
    fxverify.check_rewrite(add_relu, rewrite=relu_in_place, expose_internals=False, max_examples=20, **SMALL)


def test_bad_arguments_say_what_to_do():
    with pytest.raises(TypeError, match="exactly one of replacement"):
        fxverify.check_rewrite(add_relu)
    with pytest.raises(InvalidArgument, match=r"raised on every input shape tried .*shape '\[5, 7\]' is invalid"):
        graphs_with_pattern(lambda x: x.view(5, 7))  # 35 elements: no drawable shape (sides <= 4) fits
    with pytest.raises(InvalidArgument, match="max_instances must be between 1 and 16"):
        graphs_with_pattern(add_relu, max_instances=0)


def matmul(x, y):
    return torch.matmul(x, y)


def at(x, y):
    return x @ y


def test_shape_constrained_patterns_get_matching_shapes_and_correct_rules_pass(replaced):
    seen = set()

    @settings(max_examples=30, deadline=None, database=None, derandomize=True)
    @given(graphs_with_pattern(matmul, ranks=(2, 3)))
    def record(case):
        for node in (n for n in case.module.graph.nodes if n.target is torch.matmul):
            x, y = operand_shapes(case, node)
            seen.add("non-square" if x[-2] != x[-1] else "square")

    record()
    assert "non-square" in seen  # the second input's last two dims swapped, not only square shapes
    fxverify.check_rewrite(matmul, at, max_examples=15, derandomize=True, **{k: SMALL[k] for k in ("ops", "checks")})
    assert sum(replaced) > 0
    replaced.clear()
    fxverify.check_rewrite(at, matmul, max_examples=10, broadcast=False, ranks=(2, 2), derandomize=True)
    assert sum(replaced) > 0


NUDGED: list[str] = []  # the relus nudge_relu scaled


@fxverify.contract(modes=("eval",), rtol=1e-2, atol=1e-2)
def nudge_relu(gm):
    """Scales every relu by 1.001: wrong by 1e-3 relative, within its declared contract tolerance."""
    for node in list(gm.graph.nodes):
        if node.target is torch.relu:
            NUDGED.append(node.name)
            with gm.graph.inserting_after(node):
                scaled = gm.graph.call_function(operator.mul, (node, 1.001))
            node.replace_all_uses_with(scaled)
            scaled.update_arg(0, node)
    gm.recompile()
    return gm


def test_the_contract_tolerance_of_a_rewrite_is_honoured():
    NUDGED.clear()
    fxverify.check_rewrite(add_relu, rewrite=nudge_relu, special_values=False, max_examples=10, **SMALL)
    assert NUDGED  # it did move the outputs, by 1e-3: far beyond float32's default tolerance


def broken(gm):
    raise RuntimeError("matcher bug")


@pytest.mark.slow
def test_a_rewrite_that_raises_is_a_rewrite_failure_with_the_case():
    with pytest.raises(RewriteFailed, match="raised RuntimeError: matcher bug") as failure:
        fxverify.check_rewrite(add_relu, rewrite=broken, max_examples=5, max_nodes=0, max_instances=1,
                               checks=("lint",), special_values=False, non_contiguous=False, derandomize=True)
    assert computation_nodes(failure.value.case) == 2  # the (shrunk) case: the pattern's add and relu
