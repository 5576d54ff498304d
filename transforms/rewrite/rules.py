"""Shipped rewrite rules (``docs/rewrite.md`` explains each), ready for ``rewrite``: four worked
rules and ``ATTENTION``, the attention rule set::

    from transforms.rewrite import rewrite
    from transforms.rewrite_rules import ATTENTION_ASSUMES, RULES
    q = rewrite(p, RULES, assume=ATTENTION_ASSUMES)

or on the command line: ``purefx model.pt2 --rules transforms.rewrite_rules:RULES --assume
no_nans,no_infs,no_signed_zeros,reassociate``. Without the grant the attention rules are not
applied (exact IEEE semantics; ``RewriteReport.not_granted`` names them).

Also ``SHARED_INPUT_MM``, a rule of two results (two matmuls of one input fused), and its
``nn.Linear`` twins ``SHARED_INPUT_LINEAR`` / ``SHARED_INPUT_LINEAR_NO_BIAS``, kept out of
``RULES``: whether it pays depends on the shapes, so it is meant for ``saturate`` and its cost
model (``docs/search.md``), or for ``rewrite`` where the caller knows it pays.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from transforms.rewrite.rule import Match, Rule, hyper, optional

_X = (torch.randn(4, 8),)


def _relu_relu(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(torch.relu(x))


def _times_one(x: torch.Tensor) -> torch.Tensor:
    return x * 1


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _sigmoid_times(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x) * x  # matches x * sigmoid(x) too: mul is commutative


_CONV = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}  #: by the weight's rank


def _conv_bn(x, w, b, mean, var, gamma, beta, momentum: float, eps: float,
             stride, padding, dilation, groups) -> torch.Tensor:
    y = _CONV[w.dim()](x, w, b, stride, padding, dilation, groups)
    return F.batch_norm(y, mean, var, gamma, beta, False, momentum, eps)


def _conv_folded(x, w, b, mean, var, gamma, beta, momentum: float, eps: float,
                 stride, padding, dilation, groups) -> torch.Tensor:
    s = gamma * torch.rsqrt(var + eps)
    shift = beta - mean * s if b is None else (b - mean) * s + beta
    scale = s.reshape(-1, *(1,) * (w.dim() - 1))
    return _CONV[w.dim()](x, w * scale, shift, stride, padding, dilation, groups)


_C = 4


def _conv_bn_example(spatial: tuple[int, ...], stride: Any, padding: Any) -> tuple:
    """Example inputs of ``CONV_BN`` for a convolution of ``len(spatial)`` dimensions. The
    hyperparameters' examples are told apart in the trace (stride 2s, padding 1s or a
    string, dilation 3s, groups 2); the bias may be None."""
    n = len(spatial)
    return (
        torch.randn(1, _C, *spatial), torch.randn(_C, _C // 2, *(3,) * n), torch.randn(_C),
        torch.randn(_C), torch.rand(_C) + 0.5, torch.randn(_C), torch.randn(_C), 0.1, 1e-5,
        stride, padding, hyper((3,) * n), hyper(2),
    )


_CONV_BN = _conv_bn_example((10, 10), hyper((2, 2)), hyper((1, 1)))
_CONV_BN = (*_CONV_BN[:2], optional(_CONV_BN[2]), *_CONV_BN[3:])
_CONV_BN_ALSO = (
    _conv_bn_example((10,), hyper((2,)), hyper((1,))),  # conv1d
    _conv_bn_example((8, 8, 8), hyper((2, 2, 2)), hyper((1, 1, 1))),  # conv3d
    # conv{1,2,3}d(..., padding="same" | "valid"): other operators (aten.conv2d.padding);
    # "same" admits stride 1 only
    *(_conv_bn_example(spatial, hyper((1,) * len(spatial), values=[(2,) * len(spatial)]),
                       hyper("same", values=["valid"]))
      for spatial in ((10,), (10, 10), (8, 8, 8))),
)

RELU_RELU = Rule(_relu_relu, torch.relu, _X, name="relu_relu")
"""``relu(relu(x)) -> relu(x)``."""


def _not_bool(m: Match) -> bool:
    x = m.val(0)
    return isinstance(x, torch.Tensor) and x.dtype != torch.bool


def _floating(m: Match) -> bool:
    x = m.val(0)
    return isinstance(x, torch.Tensor) and x.dtype.is_floating_point


TIMES_ONE = Rule(_times_one, _identity, _X, name="times_one", where=_not_bool)
"""``x * 1 -> x`` on a tensor that is not bool (``bool * 1`` is int64). A literal matches
only a literal of its type: ``x * 1.0`` is another rule (it makes an int tensor float)."""
SILU = Rule(_sigmoid_times, F.silu, _X, name="silu", where=_floating)
"""``sigmoid(x) * x -> silu(x)``, either operand order, on floating tensors (``sigmoid`` of an
int tensor is float, ``silu`` refuses ints)."""
CONV_BN = Rule(_conv_bn, _conv_folded, _CONV_BN, name="conv_bn", specials=False,
               assumes=frozenset({"reassociate"}), also_at=_CONV_BN_ALSO)
"""Eval-mode ``batch_norm(conv(x, w, b, stride, padding, dilation, groups))`` -> one
convolution with folded weight and bias (computed in the graph from the same parameters; the
state dict is unchanged). One rule for every convolution: ``conv1d``, ``conv2d`` and ``conv3d``
(the functions pick the operator by the weight's rank, traced at each rank by ``also_at``),
padding as numbers or as ``"same"`` / ``"valid"``; stride, padding, dilation and groups are
hyperparameters (``hyper``) bound from each match, the bias is ``optional`` (``None``: the
folded bias is ``beta - mean * scale``), momentum and eps are scalar wildcards. Not covered: a
batch norm without affine parameters (``affine=False``: its weight and bias are ``None``).

Assumes ``reassociate``: folding distributes the batch norm's scale over the convolution's sum
and its bias (``(conv(x, w) + b - mean) * s -> conv(x, w * s) + (b - mean) * s``), which rounds
elsewhere; where the terms cancel (a channel of variance 0, so ``s = gamma / sqrt(eps)`` is
large, and a bias near the mean) the two differ past the dtype's tolerance (bfloat16 gives 18.1
where the pattern gives 9.9; float32 0.00635 for 0.00633), so under exact semantics
``check_rule`` refuses it. Grant it: ``rewrite(p, [CONV_BN], assume={"reassociate"})``."""

# --- shared-input matmuls (a rule of two results) ----------------------------------------------


def _shared_input_mm(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor):
    return x @ w1, x @ w2


def _shared_input_mm_fused(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor):
    a, b = (x @ torch.cat([w1, w2], dim=-1)).split([w1.shape[-1], w2.shape[-1]], dim=-1)
    return a, b


def _weight_matrices(m: Match) -> bool:
    """Both weights are matrices of one dtype, as ``check_rule`` draws them (it varies sizes
    and dtypes, not ranks). Then ``cat(w1, w2, -1)`` exists (the pattern ran, so both have
    ``x``'s last size as rows) and ``x @ cat`` holds ``x @ w1`` then ``x @ w2`` along its last
    dimension, for ``x`` of any rank: each element is the same dot product. A vector weight
    contracts that dimension away (nothing to split; the replacement would not trace). The
    ``linear`` rules ask the same of their ``(out, in)`` weights: ``cat(w1, w2)`` along the
    output rows, and ``linear(x, cat)`` holds ``linear(x, w1)`` then ``linear(x, w2)``."""
    x, w1, w2 = m.val(0), m.val(1), m.val(2)
    return (all(isinstance(t, torch.Tensor) for t in (x, w1, w2))
            and x.dim() >= 1 and w1.dim() == w2.dim() == 2 and w1.dtype == w2.dtype)


SHARED_INPUT_ASSUMES = frozenset({"reassociate", "no_nans", "no_infs", "no_signed_zeros"})
"""What the shared-input rules assume (``SHARED_INPUT_MM``, ``SHARED_INPUT_LINEAR``,
``SHARED_INPUT_LINEAR_NO_BIAS``): the fused product sums each dot product in an order of its
own. The matmul kernel picks its blocking, and with it the order of each sum, by the operands'
shapes and strides, so ``(x @ cat(w1, w2))[..., :n1]`` and ``x @ w1`` may round differently
and, where a partial sum overflows, differ outright: at float64 rows of ``1.8e308`` one order
gives ``inf`` where the other gives the largest finite, or ``-inf`` where the other gives NaN
(``check_rule`` finds both), and a sum of zeros may come out ``+0.0`` where the other gives
``-0.0`` (``linear`` of zero weights, rows of ``-1.0``). Right up to regrouping and the sign of
zero, where no sum overflows: grant these to ``rewrite``/``saturate``
(``assume=SHARED_INPUT_ASSUMES``: the four fast-math flags, as the attention rules)."""

SHARED_INPUT_MM = Rule(
    _shared_input_mm, _shared_input_mm_fused,
    (torch.randn(3, 4), torch.randn(4, 5), torch.randn(4, 6)),
    name="shared_input_mm", where=_weight_matrices, assumes=SHARED_INPUT_ASSUMES)
"""``x @ w1, x @ w2 -> split(x @ cat(w1, w2, -1), [n1, n2], -1)``: two matmuls that share their
left operand become one, on the concatenated weight matrices (``x`` read once, one launch; the
``cat`` reads only the weights). A rule of two results: the halves are views of one buffer,
strided (row stride ``n1 + n2``) where ``x @ w1`` was contiguous. ``check_rule`` accepts
results that alias each other where the pattern's are fresh (the law's ``fresh_may_alias``:
values, shapes and dtypes must agree, the aliasing that appears is the engine's to guard), and
the engine takes a match only where nothing writes either result and the caller does not get
both (``rewrite``: guard ``shared``; ``saturate``: the escape guard), and where every reader
admits the halves' strides. Assumes ``SHARED_INPUT_ASSUMES`` (the fused sums run in another
order; they overflow elsewhere). Not in ``RULES``: whether it pays depends on
the shapes (large weights make the ``cat`` dearer than the launch and the read of ``x`` it
saves), which ``saturate``'s cost model decides and greedy ``rewrite`` does not."""


def _shared_input_linear(x, w1, w2, b1, b2):
    return F.linear(x, w1, b1), F.linear(x, w2, b2)


def _shared_input_linear_fused(x, w1, w2, b1, b2):
    bias = None if b1 is None else torch.cat([b1, b2])
    a, b = F.linear(x, torch.cat([w1, w2]), bias).split([w1.shape[0], w2.shape[0]], dim=-1)
    return a, b


SHARED_INPUT_LINEAR = Rule(
    _shared_input_linear, _shared_input_linear_fused,
    (torch.randn(3, 4), torch.randn(5, 4), torch.randn(6, 4), torch.randn(5), torch.randn(6)),
    name="shared_input_linear", where=_weight_matrices, assumes=SHARED_INPUT_ASSUMES)
"""``linear(x, w1, b1), linear(x, w2, b2) -> split(linear(x, cat(w1, w2), cat(b1, b2)), [n1,
n2], -1)``: ``SHARED_INPUT_MM`` for ``nn.Linear`` projections with biases (BERT's query, key
and value), as ``torch.export`` keeps them (``aten.linear``). Same results, same aliasing
contract, guards and assumptions (``SHARED_INPUT_ASSUMES``) as ``SHARED_INPUT_MM``; not in
``RULES`` (the cost model decides)."""

SHARED_INPUT_LINEAR_NO_BIAS = Rule(
    _shared_input_linear, _shared_input_linear_fused,
    (torch.randn(3, 4), torch.randn(5, 4), torch.randn(6, 4), None, None),
    name="shared_input_linear_no_bias", where=_weight_matrices, assumes=SHARED_INPUT_ASSUMES)
"""``SHARED_INPUT_LINEAR`` for projections without biases (``nn.Linear(..., bias=False)``:
Llama's). Two rules, not one with ``optional`` biases: ``optional`` would also stand for one
bias present and one absent, which a single fused ``linear`` cannot compute exactly."""

# --- attention ----------------------------------------------------------------------------------
#
# The eager attention of transformers models (BERT, GPT-2, DistilBERT, T5, ViT, ...) computes
# ``softmax(q @ k.transpose(-2, -1) * scale + mask) @ v``, with variants: no mask, an extra
# position bias (T5), no scaling or a division by ``sqrt(d)`` (older GPT-2 code), a boolean mask
# applied with ``where`` / ``masked_fill``, eval-mode dropout on the probabilities. Each variant
# is one rule; ``scaled_dot_product_attention`` computes each of them. Every rule's ``where``
# admits only matches on which ``scaled_dot_product_attention`` computes what the pattern does:
# q, k, v of one floating dtype and rank, equal batch sizes (it does not broadcast them), and a
# mask or bias that broadcasts to the scores' shape without enlarging them, in q's dtype (an
# additive mask) or bool (a boolean one).


def _scores_shape(m: Match) -> tuple[int, ...] | None:
    """The shape of ``q @ k.transpose(-2, -1)`` when q, k, v (arguments 0, 1, 2) are tensors that
    ``scaled_dot_product_attention`` takes as they are; ``None`` otherwise."""
    q, k, v = m.val(0), m.val(1), m.val(2)
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return None
    if not (q.dtype == k.dtype == v.dtype and q.dtype.is_floating_point):
        return None
    if not (q.dim() == k.dim() == v.dim() and q.dim() >= 2):
        return None
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2] and q.shape[-1] == k.shape[-1]
            and k.shape[-2] == v.shape[-2]):
        return None
    return (*q.shape[:-1], k.shape[-2])


def _fits(scores: tuple[int, ...], t: Any, dtype: torch.dtype) -> bool:
    """``t`` (a mask or bias) is a tensor of ``dtype`` that broadcasts to ``scores``."""
    if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.dim() > len(scores):
        return False
    try:
        return tuple(torch.broadcast_shapes(tuple(t.shape), scores)) == tuple(scores)
    except RuntimeError:
        return False


def _where_qkv(m: Match) -> bool:
    return _scores_shape(m) is not None


def _where_additive(*positions: int) -> Callable[[Match], bool]:
    """``where`` for a rule whose arguments at ``positions`` are added to the scores."""

    def where(m: Match) -> bool:
        scores = _scores_shape(m)
        return scores is not None and all(
            _fits(scores, m.val(i), m.val(0).dtype) for i in positions)

    return where


def _where_divisor(mask: int | None, divisor: int) -> Callable[[Match], bool]:
    """``where`` for a rule that divides the scores by argument ``divisor`` (not zero)."""
    additive = _where_additive(*(() if mask is None else (mask,)))

    def where(m: Match) -> bool:
        d = m.val(divisor)
        return isinstance(d, (int, float)) and d != 0 and additive(m)

    return where


def _where_boolean(mask: int, fill: int) -> Callable[[Match], bool]:
    """``where`` for a rule that fills the scores outside a bool mask (argument ``mask``) with
    argument ``fill``, which must be ``-inf``: only then is the filled score's weight 0, as
    ``scaled_dot_product_attention`` gives it (a finite fill weighs a row whose every score is
    filled evenly, which no attention mask can say)."""

    def where(m: Match) -> bool:
        scores = _scores_shape(m)
        return (scores is not None and m.val(fill) == -math.inf
                and _fits(scores, m.val(mask), torch.bool))

    return where


def _qk(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q @ k.transpose(-2, -1)


def _att_scaled(q, k, v, scale: float) -> torch.Tensor:
    return torch.softmax(_qk(q, k) * scale, dim=-1) @ v


def _sdpa_scaled(q, k, v, scale: float) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, scale=scale)


def _att_scaled_mask(q, k, v, mask, scale: float) -> torch.Tensor:
    return torch.softmax(_qk(q, k) * scale + mask, dim=-1) @ v


def _att_scaled_mask_dropout(q, k, v, mask, scale: float, p: float) -> torch.Tensor:
    return F.dropout(torch.softmax(_qk(q, k) * scale + mask, dim=-1), p, training=False) @ v


def _sdpa_scaled_mask(q, k, v, mask, scale: float, p: float = 0.0) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _att_scaled_bias_mask(q, k, v, bias, mask, scale: float) -> torch.Tensor:
    return torch.softmax(_qk(q, k) * scale + bias + mask, dim=-1) @ v


def _sdpa_scaled_bias_mask(q, k, v, bias, mask, scale: float) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias + mask, scale=scale)


def _att_plain(q, k, v) -> torch.Tensor:
    return torch.softmax(_qk(q, k), dim=-1) @ v


def _sdpa_plain(q, k, v) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, scale=1.0)


def _att_mask(q, k, v, mask) -> torch.Tensor:
    return torch.softmax(_qk(q, k) + mask, dim=-1) @ v


def _sdpa_mask(q, k, v, mask) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)


def _att_bias_mask(q, k, v, bias, mask) -> torch.Tensor:
    return torch.softmax(_qk(q, k) + bias + mask, dim=-1) @ v


def _sdpa_bias_mask(q, k, v, bias, mask) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias + mask, scale=1.0)


def _att_div(q, k, v, d: float) -> torch.Tensor:
    return torch.softmax(_qk(q, k) / d, dim=-1) @ v


def _sdpa_div(q, k, v, d: float) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, scale=1.0 / d)


def _att_div_mask(q, k, v, mask, d: float) -> torch.Tensor:
    return torch.softmax(_qk(q, k) / d + mask, dim=-1) @ v


def _sdpa_div_mask(q, k, v, mask, d: float) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / d)


def _att_where(q, k, v, keep, scale: float, fill: float) -> torch.Tensor:
    return torch.softmax(torch.where(keep, _qk(q, k) * scale, fill), dim=-1) @ v


def _sdpa_where(q, k, v, keep, scale: float, fill: float) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale)


def _att_masked_fill(q, k, v, hide, scale: float, fill: float) -> torch.Tensor:
    return torch.softmax((_qk(q, k) * scale).masked_fill(hide, fill), dim=-1) @ v


def _sdpa_masked_fill(q, k, v, hide, scale: float, fill: float) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=hide.logical_not(), scale=scale)


def _qkv(*extra: Any) -> tuple:
    g = torch.Generator().manual_seed(0)
    return (*(torch.randn(2, 3, 5, 8, generator=g) for _ in range(3)), *extra)


_FAST = frozenset({"no_nans", "no_infs", "no_signed_zeros", "reassociate"})
"""What fused attention assumes, as inductor does when it fuses: finite inputs and scores (a row
of ``-inf`` scores gives NaN eagerly, 0 from ``sdpa``; scores near the largest finite overflow
differently), a sum taken in another order (``sdpa``'s softmax and product accumulate
differently: rounding, visible in bfloat16 at large scores), and zeros of either sign (in
float16 ``sdpa`` gives -0.0 where the pattern gives +0.0). Each is needed (``docs/rewrite.md``
says by which counterexample). Within them, the fused result equals eager's up to rounding.
The bool-mask rules declare the same: the same fused kernel sums in the same other order, and
which order, so a zero's sign and the last bits, depends on the machine's kernel (torch 2.11 on
another CPU gave +0.0 where the pattern gives -0.0 for ``attention_masked_fill``)."""


_MASK = torch.randn(2, 1, 5, 5)
_BIAS = torch.randn(1, 3, 5, 5)
_KEEP = torch.ones(5, 5, dtype=torch.bool).tril()

ATTENTION_SCALED = Rule(_att_scaled, _sdpa_scaled, _qkv(0.5), name="attention",
                        where=_where_qkv, assumes=_FAST)
"""``softmax(q @ k.T * scale) @ v -> sdpa(q, k, v, scale=scale)``."""
ATTENTION_MASK = Rule(_att_scaled_mask, _sdpa_scaled_mask, _qkv(_MASK, 0.5),
                      name="attention_mask", where=_where_additive(3), assumes=_FAST)
"""``softmax(q @ k.T * scale + mask) @ v -> sdpa(q, k, v, attn_mask=mask, scale=scale)``:
BERT, DistilBERT, GPT-2 (its causal mask is additive), ViT."""
ATTENTION_MASK_DROPOUT = Rule(
    _att_scaled_mask_dropout, _sdpa_scaled_mask, _qkv(_MASK, 0.5, 0.1),
    name="attention_mask_dropout", where=_where_additive(3), assumes=_FAST)
"""The same with ``dropout(p, training=False)`` on the probabilities (which computes nothing)."""
ATTENTION_BIAS_MASK = Rule(_att_scaled_bias_mask, _sdpa_scaled_bias_mask,
                           _qkv(_BIAS, _MASK, 1.0), name="attention_bias_mask",
                           where=_where_additive(3, 4), assumes=_FAST)
"""``softmax(q @ k.T * scale + bias + mask) @ v -> sdpa(..., attn_mask=bias + mask)``: T5 (its
scale is 1.0, its position bias added before the mask)."""
ATTENTION_PLAIN = Rule(_att_plain, _sdpa_plain, _qkv(), name="attention_unscaled",
                       where=_where_qkv, assumes=_FAST)
"""``softmax(q @ k.T) @ v -> sdpa(q, k, v, scale=1.0)``."""
ATTENTION_UNSCALED_MASK = Rule(_att_mask, _sdpa_mask, _qkv(_MASK), name="attention_unscaled_mask",
                               where=_where_additive(3), assumes=_FAST)
"""``softmax(q @ k.T + mask) @ v -> sdpa(q, k, v, attn_mask=mask, scale=1.0)``."""
ATTENTION_UNSCALED_BIAS_MASK = Rule(_att_bias_mask, _sdpa_bias_mask, _qkv(_BIAS, _MASK),
                                    name="attention_unscaled_bias_mask",
                                    where=_where_additive(3, 4), assumes=_FAST)
"""``softmax(q @ k.T + bias + mask) @ v -> sdpa(..., attn_mask=bias + mask, scale=1.0)``: T5
without its ``* 1.0``."""
ATTENTION_DIV = Rule(_att_div, _sdpa_div, _qkv(2.0), name="attention_div",
                     where=_where_divisor(None, 3),
                     assumes=_FAST)
"""``softmax(q @ k.T / d) @ v -> sdpa(q, k, v, scale=1 / d)`` (GPT-2's division by sqrt(d))."""
ATTENTION_DIV_MASK = Rule(_att_div_mask, _sdpa_div_mask, _qkv(_MASK, 2.0),
                          name="attention_div_mask", where=_where_divisor(3, 4), assumes=_FAST)
"""``softmax(q @ k.T / d + mask) @ v -> sdpa(q, k, v, attn_mask=mask, scale=1 / d)``."""
ATTENTION_WHERE = Rule(_att_where, _sdpa_where, _qkv(_KEEP, 0.5, -math.inf),
                       name="attention_where", where=_where_boolean(3, 5),
                       assumes=_FAST)
"""``softmax(where(keep, q @ k.T * scale, -inf)) @ v -> sdpa(q, k, v, attn_mask=keep,
scale=scale)`` (a causal or padding mask as bool)."""
ATTENTION_MASKED_FILL = Rule(_att_masked_fill, _sdpa_masked_fill, _qkv(~_KEEP, 0.5, -math.inf),
                             name="attention_masked_fill", where=_where_boolean(3, 5),
                             assumes=_FAST)
"""``softmax((q @ k.T * scale).masked_fill(hide, -inf)) @ v -> sdpa(q, k, v,
attn_mask=~hide, scale=scale)``."""

ATTENTION = (
    ATTENTION_SCALED, ATTENTION_MASK, ATTENTION_MASK_DROPOUT, ATTENTION_BIAS_MASK,
    ATTENTION_PLAIN, ATTENTION_UNSCALED_MASK, ATTENTION_UNSCALED_BIAS_MASK, ATTENTION_DIV,
    ATTENTION_DIV_MASK, ATTENTION_WHERE, ATTENTION_MASKED_FILL,
)
"""The attention rule set: eager softmax attention -> ``scaled_dot_product_attention``, one
rule per variant (each checked by ``check_rule`` the first time ``rewrite`` meets it). Fuses
every attention call of transformers' BERT, GPT-2, DistilBERT, T5 and ViT (eager attention,
eval mode) at the training IR, at core aten and after ``transform``, where the caller grants
``ATTENTION_ASSUMES``: ``rewrite(p, ATTENTION, assume=ATTENTION_ASSUMES)``."""

ATTENTION_ASSUMES = frozenset().union(*(r.assumes for r in ATTENTION))
"""The assumptions the ``ATTENTION`` set declares, all of them: grant these to ``rewrite`` for
attention to fuse (by default it grants none, and no attention rule applies). Fused attention
computes eager's result up to rounding for finite inputs, as inductor assumes when it fuses:
a row of ``-inf`` scores is NaN eagerly and 0 fused, scores near the largest finite overflow
differently, and the fused kernel sums in another order."""

RULES = (RELU_RELU, TIMES_ONE, SILU, *ATTENTION, CONV_BN)
"""The shipped rules, for ``rewrite`` and ``purefx --rules``: the four above and the
``ATTENTION`` set (which applies only where ``ATTENTION_ASSUMES`` is granted)."""

__all__ = [
    "ATTENTION",
    "ATTENTION_ASSUMES",
    "ATTENTION_BIAS_MASK",
    "ATTENTION_DIV",
    "ATTENTION_DIV_MASK",
    "ATTENTION_MASK",
    "ATTENTION_MASKED_FILL",
    "ATTENTION_MASK_DROPOUT",
    "ATTENTION_PLAIN",
    "ATTENTION_SCALED",
    "ATTENTION_UNSCALED_BIAS_MASK",
    "ATTENTION_UNSCALED_MASK",
    "ATTENTION_WHERE",
    "CONV_BN",
    "RELU_RELU",
    "RULES",
    "SHARED_INPUT_ASSUMES",
    "SHARED_INPUT_LINEAR",
    "SHARED_INPUT_LINEAR_NO_BIAS",
    "SHARED_INPUT_MM",
    "SILU",
    "TIMES_ONE",
]
