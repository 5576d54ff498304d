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

from ir.harness.run import ShrinkLimit


class ShrinkCalls(ShrinkLimit):
    """A shrink limit (:class:`ir.harness.run.ShrinkLimit`) of ``calls`` runs past the first
    failure: once ``calls`` runs have followed it, the next ``run`` raises ``OutOfTime``
    carrying the latest failure, and ``guard`` raises that failure with a note saying that
    shrinking stopped there.

    Laws: the same sequence of runs stops at the same run (no clock is read); a run with no
    failure before it is never stopped; at most ``calls`` checks run after the first failure.
    Raises ``ValueError`` for ``calls`` not a positive int. O(1) per run besides ``check``.
    """

    def __init__(self, calls: int, failure: type[BaseException] = AssertionError) -> None:
        if not isinstance(calls, int) or isinstance(calls, bool) or calls < 1:
            raise ValueError(f"calls must be a positive int, got {calls!r}")
        super().__init__(failure)
        self.calls = calls
        self.since = 0

    def _spent(self) -> bool:
        if self.since >= self.calls:
            return True
        self.since += 1
        return False

    def _note(self) -> str:
        return (f"(shrinking stopped {self.calls} calls after the first failure: the smallest "
                "failure found so far)")


__all__ = ["ShrinkCalls"]
