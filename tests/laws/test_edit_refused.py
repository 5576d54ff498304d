"""An edit purefx's editor refuses is a bug found, not a program declined: ``rewrite_nodes``
raises ``EditRefused`` (a ``PassError``) for a wrong edit, and ``check_laws`` reports it as the
law ``"edit_refused"`` with the editor's words and the program, even under
``allowed_errors=(PassError,)``; a pass's own ``PassError`` is still a program it declines."""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st
from torch import nn
from torch.export import Dim

from ir import import_ep
from ir.errors import EditRefused, PassError
from lowering.pass_laws import LawViolation, check_laws
from transforms.edit import Edit, rewrite_nodes

aten = torch.ops.aten


def _bn_program():
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(3).train()
    return import_ep(torch.export.export(bn, (torch.randn(4, 3),)))


def _relu_program(dynamic: bool):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    shapes = {"input": {0: Dim("b", min=2, max=32)}} if dynamic else None
    return import_ep(torch.export.export(model, (torch.randn(5, 4),), dynamic_shapes=shapes))


def batch_norm_running_mean_only(p):
    """Replace a train-mode batch norm by explicit ops, re-doing the ``running_mean`` write and
    forgetting ``running_var``'s (the bug)."""

    def visit(node, e: Edit):
        if node.target is not aten.batch_norm.default:
            return None
        x, weight, bias, rmean, _rvar, training, momentum, eps = e.args[:8]
        if training is not True:
            return None
        mean = e.call(aten.mean.dim, x, [0])
        var = e.call(aten.var.correction, x, [0], correction=0)
        e.write_buffer(rmean, e.call(aten.add.Tensor, e.call(aten.mul.Tensor, rmean,
                                                             1 - momentum),
                                     e.call(aten.mul.Tensor, mean, momentum)))
        y = e.call(aten.mul.Tensor, e.call(aten.sub.Tensor, x, mean),
                   e.call(aten.rsqrt.default, e.call(aten.add.Tensor, var, eps)))
        return e.call(aten.add.Tensor, e.call(aten.mul.Tensor, y, weight), bias)

    return rewrite_nodes(p, visit)


def relu_viewed_by_batch(p):
    """View each ReLU's result as ``(batch, -1)``, the batch read as an int (the bug, on a
    dynamic batch: it fixes the size; on a static one the view is right)."""

    def visit(node, e: Edit):
        if node.target is aten.relu.default:
            n = int(e.val(node.ref).shape[0])
            return e.call(aten.view.default, node.ref, [n, -1])
        return None

    return rewrite_nodes(p, visit)


def relu_as_clamp_or_decline(p):
    """A right pass that declines, with its own ``PassError``, a program without a ReLU."""
    if not any(n.target is aten.relu.default for n in p.root_module.graph.nodes):
        raise PassError("relu_as_clamp: no relu in this program; it declines it")

    def visit(node, e: Edit):
        if node.target is aten.relu.default:
            return e.call(aten.clamp_min.default, e.args[0], 0.0)
        return None

    return rewrite_nodes(p, visit)


def _refused(pass_fn, program) -> LawViolation:
    with pytest.raises(LawViolation) as caught:
        check_laws(pass_fn, programs=st.just(program), max_examples=1,
                   allowed_errors=(PassError,))
    return caught.value


def test_a_write_left_undone_is_a_violation_under_allowed_pass_errors():
    p = _bn_program()
    with pytest.raises(EditRefused, match="running_var"):
        batch_norm_running_mean_only(p)
    found = _refused(batch_norm_running_mean_only, p)
    assert found.law == "edit_refused"
    text = str(found)
    assert "editor refused" in text and "would be lost" in text and "running_var" in text
    assert "input program:" in text and found.program is p


def test_a_fixed_dynamic_size_is_a_violation_under_allowed_pass_errors():
    p = _relu_program(dynamic=True)
    found = _refused(relu_viewed_by_batch, p)
    assert found.law == "edit_refused"
    assert "would fix the dynamic size" in str(found) and "input program:" in str(found)
    # on a static batch the same pass is right: nothing to refuse
    report = check_laws(relu_viewed_by_batch, programs=st.just(_relu_program(dynamic=False)),
                        max_examples=1, allowed_errors=(PassError,))
    assert report.changed == 1


def test_a_replacement_of_another_shape_where_a_signature_names_it_is_refused():
    def summed(node, e: Edit):
        if node.target is aten.relu.default:  # the program's output
            return e.call(aten.sum.default, node.ref)
        return None

    with pytest.raises(EditRefused, match="signature names"):
        rewrite_nodes(_relu_program(dynamic=False), summed)


def test_a_pass_that_declines_on_its_own_is_still_declined():
    plain = import_ep(torch.export.export(nn.Linear(4, 3), (torch.randn(5, 4),)))
    with pytest.raises(PassError) as caught:
        relu_as_clamp_or_decline(plain)
    assert type(caught.value) is PassError  # its own, not the editor's
    report = check_laws(relu_as_clamp_or_decline, programs=st.just(plain), max_examples=1,
                        allowed_errors=(PassError,), allow_vacuous=True)
    assert report.declined == report.tried == 1
    report = check_laws(relu_as_clamp_or_decline,
                        programs=st.just(_relu_program(dynamic=False)), max_examples=1,
                        allowed_errors=(PassError,))
    assert report.changed == 1 and report.declined == 0


def test_naming_edit_refused_outright_declines_it():
    report = check_laws(batch_norm_running_mean_only, programs=st.just(_bn_program()),
                        max_examples=1, allowed_errors=(EditRefused,), allow_vacuous=True)
    assert report.declined == 1
