"""Under ``reassociate`` a result is judged by the magnitude of the terms summed, not by its own
(``ir.harness.Regrouped``, ``with_terms``): any regrouped sum of ``n`` terms is within ``n * eps
* sum(|terms|)`` of the exact one, so ``matmul(a, b) + c -> addmm(c, a, b)`` is accepted on a
cancellation (products near 7e12 summing to about 0) and a wrong rule is still refused. The
dict branch of the comparison passes the reference on (it used to drop it)."""

from __future__ import annotations

import pytest
import torch

from ir.harness import Regrouped, value_difference, widen, with_terms
from transforms.machinery.law_violation import LawViolation
from transforms.rewrite import Rule, check_rule

REGROUP = frozenset({"reassociate"})
ABC = (torch.randn(3, 4), torch.randn(4, 5), torch.randn(3, 5))


def _addmm_shaped(match) -> bool:
    a, b, c = (match.val(i) for i in range(3))
    return (all(v is not None and v.dtype == torch.float32 for v in (a, b, c))
            and a.dim() == 2 and b.dim() == 2 and tuple(c.shape) == (a.shape[0], b.shape[1]))


def test_a_cancellation_is_judged_by_the_terms_not_the_result():
    got, want, exact = torch.tensor([0.0]), torch.tensor([-1.0]), torch.tensor([-1.0], dtype=torch.float64)
    terms = torch.tensor([1.4e13], dtype=torch.float64)  # |a| @ |b| + |c|
    assert value_difference(got, want, assumes=REGROUP, reference=exact) is not None
    assert value_difference(got, want, assumes=REGROUP, reference=Regrouped(exact, terms)) is None
    # not past the bound: a difference far beyond eps * terms is still one
    far = torch.tensor([1e10])
    assert value_difference(far, want, assumes=REGROUP, reference=Regrouped(exact, terms))
    # and only under reassociate
    assert value_difference(got, want, reference=Regrouped(exact, terms)) is not None


def test_the_terms_come_from_the_pattern_on_absolute_inputs():
    a = torch.tensor([[1e6, -1e6]])
    b = torch.tensor([[1e6], [1e6]])
    exact = torch.matmul(*widen((a, b)))
    terms = torch.matmul(*widen((a, b), absolute=True))
    assert exact.item() == 0.0 and terms.item() == 2e12
    paired = with_terms((exact, {"k": exact}), (terms, {"k": terms}))
    assert paired[0] == Regrouped(exact, terms) and paired[1]["k"] == Regrouped(exact, terms)
    assert with_terms((exact,), None) == (exact,)  # no terms run: the plain reference


def test_the_dict_branch_passes_the_reference_on():
    want, got = {"k": torch.tensor([0.0])}, {"k": torch.tensor([1.0])}
    ref = {"k": torch.tensor([1.0], dtype=torch.float64)}  # got is exact, want rounded badly
    assert value_difference((got,), (want,), assumes=REGROUP, reference=(ref,)) is None
    assert value_difference((got,), (want,), assumes=REGROUP) is not None
    wrong = {"k": torch.tensor([0.0], dtype=torch.float64)}  # want exact, got off by 1
    assert value_difference((got,), (want,), assumes=REGROUP, reference=(wrong,)) is not None


def test_matmul_plus_c_as_addmm_is_accepted_under_reassociate():
    rule = Rule(lambda a, b, c: torch.matmul(a, b) + c, lambda a, b, c: torch.addmm(c, a, b),
                ABC, name="addmm", assumes=REGROUP, where=_addmm_shaped, max_examples=25)
    assert check_rule(rule).rewritten > 0  # was: "got 0.0, the pattern gives -89.6..."


def test_a_wrong_addmm_is_still_refused():
    rule = Rule(lambda a, b, c: torch.matmul(a, b) + c,
                lambda a, b, c: torch.addmm(c, a, b, beta=0.5), ABC, name="addmm_half_c",
                assumes=REGROUP, where=_addmm_shaped, max_examples=25)
    with pytest.raises(LawViolation, match="values differ"):
        check_rule(rule)
