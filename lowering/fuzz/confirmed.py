"""Which findings count: those whose own repro shows them again.

A finding is made inside the fuzzer (its run of eager and the backend, under its seeds); its
repro (``lowering.fuzz.repro``) is a standalone script that runs the shrunk program again,
eager against the backend, in this process (``Finding.reproduced``). A finding the repro does
not show (a difference that needs the fuzzer's own state, a refusal that depends on what ran
before, a program the repro writer cannot spell, or a repro that shows a difference of another
kind: ``lowering.fuzz.shown``) is not counted: the report lists it apart, as
unconfirmed, with why, and ``purefx fuzz``'s exit status ignores it.
"""

from __future__ import annotations

from collections.abc import Iterable

from lowering.fuzz.search import Finding


def split(findings: Iterable[Finding]) -> tuple[tuple[Finding, ...], tuple[Finding, ...]]:
    """``(confirmed, unconfirmed)``: the findings whose repro showed them (``reproduced`` is
    ``True``) and the others (``False``: not shown, or no repro could be written; ``None``: not
    run), each in the order given. Laws: the two partition ``findings``. O(findings)."""
    confirmed, unconfirmed = [], []
    for finding in findings:
        (confirmed if finding.reproduced is True else unconfirmed).append(finding)
    return tuple(confirmed), tuple(unconfirmed)


def why_unconfirmed(finding: Finding) -> str:
    """Why ``finding`` is not counted, in a few words. O(1)."""
    if finding.reproduced is None:
        return "its repro was not run"
    if not finding.repro:
        return "no repro could be written"
    if finding.repro_shows:
        return f"its repro shows another difference: {finding.repro_shows[0]}"
    return "its repro does not show it when run again"


__all__ = ["split", "why_unconfirmed"]
