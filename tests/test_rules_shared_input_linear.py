"""``SHARED_INPUT_LINEAR`` and ``SHARED_INPUT_LINEAR_NO_BIAS`` (issue 42): ``nn.Linear``
projections of one input (BERT's query, key and value with biases, Llama's without) fuse
into one ``linear`` under ``saturate`` where the roofline says it pays (parameter weights with
the state frozen, ``frozen_state=True``: their ``cat`` folded), pairwise and then the
fused value with the third; checked by ``check_rule`` (through ``saturate``), the in-context law
on the extracted program, and numerics against eager."""

from __future__ import annotations

import pytest
import torch

from ir import import_ep
from lowering import lower
from transforms.rewrite import saturate_report
from transforms.rewrite.check_context import check_extracted
from transforms.rewrite.rules import (
    SHARED_INPUT_ASSUMES,
    SHARED_INPUT_LINEAR,
    SHARED_INPUT_LINEAR_NO_BIAS,
)

RULES = [SHARED_INPUT_LINEAR, SHARED_INPUT_LINEAR_NO_BIAS]


class _QKV(torch.nn.Module):
    def __init__(self, d_in: int, d_out: int, bias: bool) -> None:
        super().__init__()
        self.q = torch.nn.Linear(d_in, d_out, bias=bias)
        self.k = torch.nn.Linear(d_in, d_out, bias=bias)
        self.v = torch.nn.Linear(d_in, d_out, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        return torch.relu(q).sum(-1) + torch.sigmoid(k).sum(-1) + torch.tanh(v).sum(-1)


def _linears(p) -> list:
    return [n for n in p.root_module.graph.nodes if str(n.target) == "aten.linear.default"]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_three_linear_projections_become_one_linear(bias):
    torch.manual_seed(0)
    model = _QKV(512, 64, bias).eval()
    x = torch.randn(4096, 512)
    p = import_ep(torch.export.export(model, (x,)))
    assert len(_linears(p)) == 3
    # the cats folded: constants
    q, report = saturate_report(p, RULES, assume=SHARED_INPUT_ASSUMES, frozen_state=True)
    (fused,) = _linears(q)
    assert tuple(fused.meta["val"].shape) == (4096, 192)
    assert (len(fused.args) == 3 and fused.args[2] is not None) == bias
    name = "shared_input_linear" if bias else "shared_input_linear_no_bias"
    assert dict(report.rewrites)[name] >= 2 and report.cost_after < report.cost_before
    torch.testing.assert_close(lower(q)(x), model(x), atol=1e-3, rtol=1e-4)
    check_extracted(p, q, (torch.randn(8, 512),))


class _QKVInputs(torch.nn.Module):
    def forward(self, x, wq, wk, wv, bq, bk, bv):
        F = torch.nn.functional
        q, k, v = F.linear(x, wq, bq), F.linear(x, wk, bk), F.linear(x, wv, bv)
        return torch.relu(q).sum(-1) + torch.sigmoid(k).sum(-1) + torch.tanh(v).sum(-1)


def test_projections_too_dear_to_fuse_are_left_as_they_are():
    # weights passed as inputs (a cat per call), few rows against large weights: the cats
    # copy more than the launches and the reads of x save (parameter weights pay once the
    # state is frozen: their cat is folded into a constant)
    args = (torch.randn(4, 2048), *(torch.randn(2048, 2048) for _ in range(3)),
            *(torch.randn(2048) for _ in range(3)))
    p = import_ep(torch.export.export(_QKVInputs(), args))
    q, report = saturate_report(p, RULES, assume=SHARED_INPUT_ASSUMES)
    assert q is p and len(_linears(q)) == 3 and report.cost_after == report.cost_before


class _SelfAttention(torch.nn.Module):
    """BERT's self-attention, written out: three biased projections read as heads by
    ``scaled_dot_product_attention`` (no dropout: it draws nothing, so it is no e-graph leaf)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(64, 64) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        heads = [m(x).view(2, 16, 4, 16).transpose(1, 2) for m in (self.q, self.k, self.v)]
        out = torch.nn.functional.scaled_dot_product_attention(*heads)
        return out.transpose(1, 2).reshape(2, 16, 64)


def test_attention_projections_read_as_heads_fuse_in_the_e_graph():
    torch.manual_seed(0)
    model = _SelfAttention().eval()
    x = torch.randn(2, 16, 64)
    p = import_ep(torch.export.export(model, (x,)))
    q, report = saturate_report(p, RULES, assume=SHARED_INPUT_ASSUMES, frozen_state=True)
    assert len(_linears(q)) == 1 and report.chosen == "saturate"
    assert dict(report.rewrites)["shared_input_linear"] >= 2
    torch.testing.assert_close(lower(q)(x), model(x), atol=1e-4, rtol=1e-4)
    check_extracted(p, q, (torch.randn(2, 16, 64),))
