"""What the kernel's test files share: a small flat graph and a listener that records what it hears."""

from __future__ import annotations

import torch

from ir import import_ep


class ReluMul(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2


def relu_mul_graph():
    """The flat root graph of ``relu(x) * 2`` exported at a (3, 4) input."""
    return import_ep(torch.export.export(ReluMul(), (torch.randn(3, 4),))).root_module.graph


class Heard:
    """A ``kernel.Listener`` that records each event as a tuple, in order."""

    def __init__(self):
        self.events = []

    def emitted(self, node):
        self.events.append(("emitted", node.name))

    def erased(self, name):
        self.events.append(("erased", name))

    def replaced(self, old, new):
        self.events.append(("replaced", old, new))
