"""Reducing a finding's program (``lowering.fuzz.reduce``) reaches the call at the cause wherever
it stands: the node localized as first wrong is isolated first, and after the node-by-node
bypass the calls of the operator at the cause are isolated again on what is left."""

from __future__ import annotations

import attrs
import fuzz_planted as planted
import torch
from hypothesis import strategies as st

from ir import import_ep
from ir.node import CALL_FUNCTION
from lowering.fuzz import differential
from lowering.fuzz.backends import resolve
from lowering.fuzz.judge import Setup
from lowering.fuzz.localize import MOST_CUTS, first_wrong, localize
from lowering.fuzz.reduce import MOST_ISOLATED, reduce
from lowering.fuzz.trial import try_program

ADD = "aten.add.Tensor"
BACKENDS = resolve({"alpha": planted.drop_alpha_when_broadcast})


class _LateBroadcast(torch.nn.Module):
    """Adds that do not broadcast (alpha 1) before the one the planted backend gets wrong: a
    broadcasting add with alpha 2, whose second operand comes from two keepdim means (no node
    on that path has an operand of its own shape, so none can be bypassed)."""

    def forward(self, x, b):
        y = x + 1.0
        y = y + x
        y = y + 2.0
        y = y + x
        m = y.mean(1, keepdim=True) + y.mean(0, keepdim=True)
        return torch.add(b, m, alpha=2.0)


def _program():
    ep = torch.export.export(_LateBroadcast(), (torch.randn(2, 4), torch.randn(4)))
    return import_ep(ep)


def _ops(program):
    return [n for n in program.root_module.graph.nodes if n.op == CALL_FUNCTION]


def _still(seen):
    def still(candidate):
        seen.append(candidate)
        return try_program(candidate, BACKENDS, Setup()).verdicts["alpha"] is not None
    return still


def _wrong_add(program):
    return next(n.name for n in _ops(program) if n.kwargs.get("alpha") == 2.0)


def test_the_drawn_program_has_the_wrong_add_past_the_first_isolated_calls():
    adds = [n.name for n in _ops(_program()) if str(n.target) == ADD]
    assert adds.index(_wrong_add(_program())) >= MOST_ISOLATED
    assert try_program(_program(), BACKENDS, Setup()).verdicts["alpha"] is not None


def test_the_node_at_the_cause_is_isolated_first():
    program = _program()
    seen = []
    small = reduce(program, _still(seen), cause=ADD, at=_wrong_add(program))
    assert [str(n.target) for n in _ops(small)] == [ADD]
    assert len(seen) == 1  # one trial: the localized node, isolated


def test_after_the_bypass_the_call_at_the_cause_is_isolated_on_what_is_left():
    seen = []
    small = reduce(_program(), _still(seen), cause=ADD)
    (add,) = _ops(small)
    assert str(add.target) == ADD and add.kwargs.get("alpha") == 2.0


def test_without_a_cause_the_bypass_alone_is_kept():
    small = reduce(_program(), _still([]))
    # the adds of the chain go; the means and the two adds they feed cannot be bypassed
    assert [str(n.target) for n in _ops(small)] == [
        "aten.mean.dim", "aten.mean.dim", ADD, ADD]


def test_first_wrong_names_the_node_and_localize_its_operator():
    program = _program()
    assert first_wrong(program, BACKENDS[0], Setup(), "mismatch") == _wrong_add(program)
    assert localize(program, BACKENDS[0], Setup(), "mismatch") == ADD
    assert first_wrong(program, resolve({"eager": planted.eager})[0], Setup(),
                       "mismatch") is None


def test_first_wrong_gives_up_at_its_deadline():
    program = _program()
    assert len(_ops(program)) < MOST_CUTS  # not stopped by the count
    assert first_wrong(program, BACKENDS[0], Setup(), "mismatch", seconds=0.0) is None


class _DeepBroadcast(torch.nn.Module):
    """The wrong add past the first cuts localizing tries (``MOST_CUTS``), read by a ``sub``
    that makes the output: the drawn finding is held to be at ``sub``."""

    def forward(self, x, b):
        y = x
        for _ in range(MOST_CUTS + 2):
            y = y * 1.5
        m = y.mean(1, keepdim=True) + y.mean(0, keepdim=True)
        return torch.add(b, m, alpha=2.0) - x


def test_a_finding_past_the_first_cuts_is_shrunk_to_the_call_at_its_cause():
    ep = torch.export.export(_DeepBroadcast(), (torch.randn(2, 4), torch.randn(4)))
    program = import_ep(ep)
    assert first_wrong(program, BACKENDS[0], Setup(), "mismatch") is None
    report = differential({"alpha": planted.drop_alpha_when_broadcast},
                          programs=st.just(program), max_examples=1,
                          shrink_seconds=30)
    (finding,) = report.findings
    (add,) = _ops(finding.program)
    assert finding.cause == ADD and add.kwargs.get("alpha") == 2.0, finding.summary()
    assert finding.reproduced is True


class _AfterMuls(torch.nn.Module):
    """``muls`` multiplications, then the add the planted backend gets wrong."""

    def __init__(self, muls):
        super().__init__()
        self.muls = muls

    def forward(self, x, b):
        for _ in range(self.muls):
            x = x * 1.5
        return torch.add(b, x, alpha=2.0)


def test_first_wrong_cuts_exactly_the_first_most_cuts_compute_nodes():
    """The wrong add as the MOST_CUTS-th tensor-valued compute node is found, one node later it
    is not (placeholders are not counted)."""
    args = (torch.randn(2, 4), torch.randn(4))
    last = import_ep(torch.export.export(_AfterMuls(MOST_CUTS - 1), args))
    past = import_ep(torch.export.export(_AfterMuls(MOST_CUTS), args))
    assert first_wrong(last, BACKENDS[0], Setup(), "mismatch") == _ops(last)[-1].name
    assert first_wrong(past, BACKENDS[0], Setup(), "mismatch") is None


class _AddThen(torch.nn.Module):
    """The add the planted backend gets wrong, read by ``after``: the drawn finding is held to
    be at ``after``'s operator, its drawn program wrong first at the add."""

    def __init__(self, after):
        super().__init__()
        self.after = after

    def forward(self, x, b):
        return self.after(torch.add(b, x, alpha=2.0), x)


def test_a_finding_wrong_first_where_a_shrunk_one_is_merged_into_it_unshrunk(monkeypatch):
    from lowering.fuzz import search

    args = (torch.randn(2, 4), torch.randn(4))
    sub = import_ep(torch.export.export(_AddThen(torch.sub), args))
    mul = import_ep(torch.export.export(_AddThen(torch.mul), args))
    shrunk = []
    shrink = search._Search.shrink

    def counted(self, finding, seconds):
        shrunk.append(finding.cause)
        return shrink(self, finding, seconds)

    monkeypatch.setattr(search._Search, "shrink", counted)
    report = differential({"alpha": planted.drop_alpha_when_broadcast},
                          programs=st.sampled_from([sub, mul]), max_examples=10,
                          shrink_seconds=30)
    assert report.raw == 2 and len(shrunk) == 1, (report.raw, shrunk)
    (finding,) = report.findings
    assert finding.key == ("alpha", "mismatch", ADD) and finding.count == 2
    assert finding.reproduced is True
    # a finding of another backend, or a crash, is never held to be a shrunk one
    other = attrs.evolve(finding, backend="other", cause=shrunk[0])
    crash = attrs.evolve(finding, kind="crash", cause=shrunk[0])
    seen = search._Search(BACKENDS, st.just(sub), Setup(), (), None)
    merged = {finding.key: finding}
    assert seen.seen_already(attrs.evolve(finding, cause=shrunk[0]), merged, 30) == finding.key
    assert seen.seen_already(other, merged, 30) is None
    assert seen.seen_already(crash, merged, 30) is None
    # a drawn program wrong past the first cuts is not localized: its drawn cause alone (the
    # output's sub), though a shrunk finding has that key, merges nothing
    deep = import_ep(torch.export.export(_DeepBroadcast(), args))
    held_at_sub = attrs.evolve(finding, program=deep, cause="aten.sub.Tensor")
    assert seen.seen_already(held_at_sub, {held_at_sub.key: held_at_sub}, 30) is None
