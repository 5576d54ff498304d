"""The rule drivers' one front-end: a rule set prepared for a program, as ``rewrite`` and
``saturate`` both take it (``prepare``), and each rule's verdict reached once
(``ensure_checked``).

Preparing is, in order: the granted assumptions read (``rule.check_assumptions``), the rules
listed (``engine.rule_list``: Rule values, distinct names), those whose ``assumes`` are not
all granted set apart (neither checked nor applied), the program's level read
(``engine.program_level``, the one ``matches`` and ``apply_rules`` read), each granted rule
compiled at it (a malformed rule is refused before any check runs), the verdicts reached
(``verdicts.check_rules``: memory, shipped, store, else checked over the cores) and every
wrong one refused (``ensure_checked``). What is left differs per driver: ``apply_rules`` for
``rewrite``; for ``saturate``, each rule compiled in the directions it is matched in
(``directions``: a ``both_ways`` rule's reverse too), then the e-graph search.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from ir.errors import PassError
from ir.program import Program
from transforms.rewrite.ematch import result_nodes
from transforms.rewrite.engine import program_level, rule_list
from transforms.rewrite.rule import Compiled, Rule, check_assumptions, reads_inputs, rule_cache
from transforms.rewrite.verdicts import check_rules

__all__ = [
    "Directed", "RuleSet", "directions", "ensure_checked", "prepare", "reverse_of",
    "rule_verdict",
]


@attrs.frozen
class RuleSet:
    """Rules prepared for one program (``prepare``).

    - ``rules``: the rules as given (``engine.rule_list``), in order;
    - ``applied``: those whose ``assumes`` are all granted, compiled at ``level`` and checked
      right (or ``trusted``);
    - ``missing``: ``{rule name: the flags it assumes that were not granted}`` for the others;
    - ``level``: the program's level (``engine.program_level``); ``None`` where no rule is
      applied (the program is then not read).
    """

    rules: tuple[Rule, ...]
    applied: tuple[Rule, ...]
    missing: Mapping[str, frozenset[str]]
    level: str | None


def prepare(p: Program, rules: Iterable[Rule], assume: Any = frozenset(), *, who: str,
            verdicts: Any = None) -> RuleSet:
    """``rules`` prepared for ``p`` as the drivers take them (see the module docstring).

    Parameters:
        p: the program the rules will be applied to (its level is read from it).
        rules: one ``Rule`` or an iterable of them.
        assume: the granted assumptions (a set out of ``rule.ASSUMPTIONS``).
        who: the driver's name (``"rewrite"``, ``"saturate"``), named in the errors about
            ``assume``.
        verdicts: the verdict store (``verdicts.check_rules``): ``None`` for the default, a
            directory, or ``False`` for none.

    Raises:
        TypeError, ValueError: ``assume`` is not a set of known flags (naming ``who``).
        PassError: a value that is not a Rule or names given twice (``rule_list``); naming the
            rule, when a granted rule is malformed or checked wrong.

    **Laws:** deterministic but for the verdicts' first check (then kept); ``prepare(p, [],
    ...)`` reads nothing of ``p``. Complexity: O(nodes) for the level plus one compilation
    per rule, plus ``check_rule`` for each rule without a verdict yet.
    """
    granted = check_assumptions(assume, f"{who}: assume")
    listed = rule_list(rules)
    missing = {r.name: r.assumes - granted for r in listed if not r.assumes <= granted}
    applied = tuple(r for r in listed if r.name not in missing)
    level = None
    if applied:
        level = program_level(p)
        for r in applied:
            r.compiled(level)  # a malformed rule is refused before its check runs
        check_rules(applied, verdicts=verdicts)  # the unchecked ones over the cores
        for r in applied:
            ensure_checked(r)
    return RuleSet(tuple(listed), applied, MappingProxyType(missing), level)


def rule_verdict(rule: Rule) -> BaseException | bool | None:
    """``check_rule``'s verdict on ``rule`` as ``rewrite`` keeps it (in ``rule_cache``, a memo
    keyed by the rule): ``True`` (right), the ``LawViolation``, or ``None`` before the first
    ``rewrite`` that met the rule. O(1)."""
    return rule_cache(rule).verdict


def ensure_checked(rule: Rule, *, verdicts: Any = None) -> None:
    """``check_rule``'s verdict on ``rule``, reached once and kept (``rule_verdict``), as
    ``rewrite`` reaches it before applying the rule: nothing for a right or ``trusted`` rule;
    ``PassError`` naming the rule and the counterexample for a wrong one (or a check that
    broke), its ``excused_by`` the refusal's (``transforms.rewrite.refusal``: the assumptions
    that would make the rule right; ``None`` for a check that broke). The verdict is looked for among the shipped verdicts and in the store
    ``verdicts`` names before ``check_rule`` runs (``transforms.rewrite.verdicts.check_rules``).
    ``check_rule_in_context`` calls it before its own search, outside hypothesis, so
    the rule is checked as ``check_rule`` alone checks it. Cost: one ``check_rule`` the first
    time in a process when no verdict is on disk (else a training-level trace of the rule, its
    key), O(1) after."""
    if rule.trusted:
        return
    cache = rule_cache(rule)
    if cache.verdict is None:
        check_rules([rule], verdicts=verdicts)
    if isinstance(cache.verdict, BaseException):
        cache.verdict = _without_frames(cache.verdict)
    if cache.verdict is not True:
        refused = PassError(
            f"rule {rule.name!r} is wrong, so rewrite refuses it (mark it Rule(..., "
            f"trusted=True) to skip the check): {cache.verdict}"
        )
        # the assumptions that would make it right, as the refusal found them (``refusal``)
        refused.excused_by = getattr(cache.verdict, "excused_by", None)
        raise refused from cache.verdict


def _without_frames(exc: BaseException) -> BaseException:
    """``exc`` with the tracebacks of it and its causes dropped: a verdict kept beside a rule
    must hold no frame that holds the rule (the memo would never let the rule go)."""
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        e.__traceback__ = None
        e = e.__cause__ or e.__context__
    return exc


# --- rules: each direction compiled once ---------------------------------------------------------


@attrs.frozen
class Directed:
    """A rule in one direction: the ``Rule`` whose pattern is matched (the reverse of a
    ``both_ways`` rule is a trusted rule of swapped functions: the forward's check covers it,
    equality being symmetric) and its compiled form."""

    rule: Rule
    compiled: Compiled
    name: str


def directions(rules: Iterable[Rule], level: str | None,
               skipped: dict[str, str]) -> list[Directed]:
    """Each rule of ``rules`` (each variant of its ``optional`` arguments) compiled at
    ``level`` in the directions ``saturate`` matches it: forwards, and backwards too for a
    ``both_ways`` rule (``reverse_of``). A direction whose pattern's results are not distinct
    computed values (``ematch.result_nodes``), or whose reverse cannot be matched, is named in
    ``skipped`` (``{name: why}``, written in place) and left out. ``PassError`` naming the rule
    where ``both_ways`` cannot hold (``_refuse_one_way``). O(variants x compilation)."""
    out: list[Directed] = []
    for r in (v for rule in rules for v in rule.variants()):
        c = r.at_level(level)
        if c is None:
            continue  # this variant does not exist at the program's level
        if result_nodes(c.pattern) is not None:
            out.append(Directed(r, c, r.name))
        else:
            skipped[r.name] = _NOT_MATCHED
        if r.both_ways:
            _refuse_one_way(r, c)
            back = reverse_of(r)
            try:
                bc = back.compiled(level)
            except PassError as exc:
                if "uses scalar argument" in str(exc):  # one the replacement drops
                    raise PassError(
                        f"rule {r.name!r}: both_ways=True, but its reverse cannot be built: "
                        f"{exc}; drop both_ways (the rule is then applied forwards only)"
                    ) from exc
                skipped[back.name] = f"cannot be matched: {exc}"
                continue
            if result_nodes(bc.pattern) is not None:
                out.append(Directed(back, bc, r.name))
            else:
                skipped[back.name] = _NOT_MATCHED
    return out


def _refuse_one_way(r: Rule, c: Compiled) -> None:
    """``PassError`` where ``r`` says ``both_ways=True`` but its replacement drops a tensor
    argument its pattern reads (a scalar one: the reverse's own refusal, ``directions``): the reverse would have to compute the pattern from
    a value no match of the replacement binds, so it cannot be built, and the rule would be
    used one way only, silently. Names the argument. O(pattern + replacement nodes)."""
    names = _parameter_names(r.pattern)
    dropped = [pos for pos, pat_reads, rep_reads in zip(
        c.traced.tensor_args, reads_inputs(c.traced), reads_inputs(c.replacement))
        if pat_reads and not rep_reads]
    if dropped:
        pos = dropped[0]
        what = names[pos] if pos < len(names) else f"argument {pos}"
        raise PassError(
            f"rule {r.name!r}: both_ways=True, but its replacement drops argument {pos} "
            f"({what!r}), which its pattern reads: the reverse would have to compute the "
            f"pattern from a value no match of the replacement binds, so it cannot be built; "
            "drop both_ways (the rule is then applied forwards only) or make the replacement "
            f"read {what!r}"
        )


def _parameter_names(fn: Any) -> list[str]:
    """The positional parameter names of ``fn`` (empty where it has no signature). O(1)."""
    try:
        return [p.name for p in inspect.signature(fn).parameters.values()]
    except (TypeError, ValueError):
        return []


_NOT_MATCHED = ("a result of its pattern is an input, a literal or another result again "
                "(saturate matches results that are distinct computed values)")


def reverse_of(r: Rule) -> Rule:
    """The reverse of a ``both_ways`` rule, made once and kept beside it (``rule_cache``), so
    that its traces are made once too: the pattern and replacement swapped, trusted (the
    forward's check covers it: equality is symmetric). O(1) after the first call."""
    cache = rule_cache(r)
    back = cache.reversed
    if back is None:
        back = cache.reversed = Rule(
            r.replacement, r.pattern, r.example_inputs, name=f"{r.name} (reversed)",
            where=r.where, trusted=True, specials=r.specials, assumes=r.assumes,
            hypers=r.hypers,
        )
    return back
