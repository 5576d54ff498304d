"""User rewrite rules: patterns and replacements written as PyTorch functions (``docs/rewrite.md``).

One package, one idea a module, no import cycle (each imports only those above it):

- ``trace``: a rule's functions traced into IR graphs at a program's level;
- ``match``: a traced pattern matched against a graph in a normal form;
- ``rule``: ``Rule`` (the user's value), ``Compiled`` (a rule at one level), ``Match``;
- ``check``: ``check_rule``, the rule's own law on generated inputs;
- ``check_context``: ``check_rule_in_context``, rewrite's law on programs holding the pattern;
- ``fold``: replacement values computed from state alone, folded into constants;
- ``engine``: ``rewrite`` / ``rewrite_report``, the worklist that applies rules to a fixpoint;
- ``rules``: shipped rules (also importable as ``transforms.rewrite_rules``).
"""

from transforms.rewrite.check import check_rule
from transforms.rewrite.check_context import check_rule_in_context
from transforms.rewrite.engine import Rewrite, RewriteReport, rewrite, rewrite_report
from transforms.rewrite.rule import Compiled, Match, Rule
from transforms.rewrite.trace import LEVELS

__all__ = [
    "LEVELS",
    "Compiled",
    "Match",
    "Rewrite",
    "RewriteReport",
    "Rule",
    "check_rule",
    "check_rule_in_context",
    "rewrite",
    "rewrite_report",
]
