"""``saturate`` with rules whose replacement returns its input (issue 42, item 5): ``x * 1.0 ->
x``, ``(x * 1.0).t() -> x.t()``.

Merging the matched class with its input makes one tensor of two. That keeps the program's
meaning while nothing writes either and the caller cannot see the new aliasing, as
``rewrite``'s ``alias_guard`` decides on the program. Here (``guards.alias_guard`` on the e-graph's ``EClassView``): a value
written in place that the e-graph does not see functionally is a leaf, with every reader of
it, and never matched; a write seen functionally is built as its functional twin; so what is
left is the caller: declined where the result escapes (returned, read by a leaf) while its
input does too (an input or state value, a leaf; or returned). A later merge may still make
a returned class hold an input (hash-consing into a merged class), so the extracted choice is
checked again (``extracted.output_alias``). Each guard is shown needed, and the in-context
law holds on every program derived, and on generated programs with identities and writes in
place.

The rules are trusted copies (these tests are about the search; ``check_rule`` on the
shipped ``TIMES_ONE`` takes about a minute): every program derived is checked against the
original (``check_extracted``).
"""

from __future__ import annotations

import functools
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from ir import format_graph, import_ep
from ir.strategies import program_inputs, programs
from ir.verify import verify
from lowering import lower
from transforms.machinery.law_violation import LawViolation
from transforms.rewrite import Rule, saturate, saturate_report
from transforms.rewrite import search_result as extracted_mod
from transforms.rewrite.check_context import check_extracted

saturate_mod = sys.modules["transforms.rewrite.saturate"]  # the package's name is the function
ATOL = {"atol": 1e-5, "rtol": 1e-5}


def _times_one(x):
    return x * 1.0


def _same(x):
    return x


def _times_one_t(x):
    return (x * 1.0).t()


def _t(x):
    return x.t()


def _neg_neg(x):
    return x.neg().neg()


def _times_one_and_exp(x):
    return x * 1.0, x.exp()


def _same_and_exp(x):
    return x, x.exp()


ONE = Rule(_times_one, _same, (torch.randn(3, 4),), name="one", trusted=True)
ONE_T = Rule(_times_one_t, _t, (torch.randn(3, 4),), name="one_t", trusted=True)
# a rule of several results, one of them its input
PAIR = Rule(_times_one_and_exp, _same_and_exp, (torch.randn(3, 4),), name="pair", trusted=True)
# a fresh replacement that hash-consing puts into a class ONE merged with an input
BACK = Rule(_neg_neg, _times_one, (torch.randn(3, 4),), name="back", trusted=True)


def _compute(p) -> str:
    return "\n".join(line for line in format_graph(p.root_module.graph).splitlines()
                     if "placeholder" not in line)


class _Fn(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _fresh(x):
    t = x + 1
    y = t * 1.0
    return y.exp() + t.sin()


def _returned_of_input(x):
    return x * 1.0


def _returned_twice(x):
    t = x + 1
    return t * 1.0, t


def _returned_fresh(x):
    t = x + 1
    return t * 1.0, t.sin()


def _input_written_through_a_view(x):
    t = x + 1
    y = t * 1.0
    t[0].add_(1)
    return y + t


def _result_written_through_a_view(x):
    t = x + 1
    y = t * 1.0
    y[0].add_(1)
    return y + t


def _result_written(x):
    t = x + 1
    y = t * 1.0
    y.add_(2)
    return y.exp() + t


def _viewed(x):
    t = x + 1
    return (t * 1.0).t().exp()


def _viewed_returned(x):
    return (x * 1.0).t()


def _hash_consed(x):
    b = x.neg().neg()
    a = x * 1.0
    return a.exp(), b


def _pair(x):
    t = x + 1
    a = t * 1.0
    b = t.exp()
    return a.sin() + b


def _pair_returned(x):
    return x * 1.0, x.exp()


@functools.cache
def _program(fn):
    """``fn`` exported once (the program is immutable) with its input."""
    x = torch.randn(4, 4)
    return import_ep(torch.export.export(_Fn(fn), (x.clone(),))), x


def _law(p, q, x) -> None:
    check_extracted(p, q, (x.clone(),))


def test_an_identity_merges_where_its_input_is_fresh_and_unreturned():
    p, x = _program(_fresh)
    assert _compute(p) == """\
%add = call_function[aten.add.Tensor](%x, 1)
%mul = call_function[aten.mul.Tensor](%add, 1.0)
%exp = call_function[aten.exp.default](%mul)
%sin = call_function[aten.sin.default](%add)
%add_1 = call_function[aten.add.Tensor](%exp, %sin)
return (%add_1,)"""
    q, report = saturate_report(p, [ONE])
    assert _compute(q) == """\
%add = call_function[aten.add.Tensor](%x, 1)
%exp = call_function[aten.exp.default](%add)
%sin = call_function[aten.sin.default](%add)
%add_1 = call_function[aten.add.Tensor](%exp, %sin)
return (%add_1,)"""
    assert report.chosen == "saturate" and report.cost_after < report.cost_before
    assert report.classes == ((6, 5, 5),)  # the mul's class merged with its input's
    torch.testing.assert_close(lower(q)(x.clone()), _fresh(x.clone()), **ATOL)
    _law(p, q, x)


def test_a_result_returned_while_its_input_is_a_program_input_is_declined():
    """The output would be the caller's own input: never merged (``alias_guard``)."""
    p, _ = _program(_returned_of_input)
    q, report = saturate_report(p, [ONE])
    assert q is p and report.classes == ((2, 2),)


def test_the_alias_guard_is_needed_and_output_alias_catches_what_it_lets_through(monkeypatch):
    """Without ``alias_guard`` the class of the returned ``mul`` holds the input ``x``, a leaf
    of cost 0, which extraction picks: ``output_alias`` keeps the graph. Without both, the
    derived program returns ``x`` itself (it lowers and runs) and the in-context law's
    aliasing check fails."""
    p, x = _program(_returned_of_input)
    monkeypatch.setattr(saturate_mod, "alias_guard", lambda view, aliases: True)
    q, report = saturate_report(p, [ONE])
    assert report.classes == ((2, 1, 1),) and q is p
    monkeypatch.setattr(extracted_mod, "output_alias", lambda geg, graph, choice: False)
    q, report = saturate_report(p, [ONE])
    assert _compute(q) == "return (%x,)"
    torch.testing.assert_close(lower(q)(x.clone()), x, **ATOL)
    with pytest.raises(LawViolation, match="alias of input"):
        _law(p, q, x)


def test_two_outputs_that_would_be_one_tensor_are_declined():
    p, x = _program(_returned_twice)
    q, report = saturate_report(p, [ONE])
    assert report.classes == ((3, 3),)  # t is returned too: not merged
    _law(p, q, x)


def test_a_returned_result_of_a_fresh_unreturned_input_merges():
    """``t * 1.0`` returned, ``t`` read only by ``sin``: the merge is admitted (the caller
    would get ``t``, which no one else returns nor writes). The builder gives a returned value
    a tensor of its own where its class was made before it, so the ``mul`` stays; greedy
    ``rewrite`` removes it and is kept."""
    p, x = _program(_returned_fresh)
    q, report = saturate_report(p, [ONE])
    assert report.classes == ((4, 3, 3),)
    assert report.chosen == "greedy" and "aten.mul" not in _compute(q)
    _law(p, q, x)


@pytest.mark.parametrize("fn", [_input_written_through_a_view, _result_written_through_a_view])
def test_a_value_written_in_place_is_a_leaf_and_never_merged(fn):
    """A write into a view of ``t`` (or of ``t * 1.0``) is a barrier: the written value and
    its readers are leaves (``egraph.value_roles``), the rule matches nothing there."""
    p, x = _program(fn)
    q, report = saturate_report(p, [ONE])
    assert report.classes[0][0] == report.classes[0][-1]  # nothing merged
    assert "aten.mul.Tensor" in _compute(q)
    _law(p, q, x)


def test_a_result_written_in_place_seen_functionally_merges():
    """``y.add_(2)`` writes the fresh ``y = t * 1.0``: the e-graph sees the write as
    ``add(y, 2)`` (``versions``); ``y`` merges with ``t`` and the built program writes
    nothing (the write's functional twin reads ``t``). Greedy ``rewrite`` does not take the
    match (the result is written after it)."""
    p, x = _program(_result_written)
    assert "aten.add_.Tensor" in _compute(p)
    q, report = saturate_report(p, [ONE])
    assert report.chosen == "saturate" and report.greedy_cost > report.cost_after
    assert _compute(q) == """\
%add = call_function[aten.add.Tensor](%x, 1)
%add_2 = call_function[aten.add.Tensor](%add, 2)
%exp = call_function[aten.exp.default](%add_2)
%add_1 = call_function[aten.add.Tensor](%exp, %add)
return (%add_1,)"""
    verify(q, vals=True)
    _law(p, q, x)


def test_a_view_of_an_input_merges_where_not_returned():
    p, x = _program(_viewed)
    q, report = saturate_report(p, [ONE_T])
    assert _compute(q) == """\
%add = call_function[aten.add.Tensor](%x, 1)
%t_1 = call_function[aten.t.default](%add)
%exp = call_function[aten.exp.default](%t_1)
return (%exp,)"""
    assert report.chosen == "saturate" and report.rewrites == {"one_t": 1}
    _law(p, q, x)


def test_a_returned_view_of_a_program_input_is_declined():
    p, _ = _program(_viewed_returned)
    q, report = saturate_report(p, [ONE_T])
    assert q is p and report.rewrites == {}


def test_output_alias_is_needed_where_hash_consing_merges_a_returned_class_with_an_input(
        monkeypatch):
    """``ONE`` merges ``a = x * 1.0`` (not returned) with ``x``; ``BACK`` then rewrites the
    returned ``b = -(-x)`` to ``x * 1.0``, an e-node already in that class: ``b``'s class holds
    ``x``, no alias check asked (the replacement is fresh). The choice would return ``x``:
    ``output_alias`` keeps the graph (greedy's program is kept); without it the law fails."""
    p, x = _program(_hash_consed)
    q, report = saturate_report(p, [ONE, BACK])
    assert report.chosen != "saturate"
    assert all(line != "return (%exp, %x)" for line in _compute(q).splitlines())
    _law(p, q, x)
    monkeypatch.setattr(extracted_mod, "output_alias", lambda geg, graph, choice: False)
    q, report = saturate_report(p, [ONE, BACK])
    assert _compute(q).endswith("return (%exp, %x)")
    with pytest.raises(LawViolation, match="alias of input"):
        _law(p, q, x)


def test_a_rule_of_several_results_one_its_input_merges_where_safe():
    """``(x * 1.0, x.exp()) -> (x, x.exp())``: each result is checked as a rule of one result
    is; the input result has no e-node of its own, so the rewrite's group (tried together
    by extraction) holds the others only. Returned with ``x`` a program input: declined."""
    p, x = _program(_pair)
    q, report = saturate_report(p, [PAIR])
    assert _compute(q) == """\
%add = call_function[aten.add.Tensor](%x, 1)
%exp = call_function[aten.exp.default](%add)
%sin = call_function[aten.sin.default](%add)
%add_1 = call_function[aten.add.Tensor](%sin, %exp)
return (%add_1,)"""
    assert report.chosen == "saturate"
    _law(p, q, x)
    p, _ = _program(_pair_returned)
    q, report = saturate_report(p, [PAIR])
    assert q is p and report.classes == ((3, 3),)


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs(features={"identities", "inplace_ops", "activations", "buffers",
                          "input_mutation", "inplace_mutation", "repeated_subexpressions",
                          "matrices", "nesting", "pytree_outputs", "overwrites",
                          "inplace_copies"},
                always={"identities"}))
def test_law_saturate_in_context_with_identities(p):
    """``ir.strategies.programs`` with identities (``mul(a, 1.0)``, copies taken just before a
    write in place of their input) and writes in place: the program ``saturate`` returns
    (the e-graph's, or greedy ``rewrite``'s where that is cheaper) verifies and passes the
    in-context law; so does the e-graph's own program.

    Greedy's program took part only once the generated programs gave each value a fake value
    of its own (``ProgramBuilder.fake``): with one fake value per shape and dtype, greedy's alias
    guard saw ``x0 * 1.0`` share ``x0``'s memory and returned the input itself (the law: "an
    alias of input 0")."""
    q = saturate(p, [ONE, ONE_T])
    args, _ = program_inputs(p)
    verify(q, vals=True)
    check_extracted(p, q, tuple(args))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(saturate_mod, "_greedy",
                   lambda p, rules, cost, deadline, frozen=False: (None, None, None, 0))
        q = saturate(p, [ONE, ONE_T])
    args, _ = program_inputs(p)
    verify(q, vals=True)
    check_extracted(p, q, tuple(args))
