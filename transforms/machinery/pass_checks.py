"""Argument checks shared by the passes: one error class (``PassError``) and one message each."""

from __future__ import annotations

from ir.errors import PassError
from ir.program import Program
from ir.program import require_program as check_program

__all__ = ["require_flat", "require_program"]


def require_program(value: object, where: str) -> None:
    """Raise ``ir.errors.NotAProgramError`` (a ``PassError``) naming what ``where`` got instead
    of a Program, and what to call first (``import_ep``): ``ir.program.require_program``. O(1)."""
    check_program(value, where)


def require_flat(program: Program, where: str) -> None:
    """Raise ``PassError`` when ``program`` is outlined (``Program.is_outlined``): pass
    ``where`` runs on the flat root graph, before ``outline``. The message names the pass and
    what to run first (``inline``, or this pass before ``outline``). O(1) after the Program's
    first kind check (a memo)."""
    require_program(program, where)
    if program.is_outlined:
        raise PassError(
            f"{where} runs on a flat program (before outline), but this one is outlined: its "
            f"root graph calls modules; run {where} before outline, or run inline first"
        )
