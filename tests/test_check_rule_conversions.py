"""``check_rule`` draws values at the edges of every dtype conversion its pattern performs
(``ir.strategies.values.conversion_edges``), in both directions: the narrower integer's bounds
and just past them, floats outside the integer range they are cast to, a float's largest finite
and just past it. A rule wrong only there is refused (it was accepted when only the input
dtypes' edges were drawn)."""

from __future__ import annotations

import pytest
import torch

from ir.strategies.values import conversion_edges, conversions_edges
from transforms.machinery.law_violation import LawViolation
from transforms.rewrite import Rule, check_rule
from transforms.rewrite import rule_check as rule_law


def test_the_edges_of_a_conversion_both_ways():
    assert conversion_edges(torch.int32, torch.int8) == (-128, 127, -129, 128)
    assert conversion_edges(torch.float32, torch.int8) == (
        -128, 127, -129, 128, -128.5, 127.5, -256.0, 256.0)
    assert conversion_edges(torch.int32, torch.float32) == (16777217, -16777217)
    wide_to_half = conversion_edges(torch.float32, torch.float16)
    assert 65504.0 in wide_to_half and torch.tensor(max(wide_to_half)).half().isinf()
    assert conversion_edges(torch.int8, torch.int32)[:2] == ()  # int32's bounds: not in int8
    assert conversion_edges(torch.float32, torch.float32) == ()
    assert conversion_edges(torch.bool, torch.int8) == ()
    # every argument is offered the edges it can hold, whatever the conversion's source
    assert conversions_edges(torch.int64, [(torch.float32, torch.int16)]) == (
        -32768, 32767, -32769, 32768, -65536, 65536)


def _of(dtypes):
    return lambda m: m.val(0) is not None and m.val(0).dtype in dtypes


def _clamp_dropped() -> Rule:
    # right while x is inside int8's range: ordinary values and the float32 edges never tell
    return Rule(lambda x: x.clamp(-128, 127).to(torch.int8).to(torch.float32),
                lambda x: x.to(torch.int8).to(torch.float32), (torch.randn(3, 4),),
                name="clamp_dropped", where=_of((torch.float32,)), specials=False,
                max_examples=10)


def test_a_clamp_dropped_around_a_cast_is_refused_at_the_int8_edge():
    with pytest.raises(LawViolation, match="values differ"):
        check_rule(_clamp_dropped())


def test_teeth_without_the_conversion_edges_it_was_accepted(monkeypatch):
    monkeypatch.setattr(rule_law, "conversions", lambda p: ())
    assert check_rule(_clamp_dropped()).rewritten > 0


def test_a_narrowing_through_a_narrower_integer_is_refused():
    rule = Rule(lambda x: x.to(torch.int16).to(torch.int32),
                lambda x: x.to(torch.int8).to(torch.int32),
                (torch.arange(12, dtype=torch.int32).reshape(3, 4),), name="via_int8",
                where=_of((torch.int32, torch.int64)), max_examples=10)
    with pytest.raises(LawViolation, match="values differ"):
        check_rule(rule)
