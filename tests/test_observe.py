"""The one comparison of the three laws (``ir.harness.observe``): a run observed as a value
(outputs, inputs after the call, state, aliasing read before copying), a law as a value (what
it observes, how it names the wanted side), differences as structured values."""

from __future__ import annotations

import pytest
import torch

from ir.harness import (
    MISSING,
    Difference,
    Law,
    Observed,
    observe,
    observed_difference,
    shares_storage,
)

ALL = Law("all", wanted="the original gives", side="the original's result is")


def test_aliasing_is_read_from_the_run_itself():
    x, w = torch.ones(3), torch.zeros(2)
    seen = observe((x[:2], torch.ones(1), w), (x,), {"w": w})
    assert seen.aliasing == (frozenset({"input 0"}), frozenset(), frozenset({"state 'w'"}))
    again = observe((x, x), (torch.ones(3),))
    assert again.aliasing == (frozenset(), frozenset({"output 0"}))


def test_shares_storage_is_the_one_run_time_aliasing_question():
    x = torch.arange(6.0)
    assert shares_storage(x, x) and shares_storage(x[1:], x.view(2, 3).t())  # views of one base
    assert not shares_storage(x, x.clone())
    assert not shares_storage(x[:0], x)  # an empty view shares nothing
    assert not shares_storage(torch.empty(2, device="meta"), torch.empty(2, device="meta"))
    assert not shares_storage(x, 1.0) and not shares_storage([x], x)  # tensors only
    sparse = torch.eye(3).to_sparse()
    assert not shares_storage(sparse, sparse) and not shares_storage(x, sparse)  # no storage
    assert observe([1, x], [sparse], {"s": sparse}).aliasing == (frozenset(), frozenset())


def test_a_difference_is_a_value_naming_where_it_is():
    a = observe((torch.ones(2), {"k": torch.ones(3)}))
    b = observe((torch.ones(2), {"k": torch.zeros(3)}))
    found = observed_difference(a, b, ALL)
    assert isinstance(found, Difference)
    assert (found.what, found.path) == ("outputs", (1, "k"))
    assert found.wanted == "the original gives" and found.want == "0.0"
    assert str(found).startswith("outputs [1] ['k']: values differ at 3 of 3 positions")
    assert observed_difference(a, a, ALL) is None


def test_each_part_is_compared_in_order_and_only_what_the_law_observes():
    x = torch.ones(2)
    same_out = (torch.ones(1),)
    got = Observed(same_out, (torch.zeros(2),), {"w": torch.ones(1)}, (frozenset(),))
    want = Observed(same_out, (x,), {"w": torch.zeros(1)}, (frozenset(),))
    assert observed_difference(got, want, ALL).what == "inputs after the call"
    only_state = Law("s", frozenset({"state"}))
    assert observed_difference(got, want, only_state).what == "state 'w'"
    assert observed_difference(got, want, Law("o", frozenset({"outputs"}))) is None
    missing = Observed(same_out, (x,), {"w": MISSING}, (frozenset(),))
    assert str(observed_difference(missing, want, only_state)) == (
        "state 'w': missing, want present")
    fewer = Observed((), (), {}, ())
    assert str(observed_difference(fewer, want, ALL)) == "outputs: 0, the original gives 1"


def test_aliasing_both_ways():
    x = torch.ones(3)
    view, copy = observe((x[:1],), (x,)), observe((x[:1].clone(),), (x,))
    assert str(observed_difference(copy, view, ALL)) == (
        "outputs [0]: fresh, the original's result is an alias of input 0")
    assert str(observed_difference(view, copy, ALL)) == (
        "outputs [0]: an alias of input 0, the original's result is fresh")
    assert observed_difference(copy, view, Law("v", frozenset({"outputs"}))) is None


def test_a_law_observes_only_what_there_is():
    with pytest.raises(ValueError, match="a law observes a part of"):
        Law("bad", frozenset({"outputs", "timing"}))


def test_aliasing_is_each_pair_that_shares_storage():
    # ``observe`` looks storages up instead of asking every pair: the same sets as the pairs
    base, other, state = torch.arange(12.0), torch.ones(4), torch.zeros(3)
    inputs = (base, other, torch.empty(0), 1.5)
    pool = [base[:3], base.view(3, 4).t(), other, other.clone(), state[1:], torch.ones(2),
            base[:0], torch.empty(2, device="meta"), 7, None]
    for picks in [(0, 1, 2, 3, 4, 5), (5, 5, 0, 6, 7, 8), (2, 2, 9, 1, 4, 3), (3, 0, 4, 1, 2, 0)]:
        outputs = tuple(pool[i] for i in picks)
        seen = observe(outputs, inputs, {"s": state, "t": base})
        named = [(f"input {i}", x) for i, x in enumerate(inputs)]
        named += [("state 's'", state), ("state 't'", base)]
        for k, out in enumerate(outputs):
            others = named + [(f"output {j}", outputs[j]) for j in range(k)]
            assert seen.aliasing[k] == frozenset(n for n, x in others if shares_storage(out, x))
            assert seen.repeats[k] == frozenset(
                f"output {j}" for j in range(k)
                if isinstance(out, torch.Tensor) and outputs[j] is out)
