"""``check_rule`` on torch inductor's 14 no-dropout attention rules, loaded from the installed
torch (``tests/inductor_rules.py``): never a raw error (the old check raised ``view size is not
compatible`` on rules 15, 23 and 30), right rules accepted, wrong ones refused with a true
counterexample. The verdicts are those ``bench/inductor_attention.py`` reports."""

from __future__ import annotations

import pytest
import torch

from tests.inductor_rules import NO_DROPOUT, inductor_rule
from transforms.machinery.law_violation import LawViolation
from transforms.rewrite import check_rule

RIGHT = (1, 2, 8, 10, 11, 23, 30)
"""Accepted: right wherever inductor's own parameter check holds and ``rewrite`` takes the match
(8 and 10, which end in a cast to float16, checked with float16 examples; on int64 inputs 23's
replacement raises on the match's fake values and 8's cannot be traced, so ``rewrite`` declines
those matches and nothing is wrong;
1, 10 and 11 divide by their scale argument in Python, so at a drawn scale of 0.0 or -0.0 the
replacement cannot be traced and ``rewrite`` declines the match: guard
``replacement_untraceable``)."""
_MASK = "the rewritten program raised"  # the mask enlarges the scores: keys of length 1 broadcast
WRONG = {
    # or another true counterexample found first: -0.0 for +0.0, half-precision rounding at a
    # scale of 1e4
    5: (_MASK, "values differ"), 14: _MASK, 21: _MASK, 22: _MASK, 29: (_MASK, "values differ"),
    15: "values differ",  # (mask == 0) in the pattern, (mask == 1) in the replacement
    24: "the rewritten program raised",  # heads read from the query reshape the keys
}
"""Refused, with the kind of counterexample (or kinds). The rules are checked with
``tests.inductor_rules.ASSUMES`` (finite values, sums regrouped), what the fusion assumes."""


def _expected(k: int, verdict: str) -> bool:
    if k in WRONG:
        kinds = WRONG[k] if isinstance(WRONG[k], tuple) else (WRONG[k],)
        return any(kind in verdict for kind in kinds)
    return verdict == "accepted"


def _verdict(k: int) -> str:
    try:
        check_rule(inductor_rule(k))
    except LawViolation as exc:
        return str(exc)
    return "accepted"


def test_the_rules_split_into_right_and_wrong():
    assert sorted((*RIGHT, *WRONG)) == sorted(NO_DROPOUT)


@pytest.mark.parametrize("k", [11, 15])  # 11: a scale of 0.0 declined, not raised
def test_a_sample_of_inductors_rules(k):
    verdict = _verdict(k)
    assert _expected(k, verdict), verdict


@pytest.mark.slow
@pytest.mark.nightly  # every rule; the sample above runs by default
@pytest.mark.parametrize("k", NO_DROPOUT)
def test_every_inductor_rule_gets_its_verdict(k):
    verdict = _verdict(k)  # a raw error would fail the test here
    assert _expected(k, verdict), verdict


def test_rule_15_is_refused_with_a_mask_of_other_values_than_0_and_1():
    # the old check raised RuntimeError (view size is not compatible) comparing the result
    with pytest.raises(LawViolation, match="values differ .* on inputs"):
        check_rule(inductor_rule(15))
    assert torch.is_tensor(inductor_rule(15).example_inputs[3])
