"""Tensors of the kinds ``ir.strategies.values.tensors`` draws, drawn from a seeded
``random.Random`` instead of by hypothesis: purefx's own draws, the same on every hypothesis
version.

``check_rule`` draws its examples here (``transforms.rewrite.rule_check``), so a rule's verdict
depends on the rule, the checker and torch, not on which hypothesis is installed: hypothesis's
derandomized stream changes from release to release, this one does not (``random.Random``
seeded by a string hashes it with SHA-512 and its generator is fixed across Python 3 releases;
a ``torch.Generator``'s stream belongs to torch, whose version keys a verdict anyway).

The kinds are ``tensors``': per element an ordinary value (``ORDINARY`` or a float in [-4, 4]),
an IEEE edge value (``edges``, as the assumptions admit) or an ``extra`` value, each branch as
often as the others; a quarter of the small tensors made of a palette of up to ``PALETTE``
values; a tensor larger than ``WHOLE`` elements a seeded fill with up to ``OVERRIDES`` drawn
positions; each of ``LAYOUTS``. Nothing shrinks here: a counterexample found is what it is.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import torch

from ir.strategies.values import (
    LAYOUTS,
    ORDINARY,
    OVERRIDES,
    PALETTE,
    SMALL_INTS,
    WHOLE,
    check_assumes,
    edges,
    in_layout,
    int_edges,
)


def seeded_element(rng: random.Random, dtype: torch.dtype, *,
                   assumes: frozenset[str] = frozenset(),
                   extra: Sequence[float | int] = ()) -> float | int | bool:
    """One element of a tensor of ``dtype``, of the kinds ``values.elements`` draws: a bool for
    bool; for an integer dtype a small int, one in [-100, 100], an edge (``int_edges``) or an
    ``extra`` value; for a floating dtype an ordinary value, an edge that ``assumes`` admits
    or an ``extra`` value. Each branch is taken as often as each other. Consumes a bounded
    number of ``rng`` draws. O(1)."""
    if dtype == torch.bool:
        return rng.random() < 0.5
    branches = 3 if extra else 2
    if not (dtype.is_floating_point or dtype.is_complex):
        pick = rng.randrange(branches + 1)
        if pick == 0:
            return rng.choice(SMALL_INTS)
        if pick == 1:
            return rng.randint(-100, 100)
        if pick == 2:
            return rng.choice(int_edges(dtype))
        return rng.choice(tuple(extra))
    pick = rng.randrange(branches)
    if pick == 1:
        real = dtype if dtype.is_floating_point else torch.float32
        return rng.choice(edges(real, assumes=assumes))
    if pick == 2:
        return rng.choice(tuple(extra))
    v = rng.choice(ORDINARY) if rng.random() < 0.5 else rng.uniform(-4.0, 4.0)
    return 0.0 if v == 0 else v


def seeded_tensor(rng: random.Random, shape: Sequence[int], dtype: torch.dtype, *,
                  assumes: frozenset[str] = frozenset(), layout: str | None = None,
                  extra: Sequence[float | int] = ()) -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype`` drawn from ``rng`` as ``values.tensors`` draws one
    (module docstring), laid out per ``layout`` (one of ``LAYOUTS``; ``None``: drawn). The same
    ``rng`` state gives the same tensor, on every hypothesis version. Raises ``ValueError``
    naming ``assumes`` or ``layout`` when either is unknown. O(elements)."""
    assumes = check_assumes(assumes)
    shape = tuple(int(s) for s in shape)
    if layout is None:
        layout = rng.choice(LAYOUTS)
    elif layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return in_layout(lambda values_shape: _values(rng, values_shape, dtype, assumes,
                                                  tuple(extra)), shape, layout)


def _values(rng: random.Random, shape: tuple[int, ...], dtype: torch.dtype,
            assumes: frozenset[str], extra: tuple) -> torch.Tensor:
    n = math.prod(shape)

    def one() -> Any:
        return seeded_element(rng, dtype, assumes=assumes, extra=extra)

    wide = torch.float64 if (dtype.is_floating_point or dtype.is_complex) else torch.int64
    if dtype == torch.bool:
        wide = torch.bool
    if n <= WHOLE:
        if rng.randrange(4) == 3:
            palette = [one() for _ in range(rng.randint(1, PALETTE))]
            drawn = [rng.choice(palette) for _ in range(n)]
        else:
            drawn = [one() for _ in range(n)]
        return torch.tensor(drawn, dtype=wide).reshape(shape).to(dtype)
    gen = torch.Generator().manual_seed(rng.randrange(2**16))
    if rng.random() < 0.5:
        flat = torch.full((n,), one(), dtype=wide)
    elif wide == torch.float64:
        flat = torch.randn(n, generator=gen, dtype=torch.float64)
    elif wide == torch.bool:
        flat = torch.randint(0, 2, (n,), generator=gen).bool()
    else:
        flat = torch.randint(-3, 4, (n,), generator=gen)
    for _ in range(rng.randint(0, OVERRIDES)):
        j = rng.randrange(n)
        flat[j] = one()
    return flat.reshape(shape).to(dtype)


__all__ = ["seeded_element", "seeded_tensor"]
