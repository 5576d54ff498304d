"""The search's caps and deadlines, each reached by a test (issue 54, item 7).

- The layout walk's work cap (``guards.LAYOUT_CAP`` readers followed, in ``eclass_view.EClassView``
  and in ``rewrite``'s ``layout_guard``): a fused attention whose result has other strides is
  taken where its readers are few, and refused where more than the cap would have to be
  followed (a long chain of elementwise readers, each keeping the new layout).
- The ILP's deadline (``extract.exact``: building the integer program counts against its
  seconds; ``extracted.plan`` does not start it once the search's deadline has passed) and its
  cost cap (a finite cost at or above ``extract.CAP`` gives no answer: greedy's choice stands).

The ILP tests need the optional ``scipy`` (the ``test`` extra installs it).
"""

from __future__ import annotations

from types import SimpleNamespace

import attrs
import pytest
import torch

from ir import import_ep
from ir.node import CALL_FUNCTION
from transforms.rewrite import extract, rewrite, saturate_report
from transforms.rewrite import search_result as extracted_mod
from transforms.rewrite.check_context import check_extracted
from transforms.rewrite.egraph import ClassData, EGraph, ENode, leaf
from transforms.rewrite.rules import (
    ATTENTION_ASSUMES,
    ATTENTION_MASK,
    SHARED_INPUT_ASSUMES,
    SHARED_INPUT_MM,
)

SDPA = torch.ops.aten.scaled_dot_product_attention.default
GRANTED = ATTENTION_ASSUMES | {"reassociate"}
RULE = attrs.evolve(ATTENTION_MASK, trusted=True)  # checked by test_rewrite_attention

FEW, MANY = 4, 80
"""Elementwise readers between the attention and its head merge: well under the cap (64, in
both walks), and over it."""


class ChainedAttention(torch.nn.Module):
    """Attention on heads split by ``transpose`` (the fused result is laid out (B, L, H, E)
    in memory, the eager one (B, H, L, E)), then ``n`` elementwise ops, each of which keeps
    its input's layout (so each is a reader the walk must follow), then the heads merged."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, q, k, v, mask):
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        out = torch.softmax(q @ k.transpose(-2, -1) * 0.125 + mask, dim=-1) @ v
        for i in range(self.n):
            out = out + float(i + 1)
        return out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1)


def _program(n: int):
    g = torch.Generator().manual_seed(0)
    args = (*(torch.randn(2, 16, 4, 8, generator=g) for _ in range(3)),
            torch.randn(2, 1, 16, 16, generator=g))
    return import_ep(torch.export.export(ChainedAttention(n).eval(), args)), args


def _sdpas(p) -> int:
    return sum(1 for n in p.root_module.graph.nodes if n.op == CALL_FUNCTION and n.target == SDPA)


@pytest.mark.parametrize("n", [FEW, MANY])
def test_saturate_follows_the_fused_layout_up_to_the_cap(n: int) -> None:
    p, args = _program(n)
    q, report = saturate_report(p, [RULE], assume=GRANTED)
    if n == FEW:
        assert _sdpas(q) == 1 and report.rewrites == {"attention_mask": 1}, report
    else:  # more readers than the cap: refused, though every reader would have admitted it
        assert _sdpas(q) == 0 and report.rewrites == {}, report
    check_extracted(p, q, args, GRANTED, where=f"attention, {n} readers")


@pytest.mark.parametrize("n", [FEW, MANY])
def test_rewrite_follows_the_fused_layout_up_to_the_cap(n: int) -> None:
    p, _ = _program(n)
    q = rewrite(p, [RULE], assume=GRANTED)
    assert _sdpas(q) == (1 if n == FEW else 0)


# --- the ILP ------------------------------------------------------------------------------------


def _scipy() -> None:
    pytest.importorskip("scipy.optimize", reason="the optional extra `search` (scipy)")


def _op(name: str, *children: int) -> ENode:
    from ir.args import EMPTY_DICT, Ref

    canon = tuple(Ref(f"#{i}") for i in range(len(children)))
    return ENode(name, canon, canon, EMPTY_DICT, tuple(children), (name, len(children)))


def _choice_of_two() -> tuple[EGraph, int]:
    """``y`` in ``{f(x), g(x)}``: a class of two e-nodes, the ILP's smallest real choice."""
    eg = EGraph()
    x = eg.add(leaf("x"), ClassData(None, True, "x"))
    y = eg.add(_op("f", x), ClassData(None, False, None))
    eg.union(y, eg.add(_op("g", x), ClassData(None, False, None)))
    eg.rebuild()
    return eg, eg.find(y)


def _cost(n: ENode) -> float:
    return {"f": 3.0, "g": 2.0}.get(n.op, 0.0)


def test_exact_answers_within_a_fraction_of_a_second() -> None:
    _scipy()
    eg, y = _choice_of_two()
    got = extract.exact(eg, [y], _cost, seconds=0.5)
    assert got is not None and got[y].op == "g"


def test_exact_counts_building_the_program_against_its_seconds(monkeypatch) -> None:
    _scipy()
    eg, y = _choice_of_two()
    clock = iter([100.0])  # the start; every later reading is 30 s on
    monkeypatch.setattr(extract, "time", SimpleNamespace(monotonic=lambda: next(clock, 130.0)))
    assert extract.exact(eg, [y], _cost, seconds=10.0) is None
    clock = iter([100.0])
    monkeypatch.setattr(extract, "time", SimpleNamespace(monotonic=lambda: next(clock, 105.0)))
    assert extract.exact(eg, [y], _cost, seconds=10.0) is not None


@pytest.mark.parametrize("big", [extract.CAP, 1e301])
def test_exact_gives_none_at_the_cost_cap(big: float) -> None:
    _scipy()
    eg, y = _choice_of_two()
    assert extract.exact(eg, [y], lambda n: big if n.op == "f" else _cost(n)) is None
    below = extract.exact(eg, [y], lambda n: 1e6 if n.op == "f" else _cost(n))
    assert below is not None and below[y].op == "g"


class _TwoHeads(torch.nn.Module):
    def forward(self, x, w1, w2):
        return torch.relu(x @ w1) + torch.sigmoid(x @ w2)


def _two_heads():
    g = torch.Generator().manual_seed(0)
    args = (torch.rand(4096, 512, generator=g), torch.rand(512, 64, generator=g),
            torch.rand(512, 64, generator=g))
    return import_ep(torch.export.export(_TwoHeads(), args)), args


@pytest.mark.parametrize("late", [False, True])
def test_the_ilp_is_not_started_once_the_search_deadline_has_passed(monkeypatch, late) -> None:
    """Greedy alone keeps both matmuls; with ``together`` off, only the ILP finds the fused
    one. Where extraction begins past the deadline, the ILP is not started (greedy stands)."""
    _scipy()
    p, args = _two_heads()
    monkeypatch.setattr(extract, "together",
                        lambda eg, roots, choice, cost, groups, deadline=None: choice)
    started: list[float] = []
    real = extract.exact

    def spy(*a, **k):
        started.append(k.get("seconds", 0.0))
        return real(*a, **k)

    monkeypatch.setattr(extract, "exact", spy)
    if late:
        monkeypatch.setattr(extracted_mod, "time", SimpleNamespace(monotonic=lambda: 1e12))
    rule = attrs.evolve(SHARED_INPUT_MM, trusted=True)  # checked by test_rules_shared_input_mm
    # the rule assumes SHARED_INPUT_ASSUMES (f0c00d0): ungranted it is never applied, the
    # e-graph holds one e-node per class and the ILP is never in question (deadline or not)
    q, report = saturate_report(p, [rule], assume=SHARED_INPUT_ASSUMES)
    if late:
        assert started == [] and report.extractor == "greedy" and report.rewrites == {}, report
    else:
        assert len(started) == 1 and started[0] > 0 and report.extractor == "ilp", report
        check_extracted(p, q, args, where="two heads")
