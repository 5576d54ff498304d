"""``saturate`` on attention as transformers writes it: the scale must move before the fusion
in greedy's order, an eval dropout and a ``.to`` sit between softmax and ``@ v`` (the patterns
drop them: the e-graph looks through them, ``egraph.passes_on``), and the fused kernel's result
has other strides than the eager ``@`` (followed up the readers, ``eclass_view.EClassView``). Each guard has
a test that shows it is needed: a ``view`` that the fused result's strides do not admit keeps
the eager code."""

from __future__ import annotations

import attrs
import pytest
import torch
import torch.nn.functional as F

from ir import import_ep
from ir.node import CALL_FUNCTION
from transforms.rewrite import Rule, saturate_report
from transforms.rewrite.check_context import check_extracted
from transforms.rewrite.cost import program_cost
from transforms.rewrite.engine import apply_rules
from transforms.rewrite.rules import ATTENTION, ATTENTION_ASSUMES, ATTENTION_MASK
from transforms.rewrite.search_result import drop_dead

SDPA = torch.ops.aten.scaled_dot_product_attention.default
SOFTMAX = torch.ops.aten.softmax.int
DROPOUT = torch.ops.aten.dropout.default
GRANTED = ATTENTION_ASSUMES | {"reassociate"}

MOVE_SCALE = Rule(lambda a, b, s: (a @ b) * s, lambda a, b, s: (a * s) @ b,
                  (torch.randn(3, 4), torch.randn(4, 5), 0.5), name="move_scale",
                  both_ways=True, specials=False, assumes={"reassociate"}, trusted=True)
"""The scale moved onto the left operand (benefit 0): greedy takes it first, graph order."""


def _trusted(rules) -> list[Rule]:
    return [attrs.evolve(r, trusted=True) for r in rules]  # checked by test_rewrite_attention


def _targets(p) -> list:
    return [n.target for n in p.root_module.graph.nodes if n.op == CALL_FUNCTION]


class Attention(torch.nn.Module):
    """GPT-2's eager attention in miniature: scale after q @ kᵀ, an additive mask, softmax,
    ``.to`` the same dtype, eval dropout, ``@ v`` on heads split by ``transpose`` (so the
    fused kernel lays its result out as its ``q``: (B, L, H, E) in memory); then heads merged as GPT-2 merges them
    (``transpose`` + ``reshape``), or with ``view`` where ``merge="view"``."""

    def __init__(self, merge: str = "reshape") -> None:
        super().__init__()
        self.merge = merge

    def forward(self, q, k, v, mask):
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # heads split as GPT-2 splits them
        w = torch.softmax(q @ k.transpose(-2, -1) * 0.125 + mask, dim=-1).to(torch.float32)
        out = F.dropout(w, 0.1, training=False) @ v
        if self.merge == "view":
            return out.view(out.shape[0], -1)  # needs (B, H, L, E) memory order
        return out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1)


def _inputs():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 16, 4, 8, generator=g) for _ in range(3))  # (B, L, H, E)
    return q, k, v, torch.randn(2, 1, 16, 16, generator=g)


def test_dropout_and_to_between_softmax_and_v_are_looked_through_and_dropped():
    args = _inputs()
    p = import_ep(torch.export.export(Attention().eval(), args))
    assert DROPOUT in _targets(p)
    q, report = saturate_report(p, _trusted([ATTENTION_MASK]), assume=GRANTED)
    assert report.chosen in ("saturate", "greedy") and report.cost_after < report.cost_before
    after = _targets(q)
    assert after.count(SDPA) == 1
    assert SOFTMAX not in after and DROPOUT not in after  # the eager chain is gone whole
    check_extracted(p, q, args, GRANTED, where="attention")


def test_the_fused_results_strides_are_followed_to_the_readers():
    # sdpa's result is laid out (B, L, H, E); transpose + reshape read it as well as the
    # matmul's (B, H, L, E): the class takes the fused value
    args = _inputs()
    p = import_ep(torch.export.export(Attention().eval(), args))
    q, report = saturate_report(p, _trusted([ATTENTION_MASK]), assume=GRANTED)
    assert report.rewrites == {"attention_mask": 1}, report
    assert report.chosen == "saturate"
    nodes = {n.name: n for n in q.root_module.graph.nodes}
    reshape = next(n for n in nodes.values() if n.target == torch.ops.aten.reshape.default)
    assert nodes[nodes[reshape.args[0].name].args[0].name].target == SDPA  # read through
    check_extracted(p, q, args, GRANTED, where="attention-reshape")


def test_a_view_that_the_fused_layout_does_not_admit_keeps_the_eager_code():
    args = _inputs()
    p = import_ep(torch.export.export(Attention(merge="view").eval(), args))
    q, report = saturate_report(p, _trusted([ATTENTION_MASK]), assume=GRANTED)
    assert SDPA not in _targets(q)  # view(B, -1) of sdpa's (B, L, H, E) memory would raise
    assert report.rewrites == {}
    check_extracted(p, q, args, GRANTED, where="attention-view")


def test_drop_dead_of_the_same_program_is_itself():
    p = import_ep(torch.export.export(Attention().eval(), _inputs()))
    assert drop_dead(p, p) is p


# --- GPT-2's own attention code --------------------------------------------------------------------


def _gpt2(layers: int):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=layers,
                                  n_head=2, use_cache=False, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.GPT2Model(cfg).eval()
    ids = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(0))
    return import_ep(torch.export.export(model, (ids,))), (ids,)


def test_gpt2_attention_fuses_where_greedy_moves_the_scale_first():
    p, args = _gpt2(2)
    rules = [MOVE_SCALE, *_trusted(ATTENTION)]
    greedy, _ = apply_rules(p, [attrs.evolve(MOVE_SCALE, both_ways=False), *rules[1:]])
    greedy_cost = program_cost(greedy)
    # greedy moves the scale onto q first (graph order), then only the unscaled rule fuses:
    # the q * s multiply is left over
    assert any(n.target == torch.ops.aten.mul.Tensor and n.args[1] == pytest.approx(8 ** -0.5)
               for n in greedy.root_module.graph.nodes if n.op == CALL_FUNCTION)
    q, report = saturate_report(p, rules, assume=GRANTED)
    assert report.chosen == "saturate" and report.stopped == ("saturated",)
    assert _targets(q).count(SDPA) == 2 and SOFTMAX not in _targets(q)
    assert report.cost_after < greedy_cost < report.cost_before
    assert report.rewrites.get("attention_mask") == 2
    check = torch.ops.aten._assert_tensor_metadata.default
    # the checks of the two softmaxes go with them (drop_dead); those of values still read stay
    assert _targets(q).count(check) == _targets(p).count(check) - 2 > 0
    check_extracted(p, q, args, GRANTED, where="gpt2")


def test_gpt2_under_every_shipped_rule_keeps_the_fused_attention_extracted():
    # the shipped RULES (but CONV_BN), one sequence of four heads: the e-graph fuses both attentions (two
    # e-nodes joined to the eager @ v classes) and extraction keeps them. Before the exact
    # extraction costed what the built program computes (a leaf's reads), the ILP kept the
    # eager chain (the fused attention seemed to pay for the softmax that softmax's dtype
    # check reads) and saturate fell back on greedy's dearer program: chosen "greedy"
    transformers = pytest.importorskip("transformers")
    from transforms.rewrite_rules import RULES

    cfg = transformers.GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_positions=32,
                                  attn_implementation="eager", use_cache=False)
    torch.manual_seed(0)
    model = transformers.GPT2Model(cfg).eval()
    args = (torch.randint(0, 50, (1, 8), generator=torch.Generator().manual_seed(0)),)
    p = import_ep(torch.export.export(model, args))
    # no convolution here: CONV_BN's traced variants would only add seconds of tracing
    rules = _trusted(r for r in RULES if r.name != "conv_bn")
    q, report = saturate_report(p, rules, assume=GRANTED)
    assert report.sizes == ((155, 157, 157),) and report.stopped == ("saturated",)
    assert report.chosen == "saturate" and report.rewrites == {"attention_mask": 2}
    assert _targets(q).count(SDPA) == 2 and SOFTMAX not in _targets(q)
    assert report.greedy_cost is not None and report.cost_after < report.greedy_cost
    check_extracted(p, q, args, GRANTED, where="gpt2, RULES")
