"""The seeds the planted-bug tests check each bug under, so that a drop in ``check_laws``'s power
fails a test rather than hiding behind the one stream the suite happens to draw.

``bench.power`` measures every planted bug under seeds 0..19 at 100 examples (the budget a user
gets; its table is in ``docs/testing.md``, "Power"). The tests run each bug under ``SEEDS``, a
fixed sample of those, by default, and under the rest (``NIGHTLY_SEEDS``) with
``@pytest.mark.nightly``: a bug must be caught under every one of them
(``check_laws(..., seed=s)``, found, not shrunk). A bug the generators do not reach yet under a
seed is listed in the test's ``MISSED`` and marked ``xfail(strict=True)`` there: once a
generator reaches it the test says so (XPASS fails), and the entry goes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import pytest

SEEDS = (2, 9, 16)
"""The seeds every planted bug is checked under by default: a sample of ``bench.power``'s."""

NIGHTLY_SEEDS = tuple(s for s in range(20) if s not in SEEDS)
"""The rest of ``bench.power``'s 20 seeds, under ``@pytest.mark.nightly``."""

GENERATOR_REACH = "issue 60: generator reach (h/motifs)"


def seeded(rows: Sequence[tuple], name: Callable[[tuple], str],
           missed: Mapping[Any, Collection[int]] = (), *,
           marks: Callable[[tuple], Sequence[Any]] = lambda row: (),
           default: Collection[int] = SEEDS,
           key: Callable[[tuple], Any] = lambda row: row[0],
           reason: str = GENERATOR_REACH) -> list[Any]:
    """``pytest.param(*row, seed)`` for each row and each of the 20 seeds: those in
    ``default`` (``SEEDS``) run by default, the others are ``nightly``; each with
    ``marks(row)``, and ``xfail(strict=True)`` where ``missed`` lists the seed for the row's
    ``key(row)`` (its pass, ``row[0]``): a collection of seeds (each with ``reason``) or a
    mapping of seed to its own reason. Ids: ``name(row)-seedN``."""
    missed = dict(missed)
    params = []
    for seed in (*default, *(s for s in range(20) if s not in default)):
        for row in rows:
            extra = list(marks(row))
            if seed not in default:
                extra.append(pytest.mark.nightly)
            listed = missed.get(key(row), ())
            if seed in listed:
                why = listed[seed] if isinstance(listed, Mapping) else reason
                extra.append(pytest.mark.xfail(strict=True, reason=why))
            params.append(pytest.param(*row, seed, id=f"{name(row)}-seed{seed}", marks=extra))
    return params


__all__ = ["GENERATOR_REACH", "NIGHTLY_SEEDS", "SEEDS", "seeded"]
