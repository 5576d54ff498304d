"""How large the values are that a result was computed from: the scale of its rounding error.

A backend rounds at every operator, so the error it may make in a value is a few ulp of the
values *it was computed from*, not of the value itself: ``gelu(x) - gelu(x, approximate='tanh')``
subtracts two values near 0.6 and gives 1e-4, and one ulp of 0.6 in either operand is 6e-4 of
the result. :class:`Magnitudes` watches a run (a ``torch.overrides.TorchFunctionMode``: every
operator call the lowered module makes) and gives each floating tensor it makes an elementwise
**magnitude** ``M``, propagated from the operands:

- an input, a state value, a constant, the result of an operator not below: ``|value|``;
- a pointwise operator (``torch.Tag.pointwise``: add, sub, neg, tanh, where, ...), in place or
  not: ``max(|value|, sum of the operands' M)``, broadcast (the operands' errors add up);
- ``mul``: ``M_a * |b| + |a| * M_b``; ``div``: ``M_a / |b| + |a| * M_b / b**2`` (a scalar
  operand is exact: ``M = 0``);
- a view (its schema's result aliases its first operand: view, permute, expand, select, ...):
  the same view of the operand's M; ``copy_``, ``clone``, ``_to_copy``: the source's M;
- an operator that moves values (``cat``, ``gather``, ``flip``, ``index``, ...) or adds them up
  (``sum``, ``mean``, ``cumsum``): the same operator applied to the operands' M (an M is not
  negative, so a sum of M bounds the sum's error as the operands' bound each term's);
- an operator that picks values along a dimension and says where from (its schema returns
  ``values`` and ``indices``: ``sort``, ``topk``, ``kthvalue``, ``max.dim``, ``cummax``, ...):
  the operand's M at the picked indices.

``lowering.fuzz.judge`` allows ``rtol * M`` more where a first comparison found a difference
(``lowering.fuzz.error_bounds``'s ``rtol``): a cancelling subtraction is judged on its operands'
scale, while a value not computed by cancellation keeps ``M = |value|`` and its tolerance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ir.torch_seam import OpOverload, op_schema

aten = torch.ops.aten

_MUL = frozenset({aten.mul.Tensor, aten.mul.Scalar, aten.mul_.Tensor, aten.mul_.Scalar})
_DIV = frozenset({aten.div.Tensor, aten.div.Scalar, aten.div_.Tensor, aten.div_.Scalar})
_SAME = frozenset({aten.copy_.default, aten.clone.default, aten._to_copy.default,
                   aten.detach.default, aten.lift_fresh_copy.default, aten.contiguous.default})
_LINEAR = frozenset({
    # values moved, none computed
    aten.cat.default, aten.stack.default, aten.flip.default, aten.roll.default,
    aten.gather.default, aten.index_select.default, aten.index.Tensor, aten.take.default,
    aten.repeat.default, aten._unsafe_view.default, aten.take_along_dim.default,
    # values added up (a mean divides the sum by a count)
    aten.sum.default, aten.sum.dim_IntList, aten.mean.default, aten.mean.dim,
    aten.cumsum.default,
})
"""Operators linear in their floating operands with non-negative coefficients: the same
operator applied to the operands' magnitudes is the result's."""


class Magnitudes(TorchFunctionMode):
    """A run's magnitudes (module docstring). Use as ``with Magnitudes() as m: out = fn(*a)``,
    then ``m.of(t)`` for a tensor the run made, read or wrote. Holds every floating tensor the
    run touches until it is dropped (ids stay valid). Per operator call: O(elements)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def of(self, t: Any) -> torch.Tensor | None:
        """The float64 magnitude of ``t`` (same shape), ``None`` for a value that is not a
        floating tensor; ``|t|`` for one the run never made. O(elements)."""
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            return None
        kept = self.seen.get(id(t))
        if kept is not None and kept[0] is t and kept[1].shape == t.shape:
            return kept[1]
        return t.detach().to(torch.float64).abs()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if isinstance(func, OpOverload) and isinstance(out, tuple) and _picks_values(func):
            self._keep(out[0], _picked(self, func, args, kwargs, out))
        elif isinstance(func, OpOverload) and isinstance(out, torch.Tensor) \
                and out.is_floating_point():
            try:
                m = _rule(func)(self, func, args, kwargs, out)
            except Exception:  # noqa: BLE001 - no rule for this call: the value's own size
                m = None
            self._keep(out, m)
        return out

    def _keep(self, out: Any, m: torch.Tensor | None) -> None:
        """Record ``m`` as the magnitude of ``out`` (a floating tensor; anything else is not
        recorded), never below ``|out|``; ``None`` or a wrong shape: ``|out|``."""
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return
        size = out.detach().to(torch.float64).abs()
        if m is None or m.shape != out.shape:
            m = size
        self.seen[id(out)] = (out, torch.maximum(torch.nan_to_num(m, nan=0.0), size))


def _picks_values(func: OpOverload) -> bool:
    """Whether ``func`` returns ``(values, indices)``: values of its first operand picked
    along a dimension, and where from."""
    schema = op_schema(func)
    names = [r.name for r in schema.returns] if schema is not None else []
    return names[:2] == ["values", "indices"]


def _picked(mode: Magnitudes, func: OpOverload, args: tuple, kwargs: dict, out: tuple
            ) -> torch.Tensor | None:
    """The magnitudes of the values ``func`` picked (``out[0]``): its first operand's at
    ``out[1]`` along its ``dim`` (re-inserted where ``keepdim`` is false and the values have
    one dimension fewer). ``None`` where that cannot be read."""
    try:
        values, indices = out[0], out[1]
        m = mode.of(args[0])
        if m is None or not isinstance(indices, torch.Tensor) or m.dim() == 0:
            return None
        schema = op_schema(func)
        bound = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
        bound.update(zip((a.name for a in schema.arguments), args))
        bound.update(kwargs)
        dim = bound.get("dim", -1) % m.dim()
        if indices.dim() < m.dim():
            indices = indices.unsqueeze(dim)
        picked = m.gather(dim, indices)
        return picked.reshape(values.shape)
    except Exception:  # noqa: BLE001 - an operand this reading does not cover: no M
        return None


def _operand(mode: Magnitudes, x: Any, shape: torch.Size) -> torch.Tensor | float:
    m = mode.of(x)
    return 0.0 if m is None else m.expand(shape) if m.shape != shape else m


def _abs(x: Any) -> torch.Tensor | float:
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).abs()
    return abs(x) if isinstance(x, (int, float)) else 0.0


def _pointwise(mode: Magnitudes, func: Any, args: tuple, kwargs: dict, out: torch.Tensor):
    total: torch.Tensor | float = 0.0
    for x in (*args, *kwargs.values()):
        if isinstance(x, torch.Tensor):
            total = total + _operand(mode, x, out.shape)
    return total if isinstance(total, torch.Tensor) else None


def _mul(mode: Magnitudes, func: Any, args: tuple, kwargs: dict, out: torch.Tensor):
    a, b = args[0], args[1]
    return _operand(mode, a, out.shape) * _abs(b) + _abs(a) * _operand(mode, b, out.shape)


def _div(mode: Magnitudes, func: Any, args: tuple, kwargs: dict, out: torch.Tensor):
    a, b = args[0], args[1]
    size = _abs(b)
    return _operand(mode, a, out.shape) / size + _abs(a) * _operand(mode, b, out.shape) / (
        size * size)


def _same(mode: Magnitudes, func: Any, args: tuple, kwargs: dict, out: torch.Tensor):
    source = args[1] if func is aten.copy_.default else args[0]
    m = mode.of(source)
    return None if m is None else m.expand(out.shape).clone()


def _view(mode: Magnitudes, func: Any, args: tuple, kwargs: dict, out: torch.Tensor):
    m = mode.of(args[0])
    return None if m is None else func(m, *args[1:], **kwargs)


def _linear(mode: Magnitudes, func: Any, args: tuple, kwargs: dict, out: torch.Tensor):
    def magnitude(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return mode.of(x)
        if isinstance(x, (list, tuple)):
            return type(x)(magnitude(item) for item in x)
        return x

    return func(*(magnitude(a) for a in args), **{k: magnitude(v) for k, v in kwargs.items()})


def _own(mode: Magnitudes, func: Any, args: tuple, kwargs: dict, out: torch.Tensor):
    return None


def _rule(func: OpOverload) -> Callable:
    if func in _MUL:
        return _mul
    if func in _DIV:
        return _div
    if func in _SAME:
        return _same
    if func in _LINEAR:
        return _linear
    if torch.Tag.pointwise in func.tags:
        return _pointwise
    schema = op_schema(func)
    returns = schema.returns if schema is not None else []
    if returns and returns[0].alias_info is not None and not returns[0].alias_info.is_write:
        return _view
    return _own


__all__ = ["Magnitudes"]
