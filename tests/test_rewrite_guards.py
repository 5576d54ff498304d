"""The engine's guards as one table (``transforms.rewrite.guards.GUARDS``), the assumptions a
caller grants (``rewrite(..., assume=...)``), literals matched by value, in-place patterns
refused, and the copy and layout guards of issue 36: each with a Before/Expected IR text or
numerics against eager, and a teeth test with the guard's row taken out of the table."""

from __future__ import annotations

import sys
from pathlib import Path

import attrs
import pytest
import torch
from torch import nn

from ir import PassError, format_graph, import_ep
from lowering import lower
from transforms.rewrite import (
    Rule,
    apply_rules,
    guards,
    matches,
    rewrite,
    rewrite_report,
    sizes,
)

sys.path.insert(0, str(Path(__file__).parent / "examples"))
from beforeafter import program

X = (torch.randn(3, 4),)


def _program(model: nn.Module, *args):
    return import_ep(torch.export.export(model, args))


def _targets(p) -> list[str]:
    return [str(n.target) for n in p.root_module.graph.nodes if n.op == "call_function"]


# --- the table ----------------------------------------------------------------------------------


def test_the_table_is_ordered_by_stage_and_names_each_guard_once():
    names = [g.name for g in guards.GUARDS]
    assert len(names) == len(set(names))
    stages = [g.stage for g in guards.GUARDS]
    assert stages == sorted(stages)
    assert all(g.reason and callable(g.holds) for g in guards.GUARDS)
    assert {"retrace", "interior", "where", "barrier", "alias", "dtype", "layout"} <= set(names)


def test_without_names_the_known_rows():
    assert "alias" not in [g.name for g in guards.without("alias")]
    with pytest.raises(ValueError, match="unknown guard.*'nope'.*the guards are"):
        guards.without("nope")


class Interior(nn.Module):
    def forward(self, x):
        a = torch.relu(x)
        return torch.relu(a), a  # the inner relu is read outside the match


RELU_RELU = Rule(lambda x: torch.relu(torch.relu(x)), torch.relu, X, name="rr", trusted=True)


def test_a_skip_is_counted_under_the_first_guard_that_fails():
    p = _program(Interior(), torch.randn(3, 4))
    q, report = rewrite_report(p, [RELU_RELU])
    assert q is p
    assert dict(report.counts) == {"rr": 0}
    assert dict(report.skipped) == {"interior": 1}
    assert "skipped: interior 1" in str(report)


def test_where_is_a_guard_too():
    rule = Rule(lambda x: torch.relu(torch.relu(x)), torch.relu, X, name="rr_never",
                trusted=True, where=lambda m: False)
    p = _program(nn.Sequential(nn.ReLU(), nn.ReLU()), torch.randn(3, 4))
    q, report = rewrite_report(p, [rule])
    assert q is p and dict(report.skipped) == {"where": 1}


def test_the_one_pass_worklist_is_a_parameter_not_a_switch():
    p = _program(nn.Sequential(nn.ReLU(), nn.ReLU()), torch.randn(3, 4))
    q1, r1 = apply_rules(p, [RELU_RELU])
    q2, r2 = apply_rules(p, [RELU_RELU], fixpoint=False)
    assert r1.counts == r2.counts == {"rr": 1}
    assert format_graph(q1.root_module.graph) == format_graph(q2.root_module.graph)


class Scaled(nn.Module):
    def forward(self, x):
        return x / 0.0, x / 4.0


RECIPROCAL = Rule(lambda x, s: x / s, lambda x, s: x * (1.0 / s), (torch.randn(3, 4), 2.0),
                  name="reciprocal", trusted=True)
"""Its replacement divides by the matched scale in Python: at 0.0 it cannot be traced."""


def test_a_match_whose_replacement_cannot_be_traced_is_declined_not_raised():
    """Before: ``x / 0.0, x / 4.0``. Expected: ``x / 0.0`` kept (the replacement raises
    ZeroDivisionError when traced at 0.0: the match is skipped under
    ``replacement_untraceable``), ``x * 0.25`` for the other."""
    p = _program(Scaled(), torch.randn(3, 4))
    q, report = rewrite_report(p, [RECIPROCAL])
    assert format_graph(q.root_module.graph) == (
        "%x = placeholder\n"
        "%div = call_function[aten.div.Tensor](%x, 0.0)\n"
        "%div_1 = call_function[aten.mul.Tensor](%x, 0.25)\n"
        "return (%div, %div_1)"
    )
    assert dict(report.counts) == {"reciprocal": 1}
    assert set(report.skipped) == {"replacement_untraceable"}
    x = torch.randn(3, 4)
    for got, want in zip(lower(q)(x), Scaled()(x)):
        torch.testing.assert_close(got, want)


def test_a_failed_replacement_trace_is_kept_and_told_apart_by_the_sign_of_zero():
    from transforms.rewrite.rule import replacement_for, rule_cache

    rule = attrs.evolve(RECIPROCAL, name="reciprocal_keys")
    c = rule.compiled("training")
    for s in (0.0, -0.0, 0.0):  # two traces tried, not one (0.0 == -0.0 as a dict key)
        with pytest.raises(PassError, match="cannot be traced"):
            replacement_for(rule, c, {1: s}, {0: torch.empty(3, 4)})
    keys = [k for k in rule_cache(rule).traced if isinstance(k, tuple) and k[0] == "concrete"]
    assert sorted(k[1][1][1] for k in keys) == ["-0.0", "0.0"]


def test_teeth_without_the_guard_the_untraceable_replacement_raises(monkeypatch):
    monkeypatch.setattr(guards, "GUARDS", guards.without("replacement_untraceable"))
    p = _program(Scaled(), torch.randn(3, 4))
    _q, report = rewrite_report(p, [RECIPROCAL])
    assert "replacement_untraceable" not in report.skipped
    assert report.skipped.get("replacement") == 2  # the next row still declines it


# --- assumptions granted ------------------------------------------------------------------------


class SubSelf(nn.Module):
    def forward(self, x):
        return torch.sin(x - x)


SUB_SELF = Rule(lambda x: x - x, torch.zeros_like, X, name="sub_self", trusted=True,
                assumes={"no_nans", "no_infs"})


def test_a_rule_is_applied_only_where_its_assumptions_are_granted():
    """Before: ``sin(x - x)``. Expected: unchanged with no grant or half of it (the report
    names the rule and what it misses); ``sin(zeros_like(x))`` with both granted."""
    p = _program(SubSelf(), torch.randn(3, 4))
    q, report = rewrite_report(p, [SUB_SELF])
    assert q is p
    assert dict(report.not_granted) == {"sub_self": frozenset({"no_nans", "no_infs"})}
    assert "not applied: 'sub_self' assumes ['no_infs', 'no_nans']" in str(report)
    q, report = rewrite_report(p, [SUB_SELF], assume={"no_nans"})
    assert q is p and dict(report.not_granted) == {"sub_self": frozenset({"no_infs"})}
    q, report = rewrite_report(p, [SUB_SELF], assume={"no_nans", "no_infs", "reassociate"})
    assert dict(report.counts) == {"sub_self": 1} and not report.not_granted
    assert _targets(q) == ["aten.zeros_like.default", "aten.sin.default"]
    x = torch.randn(3, 4)
    torch.testing.assert_close(lower(q)(x), SubSelf()(x))


def test_an_unknown_grant_is_a_value_error_naming_the_known_flags():  # a bare string: TypeError
    p = _program(SubSelf(), torch.randn(3, 4))
    with pytest.raises(ValueError, match="unknown assumption.*'fast'.*no_infs"):
        rewrite(p, [SUB_SELF], assume={"fast"})
    with pytest.raises(TypeError, match="set of assumption names"):  # a bare string
        rewrite(p, [SUB_SELF], assume="no_nans")


def test_a_rule_without_assumptions_needs_no_grant():
    p = _program(nn.Sequential(nn.ReLU(), nn.ReLU()), torch.randn(3, 4))
    _q, report = rewrite_report(p, [RELU_RELU])
    assert report.counts == {"rr": 1} and not report.not_granted


# --- literals by value --------------------------------------------------------------------------


class TimesOneFloat(nn.Module):
    def forward(self, x):
        return torch.sin(x * 1.0)


def _times_one() -> Rule:
    return Rule(lambda x: x * 1, lambda x: x, (torch.randn(4),), name="times_one",
                trusted=True)


def test_an_int_literal_matches_the_same_float_on_a_float_tensor():
    """Before: ``sin(x * 1.0)``, ``x`` float32. Expected: ``sin(x)`` (``x * 1 -> x``)."""
    p = _program(TimesOneFloat(), torch.randn(3, 4))
    q, report = rewrite_report(p, [_times_one()])
    assert report.counts == {"times_one": 1}
    assert _targets(q) == ["aten.sin.default"]


def test_an_int_literal_does_not_match_a_float_on_an_int_tensor():
    """Before: ``sin(x * 1.0)``, ``x`` int64 (the product is float). Expected: unchanged: the
    pattern re-traced at int64 computes int64."""
    p = _program(TimesOneFloat(), torch.ones(3, 4, dtype=torch.int64))
    q, report = rewrite_report(p, [_times_one()])
    assert q is p and report.skipped == {"retrace": 1}


def test_teeth_without_the_dtype_recheck_and_guard_the_int_case_is_taken(monkeypatch):
    monkeypatch.setattr(sizes, "dtypes_agree", lambda *a, **k: True)
    monkeypatch.setattr(guards, "GUARDS", guards.without("dtype"))
    p = _program(TimesOneFloat(), torch.ones(3, 4, dtype=torch.int64))
    _q, report = rewrite_report(p, [_times_one()])
    assert report.counts == {"times_one": 1}  # a float program made int: wrong


def test_minus_zero_is_not_zero():
    class TimesMinusZero(nn.Module):
        def forward(self, x):
            return torch.sin(x * -0.0)

    rule = Rule(lambda x: x * 0, torch.zeros_like, (torch.randn(4),), name="times_zero",
                trusted=True)
    p = _program(TimesMinusZero(), torch.randn(3, 4))
    assert rewrite(p, [rule]) is p


# --- in-place patterns --------------------------------------------------------------------------


def test_a_pattern_that_writes_in_place_is_refused_saying_why():
    rule = Rule(lambda x: torch.relu(x.clone().add_(1.0)), lambda x: torch.relu(x + 1.0), X,
                name="inplace")
    p = _program(nn.Sequential(nn.ReLU(), nn.ReLU()), torch.randn(3, 4))
    with pytest.raises(PassError, match="functional programs: write the functional form "
                                        r"\(e.g. add instead of add_\)"):
        rewrite(p, [rule])
    with pytest.raises(PassError, match="writes in place"):
        rule.compiled("core")


# --- copies inside the match --------------------------------------------------------------------


T_T = Rule(lambda x: x.t().t(), lambda x: x, X, name="t_t", trusted=True)


class CloneBetweenWritten(nn.Module):
    def forward(self, x):
        y = x.t().clone().t()
        y.add_(1.0)
        return y


class CloneBetweenRead(nn.Module):
    def forward(self, x):
        return torch.sin(x.t().clone().t())


def _writes_input(m, p, x) -> bool:
    before = x.clone()
    lower(p)(x)
    return not torch.equal(x, before)


def test_a_copy_inside_the_match_makes_its_result_fresh():
    """Before: ``y = x.t().clone().t(); y.add_(1)``. Expected: unchanged: ``t_t`` would make
    ``y`` the caller's ``x`` and the write land there."""
    x = torch.randn(3, 4)
    p = _program(CloneBetweenWritten(), x)
    q, report = rewrite_report(p, [T_T])
    assert q is p and report.skipped.get("alias", 0) >= 1
    assert not _writes_input(CloneBetweenWritten(), q, x.clone())


def test_a_copy_inside_the_match_is_no_bar_where_nothing_writes():
    """Before: ``sin(x.t().clone().t())``. Expected: ``sin(x)``."""
    p = _program(CloneBetweenRead(), torch.randn(3, 4))
    q = rewrite(p, [T_T])
    assert _targets(q) == ["aten.sin.default"]


def test_teeth_the_copy_slips_without_the_alias_guard(monkeypatch):
    monkeypatch.setattr(guards, "GUARDS", guards.without("alias"))
    x = torch.randn(3, 4)
    p = _program(CloneBetweenWritten(), x)
    q = rewrite(p, [T_T])
    assert q is not p and _writes_input(CloneBetweenWritten(), q, x.clone())


RESHAPE_ROUND = Rule(lambda x: x.reshape(-1).reshape(x.shape), lambda x: x, X,
                     name="reshape_round", trusted=True)


class ReshapeRoundWritten(nn.Module):
    def forward(self, x):
        a = x.t()
        y = a.reshape(-1).reshape(a.shape)  # a is transposed: the first reshape copies
        y.mul_(2.0)
        return y


def test_a_reshape_that_copies_makes_its_result_fresh():
    """Before: ``y = x.t().reshape(-1).reshape(4, 3); y.mul_(2)``. Expected: unchanged."""
    x = torch.randn(3, 4)
    p = _program(ReshapeRoundWritten(), x)
    q = rewrite(p, [RESHAPE_ROUND])
    assert q is p
    assert not _writes_input(ReshapeRoundWritten(), q, x.clone())


def test_teeth_the_reshape_copy_slips_without_the_alias_guard(monkeypatch):
    # the result's strides differ from x.t()'s too, and a write reads it: the layout guard
    # refuses the match as well. The match's input x.t() may share memory with y (reshape may
    # return its input: ir.effects joins them), which mul_ writes, so input_written refuses it
    # first; with those two gone, alias refuses; with all three gone, the caller's x is written
    x = torch.randn(3, 4)
    p = _program(ReshapeRoundWritten(), x)
    monkeypatch.setattr(guards, "GUARDS", guards.without("layout"))
    q, report = rewrite_report(p, [RESHAPE_ROUND])
    assert q is p and report.skipped == {"input_written": 1}
    monkeypatch.setattr(guards, "GUARDS", guards.without("layout", "input_written"))
    q, report = rewrite_report(p, [RESHAPE_ROUND])
    assert q is p and report.skipped == {"alias": 1}
    monkeypatch.setattr(guards, "GUARDS", guards.without("alias", "layout", "input_written"))
    p = _program(ReshapeRoundWritten(), x)
    q = rewrite(p, [RESHAPE_ROUND])
    assert q is not p and _writes_input(ReshapeRoundWritten(), q, x.clone())


# --- layouts ------------------------------------------------------------------------------------


MM_T = Rule(lambda a, b: b.t() @ a.t(), lambda a, b: (a @ b).t(),
            (torch.randn(3, 4), torch.randn(4, 5)), name="mm_t", trusted=True)


class MmThenView(nn.Module):
    def forward(self, a, b):
        return (b.t() @ a.t()).view(-1)


class MmThenAdd(nn.Module):
    def forward(self, a, b):
        return (b.t() @ a.t()) + 1.0


AB = (torch.randn(3, 4), torch.randn(4, 5))


def test_a_result_with_other_strides_is_not_replaced_where_a_view_reads_it():
    """Before: ``(b.t() @ a.t()).view(-1)``. Expected: unchanged (``(a @ b).t()`` is not
    contiguous: ``view(-1)`` would raise)."""
    p = _program(MmThenView(), *AB)
    q, report = rewrite_report(p, [MM_T])
    assert q is p and report.skipped == {"layout": 1}
    torch.testing.assert_close(lower(q)(*AB), MmThenView()(*AB))


def test_a_result_with_other_strides_is_replaced_where_readers_are_elementwise():
    """Before: ``(b.t() @ a.t()) + 1``. Expected: ``(a @ b).t() + 1``."""
    p = _program(MmThenAdd(), *AB)
    q = rewrite(p, [MM_T])
    assert q is not p
    torch.testing.assert_close(lower(q)(*AB), MmThenAdd()(*AB))


def test_teeth_the_layout_slips_without_the_layout_guard(monkeypatch):
    monkeypatch.setattr(guards, "GUARDS", guards.without("layout"))
    p = _program(MmThenView(), *AB)
    q = rewrite(p, [MM_T])
    assert q is not p
    with pytest.raises(RuntimeError, match="view"):
        lower(q)(*AB)


class MmAddThenView(nn.Module):
    def forward(self, a, b):
        return ((b.t() @ a.t()) + 1.0).view(-1)


def test_an_elementwise_reader_passes_the_strides_on():
    """Before: ``((b.t() @ a.t()) + 1).view(-1)``. Expected: unchanged: ``+ 1`` keeps its
    input's layout, so the ``view`` would see the transposed strides too."""
    p = _program(MmAddThenView(), *AB)
    q, report = rewrite_report(p, [MM_T])
    assert q is p and report.skipped == {"layout": 1}
    torch.testing.assert_close(lower(q)(*AB), MmAddThenView()(*AB))


class MmReshapeWritten(nn.Module):
    def forward(self, a, b):
        m = b.t() @ a.t()
        return m.reshape(-1).mul_(2.0)


class MmReshapeWrittenReadTwice(nn.Module):
    def forward(self, a, b):
        m = b.t() @ a.t()
        r = m.reshape(-1)
        r.mul_(2.0)
        return r, m.sum()


def test_a_reshape_that_turns_copy_is_allowed_where_nothing_else_reads_what_it_shared():
    """Before: ``(b.t() @ a.t()).reshape(-1).mul_(2)``. Expected: ``mm_t`` applied: at the
    new strides the ``reshape`` copies, and the write lands in the copy, but nothing else
    reads ``m``, so the caller sees the same values."""
    p = _program(MmReshapeWritten(), *AB)
    q, report = rewrite_report(p, [MM_T])
    assert q is not p and report.skipped == {}
    torch.testing.assert_close(lower(q)(*AB), MmReshapeWritten()(*AB))


def test_a_reshape_that_turns_copy_is_refused_where_a_second_reader_saw_the_write():
    """Before: ``r = m.reshape(-1); r.mul_(2); return r, m.sum()`` with ``m = b.t() @ a.t()``.
    Expected: unchanged: eagerly ``m.sum()`` sees the write through the view; at ``mm_t``'s
    strides the ``reshape`` copies and ``m.sum()`` would not (the fan-out of one value of
    the group: two readers outside the match)."""
    p = _program(MmReshapeWrittenReadTwice(), *AB)
    q, report = rewrite_report(p, [MM_T])
    assert q is p and report.skipped == {"layout": 1}
    torch.testing.assert_close(lower(q)(*AB), MmReshapeWrittenReadTwice()(*AB))


def test_the_engine_does_not_run_the_checker():
    """``rewrite`` = check the rules (``api``), then ``apply_rules`` (``engine``): the engine
    imports no checker and holds no test switch."""
    import ast
    from pathlib import Path

    from transforms.rewrite import engine

    tree = ast.parse(Path(engine.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in imported if m and m.startswith("transforms.rewrite.rule_check")}
    assert not hasattr(engine, "FIXPOINT") and not hasattr(engine, "rewrite")


# --- input_written: the one effect analysis's answer ---------------------------------------------

TIMES_ONE = Rule(lambda x: x * 1, lambda x: x, X, name="times_one", trusted=True)

ONE_TENSOR_TWICE = """\
program:
  inputs:
    %x: user_input
  outputs:
    %b: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %c = call_function[aten.clone.default](%x)
      %b = call_module[b](%c, %c)
      return (%b,)
  module b: B
    graph 0:
      %y = placeholder
      %z = placeholder
      %m = call_function[aten.mul.Tensor](%y, 1)
      %w = call_function[aten.add_.Tensor](%z, 1)
      %add = call_function[aten.add.Tensor](%m, %m)
      return %add"""


def test_an_input_that_may_be_a_written_input_is_written():
    """``b`` reads ``y * 1`` and then writes ``z``; its caller passes one tensor as both. The
    match's input ``y`` is written (``ir.effects``: a module graph's inputs may be one tensor),
    though no node names it: Expected unchanged, where a guard that saw only direct writes
    made ``add`` read ``y`` after the write (``2 x + 2`` for ``2 x``)."""
    p = program(ONE_TENSOR_TWICE)
    q, report = rewrite_report(p, [TIMES_ONE])
    assert q is p and report.skipped == {"input_written": 1}
    assert matches(p, TIMES_ONE) == ()  # matches and rewrite judge on the one analysis
    x = torch.randn(2)
    torch.testing.assert_close(lower(q)(x.clone())[0], 2 * x)


def test_teeth_the_one_tensor_twice_slips_without_the_input_written_guard(monkeypatch):
    monkeypatch.setattr(guards, "GUARDS", guards.without("input_written"))
    p = program(ONE_TENSOR_TWICE)
    q = rewrite(p, [TIMES_ONE])
    x = torch.randn(2)
    assert q is not p and torch.allclose(lower(q)(x.clone())[0], 2 * x + 2)


ADD_SELF = Rule(lambda x: x + x, lambda x: x * 2, X, name="add_self", trusted=True)


class WrittenThroughAView(nn.Module):
    def forward(self, x):
        y = x * 3
        a = y + y
        y[:1].add_(1.0)  # a write of y through a view of it
        return a, y


class WrittenDirectly(nn.Module):
    def forward(self, x):
        y = x * 3
        a = y + y
        y.add_(1.0)
        return a, y


@pytest.mark.parametrize("model", [WrittenThroughAView, WrittenDirectly])
def test_an_input_written_through_a_view_is_written_like_one_written_directly(model):
    """Before: ``y + y`` with ``y`` written later, through ``y[:1]`` or itself. Expected: both
    unchanged, skipped by ``input_written`` (``WorkingGraph.is_written``: writes through views
    count, as in ``ir.effects``)."""
    x = torch.randn(3, 4)
    p = _program(model(), x)
    q, report = rewrite_report(p, [ADD_SELF])
    assert q is p and set(report.skipped) == {"input_written"}
    for got, want in zip(lower(q)(x.clone()), model()(x.clone()), strict=True):
        torch.testing.assert_close(got, want)
