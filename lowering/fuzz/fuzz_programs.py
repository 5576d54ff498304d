"""The programs the fuzzer draws by default.

One strategy, named here so that switching the fuzzer's vocabulary is a one-line change:
``ir.strategies.programs.programs`` with every deterministic feature: its fixed vocabulary
(30-odd operators) and its ``opset`` steps, which call the rows of the verified operator table
(``ir.opset.table()``);
random operators are left out, since a compiler may draw other numbers than eager
(``lowering.fuzz.known.RANDOM_NUMBERS`` explains such a difference when a caller's strategy has
them).
"""

from __future__ import annotations

from hypothesis import strategies as st

from ir.program import Program
from ir.strategies.programs import DETERMINISTIC_FEATURES, programs


def default_programs(symbolic: bool = False) -> st.SearchStrategy[Program]:
    """The default strategy of :func:`lowering.fuzz.differential`: flat Programs of
    ``ir.strategies.programs.programs`` over every deterministic feature (the verified
    operator table's steps, ``opset``, among them), at most 3 modules below the root, 8 steps
    per body and about 60 nodes: big enough that the rarer steps (``mean(..., keepdim=True)``
    of ``near_duplicates``) come about once in five programs, small enough for a CPU inductor
    compile of seconds. ``symbolic``: every program has a dynamic dimension (the feature
    ``symbolic_sizes`` always on: a symbolic batch with a range), what
    ``differential(..., sizes=k)`` calls at other sizes. Shrinks as that strategy does (fewer
    features, modules and ops; the symbolic batch stays). O(1)."""
    return programs(features=DETERMINISTIC_FEATURES, max_modules=3, max_ops=8, max_nodes=60,
                    always={"symbolic_sizes"} if symbolic else frozenset())


__all__ = ["default_programs"]
