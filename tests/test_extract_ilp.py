"""``extract.exact``, the extraction by an integer program (issue 42, item 4), where the
optional extra ``search`` (scipy) is installed; every test here is skipped without it.

The exact choice is of least DAG cost (a value two results share counted once), acyclic and
complete; it gives ``None`` (the caller keeps greedy's choice) where its seconds run out or
the solver fails; ``saturate`` keeps it where it is strictly cheaper than greedy's and says so
in ``report.extractor``.
"""

from __future__ import annotations

import attrs
import pytest
import torch

from ir import import_ep
from ir.args import EMPTY_DICT, Ref
from transforms.rewrite import extract, saturate_report
from transforms.rewrite.check_context import check_extracted
from transforms.rewrite.egraph import ClassData, EGraph, ENode, leaf
from transforms.rewrite.rules import SHARED_INPUT_ASSUMES, SHARED_INPUT_MM

COSTS = {"mm": 8.0, "fused": 12.0, "split": 0.0, "get0": 0.0, "get1": 0.0, "relu": 1.0}


def _scipy() -> None:
    pytest.importorskip("scipy.optimize", reason="the optional extra `search` (scipy)")


def _op(name: str, *children: int) -> ENode:
    canon = tuple(Ref(f"#{i}") for i in range(len(children)))
    return ENode(name, canon, canon, EMPTY_DICT, tuple(children), (name, len(children)))


def _cost(n: ENode) -> float:
    return COSTS.get(n.op, 0.0)


def _data() -> ClassData:
    return ClassData(None, False, None)


def _two_results() -> tuple[EGraph, list[int], int]:
    """``x @ w1, x @ w2`` each merged with ``getitem(split(fused(x)), i)``, a rewrite of two
    results: each ``getitem``'s tree cost carries the whole fused matmul (12 > 8), so greedy
    keeps both matmuls (16); the DAG of both ``getitem`` s computes the fused one once (12).
    Returns ``(eg, roots, the split's class)``."""
    eg = EGraph()
    x = eg.add(leaf("x"), ClassData(None, True, "x"))
    a = eg.add(_op("mm", x), _data())
    b = eg.add(_op("mm", x, x), _data())
    s = eg.add(_op("split", eg.add(_op("fused", x), _data())), _data())
    eg.union(a, eg.add(_op("get0", s), _data()))
    eg.union(b, eg.add(_op("get1", s), _data()))
    eg.rebuild()
    return eg, [eg.find(a), eg.find(b)], eg.find(s)


def test_exact_takes_a_split_two_results_share_once_where_greedy_pays_it_twice():
    _scipy()
    eg, roots, split = _two_results()
    greedy = extract.greedy(eg, roots, _cost)
    assert [greedy[r].op for r in roots] == ["mm", "mm"]
    assert extract.dag_cost(eg, roots, greedy, _cost) == pytest.approx(16.0)
    got = extract.exact(eg, roots, _cost)
    assert got is not None and extract.complete(eg, roots, got)
    assert [got[r].op for r in roots] == ["get0", "get1"] and got[split].op == "split"
    assert extract.dag_cost(eg, roots, got, _cost) == pytest.approx(12.0)


def test_exact_counts_what_a_dropped_leaf_reads_only_where_the_leaf_is_read():
    # root = relu(y) where y in {mm(x), get0(split(fused(x)))}; a check (leaf k) reads the
    # fused value. As a root the check makes the fused value needed (getitem: 12); given in
    # ``reads`` it is computed only where chosen (mm: 8)
    _scipy()
    eg = EGraph()
    x = eg.add(leaf("x"), ClassData(None, True, "x"))
    fused = eg.add(_op("fused", x), _data())
    y = eg.add(_op("mm", x), _data())
    eg.union(y, eg.add(_op("get0", eg.add(_op("split", fused), _data())), _data()))
    root = eg.add(_op("relu", y), _data())
    check = eg.add(leaf("k"), ClassData(None, True, "k"))
    eg.rebuild()
    root, fused = eg.find(root), eg.find(fused)
    pinned = extract.exact(eg, [root, fused], _cost)
    assert pinned is not None and pinned[eg.find(y)].op == "get0"
    got = extract.exact(eg, [root], _cost, reads={check: [fused]})
    assert got is not None and got[eg.find(y)].op == "mm" and fused not in got
    assert extract.dag_cost(eg, [root], got, _cost, {check: [fused]}) == pytest.approx(9.0)
    held = {c: eg.classes[c][0] for c in (x, check, fused)}
    assert extract.dag_cost(eg, [check], held, _cost, {check: [fused]}) == 12.0  # read: paid
    assert extract.dag_cost(eg, [check], held, _cost) == 0.0


def test_exact_never_chooses_a_cycle_nor_a_node_of_nan_cost():
    _scipy()
    # x = f(x) (x * 1 = x) and y in {g(x) of NaN cost, h(x)}: the leaf and h, though the
    # cycle and g "cost" less
    eg = EGraph()
    x = eg.add(leaf("x"), ClassData(None, True, "x"))
    eg.union(x, eg.add(_op("f", x), _data()))
    y = eg.add(_op("g", x), _data())
    eg.union(y, eg.add(_op("h", x), _data()))
    eg.rebuild()
    root = eg.find(y)
    got = extract.exact(eg, [root], lambda n: {"g": float("nan"), "h": 5.0}.get(n.op, 0.0))
    assert got is not None and extract.complete(eg, [root], got)
    assert got[root].op == "h" and got[eg.find(x)].op == "leaf"


def test_exact_gives_none_where_its_seconds_are_spent_or_the_solver_fails(monkeypatch):
    _scipy()
    import scipy.optimize

    eg, roots, _ = _two_results()
    assert extract.exact(eg, roots, _cost, seconds=0.0) is None
    assert extract.exact(eg, roots, _cost, seconds=-1.0) is None

    seen: list[float] = []
    real = scipy.optimize.milp

    def timed(*a, options, **k):
        seen.append(options["time_limit"])
        return real(*a, options=options, **k)

    monkeypatch.setattr(scipy.optimize, "milp", timed)
    assert extract.exact(eg, roots, _cost, seconds=3.0) is not None
    assert 0.0 < seen[0] <= 3.0  # the solver gets what building left of the seconds

    class _NoAnswer:
        x = None
        status = 1  # the time limit, no feasible point found

    monkeypatch.setattr(scipy.optimize, "milp", lambda *a, **k: _NoAnswer())
    assert extract.exact(eg, roots, _cost) is None

    def broken(*a, **k):
        raise ValueError("the solver failed")

    monkeypatch.setattr(scipy.optimize, "milp", broken)
    assert extract.exact(eg, roots, _cost) is None


def test_exact_gives_none_where_a_cost_is_infinite():
    _scipy()
    eg, roots, _ = _two_results()
    assert extract.exact(eg, roots, lambda n: float("inf") if n.op == "mm" else 1.0) is None


class _TwoHeads(torch.nn.Module):
    """``relu(x @ w1) + sigmoid(x @ w2)`` on a tall ``x`` read twice: fused into one matmul
    of ``cat(w1, w2)`` it is read once (``bench.search``'s ``shared_heads_0``)."""

    def forward(self, x, w1, w2):
        return torch.relu(x @ w1) + torch.sigmoid(x @ w2)


def test_saturate_keeps_the_exact_choice_of_a_rewrite_of_two_results(monkeypatch):
    """Greedy alone keeps both matmuls (each half's tree cost carries the fused matmul);
    ``extract.together`` would find the fused form too, so it is off here: the ILP finds it
    alone, the report says so, and the program passes the in-context law."""
    _scipy()
    monkeypatch.setattr(extract, "together",
                        lambda eg, roots, choice, cost, groups, deadline=None: choice)
    g = torch.Generator().manual_seed(0)
    args = (torch.rand(4096, 512, generator=g), torch.rand(512, 64, generator=g),
            torch.rand(512, 64, generator=g))
    p = import_ep(torch.export.export(_TwoHeads(), args))
    rule = attrs.evolve(SHARED_INPUT_MM, trusted=True)  # checked by test_rules_shared_input_mm
    q, report = saturate_report(p, [rule], assume=SHARED_INPUT_ASSUMES)
    assert report.extractor == "ilp" and report.chosen == "saturate", report
    assert report.rewrites == {"shared_input_mm": 2}
    assert report.cost_after < report.cost_before
    check_extracted(p, q, args, where="two heads")
