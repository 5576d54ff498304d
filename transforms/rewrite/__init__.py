"""User rewrite rules: patterns and replacements written as PyTorch functions (``docs/rewrite.md``).

One package, one idea a module, no import cycle (each imports only those above it). A rule's
functions are traced into IR graphs at a program's level by ``transforms.machinery.trace`` (below this
package: the editor, ``transforms.edit``, traces too).

- ``match``: a traced pattern matched against a graph in a normal form;
- ``sizes``: a loose match re-checked by the pattern traced again at the match's shapes and
  dtypes (size wildcards, literals matched by value);
- ``rule``: ``Rule`` (the user's value, with the assumptions it ``assumes``), ``Compiled`` (a
  rule at one level), ``Match``;
- ``guards``: ``GUARDS``, the ordered table of named guards a match must pass to be taken
  (pure predicates, each with its reason);
- ``interpret``: running a flat program's graph on tensors, as the laws see programs;
- ``fold``: replacement values computed from state alone, folded into constants;
- ``engine``: ``apply_rules``, the worklist that applies rules (taken as right) to a fixpoint,
  the search hooks ``matches`` / ``apply_match``,
  and ``RewriteReport`` (rewrites, skips by guard, rules not granted);
- ``check``: ``check_rule``, a rule's law on generated inputs, its replacements instantiated by
  ``engine.apply_rules`` (the rewrite ``rewrite`` runs);
- ``refusal``: the public ``check_rule``: ``rule_check``'s, whose refusal names the
  undeclared assumptions that make the rule right (checked again with them), or says none does;
- ``ruleset``: ``prepare``, the drivers' one front-end: the rules whose assumptions the caller
  grants (``assume=``), compiled at the program's level and checked (``ensure_checked``), and
  ``directions``, each compiled in the directions ``saturate`` matches it in;
- ``api``: ``rewrite`` / ``rewrite_report``: the rules prepared (``ruleset``), then
  ``engine.apply_rules``;
- ``check_context``: ``check_rule_in_context``, rewrite's law on programs holding the pattern;
- ``rules``: shipped rules (also importable as ``transforms.rewrite_rules``);
- ``versions``: which writes in place the e-graph sees functionally (a fresh intermediate
  written in place: a new version of its value);
- ``egraph``: the e-graph of one IR graph (hash-consed e-nodes, union-find, rebuilding, class
  data) and ``value_roles``, what is a leaf;
- ``ematch``: a rule's pattern matched over an e-graph;
- ``cost``: cost models (``roofline``, ``measured_cost``, ``program_cost``);
- ``extract``: one e-node per class (greedy tree cost; exact ILP where scipy is installed);
- ``extracted``: extraction per graph and the chosen program built through ``rewrite_nodes``;
- ``saturate``: ``saturate`` / ``saturate_report``: the rules prepared (``ruleset``), then
  equality saturation, extraction, the
  program rebuilt, never worse than the input or greedy ``rewrite`` (``docs/search.md``);
- ``rule_key``: a rule's content key (what its verdict depends on, never its name);
- ``verdict_store``: verdicts on disk (the user's store, the shipped verdicts);
- ``verdicts``: ``check_rules``, verdicts reached once: in memory, on disk, else checked on the
  machine's cores.
"""

from transforms.machinery.trace import LEVELS
from transforms.rewrite.api import rewrite, rewrite_report
from transforms.rewrite.check_context import check_rule_in_context
from transforms.rewrite.engine import Rewrite, RewriteReport, apply_match, apply_rules, matches
from transforms.rewrite.refusal import check_rule
from transforms.rewrite.rule import (
    ASSUMPTIONS,
    Compiled,
    Hyper,
    Match,
    OptionalTensor,
    Rule,
    hyper,
    optional,
)
from transforms.rewrite.saturate import (
    SaturationLimits,
    SaturationReport,
    saturate,
    saturate_report,
)
from transforms.rewrite.verdict_store import VERDICTS_OFF, VerdictStore
from transforms.rewrite.verdicts import check_rules

__all__ = [
    "ASSUMPTIONS",
    "LEVELS",
    "VERDICTS_OFF",
    "Compiled",
    "Hyper",
    "Match",
    "OptionalTensor",
    "Rewrite",
    "RewriteReport",
    "Rule",
    "SaturationLimits",
    "SaturationReport",
    "VerdictStore",
    "apply_match",
    "apply_rules",
    "check_rule",
    "check_rule_in_context",
    "check_rules",
    "hyper",
    "matches",
    "optional",
    "rewrite",
    "rewrite_report",
    "saturate",
    "saturate_report",
]
