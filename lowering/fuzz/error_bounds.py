"""How far a backend's result may be from eager's before the fuzzer calls it a finding.

The bound is derived, not tuned: a backend may round differently from eager at every operator
(a fused kernel keeps an intermediate in a register, a vectorized ``tanh`` is a few ulp off) and
may regroup every sum (a reduction or a matmul of ``n`` terms split into other partial sums). A
program's **error budget** counts those places:

    k = 4 + 2 * (compute nodes) + sum over contractions of their length

(a matmul's inner size, a reduction's ratio of input to output elements), capped at
:data:`MOST_ULPS`. A floating result of dtype ``d`` then agrees when, position by position,

    |got - eager| <= eps(d) * k * (scale + |eager|)  +  2 * |eager - exact|

where ``scale`` is the largest finite magnitude of eager's result (its *output scale*) and
``exact`` the same program run eagerly in float64, when that run is possible and a first
comparison without it found a difference (so the backend may be as wrong again as eager is:
cancellation in eager is not the backend's fault). The relative part ``eps(d) * k`` is capped
at :data:`MOST_RELATIVE` of the dtype. For float32 the cap is ``400 * 2**-23 = 4.8e-5`` of the
scale, twice (absolute and relative part): below ``1e-4`` of the output scale, so a float32
difference of ``1e-4`` of the output scale is always a finding. Integers and booleans compare
exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

from ir.fake_run import hint
from ir.graph import Graph
from ir.node import CALL_FUNCTION, Node
from ir.program import Program

MOST_ULPS = 400
"""The largest error budget ``k`` (see the module docstring)."""

MOST_RELATIVE: Mapping[torch.dtype, float] = MappingProxyType({
    torch.float64: 1e-9,
    torch.float32: 5e-5,
    torch.float16: 1e-2,
    torch.bfloat16: 5e-2,
})
"""The largest relative tolerance per dtype, whatever the budget (float32: below ``1e-4``)."""

_CONTRACTIONS = frozenset({
    "aten.mm.default", "aten.matmul.default", "aten.linear.default", "aten.addmm.default",
    "aten.bmm.default", "aten.baddbmm.default", "aten.mv.default", "aten.dot.default",
})


def error_budget(program: Program) -> int:
    """The error budget ``k`` of ``program``'s root graph (module docstring), at least 4 and at
    most :data:`MOST_ULPS`. O(nodes)."""
    graph = program.root_module.graph
    k = 4
    for node in graph.nodes:
        if node.op != CALL_FUNCTION:
            continue
        k += 2 + _contraction(graph, node)
        if k >= MOST_ULPS:
            return MOST_ULPS
    return k


def _contraction(graph: Graph, node: Node) -> int:
    """How many terms one result of ``node`` sums, less one: a matmul's inner size, a
    reduction's input elements per output element; 0 for an elementwise op."""
    out = node.meta.get("val")
    vals = [graph.node(r.name).meta.get("val") for r in node.inputs()]
    tensors = [v for v in vals if isinstance(v, torch.Tensor)]
    if not isinstance(out, torch.Tensor) or not tensors:
        return 0
    first = tensors[0]
    if str(node.target) in _CONTRACTIONS and first.dim() > 0:
        return _size(first.shape[-1]) - 1
    biggest = max(_size(t.numel()) for t in tensors)
    return max(0, biggest // max(1, _size(out.numel())) - 1)


def _size(n: Any) -> int:
    # a symbolic size at its hint: ``int()`` of it would add a guard to the program's shape
    # env and specialize its dynamic dimension for every later lowering
    value = hint(n)
    return int(value) if value is not None else 1


def relative(dtype: torch.dtype, budget: int) -> float:
    """The relative tolerance of a result of ``dtype`` under error budget ``budget``:
    ``eps(dtype) * budget`` capped at :data:`MOST_RELATIVE`; ``0.0`` (exact) for a dtype
    that is not floating. O(1)."""
    if not dtype.is_floating_point:
        return 0.0
    eps = torch.finfo(dtype).eps
    return min(eps * budget, MOST_RELATIVE.get(dtype, eps * MOST_ULPS))


def bounds(want: torch.Tensor, budget: int,
           precision: torch.dtype | None = None) -> tuple[float, float]:
    """``(rtol, atol)`` for comparing a result against eager's ``want``: ``rtol`` from
    :func:`relative` (of ``want``'s dtype, or of ``precision`` where that is a coarser floating
    dtype and ``want`` is floating: the result judged as if computed in ``precision``),
    ``atol = rtol * scale`` with ``scale`` the largest finite magnitude of ``want`` (1 where it
    has none). O(elements)."""
    rtol = relative(want.dtype, budget)
    if rtol and precision is not None:
        rtol = max(rtol, relative(precision, budget))
    if rtol == 0.0:
        return 0.0, 0.0
    w = want.detach().to("cpu", torch.float64)
    finite = w[torch.isfinite(w)]
    scale = float(finite.abs().max()) if finite.numel() else 1.0
    return rtol, rtol * (scale if scale > 0 else 1.0)


__all__ = ["MOST_RELATIVE", "MOST_ULPS", "bounds", "error_budget", "relative"]
