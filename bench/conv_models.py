"""Convolution + batch-norm programs shared by the tests and ``bench.search``: one conv + bn of
given convolution arguments, a small CNN of four pairs (stride, padding, dilation, groups,
``bias=False``) and transformers' ``ResNetModel`` from a small config (16 pairs, no download).
Batch-norm statistics and affine parameters are drawn away from their defaults (a fold of the
defaults would hide a wrong formula)."""

from __future__ import annotations

import torch
from torch import nn

from ir import import_ep
from ir.program import Program

__all__ = ["CNN", "batch_norms", "bn_dear", "conv_bn", "program", "randomize_bn", "resnet_model"]


def bn_dear(target, args, kwargs, val) -> float:
    """A cost model for searching conv + batch-norm folds with state charged: the roofline
    (``transforms.rewrite.cost.roofline``), a batch norm 1000 µs dearer, so that folding it by
    hand at every call pays and the fold's arithmetic shows in the result (the roofline alone
    keeps the batch norm unless the state is frozen: ``saturate(frozen_state=True)``)."""
    from transforms.rewrite.cost import roofline

    dear = 1000.0 if target is torch.ops.aten.batch_norm.default else 0.0
    return roofline(target, args, kwargs, val) + dear


def program(model: nn.Module, x: torch.Tensor) -> Program:
    """``model`` (in eval mode) exported on ``x`` and imported: a flat Program."""
    return import_ep(torch.export.export(model.eval(), (x,)))


def conv_bn(**conv) -> nn.Module:
    """``Conv2d(4, 6, 3, **conv)`` then ``BatchNorm2d(6)`` with drawn running statistics, in
    eval mode."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(4, 6, 3, **conv), nn.BatchNorm2d(6))
    bn = m[1]
    bn.running_mean.normal_()
    bn.running_var.uniform_(0.5, 1.5)
    return m.eval()


class CNN(nn.Module):
    """Four conv + bn pairs: padding 1 with bias; stride 2 without; dilation 2 and groups 4;
    a 1x1 without bias. Input ``(N, 3, H, W)``."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(8)
        self.c3 = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=4)
        self.b3 = nn.BatchNorm2d(8)
        self.c4, self.b4 = nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.b1(self.c1(x)))
        x = torch.relu(self.b2(self.c2(x)))
        x = torch.relu(self.b3(self.c3(x)))
        return self.b4(self.c4(x))


def randomize_bn(model: nn.Module) -> None:
    """Draw every ``BatchNorm2d``'s running statistics and affine parameters (seeded)."""
    torch.manual_seed(1)
    for mod in model.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.normal_()
            mod.running_var.uniform_(0.5, 1.5)
            mod.weight.data.normal_()
            mod.bias.data.normal_()


def resnet_model() -> nn.Module:
    """transformers' ``ResNetModel`` from a small bottleneck config (16 conv + bn pairs; its
    residual adds are in place), batch norms drawn, in eval mode. Input ``(N, 3, 32, 32)``.
    ``ImportError`` without transformers."""
    import transformers

    cfg = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 16, 32],
                                    depths=[1, 1, 1, 1], layer_type="bottleneck")
    torch.manual_seed(0)
    model = transformers.ResNetModel(cfg).eval()
    randomize_bn(model)
    return model


def batch_norms(p: Program) -> int:
    """The number of batch-norm calls in ``p``'s root graph."""
    return sum(1 for n in p.root_module.graph.nodes if "batch_norm" in str(n.target))
