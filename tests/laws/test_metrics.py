"""Monotone metrics (DESIGN.md, law 7) and the counting laws the passes' docstrings state."""

from __future__ import annotations

import operator

from hypothesis import given, settings
from lawcases import before, examples, valid, without

from ir.node import CALL_FUNCTION, CALL_METHOD, CALL_MODULE
from ir.program import Program
from lowering.pass_laws import check_metric
from transforms.passes.dedup import deduplicate
from transforms.passes.mutations import INPLACE_KINDS, functional_to_inplace
from transforms.passes.outline import outline
from transforms.passes.state_sinking import sink_state


def graphs(p: Program) -> list:
    """Every graph of every distinct module object reachable from the root."""
    seen: dict = {}
    for _, mid in p.walk():
        seen.setdefault(mid, p.modules[mid].graphs)
    return [g for gs in seen.values() for g in gs]


def compute_nodes(p: Program) -> int:
    return sum(g.compute_count() for g in graphs(p))


def graph_count(p: Program) -> int:
    return len(graphs(p))


def computed_values(p: Program) -> int:
    """Nodes that compute a value: not the plumbing of calls (``call_module`` and the
    ``getitem``\\ s that take a call's results apart)."""
    total = 0
    for g in graphs(p):
        calls = {n.name for n in g.nodes if n.op == CALL_MODULE}
        for n in g.nodes:
            if n.op == CALL_METHOD or (n.op == CALL_FUNCTION and not (
                    n.target is operator.getitem and n.args[0].name in calls)):
                total += 1
    return total


@settings(max_examples=examples(100))
@given(before(deduplicate))
def test_dedup_never_adds_modules_or_graphs(p):
    out = check_metric(deduplicate, p, Program.module_count, operator.ge, "modules never added")
    check_metric(deduplicate, p, graph_count, operator.ge, "graphs never added", out)


@settings(max_examples=examples(100))
@given(before(sink_state))
def test_sinking_never_changes_the_number_of_compute_nodes(p):
    check_metric(sink_state, p, compute_nodes, operator.eq, "compute nodes unchanged")


@settings(max_examples=examples(100))
@given(before(outline, without("preserved_calls")))
def test_outline_adds_and_removes_only_call_plumbing(p):
    check_metric(outline, p, computed_values, operator.eq, "computing nodes unchanged")


@settings(max_examples=examples(100))
@given(valid(lambda p: p))
def test_functional_to_inplace_adds_one_copy_per_mutation_output(p):
    mutations = sum(1 for s in p.signature.outputs if s.kind in INPLACE_KINDS)
    out = check_metric(functional_to_inplace, p, lambda q: len(q.root_module.graph),
                       lambda a, b: b == a + mutations, "one copy_ per mutation output")
    names = {n.name for n in out.root_module.graph.nodes}
    assert {n.name for n in p.root_module.graph.nodes} <= names  # no node removed
