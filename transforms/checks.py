"""Argument checks shared by the passes: one error class (``PassError``) and one message each."""

from __future__ import annotations

from ir.errors import PassError
from ir.program import Program

__all__ = ["require_flat", "require_program"]


def require_program(value: object, where: str) -> None:
    """Raise ``PassError`` naming what ``where`` got instead of a Program, and what to call
    first (``import_ep``). O(1)."""
    if isinstance(value, Program):
        return
    kind = type(value)
    got = "None" if value is None else f"{kind.__module__}.{kind.__qualname__}"
    raise PassError(
        f"{where} takes a purefx Program, got {got}; make one with "
        "ir.import_ep(torch.export.export(model, args)) first"
    )


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
