"""``check_rule`` and ``check_rule_in_context`` judge alike (issue 36): under ``reassociate``
both judge a difference against a float64 reference through the one harness
(``ir.harness.regrouped_difference``); a wrong rule is refused by both with ``check_rule``'s
counterexample; and a rule that changes a result's strides is accepted in isolation with the
change recorded (``Checked.restrided``), while in a program ``rewrite``'s layout guard keeps it
off readers that need the strides (``tests/laws/test_rewrite_context_teeth.py``)."""

from __future__ import annotations

import attrs
import pytest
import torch
from torch import nn

from ir import PassError, import_ep
from ir.harness import regrouped_difference, value_difference
from transforms.machinery.law_violation import LawViolation
from transforms.rewrite import Rule, check_context, check_rule, check_rule_in_context
from transforms.rewrite.api import rule_verdict
from transforms.rewrite.check_context import check_site

ABC = (torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4))
REGROUP = frozenset({"reassociate", "no_nans", "no_infs", "no_signed_zeros"})


def _floats(match) -> bool:
    return all(match.val(i) is not None and match.val(i).is_floating_point() for i in range(3))


def _regroup() -> Rule:
    # a + (b + c), written so that the replacement does not match the pattern again (and on
    # floats: a - (...) raises on bools)
    return Rule(lambda a, b, c: (a + b) + c, lambda a, b, c: a - (-(b + c)), ABC,
                name="regroup", assumes=REGROUP, max_examples=30, where=_floats)


def _regroup_wrong() -> Rule:
    return Rule(lambda a, b, c: (a + b) + c, lambda a, b, c: a + (b - c), ABC,
                name="regroup_wrong", assumes=REGROUP, max_examples=30)


class Sum3(nn.Module):
    def forward(self, a, b, c):
        return (a + b) + c


# float32: (1 + 1e8) - 1e8 rounds to 0, 1 + (1e8 - 1e8) is 1 (float64 says 1): the
# replacement errs less than the pattern, far beyond float32's tolerance of the pattern's 0
_CANCEL = (torch.tensor([1.0, 2.0]), torch.tensor([1e8, 1e8]), torch.tensor([-1e8, -1e8]))


def _sum3():
    return import_ep(torch.export.export(Sum3(), _CANCEL))


def test_a_rule_right_up_to_regrouping_is_accepted_by_both_laws():
    rule = _regroup()
    # check_rule runs first, outside hypothesis (ensure_checked), its verdict kept
    check_rule_in_context(rule, max_examples=6, places=("root",), levels=("training",))
    assert rule_verdict(rule) is True
    check_site(rule, _sum3(), _CANCEL, "(1 + 1e8) - 1e8")


def test_teeth_without_the_reference_the_context_law_refuses_the_regrouping(monkeypatch):
    rule = attrs.evolve(_regroup(), trusted=True)
    check_site(rule, _sum3(), _CANCEL)
    monkeypatch.setattr(check_context, "_reference", lambda p, inputs: None)
    with pytest.raises(LawViolation, match="values differ"):
        check_site(rule, _sum3(), _CANCEL)


def test_a_wrong_regrouping_is_refused_by_both_with_one_counterexample():
    with pytest.raises(LawViolation, match="values differ") as alone:
        check_rule(_regroup_wrong())
    with pytest.raises(PassError, match="values differ") as in_context:
        check_rule_in_context(_regroup_wrong(), max_examples=6)
    # the in-context check refuses with check_rule's own verdict (the same law and words); the
    # counterexample it shows may come from another check of this rule with another budget
    # (a verdict kept in this process), so its positions are not compared
    verdict = str(alone.value).split(": values differ")[0]
    assert verdict == "law 'rule' broken by Rule('regroup_wrong'): outputs [0]"
    assert f"{verdict}: values differ" in str(in_context.value)


def test_the_reference_is_consulted_only_under_reassociate():
    calls = []
    want, got, ref = torch.tensor([0.0]), torch.tensor([1.0]), torch.tensor([1.0])

    def reference():
        calls.append(1)
        return ref

    def difference(r):
        return value_difference(got, want, assumes=assumes, reference=r)

    assumes = frozenset()
    assert regrouped_difference(difference, reference, assumes) is not None and not calls
    assumes = frozenset({"reassociate"})
    assert regrouped_difference(difference, reference, assumes) is None and calls == [1]


# --- strides ------------------------------------------------------------------------------------


def test_a_rule_that_changes_strides_is_accepted_and_says_so():
    ab = (torch.randn(3, 4), torch.randn(4, 5))
    # specials=False: at the overflow edges the two products sum in other orders (inf and -inf)
    mm_t = Rule(lambda a, b: b.t() @ a.t(), lambda a, b: (a @ b).t(), ab, name="mm_t",
                specials=False, max_examples=8)
    checked = check_rule(mm_t)
    assert checked.changes_layout
    assert "(tensor(3, 4) float32, tensor(4, 5) float32)" in checked.restrided
    relu2 = Rule(lambda x: torch.relu(torch.relu(x)), torch.relu, (torch.randn(3, 4),),
                 name="relu2", max_examples=8)
    assert not check_rule(relu2).changes_layout
