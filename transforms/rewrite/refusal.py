"""A refused rule's refusal, made to say what to do: which assumptions the rule does not declare
would make ``check_rule`` accept it, found by checking it again with them (never guessed).

``transforms.rewrite.check_rule`` (this module's ``check_rule``) is ``rule_check.check_rule``
whose ``LawViolation`` carries, on refusal, ``excused_by``: the smallest set of undeclared
assumptions (``transforms.rewrite.rule.ASSUMPTIONS``, after LLVM's fast-math flags) under
which ``rule_check`` accepts the same rule, or ``frozenset()`` when none it tried does ("no
assumption excuses it"); its message says the same in words.

Which assumptions are tried follows from the counterexample, so a refusal costs a few checks
more, not sixteen (``evidence``): a NaN on either side, ``no_nans``; an infinity, ``no_infs``
(an input or side that holds either: both); a zero of the other sign, ``no_signed_zeros``; two
finite floating values apart, ``reassociate``. No assumption relaxes a shape, a dtype, an alias
or an error, so a counterexample of those (and one of integer values) is excused by none, with
no second check. Single flags are tried first, in the order the evidence gives; when none is
enough, sets of two, then three, each a set already refused grown by what its own refusal shows
(``reassociate`` and ``no_infs``: regrouping overflows where the pattern does not), at most
``MAX_RECHECKS`` checks in all.

The re-check is ``rule_check.check_rule`` on the rule with the flags added, run as inside a
property test, where it raises its first counterexample unshrunk (``refused``): shrinking only
words a counterexample, never changes a verdict, so the verdict is ``check_rule``'s. This module is kept out of the checker's version (``rule_key``): it decides
no verdict, only how a refusal is worded.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable

import attrs

from ir.errors import PassError
from transforms.machinery.law_violation import LawViolation
from transforms.rewrite import rule_check
from transforms.rewrite.rule import Rule, sharing_traces
from transforms.rewrite.rule_check import Checked, assumed

MAX_RECHECKS = 8
"""At most this many checks of the rule with assumptions added, per refusal."""

LLVM_FLAGS = {"no_nans": "nnan", "no_infs": "ninf", "no_signed_zeros": "nsz",
              "reassociate": "reassoc"}
"""Each assumption's LLVM fast-math flag (``docs/rewrite.md``, "Refusals that name the fix")."""

_GOT_WANT = re.compile(r"got (?P<got>\S+?), the pattern gives (?P<want>\S+?)(?: on inputs|$)")
_NONFINITE = re.compile(r"(?<![\w.])-?(?:inf|nan)(?![\w.])")


def check_rule(rule: Rule, *, max_examples: int | None = None,
               seed: int | None = None) -> Checked:
    """``rule_check.check_rule(rule, max_examples=..., seed=...)``: what was checked of a right
    rule; for a wrong one its ``LawViolation`` (law ``"rule"``, the same counterexample) with
    ``excused_by`` set and said: the smallest set of assumptions the rule does not declare under
    which ``check_rule`` accepts it (checked again with them, same ``max_examples`` and
    ``seed``), or ``frozenset()`` when no assumption excuses it (``explain``).

    Raises what ``rule_check.check_rule`` raises. Laws: the verdict is
    ``rule_check.check_rule``'s; a rule with the flags ``excused_by`` names added to its
    ``assumes`` is accepted by ``check_rule``. Cost: one ``rule_check.check_rule``; on a
    refusal at most ``MAX_RECHECKS`` more checks without shrinking (none when the
    counterexample is one no assumption relaxes)."""
    try:
        return rule_check.check_rule(rule, max_examples=max_examples, seed=seed)
    except LawViolation as exc:
        raise explain(rule, exc, max_examples=max_examples, seed=seed) from exc.__cause__


@attrs.frozen
class Excuse:
    """What re-checking a refused rule found: ``flags``, the smallest set of undeclared
    assumptions under which it is accepted (``frozenset()``: none found); ``tried``, each set
    checked, in order; ``reason``, why none was tried when ``tried`` is empty; ``complete``,
    whether every set the evidence led to was tried (``False``: ``MAX_RECHECKS`` ran out)."""

    flags: frozenset[str]
    tried: tuple[frozenset[str], ...] = ()
    reason: str = ""
    complete: bool = True

    def sentence(self, rule: Rule) -> str:
        """The excuse in words, for the end of a refusal."""
        if self.flags:
            added = " and ".join(sorted(self.flags))
            llvm = ", ".join(LLVM_FLAGS[f] for f in sorted(self.flags))
            every = ", ".join(sorted(rule.assumes | self.flags))
            return (f"adding {added} to the rule's assumes makes check_rule accept it (checked "
                    f"again with assumes {every}; LLVM's {llvm}): declare them if the programs "
                    "you rewrite may assume them, and grant them to rewrite (assume=...)")
        if not self.tried:
            return f"no assumption excuses it ({self.reason})"
        shown = "; ".join(" and ".join(sorted(t)) for t in self.tried)
        if not self.complete:
            return (f"no assumption tried excuses it (check_rule refuses it with {shown} added "
                    f"too; at most {MAX_RECHECKS} sets are tried)")
        return f"no assumption excuses it (check_rule refuses it with {shown} added too)"


def explain(rule: Rule, violation: LawViolation, *, max_examples: int | None = None,
            seed: int | None = None) -> LawViolation:
    """``violation`` (``check_rule``'s refusal of ``rule``) again, its detail ending with what
    ``excusing`` found and ``excused_by`` set to its flags. A violation that already carries
    ``excused_by`` is returned as it is. Cost: ``excusing``'s."""
    if getattr(violation, "excused_by", None) is not None:
        return violation
    found = excusing(rule, violation.detail, max_examples=max_examples, seed=seed)
    return refusal(rule, violation.detail, found.flags, found.sentence(rule))


def refusal(rule: Rule, detail: str, flags: frozenset[str] | None,
            sentence: str = "") -> LawViolation:
    """The ``LawViolation`` (law ``"rule"``) of a refused ``rule``: ``detail`` then, on a line
    of its own (the first line stays the counterexample), ``sentence`` (when not already in
    it), with ``excused_by = flags`` (``None``: not known). O(1)."""
    text = detail if not sentence or sentence in detail else f"{detail}\n{sentence}"
    exc = LawViolation("rule", rule, text, None)
    exc.excused_by = None if flags is None else frozenset(flags)
    return exc


def evidence(detail: str, declared: Iterable[str] = ()) -> tuple[str, ...]:
    """The assumptions that could excuse the counterexample ``detail`` describes (a
    ``check_rule`` refusal's detail), most telling first, without those ``declared``: see the
    module docstring. ``()`` when none could (a shape, dtype, alias or error, integer values,
    no values shown). O(len(detail))."""
    found: list[str] = []
    m = _GOT_WANT.search(detail)
    if m is not None:
        got, want = _number(m["got"]), _number(m["want"])
        for v in (want, got):
            if v is not None and math.isnan(v):
                found.append("no_nans")
            elif v is not None and math.isinf(v):
                found.append("no_infs")
        if _floating(m["got"]) and _floating(m["want"]) and got is not None and want is not None \
                and math.isfinite(got) and math.isfinite(want):
            if got == want == 0.0:
                found.append("no_signed_zeros")
            else:
                found.append("reassociate")
    if _NONFINITE.search(detail):  # a special value among the inputs: draws without it
        found += ["no_infs", "no_nans"]
    skip = set(declared)
    return tuple(f for f in dict.fromkeys(found) if f not in skip)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _floating(text: str) -> bool:
    """Whether ``text`` is a float's ``repr`` (an int's or a bool's is not)."""
    return _number(text) is not None and any(c in text.lower() for c in ".ein")


def excusing(rule: Rule, detail: str, *, max_examples: int | None = None,
             seed: int | None = None) -> Excuse:
    """The smallest set of assumptions ``rule`` does not assume (``rule_check.assumed``) under
    which ``check_rule`` accepts it, found from its refusal's ``detail``: single flags of
    ``evidence(detail)`` first, then each with what its own refusal shows, at most
    ``MAX_RECHECKS`` checks (``refused``), breadth first: every set of ``k`` flags the
    evidence reaches before one of ``k + 1``, each set grown by what its own refusal shows
    first. Cost: those checks."""
    declared = assumed(rule)
    first = evidence(detail, declared)
    if not first:
        return Excuse(frozenset(), reason="the assumptions relax only floating values: NaN, "
                      "infinities, the sign of zero, rounding; this counterexample differs "
                      "otherwise")
    tried: list[frozenset[str]] = []
    queue = [frozenset({f}) for f in first]  # by size: each set's children come after it
    seen = set(queue)
    while queue and len(tried) < MAX_RECHECKS:
        flags = queue.pop(0)
        tried.append(flags)
        problem = refused(sharing_traces(rule, assumes=rule.assumes | flags),
                          max_examples=max_examples, seed=seed)
        if problem is None:
            return Excuse(flags, tuple(tried))
        # what this refusal shows first (its own counterexample), then the first one's
        for g in (*evidence(problem.detail, declared | flags), *first):
            more = flags | {g}
            if g not in flags and more not in seen:
                seen.add(more)
                queue.append(more)
    return Excuse(frozenset(), tuple(tried), complete=not queue)


def refused(rule: Rule, *, max_examples: int | None = None,
            seed: int | None = None) -> LawViolation | None:
    """``None`` where ``rule_check.check_rule(rule, max_examples=..., seed=...)`` accepts
    ``rule``, else its refusal, without the hypothesis shrink: the check runs as inside a
    property test, where ``check_rule`` raises the first draw that breaks the law unshrunk
    (its documented nested mode; its draws are its own seeded ones either way, so the verdict
    is the same). A rule whose check raises other than a verdict (``PassError``: its
    ``where`` raised) counts as refused. Cost: one check without shrinking."""

    def verdict() -> LawViolation | None:
        try:
            rule_check.check_rule(rule, max_examples=max_examples, seed=seed)
        except LawViolation as exc:
            return exc
        except PassError as exc:
            return LawViolation("rule", rule, f"its check raised: {exc}", None)
        return None

    from hypothesis import currently_in_test_context

    return verdict() if currently_in_test_context() else _unshrunk(verdict)


def _unshrunk(verdict: Callable[[], LawViolation | None]) -> LawViolation | None:
    """``verdict()`` run once inside a hypothesis test of one example (nothing to draw, no
    database, no shrink phase), which is how ``check_rule`` knows not to shrink."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    found: list[LawViolation | None] = []

    @settings(max_examples=1, database=None, derandomize=True, deadline=None,
              phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(st.none())
    def once(_: None) -> None:
        if not found:  # the one example (the verdict is returned, never raised: no replay)
            found.append(verdict())

    once()
    return found[0]


__all__ = ["LLVM_FLAGS", "MAX_RECHECKS", "Excuse", "check_rule", "evidence", "excusing",
           "explain", "refusal", "refused"]
