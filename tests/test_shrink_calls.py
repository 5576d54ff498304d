"""``ShrinkCalls``: shrinking bounded by a count of calls, and ``check_laws``' ``shrink_calls``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ir.harness.shrink_calls import ShrinkCalls
from lowering.pass_laws import SHRINK_CALLS, LawViolation, check_laws


class _Big(AssertionError):
    pass


def _shrunk_under(budget: ShrinkCalls | None) -> tuple[int, int]:
    """Hypothesis shrinking a failure ``n >= 1000`` of integers, under ``budget``: the value
    raised and how many checks ran after the first failure."""
    ran = {"calls": 0, "first": None}

    def check(n: int) -> None:
        ran["calls"] += 1
        if n >= 1000:
            ran["first"] = ran["first"] or ran["calls"]
            raise _Big(n)

    @settings(database=None, derandomize=True, max_examples=200)
    @given(st.integers(min_value=0, max_value=10**9))
    def test(n: int) -> None:
        if budget is None:
            check(n)
        else:
            budget.run(n, lambda: check(n))

    with pytest.raises(_Big) as caught:
        if budget is None:
            test()
        else:
            budget.guard(test)
    stopped = [n for n in getattr(caught.value, "__notes__", ()) if "shrinking stopped" in n]
    note = (f"(shrinking stopped {budget.calls} calls after the first failure: the smallest "
            "failure found so far)") if budget is not None else None
    assert stopped == ([] if note is None else [note])
    return caught.value.args[0], ran["calls"] - ran["first"]


def test_shrinking_stops_after_the_calls_and_raises_the_smallest_failure_so_far():
    free, free_after = _shrunk_under(None)
    assert free == 1000  # hypothesis alone shrinks to the boundary
    stopped, after = _shrunk_under(ShrinkCalls(3, _Big))
    assert after == 3  # every check of the budget, none past it
    assert stopped >= 1000 and free_after > 3  # a failure, raised before hypothesis finished
    assert _shrunk_under(ShrinkCalls(3, _Big)) == (stopped, after)  # counted, not timed


def test_a_run_without_a_failure_is_never_stopped():
    budget = ShrinkCalls(1, _Big)
    for k in range(10):
        budget.run(k, lambda: None)
    assert budget.latest is None


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_bad_budgets_are_refused(bad):
    with pytest.raises(ValueError, match="calls must be a positive int"):
        ShrinkCalls(bad)
    if bad is not None:
        with pytest.raises(ValueError, match="calls must be a positive int"):
            check_laws(lambda p: p, max_examples=1, shrink_calls=bad)


def test_check_laws_stops_shrinking_at_its_budget_and_reports_alike_twice():
    calls = []

    def breaks_verify(p):  # breaks the verify law on every program
        calls.append(p)
        return p.replace(state_order=p.state_order + ("nowhere",))

    messages = []
    for _ in range(2):
        calls.clear()
        with pytest.raises(LawViolation) as caught:
            check_laws(breaks_verify, max_examples=20, shrink_calls=4)
        assert caught.value.law == "verify"
        messages.append(str(caught.value))
        # purity calls the pass once per program: the first failure and at most 4 more
        assert len(calls) <= 5
    assert messages[0] == messages[1]
    assert SHRINK_CALLS >= 100  # the default still shrinks (a bound, not a stop)
