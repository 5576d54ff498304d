"""Five bugs that only a motif shows, each beside its correct twin, written as a user writes a
pass: ``transforms.rewrite_nodes`` and the effect facts of ``ir.effects``.

- a CSE that follows in-place results but counts a write through a view as no write, so two
  equal reads of a base on both sides of ``base[:, :2].add_(1)`` merge (twin: follows views);
- a clone elimination that forwards ``clone(x)`` to ``x`` when the clone is never written,
  forgetting that ``x`` may be written after it (twin: minds writes of the source too);
- products computed in ``float64``, int64 ones included (wrong past ``2**53``; twin: float32
  only, where the product of two float32 values is exact in float64);
- ``where(mask, x, y)`` as ``mask * x + (1 - mask) * y`` (``inf * 0`` is nan; twin:
  ``where(~mask, y, x)``);
- softmax as ``exp(x) / sum(exp(x))``, without the max subtracted (``exp`` overflows on large
  logits; twin: subtracts it).

Bugs and twins only: ``test_planted_motif_bugs.py`` has the tables and the tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ir.args import IDict, IList, Ref
from ir.effects import aliased_args, is_pure, same_tensor, written_args
from ir.node import CALL_FUNCTION, Node
from ir.program import Program
from transforms import rewrite_nodes

aten = torch.ops.aten


def _root_of(p: Program, through_views: bool) -> Callable[[str], str]:
    """``name -> the value whose tensor it is``: through in-place results (``add_(x, y)`` is
    ``x``) and, when ``through_views``, through views (``slice(x)`` is memory of ``x``)."""
    node_of = p.root_module.graph.by_name().get

    def root(name: str) -> str:
        seen: set[str] = set()
        while name not in seen:
            seen.add(name)
            node = node_of(name)
            if node is None:
                return name
            inner = same_tensor(node)
            if (inner is None and through_views and node.args and isinstance(node.args[0], Ref)
                    and node.args[0].name in aliased_args(node)):
                inner = node.args[0].name  # a view (``ir.effects.is_view`` counts ``clone`` in)
            if inner is None:
                return name
            name = inner
        return name

    return root


def _written_roots(p: Program, root: Callable[[str], str]) -> set[str]:
    return {root(w) for n in p.root_module.graph.nodes for w in written_args(n)}


def _key(value: Any) -> Any:
    """A CSE key that keeps literal types (``2`` and ``2.0`` differ; ``-0.0`` and ``0.0`` too)."""
    if isinstance(value, Ref):
        return ("ref", value.name)
    if isinstance(value, (tuple, list, IList)):
        return tuple(_key(v) for v in value)
    if isinstance(value, (dict, IDict)):
        return tuple((k, _key(v)) for k, v in dict(value).items())
    return (type(value).__name__, repr(value))


# --- common-subexpression elimination that minds writes -----------------------------------------


def _cse(p: Program, through_views: bool) -> Program:
    root = _root_of(p, through_views)
    written = _written_roots(p, root)
    seen: dict[Any, tuple[Ref, set[str]]] = {}  # key -> (value, the tensors it reads)

    def visit(node: Node, e: Any) -> Ref | None:
        if node.op != CALL_FUNCTION:
            return None
        hit = {root(w) for w in written_args(node)}
        if hit:  # a write: what was read of the written tensors is stale
            for key in [k for k, (_, reads) in seen.items() if reads & hit]:
                del seen[key]
            return None
        if not is_pure(node) or root(node.name) in written:
            return None
        key = (node.target, _key(tuple(e.args)), _key(dict(e.kwargs)))
        if key in seen:
            return seen[key][0]
        seen[key] = (node.ref, {root(r.name) for r in node.inputs()})
        return None

    return rewrite_nodes(p, visit)


def cse_minding_views(p: Program) -> Program:
    """Merges equal pure calls, unless a write between them reaches what they read (a write
    through a view writes its base) or the value is written itself."""
    return _cse(p, through_views=True)


def cse_blind_to_view_writes(p: Program) -> Program:
    """Bug: follows in-place results but not views, so ``c[:, :2].add_(1)`` writes ``c``
    for no one, and ``c * 2`` before and after it merge."""
    return _cse(p, through_views=False)


# --- clone elimination --------------------------------------------------------------------------


def _drop_clones(p: Program, mind_source: bool) -> Program:
    root = _root_of(p, through_views=True)
    written = _written_roots(p, root)
    # a clone the program returns (or a view of it) stays: forwarded, the output would share
    # the memory of its source (a parameter, an input) where the program returned a new tensor
    returned = {root(s.name) for s in p.signature.outputs if s.name}

    def visit(node: Node, e: Any) -> Ref | None:
        if (node.target is not aten.clone.default or not isinstance(node.args[0], Ref)
                or node.kwargs or root(node.name) in written | returned):
            return None
        if mind_source and root(node.args[0].name) in written:
            return None
        return e.args[0]

    return rewrite_nodes(p, visit)


def drop_unwritten_clones(p: Program) -> Program:
    """``clone(x)`` is ``x`` where neither the clone nor ``x`` (nor what it is a view of) is
    ever written."""
    return _drop_clones(p, mind_source=True)


def drop_clones_of_written_sources(p: Program) -> Program:
    """Bug: minds writes of the clone only; ``c = x.clone(); x.add_(1)`` loses ``c``'s old
    value."""
    return _drop_clones(p, mind_source=False)


# --- products in double -------------------------------------------------------------------------


def _mul_in_double(p: Program, dtypes: frozenset) -> Program:
    def visit(node: Node, e: Any) -> Ref | None:
        if node.target is not aten.mul.Tensor or node.kwargs or len(e.args) != 2:
            return None
        a, b = e.args
        if not (isinstance(a, Ref) and isinstance(b, Ref)):
            return None
        dtype = e.val(a).dtype
        if dtype not in dtypes or e.val(b).dtype != dtype:
            return None
        wide = [e.call(aten._to_copy.default, v, dtype=torch.float64) for v in (a, b)]
        return e.call(aten._to_copy.default, e.call(aten.mul.Tensor, *wide), dtype=dtype)

    return rewrite_nodes(p, visit)


def float_products_in_double(p: Program) -> Program:
    """float32 ``mul`` of two tensors computed in float64 and rounded back: the product of two
    float32 values is exact in float64, so the rounded result is float32's own."""
    return _mul_in_double(p, frozenset({torch.float32}))


def int_products_in_double(p: Program) -> Program:
    """Bug: int64 products too; float64 holds integers exactly only up to ``2**53``."""
    return _mul_in_double(p, frozenset({torch.float32, torch.int64}))


# --- where --------------------------------------------------------------------------------------


def _where_operands(node: Node, e: Any) -> tuple[Ref, Ref, Ref] | None:
    if node.target is not aten.where.self or len(e.args) != 3:
        return None
    mask, x, y = e.args
    if not all(isinstance(v, Ref) for v in (mask, x, y)):
        return None
    if e.val(x).dtype != e.val(y).dtype or not e.val(x).dtype.is_floating_point:
        return None
    return mask, x, y


def where_swapped(p: Program) -> Program:
    """``where(mask, x, y)`` as ``where(~mask, y, x)``."""

    def visit(node: Node, e: Any) -> Ref | None:
        found = _where_operands(node, e)
        if found is None:
            return None
        mask, x, y = found
        return e.call(aten.where.self, e.call(aten.logical_not.default, mask), y, x)

    return rewrite_nodes(p, visit)


def where_by_arithmetic(p: Program) -> Program:
    """Bug: ``where(mask, x, y)`` as ``mask * x + (1 - mask) * y``: where ``x`` or ``y`` is
    inf or nan at a position the mask turns away, ``0 * inf`` is nan."""

    def visit(node: Node, e: Any) -> Ref | None:
        found = _where_operands(node, e)
        if found is None:
            return None
        mask, x, y = found
        m = e.call(aten._to_copy.default, mask, dtype=e.val(x).dtype)
        kept = e.call(aten.mul.Tensor, m, x)
        other = e.call(aten.mul.Tensor, e.call(aten.rsub.Scalar, m, 1.0), y)
        return e.call(aten.add.Tensor, kept, other)

    return rewrite_nodes(p, visit)


# --- softmax ------------------------------------------------------------------------------------


def _softmax(p: Program, subtract_max: bool) -> Program:
    def visit(node: Node, e: Any) -> Ref | None:
        if node.target is aten.softmax.int and len(e.args) == 2 and not e.kwargs:
            x, dim = e.args
        elif node.target is aten._softmax.default and e.args[2] is False:
            x, dim, _ = e.args
        else:
            return None
        if not e.val(x).dtype.is_floating_point:
            return None
        if subtract_max:
            x = e.call(aten.sub.Tensor, x, e.call(aten.amax.default, x, [dim], True))
        exp = e.call(aten.exp.default, x)
        return e.call(aten.div.Tensor, exp, e.call(aten.sum.dim_IntList, exp, [dim], True))

    return rewrite_nodes(p, visit)


def softmax_decomposed(p: Program) -> Program:
    """``softmax(x, d)`` as ``exp(x - max(x, d)) / sum(..., d)``."""
    return _softmax(p, subtract_max=True)


def softmax_without_max(p: Program) -> Program:
    """Bug: ``exp(x) / sum(exp(x), d)``: ``exp`` overflows to inf past about 88, and inf / inf
    is nan."""
    return _softmax(p, subtract_max=False)
