"""The programs the fuzzer draws by default.

One strategy, named here so that switching the fuzzer's vocabulary is a one-line change:
``ir.strategies.programs.programs`` with every deterministic feature: its fixed vocabulary
(30-odd operators) and its ``opset`` steps, which call the rows of the verified operator table
(``ir.opset.table()``);
random operators are left out, since a compiler may draw other numbers than eager
(``lowering.fuzz.known.RANDOM_NUMBERS`` explains such a difference when a caller's strategy has
them). Where a backend reads preserved call signatures (``"unflatten"``), the same programs are
drawn by ``crossing_programs``: every program has preserved calls, repeated calls among them,
with values and state crossing their boundaries.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hypothesis import strategies as st

from ir.program import Program
from ir.strategies.programs import (
    CROSSING_FEATURES,
    DETERMINISTIC_FEATURES,
    crossing_programs,
    programs,
)

CALL_FEATURES = CROSSING_FEATURES | {"repeated_calls"}
"""The features always on where a backend reads preserved calls: preserved calls, repeated
calls, values and state crossing their boundaries."""


def default_programs(backends: Iterable[Any] = (), symbolic: bool = False
                     ) -> st.SearchStrategy[Program]:
    """The default strategy of :func:`lowering.fuzz.differential`: flat Programs of
    ``ir.strategies.programs.programs`` over every deterministic feature (the verified
    operator table's steps, ``opset``, among them), at most 3 modules below the root, 8 steps
    per body and about 60 nodes: big enough that the rarer steps (``mean(..., keepdim=True)``
    of ``near_duplicates``) come about once in five programs, small enough for a CPU inductor
    compile of seconds. Shrinks as that strategy does (fewer features, modules and ops).
    Where one of ``backends`` (``lowering.fuzz.backends.Backend`` values) ``wants_calls``, the
    same limits through ``crossing_programs`` with :data:`CALL_FEATURES` always on (it shrinks
    towards one preserved module called once), kept to programs torch's export can give
    (:func:`whole_paths`). ``symbolic``: every program has a dynamic
    dimension (the feature ``symbolic_sizes`` always on: a symbolic batch with a range), what
    ``differential(..., sizes=k)`` calls at other sizes (the symbolic batch stays while it
    shrinks). O(len(backends))."""
    sizes = {"symbolic_sizes"} if symbolic else set()
    if any(getattr(b, "wants_calls", False) for b in backends):
        # the crossing features now and then leave every module call unsigned (a module that
        # shrank to nothing): such a program has nothing for the backend to read, so it is drawn
        # again
        return crossing_programs(features=DETERMINISTIC_FEATURES, always=CALL_FEATURES | sizes,
                                 max_modules=3, max_ops=8, max_nodes=60
                                 ).filter(_has_calls).filter(whole_paths)
    return programs(features=DETERMINISTIC_FEATURES, max_modules=3, max_ops=8, max_nodes=60,
                    always=frozenset(sizes))


def _has_calls(program: Program) -> bool:
    return any(path != "" for path in program.call_signatures)


def whole_paths(program: Program) -> bool:
    """Whether every call of a module that has a preserved call is preserved (``m0`` and
    ``m0@1`` both, or neither), as ``torch.export.export(...,
    preserve_module_call_signature=...)`` makes them: a program with only some calls of one
    module preserved is one torch's export never gives, so what torch's unflatten does with it
    is no finding. O(calls)."""
    signed = {call.split("@")[0] for call in program.call_signatures if call}
    return all(call in program.call_signatures for call in program.call_order
               if call and call.split("@")[0] in signed)


__all__ = ["CALL_FEATURES", "default_programs", "whole_paths"]
