"""``ir.strategies.seeded_values``: ``check_rule``'s examples, purefx's own seeded draws of the
kinds ``ir.strategies.values.tensors`` draws (issue 61: a verdict independent of hypothesis)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from ir.strategies.seeded_values import seeded_element, seeded_tensor
from ir.strategies.values import edges, int_edges


def _draws(seed: str, shape, dtype, n: int = 60, **kw) -> list[torch.Tensor]:
    rng = random.Random(seed)
    return [seeded_tensor(rng, shape, dtype, **kw) for _ in range(n)]


def test_the_same_seed_draws_the_same_tensors_and_another_seed_others():
    a, b = _draws("s", (3, 4), torch.float32), _draws("s", (3, 4), torch.float32)
    assert all(x.stride() == y.stride() and torch.equal(x.nan_to_num(), y.nan_to_num())
               and torch.equal(x.isnan(), y.isnan()) for x, y in zip(a, b))
    c = _draws("t", (3, 4), torch.float32)
    assert any(not torch.equal(x.nan_to_num(), y.nan_to_num()) for x, y in zip(a, c))


def test_every_layout_and_every_edge_is_drawn():
    got = _draws("layouts", (3, 4), torch.float16, n=200)
    strides = {t.stride() for t in got}
    assert {(4, 1), (1, 3), (8, 2)} <= strides and any(0 in s for s in strides)
    seen = torch.cat([t.reshape(-1).float() for t in got])
    for e in edges(torch.float16):
        if math.isnan(e):
            assert seen.isnan().any()
        else:
            held = torch.tensor(e, dtype=torch.float16).float()  # the edge as float16 holds it
            hit = (seen == held) & (torch.signbit(seen) == torch.signbit(held))
            assert hit.any(), e
    ints = torch.cat([t.reshape(-1) for t in _draws("ints", (2, 3), torch.int32, n=200)])
    assert all((ints == e).any() for e in int_edges(torch.int32))


@pytest.mark.parametrize(("assumes", "banned"), [
    ({"no_nans"}, lambda t: t.isnan()),
    ({"no_infs"}, lambda t: t.isinf()),
    ({"no_signed_zeros"}, lambda t: (t == 0) & torch.signbit(t)),
])
def test_assumptions_narrow_what_is_drawn(assumes, banned):
    for t in _draws("assume", (4, 5), torch.float32, n=100, assumes=frozenset(assumes)):
        assert not banned(t).any()


def test_large_tensors_extra_values_and_bad_arguments():
    rng = random.Random(0)
    big = [seeded_tensor(rng, (9, 9), torch.float64) for _ in range(20)]
    assert all(t.shape == (9, 9) and t.dtype == torch.float64 for t in big)
    extra = [seeded_element(rng, torch.int8, extra=(-129,)) for _ in range(200)]
    assert -129 in extra and isinstance(seeded_element(rng, torch.bool), bool)
    with pytest.raises(ValueError, match="layout"):
        seeded_tensor(rng, (2,), torch.float32, layout="diagonal")
    with pytest.raises(ValueError, match="assumes"):
        seeded_tensor(rng, (2,), torch.float32, assumes=frozenset({"no_zeros"}))
