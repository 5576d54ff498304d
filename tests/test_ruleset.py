"""``transforms.rewrite.ruleset``: the one front-end of ``rewrite`` and ``saturate`` (the rules
prepared once: assumptions, rule list, level, compilation, verdicts), the one graph order
(``each_graph.walked_graphs``), the one ``where`` guard and the one fake-run contract."""

from __future__ import annotations

import pytest
import torch

from ir import PassError, import_ep
from ir.args import Ref
from ir.fake_memo import FakeMemo
from transforms import kernel as kn
from transforms.machinery.each_graph import walked_graphs
from transforms.machinery.trace import level_of
from transforms.rewrite import Rule, guards, rewrite_report, saturate_report
from transforms.rewrite.engine import program_level
from transforms.rewrite.ruleset import RuleSet, prepare

X = (torch.randn(4),)
NEG_NEG = Rule(lambda x: torch.neg(torch.neg(x)), lambda x: x, X, name="neg_neg",
               trusted=True)
NANS = Rule(lambda x: x - x, lambda x: torch.zeros_like(x), X, name="sub_self", trusted=True,
            assumes=frozenset({"no_nans", "no_infs"}))


class _Twice(torch.nn.Module):
    def forward(self, x):
        return torch.neg(torch.neg(x)) + (x - x)


def _program():
    return import_ep(torch.export.export(_Twice(), X))


def test_prepare_sets_apart_what_is_not_granted_and_reads_the_level():
    p = _program()
    rs = prepare(p, [NEG_NEG, NANS], {"no_nans"}, who="rewrite")
    assert isinstance(rs, RuleSet)
    assert rs.rules == (NEG_NEG, NANS) and rs.applied == (NEG_NEG,)
    assert dict(rs.missing) == {"sub_self": frozenset({"no_infs"})}
    assert rs.level == program_level(p) == level_of([g for _, g in walked_graphs(p)])
    assert prepare(p, [NANS], who="saturate").level is None  # nothing applied: p not read


@pytest.mark.parametrize("who, run", [
    ("rewrite", lambda p, rules, assume: rewrite_report(p, rules, assume)),
    ("saturate", lambda p, rules, assume: saturate_report(p, rules, assume=assume)),
])
def test_both_drivers_refuse_the_same_way(who, run):
    p = _program()
    with pytest.raises(ValueError, match=f"{who}: assume: unknown assumption"):
        run(p, [NEG_NEG], {"no_such_flag"})
    with pytest.raises(PassError, match=r"rules\[1\] is a str, expected a Rule"):
        run(p, [NEG_NEG, "neg_neg"], frozenset())
    with pytest.raises(PassError, match=r"rule names \['neg_neg'\] are given twice"):
        run(p, [NEG_NEG, NEG_NEG], frozenset())


def test_both_drivers_report_the_rules_not_granted():
    p = _program()
    _, report = rewrite_report(p, [NEG_NEG, NANS], {"no_nans"})
    assert dict(report.not_granted) == {"sub_self": frozenset({"no_infs"})}
    _, sreport = saturate_report(p, [NEG_NEG, NANS], assume={"no_nans"})
    assert sreport.skipped_rules["sub_self"] == "assumes ['no_infs'], not granted"


def test_walked_graphs_visits_each_module_once_in_walk_order():
    p = _program()
    got = walked_graphs(p)
    assert [mid for mid, _ in got] == list(dict.fromkeys(mid for _, mid in p.walk()))
    assert got[0][1] is p.root_module.graph


def _raises(m):
    raise RuntimeError("no words")


def test_a_where_that_raises_is_the_same_error_in_both_drivers():
    rule = Rule(lambda x: torch.neg(torch.neg(x)), lambda x: x, X, name="loud", trusted=True,
                where=_raises)
    p = _program()
    with pytest.raises(PassError, match=r"rule 'loud': its where\(\) raised RuntimeError: no "
                                        r"words on a match at %neg"):
        rewrite_report(p, [rule])
    with pytest.raises(PassError, match=r"rule 'loud': its where\(\) raised RuntimeError: no "
                                        r"words on a match at e-class \d+"):
        saturate_report(p, [rule])


class _Pair(torch.nn.Module):
    def forward(self, x, y):
        return x + 1, y + 1


def test_saturate_keeps_a_fake_run_failure_and_raises_it_again():
    """One contract (``kernel.fake_value`` through ``guards.fake_run``, the guards' one fake
    run): ``FakeRunFailed`` when the operator raises, kept
    in the search's memo and raised again, never a sentinel value; ``None`` when unknown."""
    p = import_ep(torch.export.export(_Pair(), (torch.randn(2, 3), torch.randn(4, 5))))
    val_of = {n.name: n.meta["val"] for n in p.root_module.graph.nodes if n.op == "placeholder"}
    x, y = (Ref(name) for name in val_of)
    mm = torch.ops.aten.mm.default
    memo = FakeMemo()
    for _ in range(2):
        with pytest.raises(kn.FakeRunFailed):
            guards.fake_run(mm, (x, y), {}, val_of, memo)
    assert memo.runs == 1
    assert guards.fake_run(mm, (x, Ref("unknown")), {}, val_of, memo) is None
    fits = {"a": val_of[y.name], "b": val_of[y.name].t()}
    assert tuple(guards.fake_run(mm, (Ref("a"), Ref("b")), {}, fits).shape) == (4, 4)
