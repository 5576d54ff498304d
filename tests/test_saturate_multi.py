"""``saturate`` with rules of several results (issue 42): ``x @ w1, x @ w2 -> split(x @
cat(w1, w2))``.

The e-matcher matches the first result, then the second among the matmuls reading a class
the match bound; each matched class is merged with a ``getitem`` of one shared ``split``;
extraction tries the two together (``extract.together``), which is what makes one fused
matmul cheaper than two under a DAG cost. Declined where both halves of one buffer would be
returned (they would alias), where a result is written in place (a leaf: never matched), and
where a reader does not admit the half's strides (``eclass_view.EClassView``). Each guard is shown needed.
A returned half may have other strides than the value it replaces (the caller gets the same
values): ``return x @ w1, relu(x @ w2)`` is fused by columns.
"""

from __future__ import annotations

import functools
import sys

import pytest
import torch

from ir import Graph, import_ep
from ir.errors import PassError
from ir.printer import format_graph
from lowering import lower
from transforms.machinery.law_violation import LawViolation
from transforms.rewrite import Rule, SaturationLimits, saturate_report
from transforms.rewrite import extract as extract_mod
from transforms.rewrite import search_result as extracted_mod
from transforms.rewrite.check_context import check_extracted
from transforms.rewrite.egraph import LEAF, from_graph
from transforms.rewrite.ematch import ematch_counted

ATOL = {"atol": 1e-4, "rtol": 1e-4}
saturate_mod = sys.modules["transforms.rewrite.saturate"]  # the package's name is the function
eclass_view_mod = sys.modules["transforms.rewrite.eclass_view"]


def _pair(x, w1, w2):
    return x @ w1, x @ w2


def _fused(x, w1, w2):
    a, b = (x @ torch.cat([w1, w2], dim=-1)).split([w1.shape[-1], w2.shape[-1]], dim=-1)
    return a, b


def _rows(x1, x2, w):
    return x1 @ w, x2 @ w


def _rows_fused(x1, x2, w):
    a, b = (torch.cat([x1, x2]) @ w).split([x1.shape[0], x2.shape[0]])
    return a, b


# trusted: these tests are about the search (check_rule on SHARED: test_rewrite_sharing.py);
# every program derived here is checked against the original (check_extracted, eager)
SHARED = Rule(_pair, _fused, (torch.randn(3, 4), torch.randn(4, 5), torch.randn(4, 6)),
              name="shared", trusted=True)
ROWS = Rule(_rows, _rows_fused, (torch.randn(3, 4), torch.randn(2, 4), torch.randn(4, 5)),
            name="rows", trusted=True)


class _Heads(torch.nn.Module):
    """Two heads on one input, their weights parameters (``cat`` of them is computed from
    state alone: nothing per call once the state is frozen, ``frozen_state=True``, which the
    tests of the fusion say; charged, the ``cat`` at every call costs what the fusion saves)."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(64, 8))
        self.w2 = torch.nn.Parameter(torch.randn(64, 8))

    def forward(self, x):
        return torch.relu(x @ self.w1) + torch.sigmoid(x @ self.w2)


@functools.cache
def _heads():
    """The program of ``_Heads`` and its input, exported once (the program is immutable)."""
    x = torch.randn(32, 64)
    return import_ep(torch.export.export(_Heads(), (x,))), (x,)


@pytest.fixture(scope="module", autouse=True)
def _exported_once():
    _heads()  # torch.export's first call in a process warms it up: here, not in a test


def _body(p) -> str:
    return format_graph(p.root_module.graph).strip()


def _targets(p) -> list[str]:
    return [str(n.target) for n in p.root_module.graph.nodes if n.op == "call_function"]


BEFORE = """\
%p_w1 = placeholder
%p_w2 = placeholder
%x = placeholder
%matmul = call_function[aten.matmul.default](%x, %p_w1)
%relu = call_function[aten.relu.default](%matmul)
%matmul_1 = call_function[aten.matmul.default](%x, %p_w2)
%sigmoid = call_function[aten.sigmoid.default](%matmul_1)
%add = call_function[aten.add.Tensor](%relu, %sigmoid)
return (%add,)"""

EXPECTED = """\
%p_w1 = placeholder
%p_w2 = placeholder
%c__folded_cat = placeholder
%x = placeholder
%matmul_2 = call_function[aten.matmul.default](%x, %c__folded_cat)
%split_with_sizes = call_function[aten.split_with_sizes.default](%matmul_2, [8, 8], -1)
%getitem = call_function[_operator.getitem](%split_with_sizes, 0)
%relu = call_function[aten.relu.default](%getitem)
%getitem_1 = call_function[_operator.getitem](%split_with_sizes, 1)
%sigmoid = call_function[aten.sigmoid.default](%getitem_1)
%add = call_function[aten.add.Tensor](%relu, %sigmoid)
return (%add,)"""


def test_shared_input_matmuls_become_one_matmul_of_the_concatenated_weights():
    p, args = _heads()
    assert _body(p) == BEFORE
    q, report = saturate_report(p, [SHARED], frozen_state=True)
    assert _body(q) == EXPECTED
    assert report.chosen == "saturate" and report.stopped == ("saturated",)
    assert report.rewrites == {"shared": 2}  # the two results, one rewrite
    assert report.cost_after < report.cost_before  # one launch instead of two per call
    assert "shared" not in report.skipped_rules
    torch.testing.assert_close(lower(q)(*args), lower(p)(*args), **ATOL)
    check_extracted(p, q, args)


def test_the_fused_program_computes_what_eager_does():
    torch.manual_seed(0)
    model = _Heads()
    x = torch.randn(32, 64)
    p = import_ep(torch.export.export(model, (x,)))
    q, _ = saturate_report(p, [SHARED], frozen_state=True)
    assert "aten.split_with_sizes.default" in _targets(q)
    torch.testing.assert_close(lower(q)(x), model(x), **ATOL)


def test_extraction_needs_the_group_tried_together(monkeypatch):
    """Tree costs count the shared ``x @ cat(w1, w2)`` once per half: each half alone is
    dearer than its own matmul, so greedy extraction never takes the fused form (the ILP,
    where scipy is installed, does: ``test_extract_ilp``; off here)."""
    p, _ = _heads()
    monkeypatch.setattr(extract_mod, "together",
                        lambda eg, roots, choice, cost, groups, deadline=None: choice)
    monkeypatch.setattr(extract_mod, "exact", lambda *a, **k: None)
    _, report = saturate_report(p, [SHARED], frozen_state=True)
    assert report.chosen != "saturate" and report.rewrites == {}


def test_groups_are_not_tried_past_the_deadline_and_the_report_says_so(monkeypatch):
    """Trying every group costs O(groups x classes); once ``limits.seconds`` has passed,
    extraction keeps greedy's choice and ``stopped`` says it was cut. The clock of extraction
    alone is moved past the deadline and past ``TOGETHER_SECONDS`` (saturation runs as it
    does)."""
    from types import SimpleNamespace

    p, _ = _heads()
    monkeypatch.setattr(extracted_mod, "time", SimpleNamespace(monotonic=lambda: 1e9))
    monkeypatch.setattr(extracted_mod, "TOGETHER_SECONDS", 0.0)
    monkeypatch.setattr(extract_mod, "time", SimpleNamespace(monotonic=lambda: 2e9))
    _, report = saturate_report(p, [SHARED], frozen_state=True)
    assert report.stopped == ("saturated; extraction cut by seconds",)
    assert report.chosen != "saturate" and report.rewrites == {}
    monkeypatch.undo()
    _, report = saturate_report(p, [SHARED], frozen_state=True)
    assert report.stopped == ("saturated",) and report.chosen == "saturate"


def test_a_search_that_used_its_seconds_still_tries_groups_for_together_seconds(monkeypatch):
    """Saturation that stops at ``seconds`` leaves extraction past the deadline; the groups
    are tried for ``TOGETHER_SECONDS`` all the same, so the fused pair is still found."""
    from types import SimpleNamespace

    p, _ = _heads()
    monkeypatch.setattr(extracted_mod, "time", SimpleNamespace(monotonic=lambda: 1e9))
    monkeypatch.setattr(extract_mod, "time", SimpleNamespace(monotonic=lambda: 1e9 + 1.0))
    _, report = saturate_report(p, [SHARED], frozen_state=True)
    assert report.stopped == ("saturated",) and report.chosen == "saturate"
    assert report.rewrites == dict(saturate_report(p, [SHARED], frozen_state=True)[1].rewrites)  # as on time


class _Rows(torch.nn.Module):
    def __init__(self, returned: str) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(256, 256))
        self.returned = returned

    def forward(self, x1, x2):
        a, b = x1 @ self.w, x2 @ self.w
        if self.returned == "both":
            return a, b
        return a.sum(-1) + b.sum(-1)


def _rows_program(returned: str):
    args = (torch.randn(4, 256), torch.randn(4, 256))
    return import_ep(torch.export.export(_Rows(returned), args)), args


def test_row_halves_are_fused_where_not_returned():
    """``cat([x1, x2]) @ w`` split by rows: contiguous halves, the strides of the matched
    values; taken where the caller gets neither."""
    p, args = _rows_program("sum")
    q, report = saturate_report(p, [ROWS])
    assert report.chosen == "saturate" and report.rewrites == {"rows": 2}
    check_extracted(p, q, args)


def test_both_halves_returned_are_declined():
    p, _ = _rows_program("both")
    q, report = saturate_report(p, [ROWS])
    assert q is p and report.rewrites == {}


def test_the_escape_guard_at_extraction_catches_what_the_matcher_let_through(monkeypatch):
    """Without the guard where the rule is applied, the choice is checked again
    (``extracted.shared_escape``: a later merge may make a result escape): the two returned
    halves are not built; the program is kept."""
    p, args = _rows_program("both")
    monkeypatch.setattr(eclass_view_mod, "escapes", lambda eg, c, pinned: False)
    q, report = saturate_report(p, [ROWS])
    assert q is p and report.rewrites == {}
    check_extracted(p, q, args)


def test_the_escape_guards_are_needed(monkeypatch):
    """Without either (nor the check of every output's memory, ``output_alias``, which
    catches it too), the two outputs become views of one buffer: the in-context law's
    aliasing check fails (a caller writing one would change the other)."""
    p, args = _rows_program("both")
    monkeypatch.setattr(eclass_view_mod, "escapes", lambda eg, c, pinned: False)
    monkeypatch.setattr(extracted_mod, "escapes", lambda eg, c, pinned: False)
    monkeypatch.setattr(extracted_mod, "output_alias", lambda geg, graph, choice: False)
    q, report = saturate_report(p, [ROWS])
    assert report.rewrites == {"rows": 2}
    try:
        check_extracted(p, q, args)
    except Exception as exc:  # noqa: BLE001 - the law's violation, named below
        assert "alias" in str(exc)
    else:
        raise AssertionError("two returned views of one buffer passed the law")


def _written():
    """``_Heads`` exported, its ``relu`` made ``relu_``: the first matmul is written in place."""
    p, args = _heads()
    g = p.root_module.graph
    nodes = [n.replace(target=torch.ops.aten.relu_.default) if n.name == "relu" else n
             for n in g.nodes]
    mod = p.root_module.replace(graphs=(Graph.of(nodes),))
    return p.replace(modules=p.modules.set(p.root, mod)), args


def test_a_fresh_result_written_in_place_is_seen_functionally_and_fused():
    """``relu_`` writes the first matmul, a fresh intermediate: the e-graph holds the write
    as ``relu`` of the matmul's class (``transforms.rewrite.versions``), the pair is fused and
    the built program is functional (no ``relu_`` writing a half of the split). Greedy
    ``rewrite`` does not fuse across the write. (A write others can see stays a leaf:
    ``test_saturate_versions``.)"""
    p, args = _written()
    geg = from_graph(p, p.root, p.root_module.graph)
    assert geg.eg.classes[geg.class_of["matmul"]][0].op != LEAF
    q, report = saturate_report(p, [SHARED], frozen_state=True)
    assert report.chosen == "saturate" and dict(report.rewrites) == {"shared": 2}
    assert report.cost_after < report.greedy_cost
    body = format_graph(q.root_module.graph)
    assert "aten.relu_" not in body and "aten.relu.default](%getitem)" in body
    check_extracted(p, q, args)


class _Viewed(torch.nn.Module):
    def forward(self, x, w1, w2):
        return (x @ w1).view(-1).sum() + (x @ w2).sum()


def _viewed():
    args = (torch.randn(1024, 256), torch.randn(256, 8), torch.randn(256, 8))
    return import_ep(torch.export.export(_Viewed(), args)), args


def test_a_view_that_the_strided_half_does_not_admit_declines():
    """The halves of ``x @ cat(w1, w2)`` split by columns have row stride 16, not 8:
    ``view(-1)`` of the first would raise; declined (``EClassView.restride``)."""
    p, args = _viewed()
    q, report = saturate_report(p, [SHARED])
    assert report.rewrites == {}
    check_extracted(p, q, args)


def test_the_layout_guard_is_needed_for_the_halves(monkeypatch):
    """Without ``EClassView.restride`` the fused halves (row stride 16) reach ``view(-1)``.
    The editor derives a reader's ``val`` again when a replacement changes the strides it
    reads (``kernel.same_meta``) and refuses a reader that no longer runs, naming it: the
    build is a PassError at the ``view`` (before, the program was built and the semantics
    law caught the raise at run time)."""
    p, _ = _viewed()
    monkeypatch.setattr(eclass_view_mod.EClassView, "restride", lambda self, c, new, memo: True)
    with pytest.raises(PassError, match=r"aten\.view\.default at node 'view'.*Cannot view"):
        saturate_report(p, [SHARED])


def test_other_results_are_matched_among_the_parents_of_bound_classes_and_counted():
    """Three matmuls of ``x`` and one of ``y``: the second result is looked for among the
    parents of the classes the first bound (``x``'s readers, and ``w``'s), not among every
    matmul; each candidate counts toward the match limit."""

    class Three(torch.nn.Module):
        def forward(self, x, y, w1, w2, w3):
            return (x @ w1 + x @ w2 + x @ w3 + y @ w1).sum()

    args = (torch.randn(4, 3), torch.randn(4, 3), *(torch.randn(3, 2) for _ in range(3)))
    p = import_ep(torch.export.export(Three(), args))
    geg = from_graph(p, p.root, p.root_module.graph)
    by_op: dict = {}
    for c, nodes in geg.eg.classes.items():
        for n in nodes:
            by_op.setdefault(n.op, []).append((n, c))
    pattern = SHARED.compiled("training").pattern
    found, counted = ematch_counted(geg.eg, pattern, by_op, 1000)
    pairs = {(geg.eg.find(m.results[0]), geg.eg.find(m.results[1])) for m in found}
    c = {k: geg.eg.find(geg.class_of[k]) for k in ("matmul", "matmul_1", "matmul_2",
                                                     "matmul_3")}
    # the ordered pairs of x's three matmuls; y @ w1 shares no input with x @ w2, x @ w3, and
    # with x @ w1 only w1 (bound as w1, not as the shared x): no match
    assert pairs == {(c[a], c[b]) for a in ("matmul", "matmul_1", "matmul_2")
                     for b in ("matmul", "matmul_1", "matmul_2") if a != b}
    assert counted > len(found)  # the candidates tried count too
    limited, over = ematch_counted(geg.eg, pattern, by_op, 3)
    assert over > 3 and len(limited) <= 3


def test_a_tight_match_limit_bans_the_rule_then_lifts_the_ban():
    p, args = _heads()
    q, report = saturate_report(p, [SHARED], frozen_state=True, limits=SaturationLimits(match_limit=1))
    assert report.rewrites == {"shared": 2}  # banned in round 1; nothing else to do: lifted
    check_extracted(p, q, args)


def test_at_another_dtype_the_recheck_matches_every_result():
    """float64 values against the rule's float32 examples: the match is re-checked with the
    pattern traced at the matched dtypes (``ematch.exact``), its second result found again."""
    model = _Heads().double()
    x = torch.randn(32, 64, dtype=torch.float64)
    p = import_ep(torch.export.export(model, (x,)))
    q, report = saturate_report(p, [SHARED], frozen_state=True)
    assert report.rewrites == {"shared": 2}
    torch.testing.assert_close(lower(q)(x), model(x))


def test_results_must_be_disjoint_or_the_fused_value_is_fused_again(monkeypatch):
    """``cat([x1, x2]) @ w`` (a class the rule made) shares ``w`` with ``x1 @ w``: without the
    guard it is fused again in round 2, and so on (3848 e-nodes in 11 rounds, stopped at
    ``seconds``, before the guard); with it the search saturates after round 1."""
    p, _ = _rows_program("sum")
    _, report = saturate_report(p, [ROWS])
    assert report.stopped == ("saturated",) and report.sizes[0][-1] == report.sizes[0][1]
    monkeypatch.setattr(saturate_mod, "_disjoint_values", lambda eg, results: True)
    _, report = saturate_report(p, [ROWS], limits=SaturationLimits(iterations=2))
    assert report.stopped == ("iterations",) and report.sizes[0][2] > report.sizes[0][1]


class _ReturnedHalf(torch.nn.Module):
    """``_Heads``' weights; the first head returned as it is, or viewed (``viewed``), or
    returned with its ``reshape`` (``reshaped``: a view of a contiguous value, a copy of a
    strided one), or both heads returned (``both``)."""

    def __init__(self, how: str = "half") -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(64, 8))
        self.w2 = torch.nn.Parameter(torch.randn(64, 8))
        self.how = how

    def forward(self, x):
        a, b = x @ self.w1, x @ self.w2
        if self.how == "both":
            return a, b
        if self.how == "viewed":
            return a.view(-1), torch.relu(b)
        if self.how == "reshaped":
            return a, a.reshape(-1), torch.relu(b)
        return a, torch.relu(b)


@functools.cache
def _returned_half(how: str):
    torch.manual_seed(0)
    model = _ReturnedHalf(how)
    x = torch.randn(32, 64)
    return import_ep(torch.export.export(model, (x,))), model, x


def test_a_returned_half_of_other_strides_is_fused():
    """``return x @ w1, relu(x @ w2)``: the returned ``x @ w1`` becomes the first half of
    ``x @ cat(w1, w2)``, a strided view (row stride 16, not 8). The caller gets the same
    values (the in-context law compares values, dtypes, shapes and aliasing, not strides),
    as ``rewrite``'s layout guard admits a returned value of other strides; before, a
    returned class pinned its layout and the pair was not fused."""
    p, model, x = _returned_half("half")
    q, report = saturate_report(p, [SHARED], frozen_state=True)
    assert _body(q) == """\
%p_w1 = placeholder
%p_w2 = placeholder
%c__folded_cat = placeholder
%x = placeholder
%matmul_2 = call_function[aten.matmul.default](%x, %c__folded_cat)
%split_with_sizes = call_function[aten.split_with_sizes.default](%matmul_2, [8, 8], -1)
%getitem = call_function[_operator.getitem](%split_with_sizes, 0)
%getitem_1 = call_function[_operator.getitem](%split_with_sizes, 1)
%relu = call_function[aten.relu.default](%getitem_1)
return (%getitem, %relu)"""
    assert report.chosen == "saturate" and report.rewrites == {"shared": 2}
    assert report.cost_after < report.cost_before
    got = lower(q)(x)
    assert got[0].stride() == (16, 1)
    torch.testing.assert_close(got, model(x), **ATOL)
    check_extracted(p, q, (x,))


def test_a_view_of_a_returned_half_that_its_strides_do_not_admit_declines():
    p, _, x = _returned_half("viewed")
    q, report = saturate_report(p, [SHARED])
    assert report.rewrites == {}
    check_extracted(p, q, (x,))


def test_two_returned_halves_of_one_buffer_stay_declined():
    """The layout admits them now; the escape guard still refuses two outputs that would be
    views of one buffer."""
    p, _, _ = _returned_half("both")
    q, report = saturate_report(p, [SHARED])
    assert q is p and report.rewrites == {}


def test_a_returned_half_whose_returned_reshape_would_stop_sharing_declines(monkeypatch):
    """``return a, a.reshape(-1), relu(b)``: ``a.reshape(-1)`` is a view of the contiguous
    ``a`` (the two outputs share memory); of the strided half it is a copy. Two returned
    values whose sharing flips: declined (``guards.same_sharing``, as ``rewrite``'s layout
    guard counts returned values where a reader flips). Without the check the in-context
    law reports the lost aliasing."""
    p, _, x = _returned_half("reshaped")
    q, report = saturate_report(p, [SHARED], frozen_state=True)
    assert q is p and report.rewrites == {}
    monkeypatch.setattr(eclass_view_mod, "same_sharing", lambda *vals, **unknown: True)
    q, report = saturate_report(p, [SHARED], frozen_state=True)
    assert report.rewrites == {"shared": 2}
    with pytest.raises(LawViolation, match="alias of output 0"):
        check_extracted(p, q, (x,))
