"""Five fast-math folds, each beside its correct twin, written as a user writes a pass
(``transforms.rewrite_nodes``): each fold is right on finite values and wrong where an operand
is at an edge (inf, -inf, nan, -0.0, the largest finite), which is what fast-math flags let a
compiler assume away and what a model's values hold after an overflow, a masked fill or a
division by zero (inductor's own ``x * 0`` fold is ``docs/findings.md``'s finding 9).

- ``x * 0`` as zeros (``inf * 0`` is nan; twin: zeros with ``x``'s sign, nan where ``x`` is
  not finite);
- ``x - x`` as zeros (``inf - inf`` is nan; twin: nan where ``x`` is not finite);
- ``x / x`` as ones (``0 / 0`` and ``inf / inf`` are nan; twin: nan where ``x`` is zero or not
  finite);
- ``where(mask, a, b)`` as ``b + mask * (a - b)``, a lerp (``inf - b`` times a mask of 0 is
  nan; twin: ``where(~mask, b, a)``);
- ``log(exp(x))`` as ``x`` (``exp`` overflows past about 88; twin: ``x + 0.0`` only where
  ``|x| < 80``, the chain elsewhere).

Bugs and twins only: ``test_planted_fast_math_and_forms.py`` has the tables and the tests.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ir.args import Ref
from ir.node import Node
from ir.program import Program
from transforms import rewrite_nodes

aten = torch.ops.aten


def _floating(e: Any, value: Any) -> bool:
    return isinstance(value, Ref) and e.val(value).dtype.is_floating_point


def _zero_literal(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


# --- x * 0 --------------------------------------------------------------------------------------


def _times_zero(node: Node, e: Any) -> Ref | None:
    """``x`` of ``x * 0`` (a literal zero of either type and sign), else None."""
    if node.target not in (aten.mul.Tensor, aten.mul.Scalar) or node.kwargs or len(e.args) != 2:
        return None
    x, k = e.args
    return x if _floating(e, x) and _zero_literal(k) else None


def times_zero_to_zeros(p: Program) -> Program:
    """Bug: ``x * 0`` is ``zeros_like(x)``, it thinks (``inf * 0`` and ``nan * 0`` are nan,
    and ``-2.0 * 0`` is ``-0.0``)."""

    def visit(node: Node, e: Any) -> Ref | None:
        x = _times_zero(node, e)
        return None if x is None else e.call(aten.zeros_like.default, x)

    return rewrite_nodes(p, visit)


def times_zero_minding_edges(p: Program) -> Program:
    """``x * 0`` (a literal ``+0``) as zeros carrying ``x``'s sign, nan where ``x`` is not
    finite: IEEE's product, spelled without the multiplication."""

    def visit(node: Node, e: Any) -> Ref | None:
        x = _times_zero(node, e)
        if x is None or math.copysign(1.0, e.args[1]) < 0:
            return None
        signed = e.call(aten.copysign.Tensor, e.call(aten.zeros_like.default, x), x)
        return e.call(aten.where.ScalarOther, e.call(aten.isfinite.default, x), signed, math.nan)

    return rewrite_nodes(p, visit)


# --- x - x and x / x ----------------------------------------------------------------------------


def _self_operand(node: Node, e: Any, target: Any) -> Ref | None:
    """``x`` of ``target(x, x)`` on a floating ``x`` (``sub`` without an ``alpha``), else None."""
    if node.target is not target or node.kwargs or len(e.args) != 2:
        return None
    x, y = e.args
    return x if _floating(e, x) and x == y else None


def self_difference_to_zeros(p: Program) -> Program:
    """Bug: ``x - x`` is zeros (``inf - inf`` and ``nan - nan`` are nan)."""

    def visit(node: Node, e: Any) -> Ref | None:
        x = _self_operand(node, e, aten.sub.Tensor)
        return None if x is None else e.call(aten.zeros_like.default, x)

    return rewrite_nodes(p, visit)


def self_difference_minding_edges(p: Program) -> Program:
    """``x - x`` as zeros where ``x`` is finite, nan elsewhere (``-0.0 - -0.0`` is ``+0.0``,
    as the zeros are)."""

    def visit(node: Node, e: Any) -> Ref | None:
        x = _self_operand(node, e, aten.sub.Tensor)
        if x is None:
            return None
        zeros = e.call(aten.zeros_like.default, x)
        return e.call(aten.where.ScalarOther, e.call(aten.isfinite.default, x), zeros, math.nan)

    return rewrite_nodes(p, visit)


def self_quotient_to_ones(p: Program) -> Program:
    """Bug: ``x / x`` is ones (``0 / 0``, ``inf / inf`` and ``nan / nan`` are nan)."""

    def visit(node: Node, e: Any) -> Ref | None:
        x = _self_operand(node, e, aten.div.Tensor)
        return None if x is None else e.call(aten.ones_like.default, x)

    return rewrite_nodes(p, visit)


def self_quotient_minding_edges(p: Program) -> Program:
    """``x / x`` as ones where ``x`` is finite and not zero, nan elsewhere (a denormal over
    itself is 1)."""

    def visit(node: Node, e: Any) -> Ref | None:
        x = _self_operand(node, e, aten.div.Tensor)
        if x is None:
            return None
        ordinary = e.call(aten.logical_and.default, e.call(aten.isfinite.default, x),
                          e.call(aten.ne.Scalar, x, 0))
        return e.call(aten.where.ScalarOther, ordinary, e.call(aten.ones_like.default, x),
                      math.nan)

    return rewrite_nodes(p, visit)


# --- where --------------------------------------------------------------------------------------


def _where_operands(node: Node, e: Any) -> tuple[Ref, Ref, Ref] | None:
    if node.target is not aten.where.self or node.kwargs or len(e.args) != 3:
        return None
    mask, a, b = e.args
    if not all(isinstance(v, Ref) for v in (mask, a, b)) or not _floating(e, a):
        return None
    if e.val(a).dtype != e.val(b).dtype or e.val(mask).dtype != torch.bool:
        return None
    return mask, a, b


def where_as_lerp(p: Program) -> Program:
    """Bug: ``where(mask, a, b)`` as ``b + mask * (a - b)``: where ``a`` or ``b`` is inf or nan
    at a position the mask turns away from it, ``0 * inf`` is nan (and ``b + (a - b)`` rounds)."""

    def visit(node: Node, e: Any) -> Ref | None:
        found = _where_operands(node, e)
        if found is None:
            return None
        mask, a, b = found
        m = e.call(aten._to_copy.default, mask, dtype=e.val(a).dtype)
        step = e.call(aten.mul.Tensor, m, e.call(aten.sub.Tensor, a, b))
        return e.call(aten.add.Tensor, b, step)

    return rewrite_nodes(p, visit)


def where_negated(p: Program) -> Program:
    """``where(mask, a, b)`` as ``where(~mask, b, a)``."""

    def visit(node: Node, e: Any) -> Ref | None:
        found = _where_operands(node, e)
        if found is None:
            return None
        mask, a, b = found
        return e.call(aten.where.self, e.call(aten.logical_not.default, mask), b, a)

    return rewrite_nodes(p, visit)


# --- log(exp(x)) --------------------------------------------------------------------------------


def _log_of_exp(p: Program) -> Any:
    """``(node, e) -> x`` of ``log(exp(x))`` on a floating ``x``, else None (the root graph's
    ``exp`` nodes; a flat program's are all there)."""
    exps = {n.name: n.args[0] for n in p.root_module.graph.nodes
            if n.target is aten.exp.default and not n.kwargs}

    def find(node: Node, e: Any) -> Ref | None:
        if node.target is not aten.log.default or node.kwargs or len(e.args) != 1:
            return None
        inner = e.args[0]
        x = exps.get(inner.name) if isinstance(inner, Ref) else None
        return x if isinstance(x, Ref) and _floating(e, x) else None

    return find


def log_of_exp_to_identity(p: Program) -> Program:
    """Bug: ``log(exp(x))`` is ``x`` (``exp`` of the largest finite is inf, ``log`` of it inf;
    ``exp(-1e30)`` is 0, ``log`` of it ``-inf``; ``log(exp(-0.0))`` is ``+0.0``)."""
    find = _log_of_exp(p)

    def visit(node: Node, e: Any) -> Ref | None:
        return find(node, e)

    return rewrite_nodes(p, visit)


def log_of_exp_in_range(p: Program) -> Program:
    """``log(exp(x))`` as ``x`` where ``2**-20 < |x| < 80``, the chain itself elsewhere (nan,
    zeros and the tiny included). Above 80 ``exp`` overflows; below ``2**-24`` it rounds to
    ``1.0``, so ``log(exp(1e-40))`` is ``0.0``, not ``1e-40``: a ``* inf`` downstream makes
    that ``nan`` against ``inf`` (``edge_operands`` drew it, torch 2.14.1, seed 17). Between,
    the chain is ``x`` within an ulp and keeps its sign."""
    find = _log_of_exp(p)

    def visit(node: Node, e: Any) -> Ref | None:
        x = find(node, e)
        if x is None:
            return None
        size = e.call(aten.abs.default, x)
        inside = e.call(aten.logical_and.default, e.call(aten.lt.Scalar, size, 80.0),
                        e.call(aten.gt.Scalar, size, 2.0 ** -20))
        return e.call(aten.where.self, inside, x, node.ref)

    return rewrite_nodes(p, visit)
