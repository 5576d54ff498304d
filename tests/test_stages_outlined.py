"""``split_stages`` of an outlined program: it is inlined with each node restacked to the call
it ran in (``transforms.inline.restacked``), so cuts follow the calls of a deduplicated program
(whose shared graph's nodes were recorded for one call) and the plumbing of preserved calls
runs in the stage that holds it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ir import import_ep, verify
from lowering import stage_module
from transforms import split_stages, transform


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x)) + x


class Stack(nn.Module):
    """Three blocks, the last the first one's object again (one module at two paths)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(2))
        self.again = self.layers[0]

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.again(x).sum(-1)


def _program(preserve=()):
    torch.manual_seed(0)
    model = Stack().eval()
    x = torch.randn(2, 4)
    ep = torch.export.export(model, (x,), preserve_module_call_signature=preserve)
    return model, x, import_ep(ep)


def _run(stages, x):
    acts = (x,)
    for k in range(len(stages)):
        out = stage_module(stages, k)(*acts)
        acts = out
    return out


@pytest.mark.parametrize("at", [["again"], ["layers.1"], ["layers.1", "again"]])
def test_a_shared_module_is_cut_at_its_call_not_at_its_graph(at):
    model, x, p = _program()
    q = transform(p)
    # one module at two paths: one graph, whose nodes name the path first recorded
    assert q.resolve("again") == q.resolve("layers.0")
    stages = split_stages(q, at)
    flat = split_stages(p, at)
    assert stages.modules == flat.modules and stages.inputs == flat.inputs
    assert stages.state == flat.state
    for program in stages.programs:
        verify(program)
    torch.testing.assert_close(_run(stages, x), model(x))


@pytest.mark.parametrize("at", [["layers.1"], ["again"]])
def test_a_transformed_program_with_a_preserved_call(at):
    model, x, p = _program(preserve=("layers.1",))
    stages = split_stages(transform(p), at)
    for program in stages.programs:
        verify(program)
    torch.testing.assert_close(_run(stages, x), model(x))
