"""Generated programs as ``transform`` outlines them, for the law tests of passes written with
``transforms.edit`` (tests/test_edit.py, tests/test_passes_doc.py)."""

from __future__ import annotations

from ir.errors import PurefxError
from ir.strategies.programs import programs
from transforms import transform


def outlined_programs():
    """Generated programs as ``transform`` outlines them (the few it refuses are skipped: its
    own law tests report them). Shrinks as ``ir.strategies.programs()`` does."""

    def outlined(p):
        try:
            return transform(p)
        except PurefxError:
            return None

    return programs().map(outlined).filter(lambda p: p is not None)
