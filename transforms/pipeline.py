"""``transform(p, passes)``: compose pure passes, checking the result of each."""

from __future__ import annotations

from typing import Callable, Sequence

from ir.program import Program
from ir.verify import verify

Pass = Callable[[Program], Program]

DEFAULT_PIPELINE: tuple[Pass, ...] = ()


def transform(
    program: Program, passes: Sequence[Pass] | None = None, *, check: bool = False
) -> Program:
    """Apply ``passes`` (default: ``DEFAULT_PIPELINE``) in order and return the final Program.

    Pure: ``program`` is not changed. With ``check=True`` every intermediate Program is verified.
    **Laws:** ``transform(p, []) is p``; ``transform(p, a + b) == transform(transform(p, a), b)``.
    """
    for run in DEFAULT_PIPELINE if passes is None else passes:
        program = run(program)
        if check:
            verify(program)
    return program
