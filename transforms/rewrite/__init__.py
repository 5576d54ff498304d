"""User rewrite rules: patterns and replacements written as PyTorch functions (``docs/rewrite.md``).

One package, one idea a module, no import cycle (each imports only those above it):

- ``trace``: a rule's functions traced into IR graphs at a program's level;
- ``match``: a traced pattern matched against a graph in a normal form;
- ``rule``: ``Rule`` (the user's value), ``Compiled`` (a rule at one level), ``Match``;
- ``interpret``: running a flat program's graph on tensors, as the laws see programs;
- ``check``: ``check_rule``'s law on generated inputs, given the rewrite that instantiates
  replacements (``engine.apply_rules``, passed in: the engine runs this check);
- ``fold``: replacement values computed from state alone, folded into constants;
- ``engine``: ``rewrite`` / ``rewrite_report``, the worklist that applies rules to a fixpoint;
- ``check_context``: ``check_rule`` bound to ``engine.apply_rules``, and
  ``check_rule_in_context``, rewrite's law on programs holding the pattern;
- ``rules``: shipped rules (also importable as ``transforms.rewrite_rules``).
"""

from transforms.rewrite.check_context import check_rule, check_rule_in_context
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
