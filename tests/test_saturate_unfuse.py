"""``saturate`` unfusing a ``split`` the program holds (issue 42, item 2: two-way rules).

The reverse of ``SHARED_INPUT_MM`` (``both_ways=True``) is ``split(x @ cat(w1, w2)) -> x @ w1,
x @ w2``. A list-valued node of the program (``split_with_sizes``, read only by ``getitem`` s)
is an e-node whose class holds the list of fake values, its ``getitem`` s e-nodes reading it
(``egraph.value_roles``), so the reverse's anchor (a ``getitem`` of a ``split`` of a matmul)
matches it, its split sizes matched as wildcards and re-checked at the matched shapes
(``ematch.exact``). Where the two matmuls are cheaper (``shared_heads_1``'s shapes) they are
extracted; where the fused form is cheaper it is kept, the matched ``getitem`` s tried together
(``saturate._projections``). A split whose list is read whole, or whose half is written in
place, stays a leaf; a half that is returned keeps its strides (``eclass_view.EClassView``). Each derived
program is checked against the original by the in-context law (``check_extracted``).
"""

from __future__ import annotations

import functools
import math
import sys
import time

import pytest
import torch

from ir import Graph, import_ep
from ir.args import Ref, thaw
from ir.printer import format_graph
from lowering import lower
from transforms.machinery.law_violation import LawViolation
from transforms.rewrite import Rule, saturate_report
from transforms.rewrite import search_result as extracted_mod
from transforms.rewrite.check_context import check_extracted
from transforms.rewrite.cost import roofline
from transforms.rewrite.egraph import LEAF, from_graph
from transforms.rewrite.extract import dag_cost
from transforms.rewrite.rules import SHARED_INPUT_MM
from transforms.rewrite.ruleset import directions
from transforms.rewrite.saturate import SaturationLimits
from transforms.rewrite.search_result import plan

saturate_mod = sys.modules["transforms.rewrite.saturate"]  # the package's name is the function
ATOL = {"atol": 1e-3, "rtol": 1e-3}

# the reverse of a both_ways rule is trusted (equality is symmetric); the forward is
# SHARED_INPUT_MM's functions, checked in test_rules_shared_input_mm.py
BOTH = Rule(SHARED_INPUT_MM.pattern, SHARED_INPUT_MM.replacement, SHARED_INPUT_MM.example_inputs,
            name="both", where=SHARED_INPUT_MM.where, trusted=True, both_ways=True)

HEADS_0 = ((4096, 512), (512, 64), (512, 64))  # bench.search's shared_heads_0: fused is cheaper
HEADS_1 = ((64, 4096), (4096, 4096), (4096, 4096))  # shared_heads_1: two matmuls are cheaper


class _FusedHeads(torch.nn.Module):
    """``relu(x @ w1) + sigmoid(x @ w2)`` written fused (``bench.search``'s ``heads``)."""

    def __init__(self, returned: str = "") -> None:
        super().__init__()
        self.returned = returned

    def forward(self, x, w1, w2):
        a, b = (x @ torch.cat([w1, w2], dim=-1)).split([w1.shape[-1], w2.shape[-1]], dim=-1)
        out = torch.relu(a) + torch.sigmoid(b)
        return (out, a) if self.returned == "half" else out


def _args(*shapes: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(*s, generator=g) / math.sqrt(s[-1]) for s in shapes)


@functools.cache
def _program(returned: str, *shapes: tuple[int, ...]):
    args = _args(*shapes)
    return import_ep(torch.export.export(_FusedHeads(returned), args)), args


@pytest.fixture(scope="module", autouse=True)
def _exported_once():
    _program("", *HEADS_1)  # torch.export's first call in a process warms it up: here


def _body(p) -> str:
    return format_graph(p.root_module.graph).strip()


def _edited(p, edit):
    """``p`` with its root graph's nodes passed through ``edit`` (node -> node)."""
    g = Graph.of(edit(n) for n in p.root_module.graph.nodes)
    mod = p.root_module.replace(graphs=(g,))
    return p.replace(modules=p.modules.set(p.root, mod))


def test_a_held_split_is_an_e_node_holding_a_list_read_by_getitems():
    p, _ = _program("", *HEADS_1)
    geg = from_graph(p, p.root, p.root_module.graph)
    eg = geg.eg
    split = eg.find(geg.class_of["split_with_sizes"])
    assert [n.op for n in eg.classes[split]] == [torch.ops.aten.split_with_sizes.default]
    val = eg.data[split].val
    assert isinstance(val, list) and [tuple(v.shape) for v in val] == [(64, 4096)] * 2
    half = eg.classes[eg.find(geg.class_of["getitem"])][0]
    assert half.op.__name__ == "getitem" and half.children == (split,)
    # the value split covers its projections: it is never fused again with one of them
    assert eg.data[eg.find(geg.class_of["matmul"])].covers == {"getitem", "getitem_1"}


def test_kept_fused_where_the_fused_form_is_cheaper():
    p, _ = _program("", *HEADS_0)
    q, report = saturate_report(p, [BOTH])
    assert q is p and report.chosen == "original" and report.stopped == ("saturated",)
    assert report.cost_before == report.cost_after  # 41.0 µs by the roofline


# the reverse alone, one way: no forward rule adds a fused form for the extraction to pick
UNFUSE = Rule(SHARED_INPUT_MM.replacement, SHARED_INPUT_MM.pattern,
              SHARED_INPUT_MM.example_inputs, name="unfuse", where=SHARED_INPUT_MM.where,
              trusted=True)


def _saturated(p, rule):
    geg = from_graph(p, p.root, p.root_module.graph)
    rules = directions([rule], "training", {})
    saturate_mod._saturate(geg.eg, rules, SaturationLimits(), time.monotonic() + 20, geg.roots)
    return geg


def _chosen(p, rule):
    """The extraction's plan of ``p`` saturated by ``rule`` and its DAG cost."""
    geg = _saturated(p, rule)
    got = plan(geg, p.root_module.graph, roofline, time.monotonic() + 20)
    return got, dag_cost(geg.eg, geg.roots, got.choice, _cost(geg))


def test_extraction_keeps_the_fused_form_by_trying_the_projections_together(monkeypatch):
    """The tree cost of greedy extraction counts the fused matmul once per half, so each half
    alone is dearer than its own matmul: without the group of the matched ``getitem`` s
    (``saturate._projections``) the extraction of the reverse alone unfuses where the fused
    form is cheaper (the comparison with ``p`` then keeps ``p``, but within a larger graph the
    loss would stay). With both directions the program's own order is kept too, where the
    forward rule's other order (``cat(w2, w1)``) costs the same."""
    p, _ = _program("", *HEADS_0)
    for rule in (UNFUSE, BOTH):
        kept, kept_cost = _chosen(p, rule)
        assert not kept.changes
    monkeypatch.setattr(saturate_mod, "_projections", lambda eg, pattern, m: None)
    monkeypatch.setattr(extracted_mod.extract, "exact", lambda *a, **k: None)  # greedy's
    unfused, unfused_cost = _chosen(p, UNFUSE)
    assert unfused.changes and unfused_cost > kept_cost  # 42.7 against 41.0 µs


def _cost(geg):
    """The roofline of one e-node, as ``extracted.plan`` costs it (invariants aside)."""
    eg = geg.eg

    def of(n):
        if n.op == LEAF:
            return 0.0
        vals = {f"#{i}": eg.data[eg.find(ch)].val for i, ch in enumerate(n.children)}
        a = thaw(n.args, lambda r: vals.get(r.name))
        k = thaw(n.kwargs, lambda r: vals.get(r.name))
        return roofline(n.op, tuple(a), dict(k), eg.data[eg.find(eg.lookup(n))].val)

    return of


@pytest.mark.parametrize("x", [(16, 1024), (2, 8, 1024)])
def test_the_unfused_program_passes_the_in_context_law(x):
    """Two matmuls are cheaper at these shapes (the ``cat`` copies two 1024 x 1024 weights per
    call). For ``x`` of shape (2, 8, 1024) the program splits along dimension 2 where the
    rule's pattern, traced at rank 2, splits along 1: the dimension is a wildcard there too,
    and the re-check at the matched shapes (``ematch.exact``) keeps the match."""
    p, args = _program("", x, (1024, 1024), (1024, 1024))
    q, report = saturate_report(p, [BOTH])
    assert report.chosen == "saturate" and report.rewrites == {"both": 2}
    targets = [str(n.target) for n in q.root_module.graph.nodes if n.op == "call_function"]
    assert targets.count("aten.matmul.default") == 2 and "aten.cat.default" not in targets
    check_extracted(p, q, args)
    torch.testing.assert_close(lower(q)(*args), _FusedHeads()(*args), **ATOL)


class _Uneven(torch.nn.Module):
    """``x @ cat(w1, w2)`` split in halves where ``w1`` is narrower than ``w2``."""

    def forward(self, x, w1, w2):
        a, b = (x @ torch.cat([w1, w2], dim=-1)).split([4096, 4096], dim=-1)
        return torch.relu(a) + torch.sigmoid(b)


def test_a_split_whose_sizes_are_not_the_weights_is_not_unfused():
    """``x @ cat(w1, w2)`` (``w1`` 2048 wide, ``w2`` 6144) split ``[4096, 4096]``: the sizes
    match as wildcards, but the pattern traced at the matched shapes splits ``[2048,
    6144]``; the re-check declines it and the program is kept."""
    args = _args((64, 4096), (4096, 2048), (4096, 6144))
    p = import_ep(torch.export.export(_Uneven(), args))
    q, report = saturate_report(p, [BOTH])
    assert q is p and report.rewrites == {}
    torch.testing.assert_close(lower(q)(*args), _Uneven()(*args), **ATOL)


def test_a_split_whose_list_is_read_whole_stays_a_leaf():
    """``cat(split(m))`` reading the list itself (a hand-made program: export unpacks lists
    by ``getitem``): the list reaches something whole, so it is a leaf and nothing matches
    its halves; the program is kept."""
    p, args = _program("", *HEADS_1)
    whole = torch.ops.aten.cat.default

    def edit(n):
        if n.name == "add":
            return n.replace(target=whole, args=(Ref("split_with_sizes"), -1))
        return n

    p = _edited(p, edit)
    geg = from_graph(p, p.root, p.root_module.graph)
    assert "split_with_sizes" in geg.leaves
    q, report = saturate_report(p, [BOTH])
    assert q is p and report.rewrites == {}
    torch.testing.assert_close(lower(q)(*args), args[0] @ torch.cat(args[1:], -1), **ATOL)


def test_a_split_whose_half_is_written_in_place_stays_a_leaf():
    """``relu_`` on the first half writes the fused matmul's memory: the split, its halves and
    their readers are leaves (the write is not seen functionally: the half is a view), so the
    program is kept even where two matmuls would be cheaper."""
    p, args = _program("", *HEADS_1)
    p = _edited(p, lambda n: n.replace(target=torch.ops.aten.relu_.default)
                if n.name == "relu" else n)
    geg = from_graph(p, p.root, p.root_module.graph)
    assert {"split_with_sizes", "getitem", "getitem_1"} <= geg.leaves
    q, report = saturate_report(p, [BOTH])
    assert q is p and report.rewrites == {}
    torch.testing.assert_close(lower(q)(*args), _FusedHeads()(*args), **ATOL)


def test_a_returned_half_is_unfused_where_no_other_output_shares_its_buffer():
    """The caller gets ``a``, a strided half of the fused matmul. A returned value may take
    other strides (the in-context law compares values, not layouts, as greedy's layout guard
    does), and no other output shares ``a``'s buffer, so both halves are unfused: 300.4 ->
    122.2 us, ``a`` now a contiguous ``x @ w1`` of its own."""
    p, args = _program("half", *HEADS_1)
    q, report = saturate_report(p, [BOTH])
    assert report.chosen == "saturate" and dict(report.rewrites) == {"both": 2}
    assert round(report.cost_before, 1) == 300.4 and round(report.cost_after, 1) == 122.2
    lines = format_graph(q.root_module.graph).splitlines()
    assert lines[-4:] == [
        "%relu = call_function[aten.relu.default](%matmul_1)",
        "%sigmoid = call_function[aten.sigmoid.default](%matmul_2)",
        "%add = call_function[aten.add.Tensor](%relu, %sigmoid)",
        "return (%add, %matmul_1)",
    ]
    check_extracted(p, q, args)


def test_two_returned_halves_of_one_buffer_are_not_unfused(monkeypatch):
    """Both halves returned: the caller's two outputs share one buffer, fresh matmuls in
    their place would not (``guards.sharing_guard`` on the pattern's pairs, ``result_sharing.base_pairs``); without
    the check the law fails."""
    args = _args((8, 16), (16, 4), (16, 4), *HEADS_0)
    p = import_ep(torch.export.export(_HalvesAndHeads(), args))
    q, _ = saturate_report(p, [BOTH])
    check_extracted(p, q, args)
    monkeypatch.setattr(saturate_mod, "sharing_guard", lambda *a: True)
    q, report = saturate_report(p, [BOTH], limits=None)
    assert report.rewrites.get("both", 0) > 2  # the halves unfused too
    with pytest.raises(LawViolation, match="alias"):
        check_extracted(p, q, args)


class _HalvesAndHeads(torch.nn.Module):
    """The caller gets both halves of a split the program holds, and the heads of another
    input that fusing makes cheaper."""

    def forward(self, x, w1, w2, y, w3, w4):
        a, b = (x @ torch.cat([w1, w2], dim=-1)).split([w1.shape[-1], w2.shape[-1]], dim=-1)
        return a, b, torch.relu(y @ w3) + torch.sigmoid(y @ w4)


def test_returned_halves_of_a_held_split_do_not_block_another_fusion(monkeypatch):
    """Two returned views of one buffer the program holds are its own aliasing, not one a
    rewrite made: the extraction's escape check (``extracted.shared_escape``) does not count
    the program's own ``getitem`` s (``_held_projections``). Without that, the fusion of
    ``y``'s heads was dropped: once the program's ``split`` is an e-node, its two returned
    halves looked like a rewrite's."""
    args = _args((8, 16), (16, 4), (16, 4), *HEADS_0)
    p = import_ep(torch.export.export(_HalvesAndHeads(), args))
    q, report = saturate_report(p, [BOTH])
    assert report.chosen == "saturate" and report.rewrites == {"both": 2}
    check_extracted(p, q, args)
    monkeypatch.setattr(extracted_mod, "_held_projections", lambda geg: {})
    q, report = saturate_report(p, [BOTH])
    assert report.chosen != "saturate" and report.rewrites == {}


def test_the_value_split_is_not_fused_again_with_its_own_half(monkeypatch):
    """Once the reverse has merged ``x @ w1`` into the first half's class, the forward would
    fuse the program's ``x @ cat(w1, w2)`` with it (``x @ cat(cat(w1, w2), w1)``), a value it
    computes already: the split value covers its projections (``from_graph``), so the match
    is not disjoint (``_disjoint_values``)."""
    p, _ = _program("", *HEADS_1)
    _, report = saturate_report(p, [BOTH])
    assert report.sizes == ((11, 13, 18, 18),) and report.stopped == ("saturated",)
    built = saturate_mod.from_graph

    def uncovered(*args, **kwargs):
        geg = built(*args, **kwargs)
        for data in geg.eg.data.values():
            data.covers = frozenset()
        return geg

    monkeypatch.setattr(saturate_mod, "from_graph", uncovered)
    _, report = saturate_report(p, [BOTH])
    assert report.sizes == ((11, 13, 38, 43, 43),)


class _Lists(torch.nn.Module):
    """Lists of other operators: ``chunk`` and ``unbind``, each half read twice by ``relu``."""

    def forward(self, x):
        a, b = x.chunk(2, dim=-1)
        c, d = x.unbind(0)
        halves = torch.relu(torch.relu(a)) + torch.relu(torch.relu(b))
        return halves.sum() + (torch.relu(torch.relu(c)) * d).sum()


def test_lists_of_other_operators_are_e_nodes_and_the_search_rewrites_below_them():
    from transforms.rewrite.rules import RELU_RELU

    args = (torch.randn(2, 8),)
    p = import_ep(torch.export.export(_Lists(), args))
    lists = [n.name for n in p.root_module.graph.nodes
             if isinstance(n.meta.get("val"), (list, tuple))]
    assert len(lists) == 2  # export's split/chunk and unbind
    geg = from_graph(p, p.root, p.root_module.graph)
    assert not set(lists) & geg.leaves
    assert all(isinstance(geg.eg.data[geg.eg.find(geg.class_of[n])].val, (list, tuple))
               for n in lists)
    q, report = saturate_report(p, [RELU_RELU])
    relus = [str(n.target) for g in (p, q) for n in g.root_module.graph.nodes
             if str(n.target) == "aten.relu.default"]
    assert report.chosen == "saturate" and len(relus) == 6 + 3  # each relu(relu(.)) is one
    check_extracted(p, q, args)
    torch.testing.assert_close(lower(q)(*args), _Lists()(*args))
