"""Slips in the argument forms models use, each beside its correct twin, written as a user
writes a pass (``transforms.rewrite_nodes``): each is right on the forms a toy model uses and
wrong on another form of the same operator that real models use.

- reductions over several dims: ``mean(x, dims)`` as ``sum(x, dims) / x.shape[dims[-1]]``
  (right for one dim, wrong for two: ``x.mean((2, 3))`` of every CNN's pooling; twin: divides
  by the product of the reduced sizes);
- view arities: ``view(x, shape)`` as ``view(x, [shape[0], -1])``, as if every view were 2-d
  (wrong for a 3-d or 4-d shape; twin: writes ``-1`` for the last size only);
- rounding modes: ``div(a, b, rounding_mode='floor')`` (and ``floor_divide``) as truncation
  (wrong for a negative quotient; twin: swaps the two spellings of floor division);
- optional arguments: ``linear(x, w, b)`` as ``matmul(x, w.t())``, the bias dropped as if it
  were ``None`` (twin: adds it when present); ``mean(x, [d], keepdim)`` as ``sum(x, [d]) /
  n``, ``keepdim`` dropped (twin: passes it on).

A reduced or viewed size that is symbolic (``programs()``' symbolic batch) is left as it is by
every pass here (its size is no literal). Bugs and twins only:
``test_planted_fast_math_and_forms.py`` has the tables and the tests.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ir.args import IList, Ref
from ir.node import Node
from ir.program import Program
from transforms import rewrite_nodes

aten = torch.ops.aten


def _static_dims(e: Any, x: Ref, dims: Any) -> tuple[int, ...] | None:
    """``dims`` of a reduction of ``x`` as non-negative ints whose sizes are all static, else
    None (no dims: every dim, which the passes here leave)."""
    if not isinstance(x, Ref) or not isinstance(dims, (list, tuple, IList)) or not dims:
        return None
    shape = e.val(x).shape
    out = tuple(int(d) % len(shape) for d in dims) if shape else ()
    if not out or any(not isinstance(shape[d], int) for d in out):
        return None
    return out


# --- mean over several dims ---------------------------------------------------------------------


def _mean_operands(node: Node, e: Any) -> tuple[Ref, Any, bool, tuple[int, ...]] | None:
    """``(x, dims, keepdim, static dims)`` of a floating ``mean.dim`` without a ``dtype`` whose
    dims are static; else None."""
    if node.target is not aten.mean.dim or "dtype" in dict(e.kwargs) or len(e.args) < 2:
        return None
    x, dims = e.args[0], e.args[1]
    keepdim = e.args[2] if len(e.args) > 2 else dict(e.kwargs).get("keepdim", False)
    found = _static_dims(e, x, dims)
    if found is None or not e.val(x).dtype.is_floating_point:
        return None
    return x, dims, keepdim, found


def _mean_by_sum(p: Program, every_dim: bool) -> Program:
    def visit(node: Node, e: Any) -> Ref | None:
        operands = _mean_operands(node, e)
        if operands is None:
            return None
        x, dims, keepdim, found = operands
        shape = e.val(x).shape
        n = math.prod(shape[d] for d in found) if every_dim else shape[found[-1]]
        total = e.call(aten.sum.dim_IntList, x, list(dims), keepdim)
        return e.call(aten.div.Tensor, total, float(n))

    return rewrite_nodes(p, visit)


def mean_by_last_dim_size(p: Program) -> Program:
    """Bug: ``mean(x, dims)`` as ``sum(x, dims) / x.shape[dims[-1]]``: right for one dim."""
    return _mean_by_sum(p, every_dim=False)


def mean_by_reduced_size(p: Program) -> Program:
    """``mean(x, dims)`` as ``sum(x, dims)`` over the product of the reduced sizes."""
    return _mean_by_sum(p, every_dim=True)


# --- view arities -------------------------------------------------------------------------------


def _static_shape(shape: Any) -> tuple[int, ...] | None:
    if not isinstance(shape, (list, tuple, IList)) or not shape:
        return None
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
        return None
    return tuple(shape)


def _views(p: Program, as_2d: bool) -> Program:
    def visit(node: Node, e: Any) -> Ref | None:
        if node.target not in (aten.view.default, aten.reshape.default) or len(e.args) != 2:
            return None
        x, shape = e.args
        found = _static_shape(shape)
        if found is None or len(found) < 2 or -1 in found or 0 in found:
            return None
        new = [found[0], -1] if as_2d else [*found[:-1], -1]
        return e.call(node.target, x, new)

    return rewrite_nodes(p, visit)


def view_as_two_dims(p: Program) -> Program:
    """Bug: ``view(x, shape)`` as ``view(x, [shape[0], -1])``: every view 2-d, it thinks."""
    return _views(p, as_2d=True)


def view_infers_last_size(p: Program) -> Program:
    """``view(x, shape)`` as ``view(x, [*shape[:-1], -1])``: the same shape, inferred."""
    return _views(p, as_2d=False)


# --- rounding modes -----------------------------------------------------------------------------


def _floor_operands(node: Node, e: Any) -> tuple[Any, Any] | None:
    if node.target is aten.floor_divide.default and len(e.args) == 2 and not e.kwargs:
        return e.args[0], e.args[1]
    if node.target is aten.div.Tensor_mode and len(e.args) == 2 and \
            dict(e.kwargs).get("rounding_mode") == "floor":
        return e.args[0], e.args[1]
    return None


def floor_division_truncates(p: Program) -> Program:
    """Bug: floor division as ``div(a, b, rounding_mode='trunc')`` (``-7 // 2`` is -4, the
    truncation -3)."""

    def visit(node: Node, e: Any) -> Ref | None:
        found = _floor_operands(node, e)
        if found is None or not isinstance(found[0], Ref):
            return None
        return e.call(aten.div.Tensor_mode, *found, rounding_mode="trunc")

    return rewrite_nodes(p, visit)


def floor_division_respelled(p: Program) -> Program:
    """``div(a, b, rounding_mode='floor')`` as ``floor_divide(a, b)`` and back: one kernel."""

    def visit(node: Node, e: Any) -> Ref | None:
        found = _floor_operands(node, e)
        if found is None or not isinstance(found[0], Ref):
            return None
        if node.target is aten.floor_divide.default:
            return e.call(aten.div.Tensor_mode, *found, rounding_mode="floor")
        scalar = not isinstance(found[1], Ref)
        return e.call(aten.floor_divide.Scalar if scalar else aten.floor_divide.default, *found)

    return rewrite_nodes(p, visit)


# --- optional arguments -------------------------------------------------------------------------


def _linear_by_matmul(p: Program, keep_bias: bool) -> Program:
    def visit(node: Node, e: Any) -> Ref | None:
        if node.target is not aten.linear.default or e.kwargs or len(e.args) not in (2, 3):
            return None
        x, w = e.args[:2]
        bias = e.args[2] if len(e.args) == 3 else None
        if not (isinstance(x, Ref) and isinstance(w, Ref)) or len(e.val(w).shape) != 2:
            return None
        out = e.call(aten.matmul.default, x, e.call(aten.t.default, w))
        if keep_bias and bias is not None:
            out = e.call(aten.add.Tensor, out, bias)
        return out

    return rewrite_nodes(p, visit)


def linear_drops_bias(p: Program) -> Program:
    """Bug: ``linear(x, w, b)`` as ``matmul(x, w.t())``: the bias treated as ``None``."""
    return _linear_by_matmul(p, keep_bias=False)


def linear_by_matmul(p: Program) -> Program:
    """``linear(x, w, b)`` as ``matmul(x, w.t()) + b`` (``b`` when it is there)."""
    return _linear_by_matmul(p, keep_bias=True)


def _mean_of_one_dim(p: Program, keep: bool) -> Program:
    def visit(node: Node, e: Any) -> Ref | None:
        operands = _mean_operands(node, e)
        if operands is None or len(operands[3]) != 1:
            return None
        x, dims, keepdim, found = operands
        n = e.val(x).shape[found[0]]
        total = e.call(aten.sum.dim_IntList, x, list(dims), keepdim if keep else False)
        return e.call(aten.mul.Tensor, total, 1.0 / n)

    return rewrite_nodes(p, visit)


def mean_forgets_keepdim(p: Program) -> Program:
    """Bug: ``mean(x, [d], keepdim)`` as ``sum(x, [d]) * (1 / n)``: ``keepdim`` dropped, so
    ``x - x.mean(-1, keepdim=True)`` broadcasts the wrong way (or not at all)."""
    return _mean_of_one_dim(p, keep=False)


def mean_by_reciprocal(p: Program) -> Program:
    """``mean(x, [d], keepdim)`` as ``sum(x, [d], keepdim) * (1 / n)``."""
    return _mean_of_one_dim(p, keep=True)
