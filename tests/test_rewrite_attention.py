"""``transforms.rewrite_rules.ATTENTION`` on real models and on each variant it names.

- Every attention call of tiny transformers models (BERT, GPT-2, DistilBERT, T5, ViT; eager
  attention, eval; ``tests/attention_models.py``) becomes one ``scaled_dot_product_attention``
  at the flat, decomposed and outlined levels: the count of rewrites equals the number of
  attention calls, no ``softmax`` is left, and the lowered module's outputs equal eager's.
  One model per level runs in CI; the rest of the matrix is marked ``slow`` and ``nightly``.
- Each rule of the set passes ``check_rule`` and is not trusted; each variant (additive mask,
  position bias + mask, no scaling, division by ``d``, bool mask via ``where`` / ``masked_fill``,
  eval dropout) is fused in a model that spells it, at other shapes than the rule's examples.
- The ``where`` of the bool-mask rules is what makes them right: without it ``check_rule``
  refuses the rule with a counterexample, and a finite fill is not fused. Each rule's ``where``
  is checked case by case on the values a match binds (it holds exactly where ``sdpa``
  computes the pattern), and where it holds ``sdpa`` gives the pattern's value.
- ``bench/inductor_attention.py`` runs on one of inductor's rules (without ``torch.compile``).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

from ir import import_ep
from lowering import lower
from lowering.pass_laws import LawViolation
from transforms.rewrite import Match, Rule, check_rule, rewrite_report
from transforms.rewrite.api import rule_verdict
from transforms.rewrite_rules import (
    ATTENTION,
    ATTENTION_ASSUMES,
    ATTENTION_BIAS_MASK,
    ATTENTION_DIV_MASK,
    ATTENTION_MASK,
    ATTENTION_MASKED_FILL,
    ATTENTION_SCALED,
    ATTENTION_WHERE,
    RULES,
)

try:
    from . import attention_models as am
except ImportError:  # tests/ is not a package
    import attention_models as am

TOL = {"rtol": 1e-4, "atol": 1e-5}
CI = {("bert", "flat"), ("gpt2", "decomposed"), ("t5", "outlined")}  # one model per level


def _targets(p) -> list[str]:
    return [str(n.target) for _, mid in p.walk() for g in p.module(mid).graphs
            for n in g.nodes if n.op == "call_function"]


# --- each variant, spelled in a model at other shapes than the rules' examples ----------------

B, H, L, S, E = 3, 2, 4, 6, 4  # the rules' examples are (2, 3, 5, 8)


def _qkv(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, E, generator=g)
    k, v = (torch.randn(B, H, S, E, generator=g) for _ in range(2))
    return q, k, v


def _keep() -> torch.Tensor:
    keep = torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L)  # causal, no empty row
    return keep


VARIANTS = {
    "additive mask": (lambda q, k, v, m: torch.softmax(q @ k.transpose(2, 3) * 0.5 + m, -1) @ v,
                      lambda: (torch.randn(B, 1, 1, S),)),
    "position bias + mask": (
        lambda q, k, v, b, m: torch.softmax(q @ k.transpose(-1, -2) * 1.0 + b + m, -1) @ v,
        lambda: (torch.randn(1, H, L, S), torch.randn(B, 1, L, S))),
    "unscaled + bias + mask": (
        lambda q, k, v, b, m: torch.softmax(q @ k.transpose(-2, -1) + b + m, -1) @ v,
        lambda: (torch.randn(1, H, L, S), torch.randn(B, 1, 1, S))),
    "no scale, no mask": (lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), -1) @ v,
                          lambda: ()),
    "scale, no mask": (lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) * 0.3, -1) @ v,
                       lambda: ()),
    "divided by sqrt(d)": (
        lambda q, k, v, m: torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(E) + m, -1) @ v,
        lambda: (torch.randn(1, 1, L, S),)),
    "divided, no mask": (
        lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) / 3.0, -1) @ v, lambda: ()),
    "causal where -inf": (
        lambda q, k, v, keep: torch.softmax(
            torch.where(keep, q @ k.transpose(-2, -1) * 0.5, -math.inf), -1) @ v,
        lambda: (_keep(),)),
    "masked_fill -inf": (
        lambda q, k, v, hide: torch.softmax(
            (q @ k.transpose(-2, -1) * 0.5).masked_fill(hide, float("-inf")), -1) @ v,
        lambda: (~_keep(),)),
    "eval dropout": (
        lambda q, k, v, m: F.dropout(torch.softmax(q @ k.transpose(2, 3) * 0.5 + m, -1), 0.1,
                                     training=False) @ v,
        lambda: (torch.randn(B, 1, 1, S),)),
}


class _Spelled(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_each_variant_is_fused_where_a_model_spells_it(variant):
    fn, extra = VARIANTS[variant]
    args = (*_qkv(), *extra())
    model = _Spelled(fn).eval()
    p = import_ep(torch.export.export(model, args))
    q, report = rewrite_report(p, ATTENTION, ATTENTION_ASSUMES)
    assert sum(report.counts.values()) == 1, dict(report.counts)
    assert not any("softmax" in t for t in _targets(q))
    torch.testing.assert_close(lower(q)(*args), model(*args), **TOL)


def test_attention_fuses_only_where_the_caller_grants_its_assumptions():
    # fused attention is right up to rounding for finite inputs (NaN vs 0 on a row of -inf
    # scores, overflow near the largest finite, another summation order): by default rewrite
    # grants no assumption (exact IEEE semantics), so nothing fuses and the report says why
    fn, extra = VARIANTS["divided by sqrt(d)"]
    args = (*_qkv(), *extra())
    model = _Spelled(fn).eval()
    p = import_ep(torch.export.export(model, args))
    q, report = rewrite_report(p, ATTENTION)
    assert q is p and sum(report.counts.values()) == 0
    assert set(report.not_granted) == {r.name for r in ATTENTION}
    assert report.not_granted["attention_div_mask"] == ATTENTION_ASSUMES
    assert report.not_granted["attention_where"] == ATTENTION_ASSUMES
    # one flag short is not enough; the whole grant fuses
    short = ATTENTION_ASSUMES - {"reassociate"}
    q, report = rewrite_report(p, ATTENTION, short)
    assert q is p and "attention_div_mask" in report.not_granted
    q, report = rewrite_report(p, ATTENTION, ATTENTION_ASSUMES)
    assert dict(report.not_granted) == {} and report.counts["attention_div_mask"] == 1
    assert any("scaled_dot_product_attention" in t for t in _targets(q))
    torch.testing.assert_close(lower(q)(*args), model(*args), **TOL)


def test_the_grant_is_exactly_the_union_of_the_rules_assumptions():
    assert ATTENTION_ASSUMES == frozenset().union(*(r.assumes for r in ATTENTION))
    assert ATTENTION_ASSUMES == {"no_nans", "no_infs", "no_signed_zeros", "reassociate"}
    assert all(r.assumes and r.specials for r in ATTENTION)  # each says what it assumes


def test_a_finite_fill_is_not_fused():
    # where(keep, s, -1e4) weighs a row whose every score is filled evenly: no sdpa mask says it
    keep = _keep()
    keep[0] = False
    args = (*_qkv(), keep)
    model = _Spelled(lambda q, k, v, m: torch.softmax(
        torch.where(m, q @ k.transpose(-2, -1) * 0.5, -1e4), -1) @ v).eval()
    p = import_ep(torch.export.export(model, args))
    q, report = rewrite_report(p, ATTENTION, ATTENTION_ASSUMES)
    assert sum(report.counts.values()) == 0 and q is p


def test_the_bool_mask_rule_is_wrong_without_its_where():
    unguarded = Rule(ATTENTION_WHERE.pattern, ATTENTION_WHERE.replacement,
                     ATTENTION_WHERE.example_inputs, name="where_unguarded",
                     assumes=ATTENTION_WHERE.assumes)
    with pytest.raises(LawViolation, match="where_unguarded"):
        check_rule(unguarded)


def test_the_set_is_a_tuple_of_untrusted_rules_inside_rules():
    assert isinstance(ATTENTION, tuple) and len(ATTENTION) >= 10
    assert all(isinstance(r, Rule) and not r.trusted for r in ATTENTION)
    assert len({r.name for r in ATTENTION}) == len(ATTENTION)
    assert all(r in RULES for r in ATTENTION)


@pytest.mark.parametrize("rule", ATTENTION, ids=lambda r: r.name)
def test_each_rule_passes_check_rule(rule):
    # rewrite runs check_rule on an untrusted rule the first time it meets it and keeps the
    # verdict (a LawViolation would make it raise PassError): the verdict is True
    p = import_ep(torch.export.export(_Spelled(torch.relu), (torch.randn(2),)))
    rewrite_report(p, [rule], ATTENTION_ASSUMES)
    assert rule_verdict(rule) is True


# --- the models -----------------------------------------------------------------------------


def _cases():
    for name in am.ATTENTION_MODELS:
        for level in am.LEVELS:
            # the rest of the matrix: slow and nightly (deselected by default)
            marks = () if (name, level) in CI else (pytest.mark.slow, pytest.mark.nightly)
            yield pytest.param(name, level, marks=marks, id=f"{name}-{level}")


@pytest.mark.parametrize("name,level", list(_cases()))
def test_every_attention_call_is_fused_and_the_model_computes_the_same(name, level):
    count, err, q, _ = am.fuse(name, level, ATTENTION)
    assert count == am.attention_calls(name)
    targets = _targets(q)
    assert sum("scaled_dot_product_attention" in t for t in targets) == count
    assert not any("softmax" in t for t in targets)
    assert err <= 1e-5, f"lowered output differs from eager by {err}"


# --- bench/inductor_attention.py (a smoke run of one rule, without torch.compile) ----------------


def test_the_inductor_bench_loads_a_rule_and_matches_it_at_other_shapes():
    import io

    from bench import inductor_attention as bench

    out = io.StringIO()
    rows = bench.measure([2], inductor=False, max_examples=5, out=out)
    (row,) = rows
    model_args = bench.model_for(bench.rule_from_entry(2, bench.inductor_entries([2])[2]))[1]
    assert model_args[0].shape != (2, 4, 8, 16)  # not the rule's example shape
    assert row["flat"] == (1, 0.0) and row["outlined"] == (1, 0.0)
    assert row["verdict"] == "accepted" and row["inductor"] is None
    assert "| 2 | 1 |" in out.getvalue()


# --- each rule's where, on the values a match binds --------------------------------------------


def _t(*shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype)


_Q, _K = _t(2, 3, 4, 8), _t(2, 3, 6, 8)
_BOOL = torch.bool
WHERE_CASES = [
    # rule, arguments after q, k, v, whether sdpa computes the pattern there
    (ATTENTION_MASK, (_K, _t(2, 1, 1, 6), 0.5), True),
    (ATTENTION_MASK, (_K, _t(4, 6), 0.5), True),  # fewer dimensions broadcast
    (ATTENTION_MASK, (_K, _t(2, 3, 4, 6), 0.5), True),
    (ATTENTION_MASK, (_K, _t(5, 2, 3, 4, 6), 0.5), False),  # enlarges the scores
    (ATTENTION_MASK, (_K, _t(2, 3, 9, 6), 0.5), False),  # does not broadcast
    (ATTENTION_MASK, (_K, _t(2, 1, 1, 6, dtype=torch.float64), 0.5), False),  # promotes
    (ATTENTION_MASK, (_K, _t(2, 1, 1, 6, dtype=_BOOL), 0.5), False),  # bool is no addend
    (ATTENTION_MASK, (_K.double(), _t(2, 1, 1, 6), 0.5), False),  # q, k dtypes differ
    (ATTENTION_MASK, (_t(1, 3, 6, 8), _t(2, 1, 1, 6), 0.5), False),  # batch broadcast
    (ATTENTION_MASK, (_t(2, 3, 6, 7), _t(2, 1, 1, 6), 0.5), False),  # head dims differ
    (ATTENTION_MASK, (_t(3, 6, 8), _t(2, 1, 1, 6), 0.5), False),  # ranks differ
    (ATTENTION_MASK, (_K.long(), _t(2, 1, 1, 6), 0.5), False),
    (ATTENTION_MASK, (None, _t(2, 1, 1, 6), 0.5), False),  # no val
    (ATTENTION_BIAS_MASK, (_K, _t(1, 3, 4, 6), _t(2, 1, 1, 6), 1.0), True),
    (ATTENTION_BIAS_MASK, (_K, _t(1, 3, 4, 6), _t(2, 1, 1, 6, dtype=torch.float16), 1.0),
     False),
    (ATTENTION_BIAS_MASK, (_K, _t(7, 3, 4, 6), _t(2, 1, 1, 6), 1.0), False),
    (ATTENTION_DIV_MASK, (_K, _t(1, 1, 4, 6), 2.0), True),
    (ATTENTION_DIV_MASK, (_K, _t(1, 1, 4, 6), 0.0), False),  # 1 / d
    (ATTENTION_DIV_MASK, (_K, _t(1, 1, 4, 6), -0.0), False),
    (ATTENTION_WHERE, (_K, _t(4, 6, dtype=_BOOL), 0.5, -math.inf), True),
    (ATTENTION_WHERE, (_K, _t(4, 6, dtype=_BOOL), 0.5, -1e4), False),  # a finite fill
    (ATTENTION_WHERE, (_K, _t(4, 6, dtype=_BOOL), 0.5, math.inf), False),
    (ATTENTION_WHERE, (_K, _t(4, 6), 0.5, -math.inf), False),  # not a bool mask
    (ATTENTION_WHERE, (_K, _t(3, 4, 4, 6, dtype=_BOOL), 0.5, -math.inf), False),
    (ATTENTION_MASKED_FILL, (_K, _t(2, 1, 4, 6, dtype=_BOOL), 0.5, -math.inf), True),
    (ATTENTION_SCALED, (_K, 0.5), True),
    (ATTENTION_SCALED, (_t(2, 3, 6, 8, dtype=torch.float16), 0.5), False),
]


@pytest.mark.parametrize("rule,rest,holds", WHERE_CASES,
                         ids=[f"{c[0].name}-{i}" for i, c in enumerate(WHERE_CASES)])
def test_where_admits_exactly_what_sdpa_computes(rule, rest, holds):
    k = rest[0]
    v = None if k is None else torch.zeros((*k.shape[:-1], 5), dtype=k.dtype)
    args = (_Q, k, v, *rest[1:])
    assert bool(rule.where(Match(rule.name, {}, args))) is holds


@pytest.mark.parametrize("rule,rest,holds", [c for c in WHERE_CASES if c[2]],
                         ids=[c[0].name for c in WHERE_CASES if c[2]])
def test_where_it_holds_sdpa_gives_the_pattern(rule, rest, holds):
    g = torch.Generator().manual_seed(1)
    k = torch.randn(rest[0].shape, generator=g)
    v = torch.randn((*k.shape[:-1], 5), generator=g)
    q = torch.randn(_Q.shape, generator=g)
    extra = []
    for x in rest[1:]:
        if isinstance(x, torch.Tensor) and x.dtype == torch.bool:
            x = torch.ones(x.shape, dtype=torch.bool).tril(diagonal=2)  # no empty row
            x = ~x if rule is ATTENTION_MASKED_FILL else x  # it says what to hide
        elif isinstance(x, torch.Tensor):
            x = torch.randn(x.shape, generator=g)
        extra.append(x)
    args = (q, k, v, *extra)
    torch.testing.assert_close(rule.replacement(*args), rule.pattern(*args), **TOL)
