"""``limits.seconds`` bounds the whole ``saturate_report`` call: the greedy ``rewrite`` compared
against runs first under a deadline of its own (``GREEDY_SHARE``) and, cut, is compared as far
as it got; its time is taken from the search's share (``SEARCH_SHARE``). Clocks are moved by
monkeypatching the modules' ``time`` (no timed assertions)."""

from __future__ import annotations

import importlib
import math
from types import SimpleNamespace

import torch

from ir import import_ep
from ir.printer import format_program
from transforms.rewrite import Rule, SaturationLimits, saturate_report
from transforms.rewrite import engine as engine_mod
from transforms.rewrite.check_context import check_extracted
from transforms.rewrite.engine import apply_rules

saturate_mod = importlib.import_module("transforms.rewrite.saturate")  # the name is the function's

E3 = (torch.randn(4, 5), torch.randn(4, 5), torch.randn(4, 5))
FACTOR = Rule(lambda a, b, c: a * b + a * c, lambda a, b, c: a * (b + c), E3, name="factor",
              trusted=True, specials=False)


class _Sites(torch.nn.Module):
    """Three places where ``factor`` applies, one after another in graph order."""

    def forward(self, a, b, c):
        return (a * b + a * c) + (b * a + b * c) + (c * a + c * b)


def _sites():
    args = tuple(torch.randn(4, 5) for _ in range(3))
    return import_ep(torch.export.export(_Sites(), args)), args


class _Clock:
    """A monotonic clock that reads 0 for its first ``ticks`` readings, then 1e18 (past any
    deadline made from the real clock)."""

    def __init__(self, ticks: int) -> None:
        self.left = ticks

    def monotonic(self) -> float:
        self.left -= 1
        return 0.0 if self.left >= 0 else 1e18


def _cut_after(ticks: int, monkeypatch):
    monkeypatch.setattr(engine_mod, "time", _Clock(ticks))


def test_a_deadline_stops_the_rewrite_between_nodes_and_the_program_is_right(monkeypatch):
    """Cut after some of the three sites: a right program, less rewritten, and the report
    says where."""
    p, args = _sites()
    full, full_report = apply_rules(p, [FACTOR])
    assert full_report.counts["factor"] == 3 and full_report.cut is None
    _cut_after(4, monkeypatch)
    q, report = apply_rules(p, [FACTOR], deadline=1.0)
    assert report.counts["factor"] == 1
    assert report.cut == "graph 0 of module '<root>'"
    assert "cut by the deadline in graph 0" in str(report)
    check_extracted(p, q, args)
    assert format_program(q, vals=False) != format_program(full, vals=False)


def test_a_deadline_that_does_not_pass_changes_nothing():
    p, _ = _sites()
    q0, r0 = apply_rules(p, [FACTOR])
    q1, r1 = apply_rules(p, [FACTOR], deadline=math.inf)
    assert format_program(q1) == format_program(q0)
    assert r1 == r0 and r1.cut is None and str(r1) == str(r0)


def test_a_deadline_passed_before_the_first_node_returns_p_itself(monkeypatch):
    p, _ = _sites()
    _cut_after(0, monkeypatch)
    q, report = apply_rules(p, [FACTOR], deadline=1.0)
    assert q is p and report.counts["factor"] == 0 and report.cut is not None


def test_greedy_cut_by_its_share_is_compared_as_far_as_it_got(monkeypatch):
    """No saturation rounds (``iterations=0``): greedy's program, cut after some rewrites, is
    the cheaper one; it is kept, right, and the report says greedy was cut."""
    p, args = _sites()
    _cut_after(4, monkeypatch)
    q, report = saturate_report(p, [FACTOR], limits=SaturationLimits(iterations=0))
    assert report.chosen == "greedy" and q is not p
    assert report.greedy_cut == "graph 0 of module '<root>'"
    assert report.cost_after == report.greedy_cost < report.cost_before
    assert "greedy rewrite" in str(report) and "cut by seconds in graph 0" in str(report)
    check_extracted(p, q, args)
    monkeypatch.undo()
    _, full = saturate_report(p, [FACTOR], limits=SaturationLimits(iterations=0))
    assert full.greedy_cut is None and full.greedy_cost < report.greedy_cost


def test_no_cut_gives_the_same_results(monkeypatch):
    """A clock that never passes the deadline: the program and the report (its times aside)
    are those of the default run."""
    p, _ = _sites()
    q0, r0 = saturate_report(p, [FACTOR])
    monkeypatch.setattr(engine_mod, "time", SimpleNamespace(monotonic=lambda: 0.0))
    q1, r1 = saturate_report(p, [FACTOR])
    assert r0.greedy_cut is None and r1.greedy_cut is None
    assert format_program(q1) == format_program(q0)
    assert str(r1) == str(r0)
    fields = ("sizes", "stopped", "cost_before", "cost_after", "chosen", "greedy_cost",
              "rewrites", "classes")
    assert all(getattr(r1, f) == getattr(r0, f) for f in fields)


def test_greedy_time_is_taken_from_the_search(monkeypatch):
    """The search stops at ``SEARCH_SHARE`` of the seconds counted from the call's start (the
    rules checked), the greedy ``rewrite`` (run first) included: a greedy rewrite that used
    that much leaves the graph unsearched (no e-graph built: ``sizes`` ``(0,)``), and the
    report says ``seconds``."""
    p, _ = _sites()
    now = [100.0]
    clock = SimpleNamespace(monotonic=lambda: now[0])
    monkeypatch.setattr(saturate_mod, "time", clock)
    monkeypatch.setattr(engine_mod, "time", clock)
    greedy = saturate_mod._greedy

    def slow_greedy(*a, **k):
        out = greedy(*a, **k)
        now[0] += saturate_mod.SEARCH_SHARE * 20.0 + 1.0
        return out

    monkeypatch.setattr(saturate_mod, "_greedy", slow_greedy)
    _, report = saturate_report(p, [FACTOR], limits=SaturationLimits(seconds=20.0))
    assert report.stopped == ("seconds",) and report.sizes == ((0,),)
    assert report.greedy_cut is None and report.chosen == "greedy"
    monkeypatch.undo()
    _, on_time = saturate_report(p, [FACTOR], limits=SaturationLimits(seconds=20.0))
    assert on_time.stopped == ("saturated",)
