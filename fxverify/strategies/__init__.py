"""Hypothesis strategies for torch.fx: random valid graphs, their inputs, and graphs
embedding a rewrite pattern.

    from hypothesis import given
    import fxverify.strategies as fxs

    @given(fxs.graph_modules(ops=["add", "F.relu", "matmul"], max_nodes=12))
    def test_my_pass(case):
        fxverify.assert_transform_ok(my_pass, case)

``graph_from_seed(seed, **options)`` builds one such graph from a seed, without Hypothesis.
``OPS`` lists the operator catalogue's names (``FAMILIES``: by family). ``probe_ops(my_pass)``
says which of them a pass rewrites (what ``--fxverify-random-graphs`` draws from).
"""

from __future__ import annotations

from fxverify.strategies.graphs import GraphCase, graph_from_seed, graph_modules
from fxverify.strategies.ops import CATALOGUE, FAMILIES
from fxverify.strategies.patterns import PatternCase, graphs_with_pattern
from fxverify.strategies.probe import Probe, probe_ops
from fxverify.strategies.tensors import SPECIAL_VALUES, Inputs, in_layout, inputs_for, tensors

OPS: tuple[str, ...] = tuple(op.name for op in CATALOGUE)

__all__ = [
    "FAMILIES", "GraphCase", "Inputs", "OPS", "PatternCase", "Probe", "SPECIAL_VALUES",
    "graph_from_seed", "graph_modules", "graphs_with_pattern", "in_layout", "inputs_for", "probe_ops", "tensors",
]
