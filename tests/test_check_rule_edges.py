"""``check_rule`` draws where rules break (issue 36): values at the IEEE edges, sizes per
dimension, scalars on their own, layouts; compares at each result's own dtype; honours declared
assumptions; says why it refuses. Each wrong rule is refused with a true counterexample, shrunk
(the message shows the values); each right rule is accepted."""

from __future__ import annotations

import math
import re
import time

import pytest
import torch
import torch.nn.functional as F

from ir import PassError
from ir.harness import value_difference
from ir.import_ep import import_ep
from transforms.machinery.law_violation import LawViolation
from transforms.rewrite import Rule, check_rule
from transforms.rewrite.check_context import check_site
from transforms.rewrite.interpret import run_graph
from transforms.rewrite.rule_check import FINITE, SHRINK_SECONDS, signatures

X = (torch.randn(3, 4),)
SMALL = {"max_examples": 30}


def refused(rule: Rule) -> str:
    with pytest.raises(LawViolation) as info:
        check_rule(rule)
    return str(info.value).splitlines()[0]


def values_in(message: str) -> list[list[float]]:
    """The lists of values a counterexample shows, as floats."""
    return [[float(v) for v in m.split(", ")] for m in re.findall(r"\[([^\]]+)\]", message)]


# --- values at the IEEE edges -------------------------------------------------------------------


def test_plus_zero_is_refused_on_minus_zero():
    msg = refused(Rule(lambda x: x + 0.0, lambda x: x, X, name="plus_zero", **SMALL))
    assert "got -0.0, the pattern gives 0.0" in msg
    assert values_in(msg)[0].count(0.0) == len(values_in(msg)[0])  # shrunk: zeros but one


def test_x_minus_x_refused_exactly_accepted_without_nans_and_infs():
    rule = Rule(lambda x: x - x, lambda x: torch.zeros_like(x), X, name="x_minus_x", **SMALL)
    msg = refused(rule)
    assert "the pattern gives nan" in msg and ("nan" in msg.split("inputs")[1]
                                                or "inf" in msg.split("inputs")[1])
    check_rule(Rule(lambda x: x - x, lambda x: torch.zeros_like(x), X, name="x_minus_x_fast",
                    assumes={"no_nans", "no_infs"}, **SMALL))


def test_log_exp_refused_accepted_only_under_the_assumptions_it_needs():
    def log_exp(x):
        return torch.log(torch.exp(x))

    refused(Rule(log_exp, lambda x: x, X, name="log_exp", **SMALL))
    # exp overflows past 88.7 (an inf result: ignored under no_infs, as LLVM's ninf makes it
    # poison) and log(exp(-0.0)) is +0.0
    refused(Rule(log_exp, lambda x: x, X, name="log_exp_ninf", assumes={"no_infs"}, **SMALL))
    check_rule(Rule(log_exp, lambda x: x, X, name="log_exp_fast",
                    assumes={"no_infs", "no_signed_zeros"}, **SMALL))


def test_exp_overflow_is_drawn():
    # x * 0 + exp(x) * 0 is 0 for finite x until exp overflows (inf * 0 is NaN)
    msg = refused(Rule(lambda x: torch.exp(x) * 0.0, lambda x: x * 0.0, X, name="exp_times_0",
                       assumes={"no_nans", "no_signed_zeros"}, **SMALL))
    assert "the pattern gives nan" in msg or "got nan" in msg


# --- tolerance: each result's own dtype ---------------------------------------------------------


def test_a_float16_round_trip_on_float32_is_refused():
    msg = refused(Rule(lambda x: x.half().float(), lambda x: x, X, name="via_half", **SMALL))
    assert "values differ" in msg


def test_summing_in_float16_instead_of_float32_is_refused():
    h = (torch.randn(3, 4).half(),)
    msg = refused(Rule(lambda x: x.float().sum(-1), lambda x: x.sum(-1).float(), h,
                       name="sum_in_half", **SMALL))
    assert "values differ" in msg and "float16" in msg


def test_the_overflow_of_a_float16_sum_is_seen():
    # inf against 122880: never within any tolerance
    x = torch.full((1, 2), 61440.0, dtype=torch.float16)
    assert "got inf, want 122880.0" in value_difference(x.sum(-1).float(), x.float().sum(-1))


# --- sizes --------------------------------------------------------------------------------------


def test_a_bias_broadcast_along_the_softmax_dim_is_drawn():
    # right while the bias has one element (softmax is shift-invariant), wrong once its size
    # equals the softmax dimension
    rule = Rule(lambda x, b: torch.softmax(x + b, -1), lambda x, b: torch.softmax(x, -1),
                (torch.randn(2, 3), torch.randn(1)), name="drop_bias", assumes=FINITE,
                **SMALL)
    msg = refused(rule)
    assert re.search(r"tensor\(2, 3\) \w+ .*tensor\(3,\)", msg), msg
    sigs = [s.args for s in signatures(rule)]
    assert any(a[1][0] == (3,) for a in sigs)


# --- scalars ------------------------------------------------------------------------------------


def test_max_as_leaky_relu_refused_for_a_slope_above_one():
    rule = Rule(lambda x, a: torch.maximum(x, a * x), lambda x, a: F.leaky_relu(x, a),
                (torch.randn(3, 4), 0.5), name="max_as_leaky", assumes=FINITE, **SMALL)
    msg = refused(rule)
    a = float(msg.rsplit(", ", 1)[1].rstrip(")"))
    assert a > 1 or a < 0, msg


def test_floor_of_a_quotient_is_not_floor_divide():
    rule = Rule(lambda x, d: torch.floor(x / d), lambda x, d: torch.floor_divide(x, d),
                (torch.randn(3, 4), 2.0), name="floor_div", assumes=FINITE, **SMALL)
    assert "values differ" in refused(rule)
    # at d = 0.1 ordinary values suffice: 1.0 / 0.1 floors to 10, 1.0 // 0.1 is 9
    sigs = [s.args for s in signatures(rule)]
    assert any(a[1] == 0.1 and a[0][1] == torch.float32 for a in sigs)
    x = torch.tensor([1.0])
    assert value_difference(torch.floor_divide(x, 0.1), torch.floor(x / 0.1)) is not None


# --- right rules, with the assumptions they need ------------------------------------------------


@pytest.mark.parametrize("rule", [
    Rule(lambda x: x * 1, lambda x: x, X, name="times_one", **SMALL),
    Rule(lambda x: x.t().t(), lambda x: x, X, name="t_t", **SMALL),
    Rule(lambda x: torch.relu(torch.relu(x)), torch.relu, X, name="relu_relu", **SMALL),
    Rule(lambda x: x * 2, lambda x: x + x, X, name="twice", **SMALL),
    Rule(lambda x: torch.neg(torch.neg(x)), lambda x: x * 1, X, name="neg_neg", **SMALL),
], ids=lambda r: r.name)
def test_right_rules_are_accepted(rule):
    check_rule(rule)


# --- refusals say why ---------------------------------------------------------------------------


def test_an_in_place_pattern_is_refused_saying_so():
    # one refusal, where the rule is compiled: check_rule and rewrite say the same
    with pytest.raises(PassError) as info:
        check_rule(Rule(lambda x: torch.relu(x).add_(1), lambda x: torch.relu(x) + 1, X,
                        name="in_place"))
    assert "rewrite matches functional programs: write the functional form (e.g. add instead " \
           "of add_)" in str(info.value)


class Oops(Exception):
    pass


def test_a_where_that_raises_is_told_by_its_type():
    def where(match):
        raise Oops("no words about where here")

    with pytest.raises(PassError, match="its where\\(\\) raised Oops: no words"):
        check_rule(Rule(torch.relu, lambda x: x.clamp(min=0), X, name="raises", where=where))


def test_a_where_that_admits_no_draw_says_so():
    with pytest.raises(LawViolation, match="where\\(\\) held on none"):
        check_rule(Rule(torch.relu, lambda x: x, X, name="never", where=lambda m: False,
                        max_examples=5))


def test_a_refused_rule_reports_within_the_budget():
    start = time.monotonic()
    refused(Rule(lambda x: x + 0.0, lambda x: x, (torch.randn(8, 16),), name="plus_zero_big"))
    # the shrink budget plus the tracing before it (generous: the machine is shared)
    assert time.monotonic() - start < SHRINK_SECONDS + 20


# --- one verdict: check_rule and check_rule_in_context compare alike ----------------------------


def test_check_site_sees_what_check_rule_sees():
    rule = Rule(lambda x: x + 0.0, lambda x: x, X, name="plus_zero_trusted", trusted=True)

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) + 0.0

    x = torch.tensor([[-0.0, 1.0], [2.0, -3.0]])
    p = import_ep(torch.export.export(M(), (x,)))
    with pytest.raises(LawViolation, match="got -0.0, the original gives 0.0"):
        check_site(rule, p, (torch.tensor([[-0.0, 1.0]]),))
    (want,) = run_graph(p.root_module.graph, [x])
    assert math.copysign(1, float(want[0, 0])) == 1.0


# --- integer edges and conversions out of range (issue 54, item 6) ------------------------------


def test_wrapping_integer_negation_is_refused_at_int_min():
    # -x wraps at INT_MIN (-INT_MIN is INT_MIN), so max(-x) is not -min(x) there: [0, INT_MIN]
    # gives max(0, INT_MIN) = 0 against -INT_MIN = INT_MIN. Accepted before the integer probes:
    # a 2-element tensor seldom drew INT_MIN beside another value
    rule = Rule(lambda x: torch.amax(-x), lambda x: -torch.amin(x), (torch.tensor([3, -2]),),
                name="amax_neg")
    msg = refused(rule)
    assert str(torch.iinfo(torch.int64).min) in msg or str(torch.iinfo(torch.int32).min) in msg


def test_a_cast_out_of_range_in_the_replacement_is_refused():
    # trunc(x) is x.to(int64).to(float) only inside int64's range; beyond it the cast gives
    # INT64_MIN. Finite values only (specials=False), so only the conversion's edges (floats
    # past the integer range, probed now for the replacement's casts too) tell
    rule = Rule(torch.trunc, lambda x: x.to(torch.int64).to(x.dtype), (torch.randn(4, 8),),
                name="trunc_via_int64", specials=False)
    msg = refused(rule)
    assert "e+18" in msg or "e+19" in msg


def test_right_integer_negations_are_accepted():
    ints = (torch.tensor([3, -2, 0, 5]),)
    check_rule(Rule(lambda x: torch.neg(torch.neg(x)), lambda x: x, ints, name="neg_neg_int",
                    max_examples=8))
    # of one dtype: -INT_MIN wraps to INT_MIN, and x + INT_MIN wraps as x - INT_MIN does (a
    # float x with an int y is refused: -y wraps before the promotion)
    check_rule(Rule(lambda x, y: x - y, lambda x, y: x + (-y), ints + ints,
                    name="sub_as_add_neg", max_examples=8,
                    where=lambda m: m.val(0).dtype == m.val(1).dtype))


def test_integer_edges_are_probed_where_the_pattern_wraps():
    from transforms.rewrite.rule_check import (
        Signature,
        divides,
        int_edge_probe,
        int_edge_starts,
        int_pool,
        pattern_program,
        wraps,
    )

    lo, hi = torch.iinfo(torch.int8).min, torch.iinfo(torch.int8).max
    assert {lo, hi, 0, 1, -1} <= set(int_pool(torch.int8))
    sig = Signature((((2,), torch.int8), ((3,), torch.int8), 0.5))
    starts = int_edge_starts(sig)
    seen = set()
    for start in starts:
        a, b, scalar = int_edge_probe(sig, start)
        assert scalar == 0.5 and a.dtype == torch.int8
        seen |= set(zip(a.tolist(), b.tolist()))
    pool = int_pool(torch.int8)
    assert {(x, y) for x in pool for y in pool} <= seen  # every pair of values at one position
    assert int_edge_starts(Signature((((2,), torch.float32),))) == ()
    neg = Rule(lambda x: -x, lambda x: x * -1, (torch.tensor([1, 2]),))
    relu = Rule(torch.relu, torch.relu, (torch.tensor([1, 2]),))
    at = Signature((((2,), torch.int64),))
    assert wraps(pattern_program(neg, at)) and not wraps(pattern_program(relu, at))
    floats = Signature((((2,), torch.float32),))
    assert not wraps(pattern_program(neg, floats))
    # a program that divides integers gets no -1: INT_MIN // -1 stops the process (SIGFPE)
    cancel = Rule(lambda i, j: (i * j) // j, lambda i, j: i, (torch.tensor([1, 2]),) * 2)
    two = Signature((((2,), torch.int32), ((2,), torch.int32)))
    assert divides(pattern_program(cancel, two)) and not divides(pattern_program(neg, at))
    assert -1 not in int_pool(torch.int32, divides=True)
    for start in int_edge_starts(two, divides=True):
        assert -1 not in int_edge_probe(two, start, divides=True)[1].tolist()
