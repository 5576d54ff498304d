"""Laws of ``extract.greedy`` (the worklist in cost order) on generated e-graphs.

The oracle is the extractor it replaced: passes over every live class, in class-id order,
until no tree cost falls (a brute-force fixpoint; the same margin, ``EPSILON`` and ``CAP``).
Both reach each class's least tree cost; the worklist settles each class once, so an e-graph
whose class ids run against its dependencies (merges make such) costs it O(e-nodes log
e-nodes) where the passes cost O(classes x e-nodes).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lawcases import examples

from ir.args import EMPTY_DICT, Ref
from transforms.rewrite import extract
from transforms.rewrite.egraph import ClassData, EGraph, ENode, leaf, reachable

_INF = float("inf")


def oracle(eg, roots, cost, prefer=None):
    """The pass loop ``greedy`` was before the worklist: the fixpoint, by brute force."""
    live = sorted(reachable(eg, roots))
    best, choice, prefer = {}, {}, prefer or {}
    changed = True
    while changed:
        changed = False
        for c in live:
            nodes = eg.classes[c]
            kept = prefer.get(c)
            if kept is not None:
                kept = eg.canonical(kept)
                nodes = [kept, *[n for n in nodes if n.key != kept.key]]
            for n in nodes:
                total = max(cost(n), 0.0) + extract.EPSILON
                for ch in n.children:
                    b = best.get(eg.find(ch))
                    if b is None:
                        break
                    total += b
                else:
                    total = min(total, extract.CAP)
                    if total < best.get(c, _INF) * (1 - 1e-12):
                        best[c], choice[c] = total, n
                        changed = True
    return choice, best


def _op(name: str, *children: int) -> ENode:
    canon = tuple(Ref(f"#{i}") for i in range(len(children)))
    return ENode(name, canon, canon, EMPTY_DICT, tuple(children), (name, len(children)))


def _tree(eg, choice, cost):
    """Each chosen class's tree cost under ``choice`` (memoised, children first)."""
    out: dict[int, float] = {}

    def of(c):
        c = eg.find(c)
        if c not in out:
            n = choice[c]
            total = max(cost(n), 0.0) + extract.EPSILON
            for ch in n.children:
                total += of(ch)
            out[c] = min(total, extract.CAP)
        return out[c]

    for c in choice:
        of(c)
    return out


@st.composite
def egraphs(draw):
    """An e-graph of 1-3 leaves and up to 24 e-nodes of 0-3 children over the classes made
    before (ops ``a``-``e``, each of a drawn cost), then up to 8 unions of drawn classes (a
    class merged with one it reads makes a cycle) and a rebuild; ``prefer`` the first e-node
    of some classes. Returns ``(eg, roots, cost, prefer)``. Shrinks towards fewer e-nodes and
    unions, cost 0."""
    eg = EGraph()
    made = [eg.add(leaf(f"x{i}"), ClassData(None, True, f"x{i}"))
            for i in range(draw(st.integers(1, 3)))]
    costs = {name: draw(st.sampled_from([0.0, 1.0, 2.0, 3.0, 7.5, 1e9]))
             for name in "abcde"}
    firsts: dict[int, ENode] = {}
    for _ in range(draw(st.integers(0, 24))):
        kids = draw(st.lists(st.sampled_from(made), max_size=3))
        n = _op(draw(st.sampled_from("abcde")), *kids)
        c = eg.add(n, ClassData(None, False, None))
        firsts.setdefault(c, n)
        made.append(c)
    for _ in range(draw(st.integers(0, 8))):
        eg.union(draw(st.sampled_from(made)), draw(st.sampled_from(made)))
    eg.rebuild()
    roots = sorted({eg.find(c) for c in draw(st.lists(st.sampled_from(made), min_size=1,
                                                       max_size=4))})
    prefer = {}
    for c, n in firsts.items():
        if draw(st.booleans()):
            prefer.setdefault(eg.find(c), n)

    def cost(n):
        return 0.0 if n.op == "leaf" else costs[n.op]

    return eg, roots, cost, prefer


@settings(max_examples=examples(150))
@given(egraphs())
def test_law_greedy_reaches_the_fixpoint_of_the_passes(case):
    eg, roots, cost, prefer = case
    got = extract.greedy(eg, roots, cost, prefer)
    want, best = oracle(eg, roots, cost, prefer)
    assert set(got) == set(want)  # the same classes can be built
    assert all(eg.find(c) == c for c in got)
    tree = _tree(eg, got, cost)  # acyclic: a cycle would recurse for ever
    for c, b in best.items():
        assert tree[c] == pytest.approx(b, rel=1e-9)
        # where the oracle's node is the only one of least cost, both choose it
        rivals = [n for n in eg.classes[c]
                  if all(eg.find(ch) in best for ch in n.children)
                  and _own_plus(n, best, eg, cost) <= b * (1 + 1e-9)]
        if len(rivals) == 1:
            assert got[c].key == eg.canonical(want[c]).key
    for c, kept in prefer.items():
        if (c in best and all(eg.find(ch) in best for ch in kept.children)
                and _own_plus(eg.canonical(kept), best, eg, cost) <= best[c] * (1 + 1e-9)):
            assert got[c].key == eg.canonical(kept).key  # the original node wins a tie
    if all(r in got for r in roots):
        assert extract.complete(eg, roots, got)


@settings(max_examples=examples(40), deadline=None)
@given(egraphs())
def test_law_exact_is_complete_and_never_costlier_than_greedy(case):
    """``extract.exact`` (where scipy is installed): an answer exactly where greedy builds
    every root, complete and acyclic, of DAG cost at most greedy's."""
    pytest.importorskip("scipy.optimize", reason="the optional extra `search` (scipy)")
    eg, roots, cost, prefer = case
    greedy = extract.greedy(eg, roots, cost, prefer)
    got = extract.exact(eg, roots, cost, seconds=5.0)
    buildable = all(r in greedy for r in roots)  # greedy builds every class that can be
    assert (got is not None) == buildable
    if got is not None:
        assert extract.complete(eg, roots, got)
        assert all(not n.children or c not in {eg.find(ch) for ch in n.children}
                   for c, n in got.items())
        want = extract.dag_cost(eg, roots, greedy, cost)
        assert extract.dag_cost(eg, roots, got, cost) <= want * (1 + 1e-9) + 1e-6


def _own_plus(n, best, eg, cost):
    total = max(cost(n), 0.0) + extract.EPSILON
    for ch in n.children:
        total += best[eg.find(ch)]
    return min(total, extract.CAP)


class _Counting(EGraph):
    """An e-graph counting ``find`` calls: the extractor's work, whatever its memo."""

    finds = 0

    def find(self, c: int) -> int:
        self.finds += 1
        return super().find(c)


def _backwards_chain(n: int) -> tuple[_Counting, int]:
    """``f(f(...f(x)))`` of depth ``n``, each class merged with an expensive ``g(y)``
    made before the chain, in the reverse order: level ``i`` takes the id of ``g_{n-i}``, so
    class ids fall as the chain rises, against the order the passes go in."""
    eg = _Counting()
    y = eg.add(leaf("y"), ClassData(None, True, "y"))
    slow = [eg.add(_op(f"g{i}", y), ClassData(None, False, None)) for i in range(n)]
    c = eg.add(leaf("x"), ClassData(None, True, "x"))
    for i in range(1, n + 1):
        c = eg.add(_op("f", c), ClassData(None, False, None))
        eg.union(slow[n - i], c)
        c = eg.find(c)
        assert c == slow[n - i]
    eg.rebuild()
    return eg, c


def test_a_chain_whose_class_ids_run_backwards_is_extracted_in_linear_work():
    n = 300
    eg, top = _backwards_chain(n)
    calls: list[str] = []

    def cost(e):
        calls.append(e.op)
        return {"f": 1.0, "leaf": 0.0}.get(e.op, 1e6)

    eg.finds = 0
    choice = extract.greedy(eg, [top], cost)
    work = eg.finds
    assert len(calls) == eg.nodes_count()  # each e-node costed once
    assert choice[top].op == "f" and extract.complete(eg, [top], choice)
    assert sum(1 for e in choice.values() if e.op == "f") == n  # the cheap chain all the way
    assert work <= 6 * (2 * n + 2)  # a few finds per e-node and child: linear
    eg.finds = 0
    oracle(eg, [top], cost)
    assert eg.finds > 50 * work  # the passes: one level per pass, O(n^2)
