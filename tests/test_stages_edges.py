"""Edge details of ``split_stages``: dynamic micro-batch sizes, which edges may carry a
gradient, and writes through views in the cross-stage write check."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.export import Dim

from bench import stage_cases as sc
from ir import InputConstraintError, PassError, import_ep
from lowering import format_stage_plan, stage_module
from transforms import split_stages, transform


def _dynamic_lm():
    torch.manual_seed(0)
    model = sc.TiedLM().double()
    tok = torch.randint(0, 13, (4, 5))
    mask = torch.ones(4, 5, dtype=torch.float64)
    b = Dim("b", min=2, max=16)
    ep = torch.export.export(
        model, (tok, mask), dynamic_shapes={"tok": {0: b}, "mask": {0: b}}
    )
    return model, import_ep(ep)


@pytest.mark.parametrize("split", [{"at": ["layers.2"]}, {"n": 3, "balance": "flops"}])
def test_dynamic_batch_stages_run_any_size_in_range(split):
    model, p = _dynamic_lm()
    stages = split_stages(p, **split)
    mods = [stage_module(stages, k) for k in range(len(stages))]
    for batch in (2, 7, 16):  # exported with 4
        tok = torch.randint(0, 13, (batch, 5))
        mask = (torch.rand(batch, 5) > 0.3).double()
        acts: tuple = (tok,)
        for m in mods:
            acts = m(*acts, mask=mask)
        torch.testing.assert_close(acts["logits"], model(tok, mask)["logits"])
    tok, mask = torch.randint(0, 13, (17, 5)), torch.ones(17, 5, dtype=torch.float64)
    with pytest.raises(InputConstraintError, match=r"shape\[0\] to be <= 16, but got 17"):
        mods[0](tok, mask=mask)
    with pytest.raises(InputConstraintError, match=r"to be <= 16, but got 17"):
        mods[1](torch.randn(17, 5, 6, dtype=torch.float64), mask=mask)
    # the edge and the keyword input must agree on the batch (one symbol)
    with pytest.raises(InputConstraintError):
        mods[1](torch.randn(3, 5, 6, dtype=torch.float64), mask=torch.ones(5, 5).double())


def test_dynamic_plan_shows_the_symbol():
    _model, p = _dynamic_lm()
    plan = format_stage_plan(split_stages(p, at=["layers.2"]))
    assert "sends to stage 1: tanh_1 (s" in plan


def test_every_floating_edge_may_carry_a_gradient():
    """Export-time ``requires_grad`` and ``detach`` no longer decide: floating edges may carry
    one, integer edges never do."""
    model, ep, *_ = sc.build("nograd_edge", 2, 2)
    stages = split_stages(import_ep(ep), ["layers.1"])
    assert [(e.name, e.grad) for e in stages.edges] == [
        ("tanh", True), ("mean", True), ("argmax", False)
    ]
    del model


def test_unfreezing_after_the_split_gives_earlier_stages_gradients():
    torch.manual_seed(0)
    model = sc.MLP().double()
    for prm in model.layers[0].parameters():
        prm.requires_grad_(False)  # frozen at export
    x = torch.randn(2, 6, dtype=torch.float64)
    stages = split_stages(import_ep(torch.export.export(model, (x,))), ["layers.2"])
    assert all(e.grad for e in stages.edges)
    mods = [stage_module(stages, k) for k in range(2)]
    for m in (mods[0], model):
        for prm in m.layers[0].parameters():
            prm.requires_grad_(True)  # unfrozen after the split
    mods[1](*mods[0](x)).sum().backward()
    model(x).sum().backward()
    got = mods[0].get_parameter("layers.0.lin.weight").grad
    assert got is not None
    torch.testing.assert_close(got, model.layers[0].lin.weight.grad)


class _WriteThroughView(nn.Module):
    """Stage 0 writes a buffer through a slice; stage 1 reads the buffer."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.register_buffer("stats", torch.zeros(6))

    def forward(self, x):
        h = self.a(x)
        self.stats[:3].add_(h.detach().mean())
        return self.b(h) + self.stats


class _WriteThroughSplit(_WriteThroughView):
    def forward(self, x):
        h = self.a(x)
        first, _ = self.stats.view(2, 3).unbind(0)
        first.mul_(0.5)
        return self.b(h) + self.stats


@pytest.mark.parametrize("cls", [_WriteThroughView, _WriteThroughSplit])
def test_writes_through_views_are_writes(cls):
    p = import_ep(torch.export.export(cls(), (torch.randn(2, 6),)))
    for q in (p, transform(p)):
        with pytest.raises(
            PassError, match=r"buffer 'stats' is written in stage\(s\) \[0\] and read or "
            r"written in stage\(s\) \[0, 1\]"
        ):
            split_stages(q, ["b"])


class _SizeAtTheEnd(nn.Module):
    """A dynamic batch size read at the top and used by the last module (``reshape(n * 4)``):
    export makes a ``sym_size`` in stage 0 that the last stage reads."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.c = nn.Linear(4, 4)

    def forward(self, x):
        n = x.shape[0]
        return self.c(self.b(self.a(x))).reshape(n * 4)


@pytest.mark.parametrize("split", [{"at": ["b", "c"]}, {"n": 3}])
def test_a_symbolic_size_is_read_off_the_later_stage_inputs(split):
    torch.manual_seed(0)
    model = _SizeAtTheEnd()
    ep = torch.export.export(
        model, (torch.randn(3, 4),), dynamic_shapes={"x": {0: Dim("b", min=2, max=9)}}
    )
    stages = split_stages(import_ep(ep), **split)
    assert all(isinstance(e.name, str) for e in stages.edges)
    assert not any("sym_size" in e.name for e in stages.edges)  # no scalar edge
    mods = [stage_module(stages, k) for k in range(3)]
    for batch in (2, 5, 9):
        x = torch.randn(batch, 4)
        acts = (x,)
        for m in mods:
            acts = m(*acts)
        torch.testing.assert_close(acts, model(x))
