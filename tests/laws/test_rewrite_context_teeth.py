"""Teeth of ``check_rule_in_context``: each class of issue 31 put back into the engine through
its seam (``transforms.rewrite.guards``, ``match.literal_equal``, ``apply_rules(fixpoint=False)``) makes
the law fail with a ``LawViolation`` that names it; with the seams as shipped it passes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ir import import_ep
from transforms.machinery.law_violation import LawViolation
from transforms.rewrite import (
    Rule,
    check_context,
    check_rule_in_context,
    engine,
    guards,
    match,
    sizes,
)
from transforms.rewrite.check_context import check_site

X = (torch.randn(4, 8),)


def _times_one(**options) -> Rule:
    """``x * 1 -> x``, trusted: the law in context, not ``check_rule``, must find what goes
    wrong (a fresh Rule per test: verdicts and traces are memoized per rule)."""
    return Rule(lambda x: x * 1, lambda x: x, X, name="times_one", trusted=True, **options)


def _loose(p, t) -> bool:
    """The matcher's literals as they were: numbers equal by value (``1 == 1.0``)."""
    numbers = (int, float)
    if isinstance(p, numbers) and isinstance(t, numbers):
        return p == t
    return type(p) is type(t) and p == t


def test_with_the_seams_as_shipped_the_law_holds():
    check_rule_in_context(_times_one(), max_examples=10)


def test_bad_options_are_pass_errors():
    from ir import PassError

    with pytest.raises(PassError, match="places must be"):
        check_rule_in_context(_times_one(), places=("nowhere",))
    with pytest.raises(PassError, match="max_examples must be"):
        check_rule_in_context(_times_one(), max_examples=0)


def test_teeth_alias_guard(monkeypatch):
    # x * 1 -> x makes a fresh result an alias of the input: returned, or written through
    monkeypatch.setattr(guards, "alias_guard", lambda *a, **k: True)
    with pytest.raises(LawViolation, match="alias of (input|state)|input 0 after the call"):
        check_rule_in_context(_times_one(), max_examples=30)


def test_teeth_dtype_guard(monkeypatch):
    # bool * 1 is int64; the replacement (a fresh copy of x: no aliasing in the way) is bool
    monkeypatch.setattr(guards, "dtype_guard", lambda *a, **k: True)
    rule = Rule(lambda x: x * 1, lambda x: torch.where(x == x, x, x), X, name="times_one",  # noqa: PLR0124
                trusted=True)
    # a bool input is one signature among many: enough draws to meet one whatever the seed
    # (the run's seed is hypothesis's digest of the law's check and the rule's name)
    with pytest.raises(LawViolation, match="dtype torch.bool, the original gives torch.int64"):
        check_rule_in_context(rule, max_examples=150, places=("root",))


class _IntTimesOneFloat(nn.Module):
    def forward(self, x):
        return x * 1.0 + 1  # int64 x: the product is float


def test_teeth_typed_literals(monkeypatch):
    # the near miss int * 1.0 (float) taken for x * 1: literals match by value, and the
    # pattern re-traced at the match's dtypes must compute its dtypes (sizes.dtypes_agree);
    # the dtype guard is the second line, so all are off here
    x = torch.tensor([1, 2, 3])
    p = import_ep(torch.export.export(_IntTimesOneFloat(), (x,)))
    check_site(_times_one(), p, (x,), "an int64 product with 1.0")  # right as shipped
    monkeypatch.setattr(match, "literal_equal", _loose)
    monkeypatch.setattr(sizes, "dtypes_agree", lambda *a, **k: True)
    check_site(_times_one(), p, (x,), "an int64 product with 1.0")  # the dtype guard holds
    monkeypatch.setattr(guards, "dtype_guard", lambda *a, **k: True)
    with pytest.raises(LawViolation, match="dtype torch.int64"):
        check_site(_times_one(), p, (x,), "an int64 product with 1.0")


def test_teeth_barrier_guard(monkeypatch):
    monkeypatch.setattr(guards, "barrier_guard", lambda *a, **k: True)
    rule = Rule(lambda x: torch.relu(torch.relu(x)), torch.relu, X, name="relu_relu",
                trusted=True)
    with pytest.raises(LawViolation, match="preserved call 'child'"):
        check_rule_in_context(rule, max_examples=15, places=("across",))


# A cascade of three right rules (tests/test_rewrite_sound.py): the third matches only once the
# second has run, two readers downstream of its new node.
_CASCADE = [
    Rule(lambda x: torch.relu(torch.relu(x)), lambda x: torch.clamp_min(x, 0.0), X,
         name="relu_relu", trusted=True),
    Rule(lambda z: torch.clamp_min(-z, 0.0), lambda z: -torch.clamp_max(z, 0.0), X,
         name="clamp_neg", trusted=True),
    Rule(lambda y: torch.neg(torch.neg(-torch.clamp_max(y, 0.0))),
         lambda y: -torch.clamp_max(y, 0.0), X, name="neg_neg", trusted=True),
]


class _Cascade(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("w", torch.randn(6, 6))

    def forward(self, x):
        return torch.neg(-torch.relu(torch.relu(-x))) + F.linear(x, self.w)


def test_teeth_fixpoint(monkeypatch):
    x = torch.randn(6)
    p = import_ep(torch.export.export(_Cascade(), (x,)))
    check_site(_CASCADE, p, (x,), "the cascade")  # a fixpoint as shipped
    # the one-pass worklist (no closing sweep) in place of rewrite's
    monkeypatch.setattr(
        check_context, "rewrite",
        lambda q, rules, assume=frozenset(): engine.apply_rules(q, rules, fixpoint=False)[0],
    )
    with pytest.raises(LawViolation, match="not a fixpoint"):
        check_site(_CASCADE, p, (x,), "the cascade")


# Issue 36: a copy inside the match, and a reader that needs the result's strides.
_T_T = (torch.randn(3, 4),)


def test_teeth_a_copy_inside_the_match(monkeypatch):
    # x.t().t() -> x is right, but on x.t().clone().t() its result is fresh: made the input,
    # a write through it lands in the caller's x (the alias guard decides on the matched vals)
    rule = Rule(lambda x: x.t().t(), lambda x: x, _T_T, name="t_t", trusted=True)
    check_rule_in_context(rule, max_examples=15, places=("copied",))
    monkeypatch.setattr(guards, "GUARDS", guards.without("alias"))
    rule = Rule(lambda x: x.t().t(), lambda x: x, _T_T, name="t_t", trusted=True)
    with pytest.raises(LawViolation, match="copied"):
        check_rule_in_context(rule, max_examples=40, places=("copied",))


def test_teeth_a_reader_that_needs_the_strides(monkeypatch):
    # b.t() @ a.t() -> (a @ b).t(): the same values, other strides; view(-1) then raises
    ab = (torch.randn(3, 4), torch.randn(4, 5))

    def rule() -> Rule:
        return Rule(lambda a, b: b.t() @ a.t(), lambda a, b: (a @ b).t(), ab, name="mm_t",
                    trusted=True)

    check_rule_in_context(rule(), max_examples=15, places=("root",))
    monkeypatch.setattr(guards, "GUARDS", guards.without("layout"))
    with pytest.raises(LawViolation, match="flat"):
        check_rule_in_context(rule(), max_examples=40, places=("root",))
