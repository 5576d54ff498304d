"""Every rule of ``check_rule``'s suites with its true verdict, for the seeded verdict matrix
(``tests/test_check_rule_seeds.py``) and the power bench (``bench.power``).

``SUITES`` lists ``Planted(suite, rule, right)``: the right rules of ``tests/rule_library.py``,
``tests/heldout_rules.py`` and torch inductor's attention rules (``tests/inductor_rules.py``,
their verdicts as ``tests/test_check_rule_inductor.py`` gives them), the wrong ones of the last
two, and the rules the other ``tests/test_check_rule*.py`` files check one by one, rebuilt here
as data (a right and a wrong rule per edge they test: IEEE specials, signed zeros, tolerances,
sizes, scalars, integer wrapping, conversions, regrouping). ``verdict(planted, seed)`` runs
``check_rule(rule, seed=seed)`` and says whether the verdict is the true one.

A rule's verdict must not depend on the seed: a right rule is accepted and a wrong one refused
on every seed (``check_rule``'s ``seed``; ``None`` is the default, content-seeded stream).
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

from ir import PurefxError
from transforms.machinery.law_violation import LawViolation
from transforms.rewrite import Rule
from transforms.rewrite.rule_check import check_rule  # the verdict alone: no refusal explained

X = (torch.randn(3, 4),)
ABC = (torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4))
FINITE = frozenset({"no_nans", "no_infs", "no_signed_zeros"})
REGROUP = frozenset({"reassociate", "no_nans", "no_infs", "no_signed_zeros"})
REGROUP_FINITE = frozenset({"reassociate", "no_nans", "no_infs"})
_SMALL = {"max_examples": 30}


@attrs.frozen
class Planted:
    """A rule of a suite and its true verdict: ``right`` (``check_rule`` must accept it) or
    not (it must refuse it). ``key``: ``"suite:name"``, unique across ``SUITES``."""

    suite: str
    rule: Rule
    right: bool

    @property
    def key(self) -> str:
        return f"{self.suite}:{self.rule.name}"


def _floats(*positions: int):
    def where(match) -> bool:
        return all(match.val(i) is not None and match.val(i).dtype.is_floating_point
                   for i in positions)

    return where


def _of(dtypes):
    return lambda m: m.val(0) is not None and m.val(0).dtype in dtypes


def _log_exp(x):
    return torch.log(torch.exp(x))


def layer_norm(x, w, b):
    """``F.layer_norm`` over the last dimension, eps 1e-5."""
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def layer_norm_regrouped(x, w, b):
    """Layer norm with the scale distributed over the difference: ``x·(r·w) - m·(r·w) + b``
    (``r`` the reciprocal deviation, ``m`` the mean). Right up to regrouping: where ``x`` is
    its row's mean it gives +0.0 where ``F.layer_norm`` gives -0.0 (a negative weight)."""
    m = x.mean(-1, keepdim=True)
    r = torch.rsqrt(x.var(-1, keepdim=True, unbiased=False) + 1e-5)
    return x * (r * w) - m * (r * w) + b


_LN = (torch.randn(4, 8), torch.randn(8), torch.randn(8))

EDGES_RIGHT = (
    Rule(lambda x: x * 1, lambda x: x, X, name="times_one", **_SMALL),
    Rule(lambda x: x * 2, lambda x: x + x, X, name="twice", **_SMALL),
    Rule(lambda x: x - x, torch.zeros_like, X, name="x_minus_x_fast",
         assumes={"no_nans", "no_infs"}, **_SMALL),
    Rule(_log_exp, lambda x: x, X, name="log_exp_fast", assumes={"no_infs", "no_signed_zeros"},
         **_SMALL),
    Rule(lambda x: torch.neg(torch.neg(x)), lambda x: x, (torch.tensor([3, -2, 0, 5]),),
         name="neg_neg_int", max_examples=8),
    Rule(lambda a, b, c: (a + b) + c, lambda a, b, c: a - (-(b + c)), ABC, name="regroup",
         assumes=REGROUP, where=_floats(0, 1, 2), **_SMALL),
    Rule(lambda a, b: b.t() @ a.t(), lambda a, b: (a @ b).t(),
         (torch.randn(3, 4), torch.randn(4, 5)), name="mm_t", specials=False, max_examples=8),
    # x + 0.0 is x but for the sign of a zero: right where the sign of zero is not judged
    Rule(lambda x: x + 0.0, lambda x: x, X, name="plus_zero_regrouped", assumes={"reassociate"},
         **_SMALL),
    Rule(layer_norm, layer_norm_regrouped, _LN, name="layer_norm_regrouped",
         where=_floats(0, 1, 2), assumes=REGROUP_FINITE),
)
"""Right rules of ``tests/test_check_rule*.py`` (and the regrouped layer norm of issue 60)."""

EDGES_WRONG = (
    # the sign of a zero, where no assumption lets it go
    Rule(lambda x: x + 0.0, lambda x: x, X, name="plus_zero", **_SMALL),
    Rule(lambda x: x + 0.0, lambda x: x, X, name="plus_zero_finite",
         assumes={"no_nans", "no_infs"}, **_SMALL),
    Rule(lambda x: x - x, torch.zeros_like, X, name="x_minus_x", **_SMALL),
    Rule(_log_exp, lambda x: x, X, name="log_exp", **_SMALL),
    Rule(_log_exp, lambda x: x, X, name="log_exp_ninf", assumes={"no_infs"}, **_SMALL),
    Rule(lambda x: torch.exp(x) * 0.0, lambda x: x * 0.0, X, name="exp_times_0",
         assumes={"no_nans", "no_signed_zeros"}, **_SMALL),
    Rule(lambda x: x.half().float(), lambda x: x, X, name="via_half", **_SMALL),
    Rule(lambda x: x.float().sum(-1), lambda x: x.sum(-1).float(), (torch.randn(3, 4).half(),),
         name="sum_in_half", **_SMALL),
    Rule(lambda x, b: torch.softmax(x + b, -1), lambda x, b: torch.softmax(x, -1),
         (torch.randn(2, 3), torch.randn(1)), name="drop_bias", assumes=FINITE, **_SMALL),
    Rule(lambda x, a: torch.maximum(x, a * x), lambda x, a: F.leaky_relu(x, a),
         (torch.randn(3, 4), 0.5), name="max_as_leaky", assumes=FINITE, **_SMALL),
    Rule(lambda x, d: torch.floor(x / d), lambda x, d: torch.floor_divide(x, d),
         (torch.randn(3, 4), 2.0), name="floor_div", assumes=FINITE, **_SMALL),
    Rule(lambda x: torch.amax(-x), lambda x: -torch.amin(x), (torch.tensor([3, -2]),),
         name="amax_neg"),
    Rule(torch.trunc, lambda x: x.to(torch.int64).to(x.dtype), (torch.randn(4, 8),),
         name="trunc_via_int64", specials=False),
    Rule(lambda x: x.clamp(-128, 127).to(torch.int8).to(torch.float32),
         lambda x: x.to(torch.int8).to(torch.float32), (torch.randn(3, 4),),
         name="clamp_dropped", where=_of((torch.float32,)), specials=False, max_examples=10),
    Rule(lambda x: x.to(torch.int16).to(torch.int32), lambda x: x.to(torch.int8).to(torch.int32),
         (torch.arange(12, dtype=torch.int32).reshape(3, 4),), name="via_int8",
         where=_of((torch.int32, torch.int64)), max_examples=10),
    Rule(lambda a, b, c: (a + b) + c, lambda a, b, c: a + (b - c), ABC, name="regroup_wrong",
         assumes=REGROUP, **_SMALL),
    Rule(torch.relu, lambda x: x * 1, X, name="relu_as_copy", where=lambda m: len(m.nodes) == 1,
         max_examples=10),
    Rule(lambda x: x.t(), lambda x: x.transpose(0, 1) * 1, X, name="t_copy", max_examples=10),
    # regrouping excuses the sign of a zero, not a wrong value: the scale left out of the mean
    Rule(layer_norm, lambda x, w, b: x * (torch.rsqrt(x.var(-1, keepdim=True, unbiased=False)
                                                      + 1e-5) * w) + b,
         _LN, name="layer_norm_no_mean", where=_floats(0, 1, 2), assumes=REGROUP_FINITE),
)
"""Wrong rules of ``tests/test_check_rule*.py`` (each refused there on the default stream)."""


def inductor_suite() -> tuple[Planted, ...]:
    """Torch inductor's 14 no-dropout attention rules with their verdicts (loads inductor's
    module on first use: seconds)."""
    from tests.inductor_rules import inductor_rule
    from tests.test_check_rule_inductor import RIGHT, WRONG

    return (*(Planted("inductor", inductor_rule(k), True) for k in RIGHT),
            *(Planted("inductor", inductor_rule(k), False) for k in WRONG))


def suites(*, inductor: bool = True) -> tuple[Planted, ...]:
    """Every planted rule of the suites (see the module docstring), in a fixed order; without
    inductor's 14 attention rules (the slowest to check) when ``inductor`` is false."""
    from tests.heldout_rules import RIGHT, WRONG
    from tests.rule_library import RULES

    found = [*(Planted("library", r, True) for r in RULES),
             *(Planted("heldout", r, True) for r in RIGHT if r.name != "drop_contiguous"),
             *(Planted("heldout", r, False) for r in WRONG),
             *(Planted("edges", r, True) for r in EDGES_RIGHT),
             *(Planted("edges", r, False) for r in EDGES_WRONG)]
    if inductor:
        found += inductor_suite()
    return tuple(found)


def verdict(planted: Planted, seed: int | None) -> str | None:
    """``None`` when ``check_rule(planted.rule, seed=seed)`` gives the true verdict; else what
    went wrong, in a line (the refusal of a right rule, or ``"accepted"`` for a wrong one)."""
    try:
        check_rule(planted.rule, seed=seed)
    except (LawViolation, PurefxError) as exc:
        return str(exc).splitlines()[0][:300] if planted.right else None
    return None if planted.right else "accepted"


__all__ = ["EDGES_RIGHT", "EDGES_WRONG", "Planted", "inductor_suite", "layer_norm",
           "layer_norm_regrouped", "suites", "verdict"]
