"""``transforms.rewrite.extract`` and ``egraph`` on hand-built e-graphs: hash-consing, union and
rebuild (congruence), greedy tree-cost choice against the exact (ILP) one where a shared value
makes tree cost mislead, and the completeness check."""

from __future__ import annotations

import pytest

from ir.args import EMPTY_DICT, Ref
from transforms.rewrite import extract
from transforms.rewrite.egraph import ClassData, EGraph, ENode, leaf

COSTS = {"s": 10.0, "p": 1.0, "q": 1.0, "r": 5.0, "f": 1.0}


def _op(name: str, *children: int) -> ENode:
    canon = tuple(Ref(f"#{i}") for i in range(len(children)))
    return ENode(name, canon, canon, EMPTY_DICT, tuple(children), (name, len(children)))


def _cost(n: ENode) -> float:
    return COSTS.get(n.op, 0.0)


def _data() -> ClassData:
    return ClassData(None, False, None)


def test_hash_consing_union_and_congruence():
    eg = EGraph()
    x = eg.add(leaf("x"), ClassData(None, True, "x"))
    y = eg.add(leaf("y"), ClassData(None, True, "y"))
    fx = eg.add(_op("f", x), _data())
    assert eg.add(_op("f", x), _data()) == fx  # one e-node
    fy = eg.add(_op("f", y), _data())
    assert fx != fy
    assert eg.union(x, y) and not eg.union(x, y)
    eg.rebuild()
    assert eg.find(fx) == eg.find(fy)  # f(x) = f(y) once x = y: congruence
    assert len(eg.classes[eg.find(fx)]) == 1


def _shared() -> tuple[EGraph, list[int]]:
    # root1 = p(S), root2 in {q(S), r(x)}, S = s(x): tree cost picks r (5 < 1 + 10), the DAG
    # with q is cheaper (S is computed for root1 anyway)
    eg = EGraph()
    x = eg.add(leaf("x"), ClassData(None, True, "x"))
    s = eg.add(_op("s", x), _data())
    root1 = eg.add(_op("p", s), _data())
    root2 = eg.add(_op("q", s), _data())
    eg.union(root2, eg.add(_op("r", x), _data()))
    eg.rebuild()
    return eg, [root1, eg.find(root2)]


def test_greedy_counts_tree_cost_and_dag_cost_counts_a_shared_value_once():
    eg, roots = _shared()
    choice = extract.greedy(eg, roots, _cost)
    assert extract.complete(eg, roots, choice)
    assert choice[roots[1]].op == "r"
    assert extract.dag_cost(eg, roots, choice, _cost) == pytest.approx(16.0)


def test_exact_extraction_finds_the_cheaper_dag():
    pytest.importorskip("scipy.optimize", reason="the optional extra `search` (scipy)")
    eg, roots = _shared()
    choice = extract.exact(eg, roots, _cost)
    assert choice is not None and extract.complete(eg, roots, choice)
    assert choice[roots[1]].op == "q"
    assert extract.dag_cost(eg, roots, choice, _cost) == pytest.approx(12.0)


def test_exact_without_scipy_returns_none(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_scipy(name, *a, **k):
        if name.startswith("scipy"):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_scipy)
    eg, roots = _shared()
    assert extract.exact(eg, roots, _cost) is None


def test_greedy_never_chooses_a_cycle():
    # x * 1 = x: the class of x holds f(x-class) too; greedy keeps the leaf
    eg = EGraph()
    x = eg.add(leaf("x"), ClassData(None, True, "x"))
    fx = eg.add(_op("f", x), _data())
    eg.union(x, fx)
    eg.rebuild()
    root = eg.find(x)
    choice = extract.greedy(eg, [root], _cost)
    assert choice[root].op == "leaf" and extract.complete(eg, [root], choice)
    cyclic = {root: next(n for n in eg.classes[root] if n.op == "f")}
    assert not extract.complete(eg, [root], cyclic)


def test_greedy_keeps_the_preferred_node_on_a_tie_even_when_it_is_costed_last():
    # the class of a(d(x)) and b(c(x)): both cost 2 (plus two EPSILONs); d settles first
    # (0.5 < 1), so a(d(x)) is costed first; the preferred b(c(x)), costed later, still wins
    costs = {"a": 1.5, "d": 0.5, "b": 1.0, "c": 1.0}
    eg = EGraph()
    x = eg.add(leaf("x"), ClassData(None, True, "x"))
    kept = _op("b", eg.add(_op("c", x), _data()))
    root = eg.add(kept, _data())
    eg.union(root, eg.add(_op("a", eg.add(_op("d", x), _data())), _data()))
    eg.rebuild()
    root = eg.find(root)

    def cost(n):
        return costs.get(n.op, 0.0)

    assert extract.greedy(eg, [root], cost, {root: kept})[root].op == "b"
    assert extract.greedy(eg, [root], cost)[root].op == "a"  # unpreferred: the first costed
    costs["b"] = 1.0 - 1e-3  # cheaper by more than the margin: taken without a preference
    assert extract.greedy(eg, [root], cost)[root].op == "b"
    costs["b"], costs["a"] = 1.0, 1.5 - 1e-3  # cheaper than the preferred one: it loses
    assert extract.greedy(eg, [root], cost, {root: kept})[root].op == "a"


def test_greedy_at_the_cap_keeps_the_preferred_node_and_stays_acyclic():
    # costs past CAP: every total is CAP; the original node is kept, and a class never takes
    # an e-node reading a class settled after it
    eg = EGraph()
    x = eg.add(leaf("x"), ClassData(None, True, "x"))
    kept = _op("s", x)
    top = eg.add(kept, _data())
    eg.union(top, eg.add(_op("r", top), _data()))  # r(top) in top's own class
    eg.union(top, eg.add(_op("p", eg.add(_op("q", x), _data())), _data()))
    eg.rebuild()
    top = eg.find(top)
    choice = extract.greedy(eg, [top], lambda n: 0.0 if n.op == "leaf" else 2 * extract.CAP,
                            {top: kept})
    assert choice[top].op == "s" and extract.complete(eg, [top], choice)


def test_greedy_never_chooses_a_node_of_nan_cost():
    eg = EGraph()
    x = eg.add(leaf("x"), ClassData(None, True, "x"))
    top = eg.add(_op("s", x), _data())
    eg.union(top, eg.add(_op("p", x), _data()))
    eg.rebuild()
    top = eg.find(top)
    costs = {"s": float("nan"), "p": 5.0}
    choice = extract.greedy(eg, [top], lambda n: costs.get(n.op, 0.0))
    assert choice[top].op == "p"
    assert top not in extract.greedy(eg, [top], lambda n: float("nan") if n.op != "leaf" else 0.0)


def test_greedy_tells_apart_two_nodes_under_a_value_read_twice_per_level_for_200_levels():
    # each level reads the one below twice, so tree costs double per level (2^200 here); the
    # two e-nodes of the top class share that and differ by 1.0 of their own. In floats the
    # totals were equal past about 50 levels (and capped at CAP past about 1000), so the
    # preferred, dearer one was kept: a program of many blocks did not reach one block's best
    eg = EGraph()
    below = eg.add(leaf("x"), ClassData(None, True, "x"))
    for _ in range(200):
        below = eg.add(_op("d", below, below), _data())
    dear = _op("a", below)
    top = eg.add(dear, _data())
    eg.union(top, eg.add(_op("b", below), _data()))
    eg.rebuild()
    top = eg.find(top)
    costs = {"d": 1.0, "a": 2.0, "b": 1.0}
    choice = extract.greedy(eg, [top], lambda n: costs.get(n.op, 0.0), {top: dear})
    assert choice[top].op == "b" and extract.complete(eg, [top], choice)
