"""The law runner (``ir.harness.runner``) every law loop goes through: ``run_side`` runs one
side on copies under a seed and observes it (aliasing read before copying), ``judge`` compares
two runs under a ``Law`` (regrouped under ``reassociate``); ``Law.alias_may_be_fresh`` lets a
lost alias pass while a new one is still a difference."""

from __future__ import annotations

import torch

from ir.harness import Law, Observed, judge, observe, regrouped, run_side

ALL = Law("all", wanted="the original gives", side="the original's result is")
LOSES = Law("loses", side="the input program's output is", alias_may_be_fresh=True)


def test_a_side_runs_on_copies_under_a_seed_and_is_observed_before_copying():
    x = torch.ones(3)
    state = {"w": torch.zeros(2)}

    def side(a):
        a.add_(1)
        state["w"].add_(2)
        return a[:2], torch.rand(2), state["w"]

    ran = run_side(side, (x,), seed=7, state=lambda: state)
    assert ran.ok and torch.equal(x, torch.ones(3))  # the caller's input is not written
    seen = ran.observed
    assert seen.aliasing == (frozenset({"input 0"}), frozenset(), frozenset({"state 'w'"}))
    assert torch.equal(seen.inputs[0], torch.full((3,), 2.0))
    assert torch.equal(seen.state["w"], torch.full((2,), 2.0))
    state["w"].add_(5)  # observed values are copies: a later write does not reach them
    assert torch.equal(seen.state["w"], torch.full((2,), 2.0))
    torch.manual_seed(7)
    assert torch.equal(seen.outputs[1], torch.rand(2))  # the seed the run was given


def test_a_side_that_raises_gives_its_error():
    ran = run_side(lambda a: a.reshape(5), (torch.ones(3),))
    assert not ran.ok and ran.observed is None
    assert ran.error[0] == "RuntimeError" and "shape '[5]'" in ran.error[1]


def test_judge_finds_a_new_alias_and_lets_a_lost_one_pass_when_the_law_says_so():
    x = torch.ones(3)
    view, copy = observe((x[:1],), (x,)), observe((x[:1].clone(),), (x,))
    assert str(judge(LOSES, view, copy)) == (
        "outputs [0]: an alias of input 0, the input program's output is fresh")
    assert judge(LOSES, copy, view) is None
    assert str(judge(ALL, copy, view)) == (
        "outputs [0]: fresh, the original's result is an alias of input 0")
    assert judge(ALL, view, view) is None


def test_judge_under_reassociate_asks_for_the_reference_only_when_needed():
    want = Observed((torch.tensor([1.0]),))
    got = Observed((torch.tensor([1.001]),))
    asked = []

    def reference():
        asked.append(1)
        return Observed((torch.tensor([1.001], dtype=torch.float64),))

    assert judge(ALL, want, want, assumes=frozenset({"reassociate"}), reference=reference) is None
    assert asked == []
    assert judge(ALL, got, want, reference=reference) is not None and asked == []
    assert judge(ALL, got, want, assumes=frozenset({"reassociate"}), reference=reference) is None
    assert asked == [1]


def test_regrouped_pairs_each_field_with_the_terms_run():
    exact = Observed((torch.ones(2, dtype=torch.float64),), (), {"w": torch.ones(1)})
    terms = Observed((torch.full((2,), 3.0, dtype=torch.float64),), (), {"w": torch.ones(1)})
    paired = regrouped(exact, terms)
    assert torch.equal(paired.outputs[0].terms, terms.outputs[0])
    assert torch.equal(paired.state["w"].exact, exact.state["w"])
    assert regrouped(exact, None) is exact


def test_one_tensor_returned_twice_passes_only_a_law_that_allows_merged_outputs():
    x = torch.ones(3)
    y = x * 2
    twice, two = observe((y, y), (x,)), observe((x * 2, x * 2), (x,))
    view = observe((y, y[:]), (x,))
    assert twice.repeats == (frozenset(), frozenset({"output 0"}))
    assert view.repeats == (frozenset(), frozenset())
    merged = Law("merged", side="the input program's output is", repeated_outputs=True)
    assert judge(merged, twice, two) is None
    assert str(judge(merged, view, two)) == (
        "outputs [1]: an alias of output 0, the input program's output is fresh")
    assert str(judge(LOSES, twice, two)) == (
        "outputs [1]: an alias of output 0, the input program's output is fresh")


def test_an_output_may_alias_what_the_wanted_side_wrote():
    """After ``x.add_(1); return x`` eager returns ``x`` itself: an output aliasing an input
    that the wanted side wrote is no new alias; aliasing any other input still is."""
    from ir.harness import Observed
    from ir.harness.observe import observed_difference
    from lowering.pass_laws import SEMANTICS

    x = torch.ones(2)
    got = Observed((x,), (x,), aliasing=(frozenset({"input 0"}),), repeats=(frozenset(),))
    want = Observed((x.clone(),), (x.clone(),), aliasing=(frozenset(),), repeats=(frozenset(),))
    assert observed_difference(got, want, SEMANTICS, written=frozenset({"input 0"})) is None
    found = observed_difference(got, want, SEMANTICS)
    assert found is not None and "an alias of input 0" in str(found)
    assert observed_difference(got, want, SEMANTICS, written=frozenset({"input 1"})) is not None


class _WritesBuf(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.zeros(2))
        self.register_buffer("keep", torch.ones(2))

    def forward(self, x):
        self.buf.add_(1)
        return x + self.buf + self.keep


def test_the_state_the_input_program_writes_is_the_effect_analysis_answer():
    """The semantics law's written state is ``ir.effects.state_written``: an in-place write of a
    buffer counts, flat and outlined, with no mutation output spec naming it; state only read
    does not."""
    from ir import import_ep
    from ir.harness import Observed
    from lowering.pass_laws import _written
    from transforms import transform

    p = import_ep(torch.export.export(_WritesBuf(), (torch.ones(2),)))
    for q in (p, transform(p)):
        assert not any(s.target == "buf" for s in q.signature.outputs)  # no mutation spec
        assert _written(q, (), Observed(())) == frozenset({"state 'buf'"})
