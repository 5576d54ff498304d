"""The law harness (``ir.harness``) and the value strategies (``ir.strategies.values``): the
comparison sees every difference, runs never write the caller's tensors, and the strategies
reach the edges (``hypothesis.find``: each property is found within the default budget)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from ir.errors import first_line
from ir.harness import (
    TOLERANCE,
    ShrinkBudget,
    fresh,
    outcome,
    same_bits,
    seeded,
    tolerance,
    value_difference,
)
from ir.strategies.values import (
    LAYOUTS,
    edges,
    elements,
    laid_out,
    overflow_points,
    scalar_values,
    size_variants,
    sizes,
    tensors,
)

T = torch.tensor
FIND = settings(max_examples=2000, database=None, derandomize=True)
REACH = settings(max_examples=500, database=None, derandomize=True, phases=[Phase.generate])
"""Reaching only (no shrinking): is some draw within 500 such?"""


# --- value_difference ---------------------------------------------------------------------------


@pytest.mark.parametrize("x", [
    T([0.0, -0.0, math.nan, math.inf, -math.inf, 1.5]),
    T([1, 2, 3]),
    T([True, False]),
    (T([1.0]), [2, {"a": -0.0}]),
    math.nan,
    -0.0,
])
def test_a_value_equals_itself_nans_included(x):
    assert value_difference(x, x) is None


@pytest.mark.parametrize("got, want, says", [
    (T([0.0]), T([-0.0]), "got 0.0, want -0.0"),
    (T([1.0, 0.0]), T([1.0, math.nan]), "got 0.0, want nan"),
    (T([math.nan]), T([1.0]), "got nan, want 1.0"),
    (T([math.inf]), T([3.4e38]), "got inf"),
    (T([math.inf]), T([-math.inf]), "got inf, want -inf"),
    (T([1.001]), T([1.0]), "1 of 1 positions"),
    (T([1, 2]), T([1, 3]), "flat index 1"),
    (T([1.0], dtype=torch.float64), T([1.0]), "dtype"),
    (T([1.0, 2.0]), T([1.0]), "shape"),
    (0.0, -0.0, "0.0, want -0.0"),
    (1, 1.0, "want 1.0"),
    ((T([1.0]), T([2.0])), (T([1.0]), T([3.0])), "result [1]"),
    ({"k": T([1.0])}, {"k": T([2.0])}, "result ['k']"),
])
def test_every_difference_is_seen_and_named(got, want, says):
    found = value_difference(got, want)
    assert found is not None and says in found


def test_tolerance_is_the_results_dtype_never_widened():
    x = torch.tensor([0.857594907283783])  # float32; through float16 it moves by 2e-4
    assert value_difference(x.half().float(), x) is not None
    assert value_difference(x.half(), x.half()) is None
    assert tolerance(torch.float16) == TOLERANCE[torch.float16]
    assert tolerance(torch.int64) == (0.0, 0.0)
    r, _ = tolerance(torch.float32)
    assert value_difference(T([1.0 + 0.5 * r]), T([1.0])) is None
    assert value_difference(T([1.0 + 3 * r]), T([1.0])) is not None


def test_assumptions_relax_the_comparison_as_fast_math_flags_do():
    assert value_difference(T([0.0]), T([math.nan]), assumes={"no_nans"}) is None
    assert value_difference(T([math.nan]), T([0.0]), assumes={"no_nans"}) is not None
    assert value_difference(T([0.0]), T([math.inf]), assumes={"no_infs"}) is None
    assert value_difference(T([0.0]), T([-0.0]), assumes={"no_signed_zeros"}) is None
    r, _ = tolerance(torch.float32)
    assert value_difference(T([1.0 + 3 * r]), T([1.0]), assumes={"reassociate"}) is None


def test_strides_compared_only_when_asked_and_only_where_they_mean_something():
    a = torch.zeros(3, 4)
    assert value_difference(a.t().contiguous(), a.t()) is None
    assert "strides" in value_difference(a.t().contiguous(), a.t(), strides=True)
    one = torch.zeros(1, 4)
    assert value_difference(one.t(), one.t().contiguous(), strides=True) is None


def test_same_bits():
    assert same_bits(T([math.nan, 1.0]), T([math.nan, 1.0]))
    assert not same_bits(T([0.0]), T([-0.0]))
    assert not same_bits(T([1.0]), T([1.0], dtype=torch.float64))
    assert same_bits(torch.zeros(3, 4).t(), torch.zeros(4, 3))  # by value, not layout
    assert same_bits((1, [0.5]), (1, [0.5])) and not same_bits(0.0, -0.0)


# --- outcome ------------------------------------------------------------------------------------


def test_outcome_runs_on_copies_with_a_seeded_rng():
    x = torch.ones(3)
    out = outcome(lambda t: t.add_(1), x)
    assert out.ok and torch.equal(x, torch.ones(3)) and torch.equal(out.args[0], 2 * x)
    a = outcome(lambda t: torch.rand_like(t), x, seed=3)
    b = outcome(lambda t: torch.rand_like(t), x, seed=3)
    assert same_bits(a.results, b.results)
    bad = outcome(lambda t: t @ t.reshape(1, 3), x)
    assert bad.error[0] == "RuntimeError" and "\n" not in bad.error[1]


@settings(max_examples=200, database=None, derandomize=True)
@given(st.text(), st.integers(0, 400))
def test_first_line_is_one_line_within_the_limit(message, limit):
    got = first_line(ValueError(message), limit)
    assert "\n" not in got and "\r" not in got and len(got) <= limit
    one = message.strip()
    if one and one.splitlines() == [one] and len(one) <= limit:
        assert got == one
    assert first_line(ValueError(f"  \n{message}\nsecond"), limit) == first_line(
        ValueError(f"{message.lstrip()}\nsecond"), limit)


def test_first_line_examples():
    assert first_line(ValueError("\n  bad input\n  detail\n")) == "bad input"
    assert first_line(ValueError("")) == "" and first_line(None) == ""
    assert first_line(ValueError("x" * 500)) == "x" * 296 + " ..."  # one word: no boundary
    assert first_line(ValueError("ab " * 200)) == "ab " * 98 + "ab ..."  # between words

def test_fresh_keeps_layouts():
    for layout in LAYOUTS:
        t = laid_out(torch.ones(3, 4), layout) if layout != "expanded" else \
            torch.ones(3, 1).expand(3, 4)
        c = fresh(t)
        assert c.stride() == t.stride() and torch.equal(c, t)
        assert c.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()


def test_shrink_budget_stops_hypothesis_with_the_latest_failure():
    budget = ShrinkBudget(0.0, AssertionError)
    calls = []

    @settings(max_examples=200, database=None, derandomize=True)
    @given(st.integers(0, 10**6))
    def law(x):
        calls.append(x)
        budget.run(x, lambda: _assert_small(x))

    with pytest.raises(AssertionError) as info:
        budget.guard(law)
    assert str(info.value) == f"{budget.latest}" and len(calls) < 200


def _assert_small(x):
    assert x < 1000, f"{x} too big"


# --- strategies ---------------------------------------------------------------------------------


def _has(pred):
    return lambda t: bool(pred(t.double()).any())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_tensors_reach_the_ieee_edges(dtype):
    shape = (3, 4)
    exp_at = overflow_points(dtype)["exp"]
    for pred in (
        lambda t: (t == 0) & torch.signbit(t),
        torch.isnan,
        torch.isinf,
        lambda t: (t.abs() > exp_at) & torch.isfinite(t),
        lambda t: (t != 0) & (t.abs() < torch.finfo(dtype).smallest_normal),
        lambda t: t.abs() == torch.finfo(dtype).max,
    ):
        find(tensors(shape, dtype), _has(pred), settings=REACH)


def test_assumptions_narrow_the_draws():
    e = edges(torch.float32, assumes={"no_nans", "no_infs", "no_signed_zeros"})
    assert all(math.isfinite(v) and abs(v) < 88 for v in e)
    assert not any(v == 0 and math.copysign(1, v) < 0 for v in e)

    @settings(max_examples=300, database=None, derandomize=True)
    def never(v):
        assert math.isfinite(v) and not (v == 0 and math.copysign(1, v) < 0)
        assert abs(v) < overflow_points(torch.float32)["exp"]

    given(elements(torch.float32, assumes={"no_nans", "no_infs", "no_signed_zeros"}))(never)()


def test_layouts_are_drawn_with_the_same_values():
    find(tensors((3, 4), torch.float32), lambda t: 0 in t.stride(), settings=FIND)
    find(tensors((3, 4), torch.float32), lambda t: t.stride() == (1, 3), settings=FIND)
    find(tensors((3, 4), torch.float32), lambda t: t.stride() == (8, 2), settings=FIND)
    x = torch.arange(12.0).reshape(3, 4)
    for layout in ("contiguous", "transposed", "strided"):
        assert torch.equal(laid_out(x, layout), x)
    assert laid_out(torch.ones(3, 4), "expanded").stride()[0] == 0
    with pytest.raises(ValueError):
        laid_out(x, "expanded")


def test_sizes_reach_one_and_equal_to_another_dim():
    shapes = [(2, 5), (1,)]
    assert find(sizes(shapes), lambda s: s[1] == (5,), settings=FIND) == ((2, 5), (5,))
    find(sizes(shapes), lambda s: s[0][0] == 1, settings=FIND)
    variants = size_variants(shapes)
    assert ((2, 5), (5,)) in variants and ((1, 5), (1,)) in variants
    assert tuple(map(tuple, shapes)) not in variants


def test_scalars_cover_each_kind_and_shrink_to_the_example():
    pool = scalar_values("float", example=0.5)
    assert pool[0] == 0.5 and {2.0, 0.1, -1.5, 1e4, 0.0} <= set(pool)
    assert any(v == 0 and math.copysign(1, v) < 0 for v in pool)
    assert -0.0 not in [v for v in scalar_values("float", assumes={"no_signed_zeros"})
                        if math.copysign(1, v) < 0]
    assert find(st.sampled_from(pool), lambda v: True) == 0.5


def test_unknown_assumptions_and_layouts_are_refused():
    with pytest.raises(ValueError):
        elements(torch.float32, assumes={"fast"})
    with pytest.raises(ValueError):
        laid_out(torch.ones(2), "diagonal")


def test_reassociate_judges_against_the_float64_reference():
    want = torch.tensor([0.48828125], dtype=torch.bfloat16)  # rounded far from the truth
    got = torch.tensor([0.376953125], dtype=torch.bfloat16)
    ref = torch.tensor([0.38], dtype=torch.float64)
    assert value_difference(got, want) is not None
    assert value_difference(got, want, reference=ref) is not None  # only under reassociate
    assert value_difference(got, want, assumes={"reassociate"}, reference=ref) is None
    far = torch.tensor([-2.0], dtype=torch.bfloat16)
    assert value_difference(far, want, assumes={"reassociate"}, reference=ref) is not None


def test_seeded_draws_alike_and_leaves_the_callers_random_state_as_it_was():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    with seeded(7):
        first = torch.rand(4)
    assert torch.equal(torch.random.get_rng_state(), before)
    with seeded(7):
        second = torch.rand(4)
    with seeded(8):
        other = torch.rand(4)
    assert torch.equal(first, second) and not torch.equal(first, other)
    after = torch.rand(4)  # the caller's stream goes on as if nothing had drawn
    assert torch.equal(after, torch.rand(4, generator=torch.Generator().manual_seed(123)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the accelerator-free path")
def test_seeded_seeds_the_cpu_generator_alone_without_an_accelerator(monkeypatch):
    def no_global_seed(seed):
        raise AssertionError("torch.manual_seed records a stack per lazy accelerator")

    monkeypatch.setattr(torch, "manual_seed", no_global_seed)
    with seeded(3):
        drawn = torch.rand(2)
    assert torch.equal(drawn, torch.rand(2, generator=torch.Generator().manual_seed(3)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                   torch.complex64])
def test_the_same_bits_never_differ_and_other_bits_are_compared_in_full(dtype):
    # equal bits end the comparison at once (``_same_bits``); anything else is judged position
    # by position, so a zero of the other sign, a NaN for a number, an ulp are still seen
    x = T([0.0, -0.0, math.inf, -math.inf, math.nan, 1.5, -2.25]).to(dtype)
    same = x.clone().t() if x.dim() > 1 else x.clone()
    for kwargs in ({}, {"atol": 0.0, "rtol": 0.0}, {"atol": 1e-3, "rtol": 1e-3}):
        assert value_difference(same, x, **kwargs) is None
        assert value_difference(x[::2], x.clone()[::2], **kwargs) is None  # strided views
    signed = x.clone()
    signed[0] = -0.0
    assert value_difference(signed, x) is not None
    numbered = x.clone()
    numbered[4] = 1.0
    assert value_difference(numbered, x, atol=1e-3, rtol=1e-3) is not None
    if not dtype.is_complex:
        near = x.clone()
        ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
        near.view(ints)[5] += 1  # the next number after 1.5 in the dtype
        assert value_difference(near, x) is None  # other bits, within the dtype's tolerance
        assert value_difference(near, x, atol=0.0, rtol=0.0) is not None
        negated = torch._neg_view(-x)  # a lazily negated view of the same numbers
        assert value_difference(negated, x) is None
