"""Metric laws that check real change: where a pass must change something, it does.

The monotone metrics (``test_metrics.py``) also hold for a pass that returns its input; these
do not:

- ``outline`` makes exactly one graph per module call of the flat program (the distinct
  ``(stack key, call number)`` frames of its nodes), so ``outline(p) != p`` whenever a node runs
  inside a module, and ``inline(outline(p))`` is then a round trip through a different program;
- ``deduplicate`` strictly reduces the number of graphs when two calls of one module have
  alpha-equivalent graphs, and leaves the count as it is otherwise;
"""

from __future__ import annotations

import logging

import pytest
from hypothesis import event, given, settings
from lawcases import PIPELINE, before, examples, through, without

from ir.alpha import graph_key
from ir.import_ep import import_ep
from ir.node import CALL_MODULE, GET_ATTR
from ir.program import Program
from transforms import inline
from transforms.machinery.frames import node_frames
from transforms.passes.dedup import deduplicate
from transforms.passes.outline import outline

try:
    from tests.zoo import CASES, export_case
except ImportError:  # tests/ is not a package
    from zoo import CASES, export_case


def module_calls(p: Program) -> set[tuple[str, int]]:
    """Every module call of a flat program: the ``(stack key, call number)`` frames of its
    nodes."""
    calls = set()
    for node in p.root_module.graph.nodes:
        if node.op in ("placeholder", "output", GET_ATTR):
            continue
        for frame in node_frames(node) or ():
            calls.add((frame.key, frame.call))
    return calls


def objects(p: Program) -> dict:
    """Each distinct module object below the root, once."""
    seen: dict = {}
    for path, mid in p.walk():
        if path:
            seen.setdefault(mid, p.modules[mid])
    return seen


@settings(max_examples=examples(100))
@given(before(outline, without("preserved_calls")))
def test_outline_makes_one_graph_per_module_call(p):
    out = outline(p)
    graphs = sum(len(m.graphs) for m in objects(out).values())
    assert graphs == len(module_calls(p))
    if module_calls(p):
        assert out != p
        assert any(n.op == CALL_MODULE for n in out.root_module.graph.nodes)
        assert inline(out) != out
    event(f"module calls: {bool(module_calls(p))}")


@settings(max_examples=examples(100))
@given(before(deduplicate, without("divergent_calls")))
def test_dedup_strictly_reduces_graphs_when_two_calls_are_alpha_equivalent(p):
    mods = objects(p)
    repeats = sum(len(m.graphs) - len({graph_key(g) for g in m.graphs}) for m in mods.values())
    out = deduplicate(p)
    after = sum(len(m.graphs) for m in objects(out).values())
    # at least the repeats: a parent whose calls differed only in which variant of a child
    # they called may become alpha-equivalent once the child's variants are merged
    assert after <= sum(len(m.graphs) for m in mods.values()) - repeats
    if repeats:
        assert out != p
    event(f"alpha-equivalent calls: {bool(repeats)}")


# Zoo cases whose pipeline, before ``deduplicate``, has two calls of one module with
# alpha-equivalent graphs (generated programs rarely do: ``before(deduplicate)`` draws them in
# about 4% of examples).
REPEATING = ["repeated_same_graph", "shared_two_parents", "aliased_attr", "helper_method"]


@pytest.mark.parametrize("name", REPEATING)
def test_dedup_strictly_reduces_graphs_on_zoo_cases_with_repeated_bodies(name, caplog):
    caplog.set_level(logging.ERROR)
    p = through(PIPELINE[:-1])(import_ep(export_case(CASES[name])))
    mods = objects(p)
    repeats = sum(len(m.graphs) - len({graph_key(g) for g in m.graphs}) for m in mods.values())
    assert repeats > 0, f"{name} no longer has alpha-equivalent calls; pick another case"
    out = deduplicate(p)
    assert sum(len(m.graphs) for m in objects(out).values()) < sum(
        len(m.graphs) for m in mods.values()
    )
