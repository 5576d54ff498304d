"""A library of right rewrite rules, varied on purpose, for the rewrite laws' tests.

Each rule is right wherever its pattern runs and its ``where`` holds (ints and bools included:
``check_rule`` draws them), so ``check_rule`` and ``check_rule_in_context`` must accept it. The
kinds: commutative operators, scalar wildcards (a replacement computing on them too), literals,
several results, views (results that are views of an argument, a replacement returning an
argument), dtype casts, integer and bool arithmetic, reductions reading sizes, broadcasting.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from transforms.rewrite import Rule

X = (torch.randn(4, 6),)
XY = (torch.randn(4, 6), torch.randn(4, 6))
IJ = (torch.randint(-3, 4, (4, 6)), torch.randint(-3, 4, (4, 6)))
B = (torch.rand(4, 6) > 0.5,)
M = (torch.randn(3, 4), torch.randn(4, 5))
_SMALL = {"max_examples": 12}


def _floating(*positions: int):
    """A ``where``: the arguments at ``positions`` are floating tensors."""

    def where(match) -> bool:
        vals = [match.val(i) for i in positions]
        return all(v is not None and v.dtype.is_floating_point for v in vals)

    return where


def _not_floating(*positions: int):
    """A ``where``: the arguments at ``positions`` are integer or bool tensors."""

    def where(match) -> bool:
        vals = [match.val(i) for i in positions]
        return all(v is not None and not v.dtype.is_floating_point for v in vals)

    return where


def _no_bool(*positions: int):
    """A ``where``: no argument at ``positions`` is a bool tensor."""

    def where(match) -> bool:
        vals = [match.val(i) for i in positions]
        return all(v is not None and v.dtype != torch.bool for v in vals)

    return where


_not_bool = _no_bool(0)


def _alike(match) -> bool:
    """A ``where``: arguments 0 and 1 have one dtype and one shape."""
    a, b = match.val(0), match.val(1)
    return a is not None and b is not None and a.dtype == b.dtype and a.shape == b.shape


def _one_dtype(match) -> bool:
    """A ``where``: arguments 0 and 1 have one dtype."""
    a, b = match.val(0), match.val(1)
    return a is not None and b is not None and a.dtype == b.dtype


def _chunk2(x):
    a, b = torch.chunk(x, 2, dim=-1)
    return a, b


def _split_half(x):
    a, b = x.split((x.shape[-1] + 1) // 2, dim=-1)
    return a, b


def _relu_and_double(x):
    r = torch.relu(x)
    return r, r * 2


def _relu_and_sum(x):
    r = torch.relu(x)
    return r, r + r


RULES = (
    # elementwise, one argument
    Rule(lambda x: torch.relu(torch.relu(x)), torch.relu, X, name="relu_relu", **_SMALL),
    Rule(lambda x: torch.abs(torch.abs(x)), torch.abs, X, name="abs_abs", **_SMALL),
    Rule(torch.relu, lambda x: torch.clamp(x, min=0), X, name="relu_as_clamp",
         where=_not_bool, **_SMALL),
    Rule(lambda x: torch.sigmoid(x) * x, F.silu, X, name="silu", where=_floating(0), **_SMALL),
    Rule(lambda x: torch.neg(torch.neg(x)), lambda x: x * 1, X, name="neg_neg", **_SMALL),
    # commutative operators and broadcasting (sizes drawn per argument)
    # of one dtype: a float x with an int32 y at INT_MIN is refused (-y wraps before the
    # promotion: x + INT_MIN where x - y is x + 2**31), found on check_rule's seed 1
    Rule(lambda x, y: x - y, lambda x, y: x + torch.neg(y), XY, name="sub_as_add_neg",
         where=_one_dtype, **_SMALL),
    # on floats: -INT_MIN wraps to INT_MIN (minimum(INT_MIN, 0) is INT_MIN, -maximum(INT_MIN, 0)
    # is 0), refused on every stream since the integer edge probes
    Rule(lambda x, y: torch.minimum(x, y), lambda x, y: -torch.maximum(-x, -y), XY,
         name="minimum_as_maximum", where=_floating(0, 1), assumes={"no_signed_zeros"},
         **_SMALL),
    # -(0 * y) is -0.0 where (-0) * y is +0.0 for an int 0 and a float y > 0; of one dtype:
    # an int64 x at INT_MIN with a float y is refused (-x wraps before the promotion)
    Rule(lambda x, y: torch.neg(x * y), lambda x, y: torch.neg(x) * y, XY, name="neg_mul",
         where=lambda m: _not_bool(m) and _one_dtype(m), assumes={"no_signed_zeros"},
         **_SMALL),
    Rule(lambda x, y: x * y + x * y, lambda x, y: (x * y) * 2, XY, name="twice_product",
         where=_not_bool, **_SMALL),
    # scalars: wildcards, a replacement computing on them, literals
    # (x * a) * b overflows to inf where x * (a * b) does not (or inf * 0 is NaN)
    Rule(lambda x, a, b: (x * a) * b, lambda x, a, b: x * (a * b), (*X, 2.0, 3.0),
         name="fold_mul_scalars", where=_floating(0), assumes={"no_infs"}, **_SMALL),
    Rule(lambda x, a: x * a + x * a, lambda x, a: x * (2 * a), (*X, 0.5), name="double_scaled",
         where=_floating(0), **_SMALL),
    Rule(lambda x: x * 0.5, lambda x: x / 2.0, X, name="half_as_div", **_SMALL),
    Rule(lambda x: x * 2, lambda x: x + x, X, name="twice_as_add", where=_not_bool, **_SMALL),
    # several results, views
    Rule(_chunk2, _split_half, X, name="chunk_as_split", **_SMALL),
    Rule(_relu_and_double, _relu_and_sum, X, name="relu_and_double", where=_not_bool,
         **_SMALL),
    Rule(lambda x: x.transpose(0, 1).transpose(0, 1), lambda x: x, X, name="transpose_twice",
         **_SMALL),
    Rule(lambda x: x.t().t(), lambda x: x, X, name="t_t", **_SMALL),
    Rule(lambda x: x.unsqueeze(0).squeeze(0), lambda x: x, X, name="unsqueeze_squeeze",
         **_SMALL),
    # dtype casts
    Rule(lambda x: x.to(torch.float64).to(torch.float32), lambda x: x.to(torch.float32, copy=True), X,
         name="via_float64", **_SMALL),
    # the product in float64 rounded once (an int product would wrap: int64 max * 2 is -2, and
    # 0 * -1 is +0 where 0.0 * -1.0 is -0.0); within float32's tolerance of two roundings
    Rule(lambda i, j: i.float() * j.float(), lambda i, j: (i.double() * j.double()).float(), IJ,
         name="cast_after_product", where=_not_floating(0, 1), **_SMALL),
    # integer and bool arithmetic
    Rule(lambda i, j: (i | j) & i, lambda i, j: i & i, IJ, name="absorption",
         where=_alike, **_SMALL),
    Rule(lambda b: torch.logical_not(torch.logical_not(b)), lambda b: b != 0, B,
         name="not_not", **_SMALL),
    Rule(lambda i, j: torch.logical_and(i, j), lambda i, j: (i != 0) & (j != 0), IJ,
         name="logical_and_as_bitwise", **_SMALL),
    # sizes read in the replacement, reductions, matrices
    # not float16: its sum overflows (65504 + 258.5 is inf) where mean, summing in float32,
    # does not
    Rule(lambda x: x.sum(-1) / x.shape[-1], lambda x: x.mean(-1), X, name="mean_spelled_out",
         where=lambda m: _floating(0)(m) and m.val(0).dtype != torch.float16, **_SMALL),
    Rule(lambda x, y: (x @ y).t(), lambda x, y: y.t() @ x.t(), M, name="transpose_product",
         where=_floating(0, 1), specials=False, **_SMALL),
)
"""The library: every rule right (``check_rule`` and ``check_rule_in_context`` accept it)."""

SAMPLE = ("relu_relu", "sub_as_add_neg", "fold_mul_scalars", "chunk_as_split",
          "cast_after_product", "not_not")
"""The rules the quick CI test runs; the whole library runs under ``@pytest.mark.slow``."""

__all__ = ["RULES", "SAMPLE"]
