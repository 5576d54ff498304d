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
``rewrite``, the e-graph search for ``saturate``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from ir.errors import PassError
from ir.program import Program
from transforms.rewrite.engine import program_level, rule_list
from transforms.rewrite.rule import Rule, check_assumptions, rule_cache
from transforms.rewrite.verdicts import check_rules

__all__ = ["RuleSet", "ensure_checked", "prepare", "rule_verdict"]


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
    broke). The verdict is looked for among the shipped verdicts and in the store
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
        raise PassError(
            f"rule {rule.name!r} is wrong, so rewrite refuses it (mark it Rule(..., "
            f"trusted=True) to skip the check): {cache.verdict}"
        ) from cache.verdict


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
