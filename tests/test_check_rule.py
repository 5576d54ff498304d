"""``check_rule`` hardened (issue 31, item 3): ``where`` sees real matches, no vacuous pass, one
instantiation path with ``rewrite`` (``apply_rules``), aliasing both ways, ints and bools drawn,
sizes drawn per argument, no counterexample of purefx's own making, nothing but ``LawViolation``
or ``PassError`` out."""

from __future__ import annotations

import logging

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ir import PassError
from transforms.machinery.law_violation import LawViolation
from transforms.rewrite import Rule, check_rule
from transforms.rewrite.rule_check import example_signature, signatures

X = (torch.randn(3, 4),)
XY = (torch.randn(3, 4), torch.randn(3, 4))


def test_where_sees_real_matches_at_the_drawn_dtypes_and_shapes():
    seen = []

    def where(match) -> bool:
        v = match.val(0)
        seen.append((len(match.nodes), v.dtype, tuple(v.shape)))
        return True

    check_rule(Rule(lambda x: torch.relu(torch.relu(x)), torch.relu, X, where=where,
                    max_examples=10))
    assert seen and all(n == 2 for n, _, _ in seen)  # the pattern's two nodes, never empty
    dtypes = {d for _, d, _ in seen}
    assert {torch.float32, torch.float64, torch.int64} <= dtypes
    assert len({s for _, _, s in seen}) >= 3


def test_a_where_that_holds_nowhere_is_refused_saying_so():
    never = Rule(torch.relu, lambda x: x, X, name="never", where=lambda m: not m.nodes,
                 max_examples=10)
    with pytest.raises(LawViolation, match="where\\(\\) held on none"):
        check_rule(never)


def test_a_where_reading_the_nodes_no_longer_hides_a_wrong_rule():
    # before, where() saw an empty match: nodes-reading conditions were false on every draw
    wrong = Rule(torch.relu, lambda x: x * 1, X, name="wrong",
                 where=lambda m: len(m.nodes) == 1, max_examples=10)
    with pytest.raises(LawViolation, match="values differ"):
        check_rule(wrong)


def test_a_view_replaced_by_a_copy_is_caught():
    rule = Rule(lambda x: x.t(), lambda x: x.transpose(0, 1) * 1, X, name="t_copy",
                max_examples=10)
    with pytest.raises(LawViolation,
                       match=r"outputs \[0\]: fresh, the pattern's result is an alias of input 0"):
        check_rule(rule)


def test_a_fresh_result_made_an_alias_is_left_to_the_alias_guard():
    # issue 42: a replacement returning its argument where the pattern copies it is accepted
    # (the values agree); rewrite takes it only where the engine's alias guard proves that no
    # write and no caller sees the new aliasing: a returned result of a user input is not
    from ir import import_ep
    from transforms.rewrite import apply_rules

    rule = Rule(lambda x: x * 1, lambda x: x, X, name="times_one_alias", max_examples=5)
    assert check_rule(rule).rewritten > 0

    class Returned(torch.nn.Module):
        def forward(self, x):
            return x * 1

    p = import_ep(torch.export.export(Returned(), (torch.randn(3),)))
    q, report = apply_rules(p, [rule])
    assert q is p and set(report.skipped) == {"alias"}


def test_the_pattern_is_exported_again_with_copies_only_where_a_reader_guard_declined(
        monkeypatch):
    # a decline that reading the results by copies cannot change (here ``where``) costs one
    # export per signature; an ``alias`` decline is tried again with copies (and rewritten)
    from transforms.rewrite import guards
    from transforms.rewrite import rule_check as check

    assert check.BLIND_TO_READERS < {g.name for g in guards.GUARDS}
    assert not {"alias", "shared", "layout"} & check.BLIND_TO_READERS
    exported = []
    real = check.pattern_program

    def counted(rule, sig, *, copies=False):
        exported.append(copies)
        return real(rule, sig, copies=copies)

    monkeypatch.setattr(check, "pattern_program", counted)
    never = Rule(torch.relu, lambda x: x.clamp(min=0), X, name="never", where=lambda m: False)
    sig = check.example_signature(never)
    assert check._rewritten_site(never, sig) is None and exported == [False]
    exported.clear()
    alias = Rule(lambda x: x * 1, lambda x: x, X, name="times_one_alias")
    site = check._rewritten_site(alias, check.example_signature(alias))
    assert site is not None and site.copies and exported == [False, True]


def test_bool_tensors_are_drawn_for_an_int_example():
    # right on ints (two's complement); on bools the replacement raises (no ``neg`` of bool):
    # rewrite declines a replacement that raises on the match's fake values, so the rule is
    # right wherever it is taken; a bool program is left alone, an int one rewritten
    from ir import import_ep
    from transforms.rewrite import rewrite

    rule = Rule(torch.bitwise_not, lambda i: -i - 1, (torch.randint(-3, 4, (3, 4)),),
                name="not_as_neg", max_examples=10)
    check_rule(rule)

    class Not(torch.nn.Module):
        def forward(self, i: torch.Tensor) -> torch.Tensor:
            return torch.bitwise_not(i)

    for x, taken in ((torch.rand(3, 4) > 0.5, False), (torch.randint(-3, 4, (3, 4)), True)):
        p = import_ep(torch.export.export(Not(), (x,)))
        assert (rewrite(p, [rule]) is not p) == taken


def test_a_replacement_declined_on_fake_values_logs_nothing(caplog):
    """rewrite tries the replacement on the match's fake values; torch logs each failing meta
    kernel with a traceback, which purefx keeps off the log (it declines the match itself)."""
    from ir import import_ep
    from transforms.rewrite import rewrite

    rule = Rule(torch.bitwise_not, lambda i: -i - 1, (torch.randint(-3, 4, (3, 4)),),
                name="not_as_neg_quiet", trusted=True)

    class Not(torch.nn.Module):
        def forward(self, i: torch.Tensor) -> torch.Tensor:
            return torch.bitwise_not(i)

    p = import_ep(torch.export.export(Not(), (torch.rand(3, 4) > 0.5,)))
    with caplog.at_level(logging.DEBUG):
        assert rewrite(p, [rule]) is p
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_int_tensors_are_drawn_for_a_bool_example():
    # right on bools, wrong on ints: the sum of 2 and -1 is not their count of nonzeros
    rule = Rule(lambda b: b.sum(), torch.count_nonzero, (torch.rand(3, 4) > 0.5,),
                name="sum_as_count", max_examples=10)
    with pytest.raises(LawViolation, match="values differ .* on inputs \\(tensor\\(.*\\) int"):
        check_rule(rule)


def test_sizes_are_drawn_per_argument():
    # right when x and y have one shape; wrong when y broadcasts along dim 0
    rule = Rule(lambda x, y: (x + y).sum(0), lambda x, y: x.sum(0) + y.sum(0), XY,
                name="sum_of_sum", max_examples=20)
    with pytest.raises(LawViolation, match="values differ|shape"):
        check_rule(rule)
    shapes = {s.args for s in signatures(rule)}
    assert any(a[0] != b[0] for a, b in shapes)  # arguments resized each their own way


def test_a_cast_to_the_querys_dtype_is_no_counterexample():
    # the replacement's trace holds an _assert_tensor_metadata(dtype=float32) after .to: drawn
    # at float64, the rewrite must not fail on purefx's own trace
    rule = Rule(lambda q, m: q - m, lambda q, m: q + torch.neg(m.to(q.dtype)), XY,
                name="cast_mask",
                where=lambda m: m.val(0).dtype == m.val(1).dtype, max_examples=15)
    check_rule(rule)
    assert any(s.args[0][1] == torch.float64 for s in signatures(rule))


def test_right_rules_pass_and_the_example_signature_comes_first():
    rule = Rule(lambda x: x * 2, lambda x: x + x, X, name="twice",
                where=lambda m: m.val(0).dtype != torch.bool, max_examples=10)
    check_rule(rule)
    assert signatures(rule)[0] == example_signature(rule)


def test_a_where_that_raises_is_a_pass_error():
    def boom(match):
        raise ValueError("no")

    with pytest.raises(PassError, match="where\\(\\) raised ValueError"):
        check_rule(Rule(torch.relu, lambda x: x.clamp(min=0), X, name="boom", where=boom,
                        max_examples=3))


def test_a_malformed_rule_is_a_pass_error():
    with pytest.raises(PassError, match="returns 2 values"):
        check_rule(Rule(lambda x: (torch.relu(x), x), torch.relu, X, name="pair"))


@settings(max_examples=1, deadline=None, database=None)
@given(st.just(0))
def test_inside_a_property_suite_the_draws_come_from_a_seeded_generator(_):
    with pytest.raises(LawViolation, match="values differ"):
        check_rule(Rule(torch.relu, lambda x: x * 1, X, name="in_suite", max_examples=5))
