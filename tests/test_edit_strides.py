"""Values that never lie, strides included: a replacement of the same dtype and shape but
other strides reaches its readers as a shape change does. Each reader's ``val`` is derived
again (a later ``add`` takes the new strides), and a reader that no longer runs on them (a
``view`` of a transposed value) is a ``PassError`` naming it; the result verifies."""

from __future__ import annotations

import pytest
import torch

from ir import import_ep, verify
from ir.errors import PassError
from lowering import lower
from transforms.edit import rewrite_nodes

A = torch.ops.aten


class _ReluThen(torch.nn.Module):
    def __init__(self, then: str) -> None:
        super().__init__()
        self.then = then

    def forward(self, x):
        r = torch.relu(x)
        return r.view(16) if self.then == "view" else r + 1.0


def _program(then: str):
    return import_ep(torch.export.export(_ReluThen(then), (torch.randn(4, 4),)))


def _column_major(node, e):
    """The ReLU's value again, same dtype and shape, strides (1, 4): t(clone(t(relu)))."""
    if node.target is A.relu.default:
        flipped = e.call(A.clone.default, e.call(A.t.default, node.ref),
                         memory_format=torch.contiguous_format)
        return e.call(A.t.default, flipped)
    return None


def _node(p, target):
    return next(n for n in p.root_module.graph.nodes if n.target is target)


def test_a_reader_of_other_strides_has_its_val_derived_again():
    p = _program("add")
    q = rewrite_nodes(p, _column_major)
    add = _node(q, A.add.Tensor)
    assert tuple(add.meta["val"].stride()) == (1, 4)
    assert tuple(_node(p, A.add.Tensor).meta["val"].stride()) == (4, 1)  # p unchanged
    verify(q, vals=True)
    x = torch.randn(4, 4)
    torch.testing.assert_close(lower(q)(x), torch.relu(x) + 1.0)
    assert lower(q)(x).stride() == (1, 4)


def test_a_view_that_no_longer_runs_on_the_new_strides_is_refused_naming_it():
    p = _program("view")
    with pytest.raises(PassError) as caught:
        rewrite_nodes(p, _column_major)
    assert "at node 'view'" in str(caught.value)
    assert "view" in str(caught.value).split("raises on")[0]
