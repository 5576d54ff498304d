"""Held-out rewrite rules, written from outside (issue 36's "wrong rules refused, right rules
accepted"): rules of the kinds researchers write, none of them in ``tests/rule_library.py`` or the
other rule tests, each with its true verdict decided by IEEE reasoning and eager runs.

``WRONG``: rules ``check_rule`` must refuse (exact IEEE semantics, or the assumptions declared are
not enough); the comment says where each breaks. ``RIGHT``: rules it must accept, some exact, some
right only under the assumptions they declare (LLVM's fast-math flags); the comment says why.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from transforms.rewrite import Rule

X = (torch.randn(4, 6),)
XY = (torch.randn(4, 6), torch.randn(4, 6))
IJ = (torch.randint(1, 5, (4, 6), dtype=torch.int32), torch.randint(1, 5, (4, 6), dtype=torch.int32))
H = (torch.randn(4, 6).half(), torch.randn(4, 6).half())

NNI = frozenset({"no_nans", "no_infs"})
FAST = frozenset({"no_nans", "no_infs", "no_signed_zeros"})
ALL = frozenset({"no_nans", "no_infs", "no_signed_zeros", "reassociate"})


def _floating(*positions: int):
    """A ``where``: the arguments at ``positions`` are floating tensors."""

    def where(match) -> bool:
        return all(match.val(i) is not None and match.val(i).dtype.is_floating_point
                   for i in positions)

    return where


def _dtype(dtype: torch.dtype, *positions: int):
    """A ``where``: the arguments at ``positions`` have ``dtype``."""

    def where(match) -> bool:
        return all(match.val(i) is not None and match.val(i).dtype == dtype for i in positions)

    return where


def _int(*positions: int):
    """A ``where``: the arguments at ``positions`` are integer tensors (not bool)."""

    def where(match) -> bool:
        return all(match.val(i) is not None and not match.val(i).dtype.is_floating_point
                   and match.val(i).dtype != torch.bool for i in positions)

    return where


def _exp_ratio(x):
    e = torch.exp(x)
    return e / e.sum(-1, keepdim=True)


WRONG = (
    # 0.0 * x is NaN at +-inf and NaN, and -0.0 at negative x: no_nans/no_infs do not cover the sign
    Rule(lambda x: 0.0 * x, torch.zeros_like, X, name="zero_times", assumes=NNI,
         where=_floating(0)),
    # 0/0 and inf/inf are NaN
    Rule(lambda x: x / x, torch.ones_like, X, name="div_self", where=_floating(0)),
    # sqrt(x * x) is |x|, not x, at negative x
    Rule(lambda x: torch.sqrt(x * x), lambda x: x, X, name="sqrt_square_id",
         where=_floating(0)),
    # x * x overflows past sqrt(max) (inf where |x| is finite)
    Rule(lambda x: torch.sqrt(x * x), torch.abs, X, name="sqrt_square_abs",
         where=_floating(0)),
    # (x + y) - y rounds ((1 + 1e8) - 1e8 is 0) and is NaN at y = inf
    Rule(lambda x, y: (x + y) - y, lambda x, y: x, XY, name="add_sub_cancel",
         where=_floating(0, 1)),
    # the float16 column sums overflow where one sum over all does not (inf - inf: NaN)
    Rule(lambda x: x.sum(0).sum(0), lambda x: x.sum(), X, name="sum_sum_all",
         where=_floating(0)),
    # torch.clamp with min > max gives max; clamping max first then min gives min
    Rule(lambda x, a, b: torch.clamp(x, a, b),
         lambda x, a, b: torch.clamp(torch.clamp(x, max=b), min=a),
         (*X, -1.0, 1.0), name="clamp_max_then_min", where=_floating(0)),
    # mean accumulates in float32; sum in float16 overflows at 65504 (inf / n)
    Rule(lambda x: x.mean(-1), lambda x: x.sum(-1) / x.shape[-1], X, name="mean_as_sum_div",
         where=_floating(0)),
    # where(c, x, y) reads only one branch; c * x + ~c * y is NaN where the other is inf/NaN
    Rule(lambda c, x, y: torch.where(c, x, y), lambda c, x, y: c * x + (~c) * y,
         (torch.rand(4, 6) > 0.5, *XY), name="where_as_arith", where=_floating(1, 2)),
    # trunc rounds toward zero, floor_divide toward -inf: -7 // 2 is -4, trunc(-3.5) is -3
    Rule(lambda x, y: torch.div(x, y, rounding_mode="trunc"), torch.floor_divide, IJ,
         name="trunc_as_floordiv"),
    # int32 wraps: 65536 * 65536 is 0 in int32, so (i * j) // j is 0, not i
    Rule(lambda i, j: (i * j) // j, lambda i, j: i, IJ, name="mul_floordiv_cancel",
         where=_int(0, 1)),
    # where(x > 0, x, 0) is 0 at NaN; relu(NaN) is NaN
    Rule(lambda x: torch.where(x > 0, x, 0.0), torch.relu, X, name="where_pos_as_relu",
         where=_floating(0)),
    # log1p(-0.0) is -0.0, log(1 + -0.0) is +0.0
    Rule(torch.log1p, lambda x: torch.log(1 + x), X, name="log1p_spelled",
         where=_floating(0), assumes=NNI),
    # exp(x) overflows past 88.7 (float32): log(inf) is inf where logsumexp is finite
    Rule(lambda x: torch.logsumexp(x, -1), lambda x: torch.log(torch.exp(x).sum(-1)), X,
         name="logsumexp_naive", where=_floating(0)),
    # softplus(100) is 100; log(1 + exp(100)) is inf
    Rule(F.softplus, lambda x: torch.log(1 + torch.exp(x)), X, name="softplus_naive",
         where=_floating(0)),
    # the tanh approximation errs by up to ~5e-4 from the exact gelu
    Rule(lambda x: F.gelu(x, approximate="tanh"), F.gelu, X, name="gelu_tanh_as_exact",
         where=_floating(0), assumes=FAST),
    # a bias of one element broadcast along the summed dim is b * n; a bias of n elements is not
    Rule(lambda x, b: (x + b).sum(-1), lambda x, b: x.sum(-1) + b * x.shape[-1],
         (torch.randn(4, 6), torch.randn(1)), name="sum_of_biased", where=_floating(0, 1),
         assumes=FAST),
    # softmax by hand overflows past 88.7 (inf / inf: NaN) and underflows to 0 / 0
    Rule(_exp_ratio, lambda x: torch.softmax(x, -1), X, name="softmax_by_hand",
         where=_floating(0)),
    # atan(y / x) is off by pi where x < 0
    Rule(torch.atan2, lambda y, x: torch.atan(y / x), XY, name="atan2_as_atan",
         where=_floating(0, 1), assumes=FAST),
    # x / a / b overflows at x / a where x / (a * b) does not (a = 0.1, b = 1e4, x = max)
    Rule(lambda x, a, b: x / a / b, lambda x, a, b: x / (a * b), (*X, 2.0, 3.0),
         name="div_div_scalars", where=_floating(0)),
    # expm1(-0.0) is -0.0, exp(-0.0) - 1 is +0.0
    Rule(torch.expm1, lambda x: torch.exp(x) - 1, X, name="expm1_spelled",
         where=_floating(0), assumes=NNI),
    # cat then sum rounds (and overflows, float16) once; two sums and an add do not
    Rule(lambda x, y: torch.cat([x, y], 0).sum(0), lambda x, y: x.sum(0) + y.sum(0), XY,
         name="sum_of_cat", where=_floating(0, 1)),
    # relu keeps -0.0; maximum(-0.0, 0.0) keeps it in its scalar tail but gives +0.0 in its
    # vectorized body (flat index 15 of 24 in float32 on x86): torch leaves the sign unspecified
    Rule(lambda x: torch.maximum(x, torch.zeros_like(x)), torch.relu, X, name="max_zero_as_relu",
         where=_floating(0)),
)
"""Wrong rules: ``check_rule`` must refuse each."""

RIGHT = (
    # torch.pow(x, 2) is computed as x * x
    Rule(lambda x: torch.pow(x, 2), lambda x: x * x, X, name="pow2_as_mul",
         where=_floating(0)),
    # x - (-y) and x + y are the same IEEE operation (signed zeros, infs and NaNs included)
    Rule(lambda x, y: x - (-y), lambda x, y: x + y, XY, name="sub_neg_as_add",
         where=_floating(0, 1)),
    # exact at every IEEE value: relu(-0.0) - relu(0.0) is -0.0, relu(inf) - relu(-inf) is inf
    Rule(lambda x: torch.relu(x) - torch.relu(-x), lambda x: x, X, name="relu_minus_relu",
         where=_floating(0)),
    Rule(torch.abs, lambda x: torch.relu(x) + torch.relu(-x), X, name="abs_as_relus",
         where=_floating(0)),
    # torch.clamp with min > max gives max, as clamping min first then max does
    Rule(lambda x, a, b: torch.clamp(x, a, b),
         lambda x, a, b: torch.clamp(torch.clamp(x, min=a), max=b),
         (*X, -1.0, 1.0), name="clamp_min_then_max", where=_floating(0)),
    # 0/0 and inf/inf are NaN (poison under no_nans); x / x is exactly 1 elsewhere
    Rule(lambda x: x / x, torch.ones_like, X, name="div_self_fast", where=_floating(0),
         assumes=frozenset({"no_nans"})),
    # x * x past sqrt(max) is inf (poison under no_infs); sqrt(x * x) is |x| exactly elsewhere
    Rule(lambda x: torch.sqrt(x * x), torch.abs, X, name="sqrt_square_abs_fast",
         where=_floating(0), assumes=frozenset({"no_infs"})),
    # LLVM's reassoc with finite values and no signed zeros: (x + y) - y is x
    Rule(lambda x, y: (x + y) - y, lambda x, y: x, XY, name="add_sub_cancel_fast",
         where=_floating(0, 1), assumes=ALL),
    # where picks; c * x + ~c * y equals it for finite values up to the sign of zero
    Rule(lambda c, x, y: torch.where(c, x, y), lambda c, x, y: c * x + (~c) * y,
         (torch.rand(4, 6) > 0.5, *XY), name="where_as_arith_fast", where=_floating(1, 2),
         assumes=FAST),
    # 2 sigmoid(x) - 1 is tanh(x / 2): at -0.0 the sign differs, elsewhere within rounding
    Rule(lambda x: torch.sigmoid(x) * 2 - 1, lambda x: torch.tanh(x / 2), X,
         name="sigmoid_as_tanh", where=_floating(0), assumes=frozenset({"no_signed_zeros"})),
    # the float32 sum of two float16 values rounds to the float16 sum (24 bits >= 2 * 11 + 2)
    Rule(lambda x, y: (x.float() + y.float()).half(), lambda x, y: x + y, H,
         name="half_add_via_float", where=_dtype(torch.float16, 0, 1)),
    # exp overflow or 0 / 0 underflow is inf/NaN in the pattern (poison); elsewhere rounding
    Rule(_exp_ratio, lambda x: torch.softmax(x, -1), X, name="softmax_by_hand_fast",
         where=_floating(0), assumes=NNI),
    # right in values (a fresh contiguous copy against a view), but the matcher looks through
    # contiguous(): the rule is refused when compiled as matching its own replacement
    Rule(lambda x: x.transpose(0, 1).contiguous(), lambda x: x.transpose(0, 1), X,
         name="drop_contiguous"),
)
"""Right rules: ``check_rule`` must accept each (under the assumptions it declares)."""

__all__ = ["RIGHT", "WRONG"]
