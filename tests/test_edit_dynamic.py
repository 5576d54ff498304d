"""A pass never writes its input, at any size of a dynamic dimension.

A program's vals share one fake mode and shape env with the ExportedProgram they came from; a
guard recorded there (``s0 == 5``) would fix the batch of the input program too. The editor's
fake runs refuse such guards (``ir.fake_run.guards_refused``), ``e.apply`` traces at dynamic
sizes (``torch.export.Dim`` per symbol), and a pass that would fix a size is a ``PassError``
naming the node and the dimension; the input program runs at other sizes after every pass.
"""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

from ir import import_ep
from ir.errors import PassError
from lowering import lower
from transforms.edit import rewrite_nodes

RELU = torch.ops.aten.relu.default


class _LinearRelu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.lin(x))


def _dynamic():
    """A fresh export (its own shape env) of Linear + ReLU at batch 5, batch in 2..32."""
    torch.manual_seed(0)
    model = _LinearRelu()
    ep = torch.export.export(model, (torch.randn(5, 4),),
                             dynamic_shapes={"x": {0: Dim("b", min=2, max=32)}})
    return model, ep, import_ep(ep)


def _runs_at(p, batch: int) -> torch.Tensor:
    return lower(p)(torch.ones(batch, 4))


def _at_relu(fn):
    def visit(node, e):
        if node.target is RELU:
            return fn(node, e)
        return None

    return visit


def test_apply_traces_at_dynamic_sizes_and_leaves_the_input_dynamic():
    model, ep, p = _dynamic()
    q = rewrite_nodes(p, _at_relu(lambda node, e: e.apply(lambda x: x * 1.0, node.ref)))
    assert q is not p
    for batch in (2, 9, 32):
        want = model(torch.ones(batch, 4))
        torch.testing.assert_close(_runs_at(q, batch), want)
        torch.testing.assert_close(_runs_at(p, batch), want)
    assert ep.module()(torch.ones(9, 4)).shape == (9, 3)


def test_apply_that_reads_sizes_symbolically_holds_at_every_size():
    model, _, p = _dynamic()

    def per_row_mean(x):
        return x.reshape(x.shape[0], -1) / x.shape[0]

    q = rewrite_nodes(p, _at_relu(lambda node, e: e.apply(per_row_mean, node.ref)))
    for batch in (3, 5, 11):
        torch.testing.assert_close(_runs_at(q, batch), model(torch.ones(batch, 4)) / batch)


def test_int_of_a_dynamic_size_in_a_visit_is_a_pass_error_naming_node_and_dimension():
    _, _, p = _dynamic()

    def visit(node, e):
        if node.target is RELU:
            int(e.val(node.ref).shape[0])  # fixes the batch

    with pytest.raises(PassError) as caught:
        rewrite_nodes(p, visit)
    text = str(caught.value)
    assert "visit at node 'relu'" in text
    assert "dimension 0 of input %x, 2..32" in text and "e.call" in text
    assert _runs_at(p, 9).shape == (9, 3)  # the input keeps its dynamic batch


def test_apply_that_fixes_a_size_is_a_pass_error_and_the_input_is_unchanged():
    _, _, p = _dynamic()
    with pytest.raises(PassError) as caught:
        rewrite_nodes(p, _at_relu(lambda node, e: e.apply(lambda x: x.view(5, 3), node.ref)))
    text = str(caught.value)
    assert "e.apply at node 'relu'" in text and "dimension 0 of input %x" in text
    assert "keep fn's sizes symbolic" in text
    assert _runs_at(p, 9).shape == (9, 3)


def test_call_whose_operator_needs_a_guard_is_a_pass_error():
    _, _, p = _dynamic()
    view = torch.ops.aten.view.default
    with pytest.raises(PassError) as caught:
        rewrite_nodes(p, _at_relu(lambda node, e: e.call(view, node.ref, [5, 3])))
    assert "aten.view.default at node 'relu' would fix the dynamic size" in str(caught.value)
    assert _runs_at(p, 9).shape == (9, 3)


def test_a_comparison_the_programs_range_decides_is_no_guard():
    """``batch >= 2`` holds over the whole range 2..32: the env proves it, nothing is fixed."""
    model, _, p = _dynamic()

    def visit(node, e):
        if node.target is RELU and e.val(node.ref).shape[0] >= 2:
            return e.call(torch.ops.aten.mul.Tensor, node.ref, 2.0)
        return None

    q = rewrite_nodes(p, visit)
    torch.testing.assert_close(_runs_at(q, 9), 2 * model(torch.ones(9, 4)))
    assert _runs_at(p, 7).shape == (7, 3)


def test_call_at_dynamic_sizes_keeps_both_programs_dynamic():
    model, _, p = _dynamic()
    q = rewrite_nodes(p, _at_relu(
        lambda node, e: e.call(torch.ops.aten.mul.Tensor, node.ref, 1.0)))
    torch.testing.assert_close(_runs_at(q, 17), model(torch.ones(17, 4)))
    assert _runs_at(p, 17).shape == (17, 3)
