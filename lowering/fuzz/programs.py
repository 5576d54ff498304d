"""The programs the fuzzer draws by default.

One strategy, named here so that switching the fuzzer's vocabulary is a one-line change:
today ``ir.strategies.programs.programs`` (30-odd operators, every deterministic feature);
random operators are left out, since a compiler may draw other numbers than eager
(``lowering.fuzz.known.RANDOM_NUMBERS`` explains such a difference when a caller's strategy has
them).
"""

from __future__ import annotations

from hypothesis import strategies as st

from ir.program import Program
from ir.strategies.programs import DETERMINISTIC_FEATURES, programs


def default_programs() -> st.SearchStrategy[Program]:
    """The default strategy of :func:`lowering.fuzz.differential`: flat Programs of
    ``ir.strategies.programs.programs`` over every deterministic feature, up to 8 steps per
    module body. Shrinks as that strategy does (fewer features, modules and ops). O(1)."""
    return programs(features=DETERMINISTIC_FEATURES, max_ops=8)


__all__ = ["default_programs"]
