"""How close two floating results must be to count as equal: one table, keyed by the dtype a
result is computed in.

A result's tolerance comes from its own dtype only, never from its inputs' (a float32 result
of a program that reads float16 values is held to float32's tolerance): a rule that rounds a
float32 value through float16 is wrong however its inputs were typed.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch

TOLERANCE: Mapping[torch.dtype, tuple[float, float]] = MappingProxyType({
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (2e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
    torch.complex128: (1e-7, 1e-7),
    torch.complex64: (1e-4, 1e-5),
    torch.complex32: (2e-2, 1e-2),
})
"""``(rtol, atol)`` per floating dtype: finite values ``got`` and ``want`` are equal when
``|got - want| <= atol + rtol * |want|``. Every other dtype (ints, bools) compares exactly."""

REASSOCIATE = 8.0
"""Under the ``reassociate`` assumption (sums and products regrouped), the tolerance is this
many times the dtype's: regrouping rounds in other places, each within the dtype's epsilon."""


def tolerance(dtype: torch.dtype, *, reassociate: bool = False) -> tuple[float, float]:
    """``(rtol, atol)`` for a result computed in ``dtype``: ``TOLERANCE[dtype]`` for a floating
    or complex dtype, ``(0.0, 0.0)`` (exact) for any other; scaled by ``REASSOCIATE`` when
    ``reassociate``. O(1)."""
    rtol, atol = TOLERANCE.get(dtype, (0.0, 0.0))
    if reassociate:
        return rtol * REASSOCIATE, atol * REASSOCIATE
    return rtol, atol


__all__ = ["REASSOCIATE", "TOLERANCE", "tolerance"]
