"""Pausing Python's cyclic garbage collector while a pass builds many small objects.

Building a Program or a module tree allocates objects by the hundred thousand, none of them
garbage yet; each automatic collection would scan the whole heap (fake tensors included), making
a linear pass quadratic in practice. Reference counting still frees everything as usual.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)


def gc_paused(fn: F) -> F:
    """Decorate ``fn`` to run with the cyclic collector paused (restored afterwards)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()

    return wrapper  # type: ignore[return-value]
