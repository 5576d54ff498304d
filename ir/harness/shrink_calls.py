"""A limit on shrinking counted in calls, not seconds: the same stopping point on any machine.

Hypothesis shrinks a counterexample for as long as it finds smaller ones, then tries on for a
while; on generated programs most of the calls after the last smaller failure are fruitless
(a semantics failure on the operator floor's programs: 1,495 calls, 250 s; its program went
from 62 nodes to 39 in the first 171 calls, to 27 by call 756, and the 739 calls after that
found nothing smaller). :class:`ShrinkCalls` stops shrinking after a number of calls past the
first failure, and raises the smallest found. (A count of calls without a smaller failure
does not bound it: hypothesis's order of "smaller" is its choice sequence's, which most
failing candidates improve by a little, so such a count restarts every few calls.) It counts
calls, never time, so a derandomized run stops at the same example on a fast machine and a
slow one and reports the same counterexample (``ir.harness.ShrinkBudget``, the rule
checker's, counts seconds).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from ir.harness.run import OutOfTime


class ShrinkCalls:
    """A shrink budget (the ``budget`` of an ``ir.harness.Trial``) of ``calls`` runs past the
    first failure.

    ``run(key, check)`` runs ``check()``. A run that raises ``failure`` (the law's error type)
    is the smallest failure so far (once a failure is found, hypothesis runs only candidates
    smaller than the best one); once ``calls`` runs have followed the first failure, the next
    ``run`` raises ``OutOfTime`` carrying the latest failure, which hypothesis lets pass at
    once. ``guard(test)`` runs the hypothesis test and raises that failure in its place.

    Laws: the same sequence of runs stops at the same run (no clock is read); a run with no
    failure before it is never stopped; at most ``calls`` checks run after the first failure.
    Raises ``ValueError`` for ``calls`` not a positive int. O(1) per run besides ``check``.
    """

    def __init__(self, calls: int, failure: type[BaseException] = AssertionError) -> None:
        if not isinstance(calls, int) or isinstance(calls, bool) or calls < 1:
            raise ValueError(f"calls must be a positive int, got {calls!r}")
        self.calls = calls
        self.failure = failure
        self.since = 0
        self.latest: BaseException | None = None

    def run(self, key: Hashable, check: Callable[[], None]) -> None:
        """Run ``check()`` under the budget (see the class docstring); ``key`` names the draw
        (kept for reports)."""
        if self.latest is not None:
            if self.since >= self.calls:
                raise OutOfTime(self.latest)
            self.since += 1
        try:
            check()
        except self.failure as exc:
            self.latest = exc
            raise

    def guard(self, test: Callable[[], None]) -> None:
        """Run the hypothesis test ``test()``; when the budget ran out, raise the smallest
        failure found (without hypothesis's report of it), with a note saying that shrinking
        stopped here."""
        try:
            test()
        except OutOfTime as stop:
            stop.failure.add_note(f"(shrinking stopped {self.calls} calls after the first "
                                  "failure: the smallest failure found so far)")
            raise stop.failure from None


__all__ = ["ShrinkCalls"]
