"""A refused rule's refusal names the fix (``transforms.rewrite.refusal``): the assumptions it
does not declare under which ``check_rule`` accepts it, found by checking it again with them,
or "no assumption excuses it". Each flag has a right rule refused without it; what the refusal
names is checked again here (the rule with the flags added is accepted)."""

from __future__ import annotations

import attrs
import pytest
import torch

from ir.errors import PassError
from transforms.machinery.law_violation import LawViolation
from transforms.rewrite import Rule, check_rule, sizes
from transforms.rewrite import rule as rule_module
from transforms.rewrite.refusal import Excuse, evidence, excusing
from transforms.rewrite.ruleset import ensure_checked
from transforms.rewrite.verdict_store import Stored, parse

X = (torch.randn(3, 4),)
FEW = 10  # examples per check (the probes come first): the refusals here are found by probes


def _refusal(rule: Rule) -> LawViolation:
    with pytest.raises(LawViolation) as info:
        check_rule(rule)
    return info.value


def _accepted_with(rule: Rule, flags: frozenset[str]) -> None:
    assert check_rule(attrs.evolve(rule, assumes=rule.assumes | flags)).rewritten > 0


def test_regrouped_products_that_overflow_need_no_infs_too():
    # (max * 2) * 0 is NaN where max * (2 * 0) is 0: reassociate is "equal up to rounding"
    rule = Rule(lambda x, a, b: (x * a) * b, lambda x, a, b: x * (a * b), (X[0], 2.0, 3.0),
                name="mul_mul", assumes={"reassociate"}, max_examples=FEW)
    exc = _refusal(rule)
    assert exc.excused_by == {"no_infs"}
    assert "adding no_infs to the rule's assumes" in str(exc) and "ninf" in str(exc)
    assert "adding" not in str(exc).splitlines()[0]  # the counterexample's line as it was
    _accepted_with(rule, exc.excused_by)


def test_x_minus_x_needs_no_nans():
    rule = Rule(lambda x: x - x, lambda x: torch.zeros_like(x), X, name="sub_self", max_examples=FEW)
    exc = _refusal(rule)
    assert exc.excused_by == {"no_nans"}
    assert "nnan" in exc.detail
    _accepted_with(rule, exc.excused_by)


def test_the_rechecks_under_more_assumptions_trace_and_export_nothing_again(monkeypatch):
    # each recheck is the rule with flags added: the same pattern and replacement, so the
    # traces made for the rule's own check serve them (Rule.compiled, sizes.pattern_at)
    rule = Rule(lambda x, a, b: (x * a) * b, lambda x, a, b: x * (a * b), (X[0], 2.0, 3.0),
                name="mul_mul_again", assumes={"reassociate"}, max_examples=FEW)
    exc = _refusal(rule)
    traced = []
    for module in (rule_module, sizes):
        real = module.trace
        monkeypatch.setattr(module, "trace", lambda *a, real=real, **k: traced.append(a[2])
                            or real(*a, **k))
    exported = []
    real_export = torch.export.export
    monkeypatch.setattr(torch.export, "export",
                        lambda *a, **k: exported.append(a[0]) or real_export(*a, **k))
    found = excusing(rule, exc.detail)
    assert found.flags == exc.excused_by == {"no_infs"} and len(found.tried) >= 1
    assert traced == []
    # nor is the pattern's own program exported again at a signature (pattern_program)
    assert exported == []


def test_x_plus_zero_needs_no_signed_zeros():
    rule = Rule(lambda x: x + 0.0, lambda x: x, X, name="add_zero", max_examples=FEW)
    exc = _refusal(rule)
    assert exc.excused_by == {"no_signed_zeros"}
    assert "nsz" in exc.detail


def test_a_wrong_rule_is_excused_by_no_assumption():
    exc = _refusal(Rule(lambda x: torch.sigmoid(x) * x, lambda x: x, X, name="silu_is_x",
                        max_examples=FEW))
    assert exc.excused_by == frozenset()
    assert "no assumption excuses it" in str(exc)


def test_a_dtype_difference_is_excused_by_none_without_a_second_check():
    # no assumption relaxes a dtype: no evidence, so nothing is checked again
    rule = Rule(lambda x: x * 2, lambda x: (x * 2).double(), X, name="widened")
    found = excusing(rule, "outputs [0]: dtype torch.float64, the pattern gives torch.float32")
    assert found == Excuse(frozenset(), (), found.reason) and found.reason
    assert "no assumption excuses it" in found.sentence(rule)


def test_evidence_follows_the_counterexample():
    nan = "outputs [0]: values differ at 1 of 12 positions; first at flat index 3: got 0.0, " \
          "the pattern gives nan on inputs (tensor(3,) float32 [1.0, 2.0, 3.0], 2.0)"
    assert evidence(nan) == ("no_nans", "no_infs")
    assert evidence(nan, {"no_nans"}) == ("no_infs",)
    inf = "outputs [0]: values differ ...: got 6.8e+37, the pattern gives inf on inputs (1.0)"
    assert evidence(inf)[0] == "no_infs"
    zero = "outputs [0]: values differ ...: got -0.0, the pattern gives 0.0 on inputs ([1.0])"
    assert evidence(zero) == ("no_signed_zeros",)
    rounded = "outputs [0]: values differ ...: got 1.5, the pattern gives 1.25 on inputs ([1.0])"
    assert evidence(rounded) == ("reassociate",)
    assert evidence(rounded, {"reassociate"}) == ()
    ints = "outputs [0]: values differ ...: got 3, the pattern gives 4 on inputs ([1, 2])"
    assert evidence(ints) == ()  # integers: no assumption relaxes them
    special_input = "the rewritten program raised RuntimeError: x on inputs ([inf, 1.0])"
    assert set(evidence(special_input)) == {"no_infs", "no_nans"}
    assert evidence("outputs [0]: shape (2,), the pattern gives (3,)") == ()


def test_ensure_checked_carries_the_excuse():
    rule = Rule(lambda x: x - x, lambda x: torch.zeros_like(x), X, name="sub_self_here",
                max_examples=FEW)
    with pytest.raises(PassError, match="adding") as info:
        ensure_checked(rule, verdicts=False)
    assert info.value.excused_by == {"no_nans"}


def test_the_excuse_is_stored_with_the_verdict():
    key, versions = "a" * 64, ("2-x", "2.13")
    wrong = Stored(False, "got 0.0, the pattern gives nan", rule="r", excused_by=("no_nans",))
    assert parse(wrong.body(key, versions), key, versions) == wrong
    none = attrs.evolve(wrong, excused_by=())
    assert parse(none.body(key, versions), key, versions) == none
    old = attrs.evolve(wrong, excused_by=None)  # an entry written before refusals named them
    body = old.body(key, versions)
    assert "excused_by" not in body and parse(body, key, versions) == old
