"""One row of the verified operator table (``ir.opset``), as values: ``OpEntry`` (the facts of
one ``OpOverload``), its ``Write`` s and its ``Sample`` s (real calls, their tensor arguments
described by ``TensorSpec``), and the two levels a row is seen at (``TRAINING``, ``CORE``).

The generated table (``ir/opset_table.py``) is built of these and nothing else, so it imports
this module, not ``ir.opset``, which reads the table (``ir.opset.table()``): the data and the
code that reads it import no cycle.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

__all__ = ["CORE", "TRAINING", "OpEntry", "Sample", "TensorSpec", "Write"]

TRAINING = "training"  #: ``OpEntry.levels``: seen in ``torch.export.export``'s default IR
CORE = "core"  #: ``OpEntry.levels``: seen after ``run_decompositions()`` (or tagged core)


@attrs.frozen
class TensorSpec:
    """How to make one real tensor argument: its shape, dtype, strides and values."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    stride: tuple[int, ...] | None = None  #: ``None``: contiguous; else these strides
    low: float = -3.0  #: values drawn uniformly in ``[low, high)`` (integers: ``randint``)
    high: float = 3.0
    values: tuple | None = None  #: exact flattened values: overrides ``low``/``high``


@attrs.frozen
class Sample:
    """One valid call of an operator: ``args`` in schema order (keywords made positional):
    ``TensorSpec``, tuples of them (``Tensor[]``), ``None``, bool, int, float, str, dtype,
    device, layout, memory format; ``kwargs`` only for keyword-only arguments that must stay
    keywords."""

    args: tuple
    kwargs: tuple[tuple[str, Any], ...] = ()


@attrs.frozen
class Write:
    """The operator writes argument ``arg`` (schema position) in place when every
    ``(position, value)`` pair of ``when`` holds (``()``: always).
    ``aten.batch_norm.default``: ``Write(3, ((5, True),))``."""

    arg: int
    when: tuple[tuple[int, Any], ...] = ()


@attrs.frozen
class OpEntry:
    """The verified facts of one ``OpOverload`` (see the module docstring)."""

    name: str  #: ``str(overload)``: ``"aten.batch_norm.default"``
    writes: tuple[Write, ...] = ()
    aliases: tuple[tuple[int, int], ...] = ()
    """``(result index, argument position)``: that result may share storage with that
    argument (a ``Tensor[]`` result or argument counts as one index)."""
    random: bool = False
    effectful: bool = False
    state_outputs: tuple[tuple[int, int], ...] = ()
    """``(result index, argument position)``: the result is the new value of that argument."""
    hidden: str = ""  #: ``""`` when the schema states every fact; else what it hides, in words
    levels: frozenset[str] = frozenset()  #: ``TRAINING`` and/or ``CORE``
    samples: tuple[Sample, ...] = ()
    source: str = ""  #: ``"opinfo:<name>"``, ``"model:<case>"``, ``"own"``

    @property
    def pure(self) -> bool:
        """Writes nothing (under any argument values), draws nothing, has no effect."""
        return not (self.writes or self.random or self.effectful)
