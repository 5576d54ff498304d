"""Scalars as Python source: the one writer of the literals purefx puts into generated files.

Two generators write Python that is later run: ``ir.opset_build`` (the data module
``ir/opset_table.py``) and ``lowering.fuzz.repro`` (standalone repro scripts). Both spell their
containers and their own records themselves and the scalars here, so that a float, a dtype or a
device reads the same in both and survives the round trip. The text of a non-finite float names
``inf`` and ``nan``: a generated file defines them once, as :data:`PRELUDE` does.
"""

from __future__ import annotations

import math
from typing import Any

import torch

PRELUDE = "inf, nan = float('inf'), float('nan')"
"""The line a generated file runs before any literal of :func:`scalar_literal`: it defines the
names ``inf`` and ``nan`` the non-finite floats are written with."""


def scalar_literal(value: Any) -> str | None:
    """The Python source of the scalar ``value``, or ``None`` when it is not one of these:
    ``None``, ``bool``, ``int``, ``str``, ``float`` (``inf``, ``-inf``, ``nan``; ``-0.0`` keeps
    its sign), ``complex`` (``complex(re, im)``), ``torch.dtype`` (``torch.float32``),
    ``torch.device`` (``torch.device('cuda:0')``), ``torch.layout`` and
    ``torch.memory_format`` (``torch.strided``, ``torch.channels_last``).

    A ``float`` or ``int`` subclass (``numpy.float64``) is written as the plain value.

    Laws: ``eval(scalar_literal(v), {"torch": torch, "inf": inf, "nan": nan})`` equals ``v``
    (``nan`` gives a ``nan``; ``-0.0`` gives ``-0.0``) and has ``v``'s type for the builtins.
    Complexity: O(len(text)).
    """
    if value is None or isinstance(value, (bool, str)):
        return repr(value)
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):
        return _float(float(value))
    if isinstance(value, complex):
        return f"complex({_float(value.real)}, {_float(value.imag)})"
    if isinstance(value, torch.device):
        return f"torch.device({str(value)!r})"
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        return str(value)
    return None


def _float(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(x)


__all__ = ["PRELUDE", "scalar_literal"]
