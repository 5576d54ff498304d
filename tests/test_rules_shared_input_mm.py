"""The shipped rule of two results, ``SHARED_INPUT_MM`` (issue 42, item 5):
``x @ w1, x @ w2 -> split(x @ cat(w1, w2, -1))``.

Not trusted: ``check_rule`` checks it once per process (``ensure_checked``, the verdict kept
beside the rule, ``rule_verdict``), and accepts results that are views of one buffer where the
pattern's are fresh. The engine takes a match only where nothing writes either result and the
caller does not get both (guard ``shared``); ``saturate`` takes the fused form where the
roofline cost says it is cheaper (``bench.search``'s program ``shared_heads_0``) and keeps the
program where it is dearer (``shared_heads_1``).
"""

from __future__ import annotations

import functools

import attrs
import pytest
import torch

from bench.search import suite
from ir import Graph, import_ep
from ir.harness import judge, observe, observed_difference, shares_storage
from ir.printer import format_graph
from lowering import lower
from transforms.rewrite import Rule, rewrite, rewrite_report, saturate_report
from transforms.rewrite.api import ensure_checked, rule_verdict
from transforms.rewrite.check_context import check_extracted
from transforms.rewrite.result_sharing import output_bases
from transforms.rewrite.rule_check import RULE
from transforms.rewrite.rules import RULES, SHARED_INPUT_ASSUMES, SHARED_INPUT_MM
from transforms.rewrite_rules import SHARED_INPUT_MM as PUBLIC

ATOL = {"atol": 1e-4, "rtol": 1e-4}


@pytest.fixture(scope="module", autouse=True)
def _checked_once():
    """``check_rule`` of the rule, once for the file (seconds); every test after reads the
    kept verdict."""
    ensure_checked(SHARED_INPUT_MM)


class _Heads(torch.nn.Module):
    def forward(self, x, w1, w2):
        return torch.relu(x @ w1).sum(-1) + torch.sigmoid(x @ w2).sum(-1)


class _Bench(torch.nn.Module):
    """A program of ``bench.search``'s suite, by name (``shared_heads_0``, ``shared_heads_1``:
    ``relu(x @ w1) + sigmoid(x @ w2)`` at two sets of shapes)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.fn = _BENCH[name][0]

    def forward(self, *xs):
        return self.fn(*xs)


_BENCH = {name: (fn, shapes) for name, fn, shapes, _ in suite()}


@functools.cache
def _bench(name: str):
    """The program ``name`` of ``bench.search``'s suite and its inputs, exported once."""
    fn, shapes = _BENCH[name]
    args = _args(*shapes)
    return import_ep(torch.export.export(_Bench(name), args)), args, fn


class _BothFirst(torch.nn.Module):
    def forward(self, x, w1, w2):
        a, b = x @ w1, x @ w2
        return torch.relu(a).sum(-1) + torch.sigmoid(b).sum(-1)


class _Both(torch.nn.Module):
    def forward(self, x, w1, w2):
        return x @ w1, x @ w2


def _args(*shapes: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(*s, generator=g) for s in shapes)


@functools.cache
def _program(module: type, *shapes: tuple[int, ...]):
    """``module`` exported at ``shapes``, once (the program is immutable)."""
    args = _args(*shapes)
    return import_ep(torch.export.export(module(), args)), args


def _body(p) -> str:
    return format_graph(p.root_module.graph).strip()


def test_check_rule_accepts_the_rule_whose_results_share_one_buffer():
    assert not SHARED_INPUT_MM.trusted and SHARED_INPUT_MM.assumes == SHARED_INPUT_ASSUMES
    assert rule_verdict(SHARED_INPUT_MM) is True
    # the replacement's two results are views of one value (the fused matmul)
    assert output_bases(SHARED_INPUT_MM.compiled("training").replacement) == (
        "matmul", "matmul")
    assert PUBLIC is SHARED_INPUT_MM
    assert SHARED_INPUT_MM not in RULES  # whether it pays depends on shapes: saturate's call


def test_the_law_admits_the_new_aliasing_and_only_by_fresh_may_alias():
    """What ``check_rule`` compares (``ir.harness.judge`` under law ``RULE``): the replacement's two
    results share one buffer where the pattern's are fresh. The law admits it (the engine's
    guards keep it from being seen); the same law without ``fresh_may_alias`` reports it."""
    args = _args((3, 4), (4, 5), (4, 6))
    want = SHARED_INPUT_MM.pattern(*args)
    got = SHARED_INPUT_MM.replacement(*args)
    assert shares_storage(got[0], got[1]) and not shares_storage(want[0], want[1])
    assert judge(RULE, observe(got, args), observe(want, args)) is None
    strict = attrs.evolve(RULE, fresh_may_alias=False)
    found = observed_difference(observe(got, args), observe(want, args), strict)
    assert found is not None and "alias" in str(found)


BEFORE = """\
%x = placeholder
%w1 = placeholder
%w2 = placeholder
%matmul = call_function[aten.matmul.default](%x, %w1)
%relu = call_function[aten.relu.default](%matmul)
%sum_1 = call_function[aten.sum.dim_IntList](%relu, [-1])
%matmul_1 = call_function[aten.matmul.default](%x, %w2)
%sigmoid = call_function[aten.sigmoid.default](%matmul_1)
%sum_2 = call_function[aten.sum.dim_IntList](%sigmoid, [-1])
%add = call_function[aten.add.Tensor](%sum_1, %sum_2)
return (%add,)"""

EXPECTED = """\
%x = placeholder
%w1 = placeholder
%w2 = placeholder
%cat = call_function[aten.cat.default]([%w1, %w2], -1)
%matmul_2 = call_function[aten.matmul.default](%x, %cat)
%split_with_sizes = call_function[aten.split_with_sizes.default](%matmul_2, [4, 6], -1)
%matmul = call_function[_operator.getitem](%split_with_sizes, 0)
%matmul_1 = call_function[_operator.getitem](%split_with_sizes, 1)
%relu = call_function[aten.relu.default](%matmul)
%sum_1 = call_function[aten.sum.dim_IntList](%relu, [-1])
%sigmoid = call_function[aten.sigmoid.default](%matmul_1)
%sum_2 = call_function[aten.sum.dim_IntList](%sigmoid, [-1])
%add = call_function[aten.add.Tensor](%sum_1, %sum_2)
return (%add,)"""


def test_rewrite_fuses_two_matmuls_that_share_their_input():
    p, args = _program(_Heads, (8, 16), (16, 4), (16, 6))
    assert _body(p) == BEFORE
    q, report = rewrite_report(p, [SHARED_INPUT_MM], SHARED_INPUT_ASSUMES)
    assert _body(q) == EXPECTED
    assert report.counts == {"shared_input_mm": 1}
    torch.testing.assert_close(lower(q)(*args), _Heads()(*args), **ATOL)
    check_extracted(p, q, args)


def test_rewrite_fuses_them_for_an_input_of_rank_three():
    """``x`` of shape (batch, tokens, features), as in a transformer: the halves are taken
    along the last dimension whatever ``x``'s rank."""
    p, args = _program(_Heads, (2, 5, 16), (16, 4), (16, 6))
    q = rewrite(p, [SHARED_INPUT_MM], SHARED_INPUT_ASSUMES)
    targets = [str(n.target) for n in q.root_module.graph.nodes if n.op == "call_function"]
    assert targets.count("aten.matmul.default") == 1
    torch.testing.assert_close(lower(q)(*args), _Heads()(*args), **ATOL)


def test_vector_weights_are_left_to_the_where():
    """``x @ v`` with a vector ``v`` contracts the last dimension away: nothing to split.
    ``where`` declines it (it would not trace: ``cat`` of the vectors does not fit ``x``)."""
    p, _ = _program(_Heads, (8, 16), (16,), (16,))
    q, report = rewrite_report(p, [SHARED_INPUT_MM], SHARED_INPUT_ASSUMES)
    assert q is p and report.counts == {"shared_input_mm": 0}
    assert set(report.skipped) == {"where"}


def _written(module: type):
    """``module`` at small shapes, its ``relu`` made ``relu_``: the first result, ``x @ w1``,
    is written in place."""
    p, args = _program(module, (8, 16), (16, 4), (16, 6))
    nodes = [n.replace(target=torch.ops.aten.relu_.default) if n.name == "relu" else n
             for n in p.root_module.graph.nodes]
    mod = p.root_module.replace(graphs=(Graph.of(nodes),))
    return p.replace(modules=p.modules.set(p.root, mod)), args


def test_rewrite_declines_it_where_a_result_is_written_in_place():
    """Both matmuls first, then ``relu_`` on the first: as a view of the fused buffer the
    write could reach the other half; declined (guard ``shared``), the program unchanged."""
    p, args = _written(_BothFirst)
    q, report = rewrite_report(p, [SHARED_INPUT_MM], SHARED_INPUT_ASSUMES)
    assert q is p and report.counts == {"shared_input_mm": 0}
    assert set(report.skipped) == {"shared"}
    torch.testing.assert_close(lower(q)(*args), _BothFirst()(*args), **ATOL)


def test_rewrite_declines_it_where_the_write_lies_between_the_matmuls():
    p, _ = _written(_Heads)  # matmul, relu_, sum, matmul_1: the second matmul comes later
    q, report = rewrite_report(p, [SHARED_INPUT_MM], SHARED_INPUT_ASSUMES)
    assert q is p and set(report.skipped) == {"write_between"}


def test_rewrite_declines_it_where_the_caller_gets_both_results():
    """Two outputs that share a buffer where the program's did not: the caller could see a
    write to one through the other."""
    p, _ = _program(_Both, (8, 16), (16, 4), (16, 6))
    q, report = rewrite_report(p, [SHARED_INPUT_MM], SHARED_INPUT_ASSUMES)
    assert q is p and set(report.skipped) == {"shared"}


def test_saturate_takes_the_fused_form_where_it_is_cheaper():
    """``bench.search``'s ``shared_heads_0``: ``x`` (4096 x 512) read once instead of twice
    pays for the ``cat`` of two small weights."""
    p, args, fn = _bench("shared_heads_0")
    q, report = saturate_report(p, [SHARED_INPUT_MM], assume=SHARED_INPUT_ASSUMES)
    assert report.chosen == "saturate" and report.rewrites == {"shared_input_mm": 2}
    assert report.cost_after < report.cost_before
    targets = [str(n.target) for n in q.root_module.graph.nodes if n.op == "call_function"]
    assert targets.count("aten.matmul.default") == 1
    assert "aten.split_with_sizes.default" in targets
    torch.testing.assert_close(lower(q)(*args), fn(*args), **ATOL)


def test_saturate_keeps_the_program_where_the_fused_form_is_dearer():
    """``shared_heads_1``: a short ``x`` (64 rows) and two 4096 x 4096 weights: the ``cat``
    copies 128 MiB per call to save one launch and a read of a small ``x``."""
    p, _, _ = _bench("shared_heads_1")
    q, report = saturate_report(p, [SHARED_INPUT_MM], assume=SHARED_INPUT_ASSUMES)
    assert q is p and report.chosen == "original" and report.rewrites == {}
    assert report.cost_after == report.cost_before


# --- both ways: a rule of two results and its reverse in saturate ------------------------------

# the forward is SHARED_INPUT_MM's functions, checked by this file's fixture; the reverse of a
# both_ways rule is trusted anyway (equality is symmetric)
BOTH = Rule(SHARED_INPUT_MM.pattern, SHARED_INPUT_MM.replacement, SHARED_INPUT_MM.example_inputs,
            name="shared_input_mm_both", where=SHARED_INPUT_MM.where, trusted=True,
            both_ways=True)


class _Fused(torch.nn.Module):
    """``bench.search``'s ``heads``, ``relu(x @ w1) + sigmoid(x @ w2)``, written fused."""

    def forward(self, x, w1, w2):
        a, b = (x @ torch.cat([w1, w2], dim=-1)).split([w1.shape[-1], w2.shape[-1]], dim=-1)
        return torch.relu(a) + torch.sigmoid(b)


@pytest.mark.parametrize(("name", "fused"), [
    ("shared_heads_0", True),  # fused is cheaper
    ("shared_heads_1", False),  # fused is dearer
])
def test_both_ways_saturates_and_keeps_the_cheaper_form(name, fused):
    """The reverse adds nothing (the e-graph has the one-way rule's size each round: what it
    would merge is equal already), so saturation ends (no cycle) and extraction takes the
    cheaper form, as with the rule taken one way."""
    p, args, fn = _bench(name)
    q, report = saturate_report(p, [BOTH])
    assert report.stopped == ("saturated",) and report.skipped_rules == {}
    one_way, one_report = saturate_report(p, [SHARED_INPUT_MM], assume=SHARED_INPUT_ASSUMES)
    assert report.sizes == one_report.sizes and _body(q) == _body(one_way)
    assert (report.chosen == "saturate") is fused
    assert report.cost_after <= report.cost_before
    if fused:
        torch.testing.assert_close(lower(q)(*args), fn(*args), **ATOL)
    else:
        assert q is p


FUSED = """\
%x = placeholder
%w1 = placeholder
%w2 = placeholder
%cat = call_function[aten.cat.default]([%w1, %w2], -1)
%matmul = call_function[aten.matmul.default](%x, %cat)
%split_with_sizes = call_function[aten.split_with_sizes.default](%matmul, [4096, 4096], -1)
%getitem = call_function[_operator.getitem](%split_with_sizes, 0)
%getitem_1 = call_function[_operator.getitem](%split_with_sizes, 1)
%relu = call_function[aten.relu.default](%getitem)
%sigmoid = call_function[aten.sigmoid.default](%getitem_1)
%add = call_function[aten.add.Tensor](%relu, %sigmoid)
return (%add,)"""

UNFUSED = """\
%x = placeholder
%w1 = placeholder
%w2 = placeholder
%matmul_1 = call_function[aten.matmul.default](%x, %w1)
%matmul_2 = call_function[aten.matmul.default](%x, %w2)
%relu = call_function[aten.relu.default](%matmul_1)
%sigmoid = call_function[aten.sigmoid.default](%matmul_2)
%add = call_function[aten.add.Tensor](%relu, %sigmoid)
return (%add,)"""


def test_both_ways_unfuses_a_split_the_program_holds_where_two_matmuls_are_cheaper():
    """The program's own ``split`` is an e-node holding a list, its ``getitem`` s e-nodes
    reading it (``egraph.value_roles``), so the reverse matches it: at ``shared_heads_1``'s
    shapes the two matmuls are extracted (the ``cat`` copied two 4096 x 4096 weights per
    call), roofline 300.4 -> 122.2 µs. Where the fused form is cheaper it is kept
    (``tests/test_saturate_unfuse.py``)."""
    p, args = _program(_Fused, (64, 4096), (4096, 4096), (4096, 4096))
    assert _body(p) == FUSED
    q, report = saturate_report(p, [BOTH])
    assert _body(q) == UNFUSED
    assert report.chosen == "saturate" and report.stopped == ("saturated",)
    assert report.rewrites == {"shared_input_mm_both": 2}
    assert round(report.cost_before, 1) == 300.4 and round(report.cost_after, 1) == 122.2
    torch.testing.assert_close(lower(q)(*args), _Fused()(*args), **ATOL)
    # the in-context law on unfused programs (smaller shapes): tests/test_saturate_unfuse.py
