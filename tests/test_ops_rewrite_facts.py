"""The op facts the rewrite matcher reads: ``is_commutative``, ``normalized_args``,
``is_core_aten``."""

from __future__ import annotations

import operator

import torch

from ir import ops
from ir.args import IDict

aten = torch.ops.aten


def test_commutative_overloads_and_not_their_scalar_ones():
    for op in (aten.add.Tensor, aten.mul.Tensor, aten.maximum.default, aten.eq.Tensor,
               aten.minimum.default):
        assert ops.is_commutative(op), op
    for op in (aten.add.Scalar, aten.mul.Scalar, aten.sub.Tensor, aten.div.Tensor, aten.mm.default,
               operator.add, aten.relu.default):
        assert not ops.is_commutative(op), op


def test_normalized_args_fill_defaults_and_take_keywords_positionally():
    assert ops.normalized_args(aten.add.Tensor, ("x", "y"), IDict(())) == ("x", "y", 1)
    assert ops.normalized_args(aten.add.Tensor, ("x",), IDict((("other", "y"),))) == (
        "x", "y", 1
    )
    assert ops.normalized_args(aten.softmax.int, ("x", -1), {}) == ("x", -1, None)
    assert ops.normalized_args(aten.relu.default, (), {}) is None  # a required argument missing
    assert ops.normalized_args(aten.relu.default, ("x",), {"bogus": 1}) is None
    assert ops.normalized_args(operator.getitem, ("x", 0), {}) is None  # no schema


def test_core_aten():
    assert ops.is_core_aten(aten.relu.default) and ops.is_core_aten(aten._softmax.default)
    assert not ops.is_core_aten(aten.linear.default)
    assert not ops.is_core_aten(aten.softmax.int)
    assert ops.is_core_aten(operator.getitem)
