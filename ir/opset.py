"""The verified operator table (issue 51): what each aten overload writes, aliases, draws.

PLACEHOLDER on branch h/gens: the agreed API shape (``/work/wt/_spec/opset_format.md``) with a
small hand-written table, so the opset generators can be written and tested before the real
module (branch h/opset) lands; a merge of h/opset replaces this file and ``ir/opset_table.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs
import torch


@attrs.frozen
class TensorSpec:
    """How to make one real tensor argument."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    stride: tuple[int, ...] | None = None
    low: float = -3.0
    high: float = 3.0
    values: tuple | None = None


@attrs.frozen
class Sample:
    """One valid call of the operator (schema order, keywords made positional)."""

    args: tuple
    kwargs: tuple[tuple[str, Any], ...] = ()


@attrs.frozen
class Write:
    """Schema position ``arg`` is written in place when every ``(position, value)`` holds."""

    arg: int
    when: tuple[tuple[int, Any], ...] = ()


@attrs.frozen
class OpEntry:
    """The checked facts of one ``OpOverload``."""

    name: str
    writes: tuple[Write, ...] = ()
    aliases: tuple[tuple[int, int], ...] = ()
    random: bool = False
    effectful: bool = False
    state_outputs: tuple[tuple[int, int], ...] = ()
    hidden: str = ""
    levels: frozenset[str] = frozenset()
    samples: tuple[Sample, ...] = ()
    source: str = ""

    @property
    def pure(self) -> bool:
        return not (self.writes or self.random or self.effectful)


@functools.cache
def table() -> Mapping[str, OpEntry]:
    """Every row by name (immutable, built once)."""
    from ir.opset_table import ROWS

    return MappingProxyType({e.name: e for e in ROWS})


def entry(target: Any) -> OpEntry | None:
    """The row of ``target`` (an ``OpOverload``), None when it has none."""
    return table().get(str(target))


def written_at(e: OpEntry, args: tuple) -> tuple[int, ...]:
    """Schema positions ``e`` writes for these normalized argument values."""
    out = []
    for w in e.writes:
        if all(i >= len(args) or not isinstance(args[i], (bool, int, float, str))
               or args[i] == v for i, v in w.when):
            out.append(w.arg)
    return tuple(out)


def _real(spec: TensorSpec, gen: torch.Generator, device: Any) -> torch.Tensor:
    if spec.values is not None:
        t = torch.tensor(spec.values, dtype=spec.dtype).reshape(spec.shape)
    elif spec.dtype == torch.bool:
        t = torch.randint(0, 2, spec.shape, generator=gen).bool()
    elif spec.dtype.is_floating_point or spec.dtype.is_complex:
        t = (torch.rand(spec.shape, generator=gen) * (spec.high - spec.low) + spec.low).to(spec.dtype)
    else:
        t = torch.randint(int(spec.low), max(int(spec.high), int(spec.low) + 1), spec.shape,
                          generator=gen).to(spec.dtype)
    if spec.stride is not None:
        t = torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype).copy_(t)
    return t.to(device)


def sample_args(sample: Sample, *, seed: int = 0, device: Any = "cpu") -> tuple[tuple, dict]:
    """Fresh real tensors for ``sample``: ``(args, kwargs)``."""
    gen = torch.Generator().manual_seed(seed)

    def make(a: Any) -> Any:
        if isinstance(a, TensorSpec):
            return _real(a, gen, device)
        if isinstance(a, tuple) and a and all(isinstance(x, TensorSpec) for x in a):
            return [make(x) for x in a]
        return a

    return tuple(make(a) for a in sample.args), {k: make(v) for k, v in sample.kwargs}
