"""``rewrite`` and ``rewrite_report``: the rules prepared (``ruleset.prepare``: those whose
assumptions the caller grants, compiled and checked), then ``engine.apply_rules``.

A ``Rule`` pairs a *pattern* and a *replacement*, two plain functions of tensors and Python
scalars with the same results, and example inputs to trace them with::

    relu_relu = Rule(lambda x: torch.relu(torch.relu(x)), torch.relu, (torch.randn(4),))
    q = rewrite(p, [relu_relu])

The pattern is traced at the level of the program it is applied to (training IR, or core aten
after ``run_decompositions``; ``transforms.machinery.trace``), the replacement at the training level
(what the user wrote: ``silu``, ``scaled_dot_product_attention``). Matching is on the IR in a
normal form (``transforms.rewrite.match``). Each rule is checked with ``check_rule``
(``transforms.rewrite.rule_check``) the first time ``rewrite`` meets it, unless it is ``trusted``.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import MappingProxyType
from typing import Any

import attrs

from ir.program import Program
from transforms.rewrite.engine import RewriteReport, apply_rules
from transforms.rewrite.rule import Rule
from transforms.rewrite.ruleset import ensure_checked, prepare, rule_verdict


def rewrite(p: Program, rules: Iterable[Rule], assume: Any = frozenset(), *,
            verdicts: Any = None) -> Program:
    """Apply ``rules`` to every graph of ``p`` until none matches.

    Parameters:
        p: a Program, flat (``import_ep``, at the training or core aten level) or outlined
            (after ``transforms.transform``); every distinct module graph is rewritten once,
            so a graph shared by several calls is rewritten once.
        rules: ``Rule`` values. Each is checked with ``check_rule`` the first time it is met
            (unless ``trusted``); the verdict is kept beside the rule (``rule_verdict``).
        assume: the assumptions the caller grants (a set out of ``rule.ASSUMPTIONS``:
            ``"no_nans"``, ``"no_infs"``, ``"no_signed_zeros"``, ``"reassociate"``; default
            none: exact IEEE semantics). A rule whose ``assumes`` are not all granted is not
            applied, nor checked (``rewrite_report`` names it in ``not_granted``).
        verdicts: where ``check_rule``'s verdicts are kept between processes
            (``transforms.rewrite.verdicts.check_rules``): ``None`` for the default (the
            directory ``PUREFX_VERDICTS`` names, else ``~/.cache/purefx/verdicts``), a
            directory, or ``False`` for none. The shipped rules' verdicts ship with the package.

    Returns:
        The rewritten Program; ``p`` itself (``is``) when no rule matched. New nodes take the
        name of the node whose value they replace (so outputs and signatures keep their names),
        the innermost module common to the matched nodes (``nn_module_stack``) and a ``val``
        computed from the matched inputs' fake tensors (else the replaced node's). A match is
        taken only where every guard of ``transforms.rewrite.guards.GUARDS`` holds (the table,
        in order, with each guard's reason, is in ``docs/rewrite.md``; ``RewriteReport.skipped``
        counts the skips by guard). Nodes the match looks through (``Binding.absorbed``) are
        removed with it. A replacement whose trace depends on dtypes (``Compiled.by_dtype``)
        is traced at each match's dtypes.

    Raises:
        ValueError: ``assume`` holds an unknown flag (naming the known ones).
        PassError: naming the rule, when a rule cannot be traced or is malformed (a pattern
        holding an in-place operator among them), when ``check_rule`` finds it wrong (with the
        counterexample), when its ``where`` raises, when its replacement reads a tensor
        argument its pattern ignores, when rules keep rewriting each other's results past the
        step cap (a cycle; names them), and for any other error met while rewriting (naming
        the rule and the node): never a raw exception.

    **Laws:**

    - semantics: ``lower(rewrite(p, rules))`` computes what ``lower(p)`` does, up to each rule's
      tolerance (``check_rule``), on inputs the granted assumptions admit;
    - purity: ``p`` and its tensors are untouched; deterministic (rules in the order of their
      benefit then as given, nodes in graph order);
    - idempotence: ``rewrite(rewrite(p, rules), rules) == rewrite(p, rules)`` (a fixpoint);
    - identity: ``rewrite(p, []) is p``; ``rewrite(p, rules) is p`` when no rule's
      assumptions are granted;
    - ``verify`` holds of the result whenever it holds of ``p``.

    Complexity: O(n · r) per sweep over n nodes, where r is the number of rules whose pattern
    ends in the node's operator (rules are indexed by that operator); each rewrite re-examines
    the nodes it created, the readers it rewired and the nodes downstream of its new nodes
    within the deepest pattern (at most 256), then one closing sweep per graph proves the
    fixpoint (``apply_rules``); a program whose level changes under the rewrites (core aten
    receiving a training-level operator) gets one more round at the new level when some
    pattern traces differently there.
    """
    return rewrite_report(p, rules, assume, verdicts=verdicts)[0]


def rewrite_report(
    p: Program, rules: Iterable[Rule], assume: Any = frozenset(), *, verdicts: Any = None
) -> tuple[Program, RewriteReport]:
    """``rewrite(p, rules, assume)`` and a ``RewriteReport`` of what it rewrote where, what the
    guards skipped (``skipped``) and which rules it did not apply for want of an assumption
    (``not_granted``: ``{rule name: missing flags}``).

    Same contract, laws and complexity as ``rewrite``.
    """
    rs = prepare(p, rules, assume, who="rewrite", verdicts=verdicts)
    q, report = apply_rules(p, rs.applied)
    counts = {r.name: report.counts.get(r.name, 0) for r in rs.rules}
    return q, attrs.evolve(report, counts=MappingProxyType(counts), not_granted=rs.missing)


__all__ = ["ensure_checked", "rewrite", "rewrite_report", "rule_verdict"]
