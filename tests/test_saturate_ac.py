"""Associativity and commutativity of ``+`` and ``*`` as two-way rules in ``saturate``.

- ``(a + b) + c <-> a + (b + c)`` and ``a + b <-> b + a`` (and ``*``'s) are checked by
  ``check_rule`` and taken by ``saturate`` (before: ``PassError: the pattern matches the whole
  of its own replacement``, a check only greedy rewriting needs): the two bracketings of a
  sum become one class, computed once (Before/Expected, numerics against eager); with state
  frozen, the constant terms of a sum meet and fold (``x + a + b``: one add);
- greedy ``rewrite`` takes such a rule too and ends: it never rewrites a node the rule made
  (``engine._drain``), so each original node is regrouped at most once;
- a rule whose replacement is the pattern itself as the matcher sees it (it drops only a
  ``contiguous()``) is still refused when compiled (``test_check_rule_heldout``);
- a ``both_ways=True`` rule whose replacement drops an argument its pattern reads is refused
  with a ``PassError`` naming the argument (before: accepted, used one way only, silently).
"""

from __future__ import annotations

import pytest
import torch

from ir import PassError, format_graph, import_ep
from lowering import lower
from transforms.rewrite import Rule, rewrite, saturate_report
from transforms.rewrite.check_context import check_extracted

R = frozenset({"reassociate"})
E3 = (torch.randn(4),) * 3
ADD_ASSOC = Rule(lambda a, b, c: (a + b) + c, lambda a, b, c: a + (b + c), E3,
                 name="add_assoc", both_ways=True, specials=False, assumes=R)
ADD_COMM = Rule(lambda a, b: a + b, lambda a, b: b + a, E3[:2], name="add_comm",
                both_ways=True)
MUL_ASSOC = Rule(lambda a, b, c: (a * b) * c, lambda a, b, c: a * (b * c), E3,
                 name="mul_assoc", both_ways=True, specials=False, assumes=R)
MUL_COMM = Rule(lambda a, b: a * b, lambda a, b: b * a, E3[:2], name="mul_comm",
                both_ways=True)
AC = [ADD_ASSOC, ADD_COMM, MUL_ASSOC, MUL_COMM]


class _Fn(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _compute(p) -> str:
    return "\n".join(line for line in format_graph(p.root_module.graph).splitlines()
                     if "placeholder" not in line)


def _sums(x, y, z):
    return ((x + y) + z) * (z + (y + x)) + ((x * y) * z) * (y * (z * x))


SUMS_BEFORE = """\
%add = call_function[aten.add.Tensor](%xs_0, %xs_1)
%add_1 = call_function[aten.add.Tensor](%add, %xs_2)
%add_2 = call_function[aten.add.Tensor](%xs_1, %xs_0)
%add_3 = call_function[aten.add.Tensor](%xs_2, %add_2)
%mul = call_function[aten.mul.Tensor](%add_1, %add_3)
%mul_1 = call_function[aten.mul.Tensor](%xs_0, %xs_1)
%mul_2 = call_function[aten.mul.Tensor](%mul_1, %xs_2)
%mul_3 = call_function[aten.mul.Tensor](%xs_2, %xs_0)
%mul_4 = call_function[aten.mul.Tensor](%xs_1, %mul_3)
%mul_5 = call_function[aten.mul.Tensor](%mul_2, %mul_4)
%add_4 = call_function[aten.add.Tensor](%mul, %mul_5)
return (%add_4,)"""

SUMS_AFTER = """\
%add = call_function[aten.add.Tensor](%xs_0, %xs_1)
%add_1 = call_function[aten.add.Tensor](%add, %xs_2)
%mul = call_function[aten.mul.Tensor](%add_1, %add_1)
%mul_1 = call_function[aten.mul.Tensor](%xs_0, %xs_1)
%mul_2 = call_function[aten.mul.Tensor](%mul_1, %xs_2)
%mul_5 = call_function[aten.mul.Tensor](%mul_2, %mul_2)
%add_4 = call_function[aten.add.Tensor](%mul, %mul_5)
return (%add_4,)"""


def test_two_bracketings_of_a_sum_and_a_product_become_one_value():
    args = tuple(torch.rand(64) for _ in range(3))
    p = import_ep(torch.export.export(_Fn(_sums), args))
    assert _compute(p) == SUMS_BEFORE
    q, report = saturate_report(p, AC, assume=R)
    assert _compute(q) == SUMS_AFTER
    assert report.chosen == "saturate" and report.cost_after < report.cost_before
    assert (report.cost_before, report.cost_after, report.greedy_cost) == pytest.approx(
        (55.0, 35.0, 55.0), abs=0.05)  # roofline: 11 launches -> 7; greedy regroups in vain
    assert report.stopped == ("saturated",) and not report.skipped_rules
    check_extracted(p, q, args, R)
    torch.testing.assert_close(lower(q)(*args), _sums(*args))


class _Biased(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("a", torch.randn(8))
        self.register_buffer("b", torch.randn(8))

    def forward(self, x):
        return (x + self.a) + self.b


def test_frozen_constant_terms_meet_by_associativity_and_fold():
    model, x = _Biased(), torch.randn(3, 8)
    p = import_ep(torch.export.export(model, (x,)))
    q, report = saturate_report(p, [ADD_ASSOC], assume=R, frozen_state=True)
    assert _compute(q) == """\
%add_3 = call_function[aten.add.Tensor](%x, %c__folded_add_2)
return (%add_3,)"""
    assert report.state.startswith("frozen: 1 ")
    torch.testing.assert_close(lower(q)(x), model(x))
    charged, got = saturate_report(p, [ADD_ASSOC], assume=R)
    # charged, a + b (8 elements) is added at every call, then x (24): two adds still
    assert got.state.startswith("charged") and "_folded_" not in _compute(charged)
    assert sum(n.op == "call_function" for n in charged.root_module.graph.nodes) == 2
    assert report.cost_after < got.cost_after <= got.cost_before


def test_greedy_rewrite_takes_a_regrouping_rule_and_ends():
    args = tuple(torch.rand(16) for _ in range(4))

    def chain(a, b, c, d):
        return ((a + b) + c) + d

    p = import_ep(torch.export.export(_Fn(chain), args))
    q = rewrite(p, [ADD_ASSOC], assume=R)
    adds = [n for n in q.root_module.graph.nodes if n.op == "call_function"]
    assert len(adds) == 3 and q is not p
    torch.testing.assert_close(lower(q)(*args), chain(*args))
    assert rewrite(p, [ADD_COMM]) is not p  # each add swapped once, then left


def test_a_both_ways_rule_that_drops_a_tensor_argument_is_refused_naming_it():
    drop = Rule(lambda x, y: x * 0 + y, lambda x, y: y * 1, E3[:2], name="drop_x",
                both_ways=True, trusted=True)
    p = import_ep(torch.export.export(_Fn(lambda x, y: x * 0 + y), E3[:2]))
    with pytest.raises(PassError, match=r"rule 'drop_x': both_ways=True, but its replacement "
                                        r"drops argument 0 \('x'\)"):
        saturate_report(p, [drop])
    one_way = Rule(drop.pattern, drop.replacement, E3[:2], name="drop_x", trusted=True)
    q, _ = saturate_report(p, [one_way])  # forwards only: taken
    assert q is not p


def test_a_both_ways_rule_that_drops_a_scalar_argument_is_refused_naming_it():
    rule = Rule(lambda x, s: (x * s) / s, lambda x, s: x * 1.0, (torch.randn(4), 2.0),
                name="cancel", both_ways=True, trusted=True, specials=False)
    p = import_ep(torch.export.export(_Fn(lambda x: (x * 3.0) / 3.0), (torch.randn(4),)))
    with pytest.raises(PassError, match=r"rule 'cancel': both_ways=True, but its reverse "
                                        r"cannot be built: .*scalar argument 1"):
        saturate_report(p, [rule])
