"""The law harness: how the laws (``lowering.pass_laws.check_laws``, ``check_rule``,
``check_rule_in_context``) run two sides and compare what they give.

- ``ir.harness.tolerance``: the tolerance table, keyed by the dtype a result is computed in;
- ``ir.harness.compare``: ``value_difference`` (every difference, position by position;
  ``SIGNLESS_ZEROS``: the assumptions that make -0.0 equal +0.0; ``FINITE_TOLERANCE`` and
  ``judged_positions``: a user's tolerance speaks of finite values, and what it leaves unjudged),
  ``regrouped_difference`` (a law's verdict under ``reassociate``: against a float64
  reference, with the magnitude of the terms summed: ``with_terms``) and ``same_bits``;
- ``ir.harness.observe``: what a law observes of a run (``Observed``: outputs, inputs, state,
  aliasing), the law as a value (``Law``) and the one comparison of two runs
  (``observed_difference``, a structured ``Difference``), shared by the three laws, and the
  one run-time aliasing question (``shares_storage``);
- ``ir.harness.runner``: the law runner every law loop goes through: ``run_side`` (one side
  run and observed, its values copied) and ``judge`` (two runs compared under a ``Law``,
  regrouped under ``reassociate``);
- ``ir.harness.loop``: the law loop every law that draws goes through: a ``Trial`` (the law,
  what is drawn, what runs on each draw, its key, a shrink budget) run by ``hold`` under
  ``law_settings`` (the hypothesis settings policy);
- ``ir.harness.run``: ``outcome``, one run on copies of the arguments with a seeded random (``seeded``)
  state; ``widen``, floating tensors made float64 (what a reference runs on).

What the laws draw lives beside the other strategies, in ``ir.strategies.values``.
"""

from ir.harness.compare import (
    FINITE_TOLERANCE,
    SIGNLESS_ZEROS,
    Difference,
    Judged,
    Regrouped,
    find_difference,
    judged_positions,
    regrouped_difference,
    same_bits,
    same_layout,
    signless_zeros,
    value_difference,
    with_terms,
)
from ir.harness.loop import Trial, digest, hold, law_settings
from ir.harness.observe import (
    MISSING,
    OBSERVABLES,
    Law,
    Observed,
    observe,
    observed_difference,
    shares_storage,
)
from ir.harness.run import (
    Outcome,
    OutOfTime,
    ShrinkBudget,
    ShrinkLimit,
    fresh,
    outcome,
    seeded,
    widen,
)
from ir.harness.runner import Ran, judge, regrouped, run_side, state_value
from ir.harness.tolerance import REASSOCIATE, TOLERANCE, tolerance

__all__ = [
    "FINITE_TOLERANCE",
    "MISSING",
    "OBSERVABLES",
    "REASSOCIATE",
    "SIGNLESS_ZEROS",
    "TOLERANCE",
    "Difference",
    "Judged",
    "Law",
    "Observed",
    "OutOfTime",
    "Outcome",
    "Ran",
    "Regrouped",
    "ShrinkBudget",
    "ShrinkLimit",
    "Trial",
    "digest",
    "find_difference",
    "fresh",
    "hold",
    "judge",
    "judged_positions",
    "law_settings",
    "observe",
    "observed_difference",
    "outcome",
    "regrouped",
    "regrouped_difference",
    "run_side",
    "same_bits",
    "same_layout",
    "seeded",
    "shares_storage",
    "signless_zeros",
    "state_value",
    "tolerance",
    "value_difference",
    "widen",
    "with_terms",
]
