"""Cost models for ``saturate``: what one operator call costs, in microseconds.

A cost model is any ``cost(target, args, kwargs, val) -> float``: ``args`` / ``kwargs`` with
each tensor replaced by its fake value, ``val`` the result's fake value. Two are given:

- ``roofline`` (the default): an analytic roofline, ``LAUNCH_US`` per launched operator plus
  the larger of FLOPs / ``PEAK_FLOPS`` (matrix products, convolutions, attention) and bytes
  moved / ``PEAK_BYTES`` (everything else); views and ``getitem`` are free. Formula and
  constants in ``docs/search.md``.
- ``measured_cost(p)``: each distinct operator of ``p`` timed once at its shapes on the
  program's device; the value returned holds the timings (no process-wide cache).

``program_cost(p, cost)`` sums a model over a program's operator calls *per call of the
program*, as ``lower(p)`` runs it: every call counts, a value computed from state alone
(parameters, buffers and constants the program never writes: ``invariant_values``) included,
since the lowered program computes it again at every call. ``program_cost(p, cost,
frozen_state=True)`` counts such values as free: what the program costs once they are folded
into constants (``fold.fold_into_state``; ``saturate(..., frozen_state=True)`` folds them), for
a caller who will not train or load other weights into the result.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from ir import ops
from ir import signature as sg
from ir.args import Ref, thaw
from ir.effects import graph_effects, is_pure, written_state
from ir.errors import PassError, PurefxError
from ir.fake_run import hint
from ir.graph import Graph
from ir.node import CALL_FUNCTION, PLACEHOLDER
from ir.program import Program

__all__ = [
    "LAUNCH_US", "PEAK_BYTES", "PEAK_FLOPS", "Cost", "MeasuredCost", "call_cost", "invariant_values",
    "measured_cost", "nbytes", "node_cost", "numel", "program_cost", "roofline", "size_hint",
]

Cost = Callable[[Any, tuple, dict, Any], float]

PEAK_FLOPS = 50e12  #: FLOP/s of matrix products (a data-centre GPU's dense fp16/bf16 order)
PEAK_BYTES = 1.5e12  #: bytes/s of memory traffic
LAUNCH_US = 5.0  #: µs per launched operator

_aten = torch.ops.aten
_MATMUL = frozenset({
    _aten.mm.default, _aten.bmm.default, _aten.matmul.default, _aten.addmm.default,
    _aten.baddbmm.default, _aten.linear.default, _aten.addbmm.default,
})
_CONV = frozenset({_aten.convolution.default, _aten.conv2d.default, _aten.conv1d.default,
                   _aten.conv3d.default})
_ATTENTION = frozenset({
    _aten.scaled_dot_product_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
})
_FREE = frozenset({"getitem"})


def size_hint(d: Any) -> int:
    """A size as a plain int: a symbolic size's hint (its value in the example export traced;
    1 when it has none), else ``int(d)``. O(1)."""
    found = hint(d)
    return 1 if found is None else int(found)


def numel(v: Any) -> int:
    """The elements of a fake value: a tensor's (symbolic sizes at ``size_hint``), the sum
    over a tuple or list, 0 for anything else. O(size of the structure)."""
    if isinstance(v, torch.Tensor):
        return math.prod(d if isinstance(d, int) else size_hint(d) for d in v.shape)
    if isinstance(v, (tuple, list)):
        return sum(numel(x) for x in v)
    return 0


def nbytes(v: Any) -> int:
    """The bytes of a fake value, as ``numel`` counts its elements. O(size of the structure)."""
    if isinstance(v, torch.Tensor):
        return numel(v) * v.element_size()
    if isinstance(v, (tuple, list)):
        return sum(nbytes(x) for x in v)
    return 0


def _flops(target: Any, args: tuple, val: Any) -> float:
    """FLOPs of a matrix product, convolution or attention call; 0 for anything else."""
    if target in _MATMUL:
        first = args[1] if target in (_aten.addmm.default, _aten.baddbmm.default,
                                      _aten.addbmm.default) else args[0]
        k = first.shape[-1] if isinstance(first, torch.Tensor) and first.dim() else 1
        return 2.0 * numel(val) * int(k)
    if target in _CONV and len(args) > 1 and isinstance(args[1], torch.Tensor):
        w = args[1]
        return 2.0 * numel(val) * numel(w) / max(int(w.shape[0]), 1)
    if target in _ATTENTION and len(args) > 2:
        q, k = args[0], args[1]
        if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor):
            return 4.0 * numel(q) * int(k.shape[-2])
    return 0.0


def _free(target: Any) -> bool:
    name = getattr(target, "__name__", "")
    return name in _FREE or (
        callable(target) and (ops.is_view(target) or ops.is_alias_like(target))
        and not ops.copy_of(target)
    )


def roofline(target: Any, args: tuple, kwargs: dict, val: Any) -> float:
    """The default cost of one call, in µs: 0 for a view or ``getitem``; else ``LAUNCH_US`` +
    1e6 x max(FLOPs / ``PEAK_FLOPS``, bytes / ``PEAK_BYTES``), FLOPs counted for matrix
    products (2·m·n·k), convolutions (2 · output elements · weight elements / output
    channels) and attention (4 · q elements · keys), bytes as the tensor arguments read plus
    the result written.

    **Laws:** non-negative; a pure function of the targets and the fake values' shapes and
    dtypes. O(arguments)."""
    if _free(target):
        return 0.0
    flops = _flops(target, args, val)
    moved = sum(nbytes(a) for a in args) + sum(nbytes(v) for v in kwargs.values()) + nbytes(val)
    return LAUNCH_US + 1e6 * max(flops / PEAK_FLOPS, moved / PEAK_BYTES)


def node_cost(cost: Cost, target: Any, args: Any, kwargs: Any, val_of: Callable[[str], Any],
              val: Any) -> float:
    """``cost`` of one call whose ``Ref`` arguments are looked up with ``val_of`` (name ->
    fake value). O(arguments)."""
    a = thaw(args, lambda r: val_of(r.name))
    k = thaw(kwargs, lambda r: val_of(r.name))
    return call_cost(cost, target, tuple(a), dict(k), val)


def call_cost(cost: Cost, target: Any, args: tuple, kwargs: dict, val: Any) -> float:
    """``float(cost(target, args, kwargs, val))``; a cost model that raises or returns what is
    not a number is a ``PassError`` naming the operator and what it raised. O(1) besides the
    model."""
    try:
        return float(cost(target, args, kwargs, val))
    except PurefxError:
        raise
    except Exception as exc:
        name = getattr(target, "__name__", None) or str(target)
        raise PassError(
            f"the cost model raised {type(exc).__name__} on {name}: {exc}; a cost model must "
            "return a float for every operator call (cost(target, args, kwargs, val))"
        ) from exc


_STATE_INPUTS = (sg.PARAMETER, sg.BUFFER, sg.CONSTANT_TENSOR)


def invariant_values(p: Program, mid: Any, graph: Graph) -> frozenset[str]:
    """The names of ``graph``'s nodes (of module ``mid`` of ``p``) whose value is the same at
    every call of ``p``: the root graph's placeholders of state that ``p`` never writes
    (parameters, buffers, constants: ``ir.effects.written_state``) and the pure
    ``call_function`` nodes that read such values and nothing else (none written in place:
    ``ir.effects.graph_effects``). Empty for any other graph (a module graph's placeholders are
    its call's arguments).

    **Laws:** a pure function of ``p`` and the graph; a node in the answer reads only nodes in
    the answer. Complexity: O(n α(n))."""
    if mid != p.root or not p.root_module.graphs or graph is not p.root_module.graphs[0]:
        return frozenset()
    specs = {s.name: s for s in p.signature.inputs}
    written = written_state(p)
    effects = graph_effects(p, mid, graph)
    found: set[str] = set()
    for n in graph.nodes:
        if n.op == PLACEHOLDER:
            spec = specs.get(n.name)
            slot = p.state.get(spec.target) if spec is not None and spec.kind in _STATE_INPUTS \
                else None
            if slot is not None and slot.tensor not in written and not effects.is_written(n.name):
                found.add(n.name)
        elif (n.op == CALL_FUNCTION and is_pure(n) and not effects.is_written(n.name)
              and n.inputs() and all(r.name in found for r in n.inputs())):
            found.add(n.name)
    return frozenset(found)


def program_cost(p: Program, cost: Cost | None = None, *, frozen_state: bool = False) -> float:
    """The sum of ``cost`` (default ``roofline``) over the ``call_function`` nodes of every
    distinct graph of ``p`` (a graph shared by several calls counted once), per call, as the
    lowered program runs it: every node counts. With ``frozen_state=True`` the nodes whose
    value is the same at every call (``invariant_values``: computed from unwritten state alone)
    count nothing: the cost once they are folded into constants (``fold.fold_into_state``).

    **Laws:** a pure function of ``p``; ``program_cost(p, c, frozen_state=True) <=
    program_cost(p, c)`` for a non-negative ``c``. O(n α(n))."""
    cost = roofline if cost is None else cost
    total = 0.0
    for mid, mod in p.module_table().items():
        for graph in mod.graphs:
            vals = {n.name: n.meta.get("val") for n in graph.nodes}
            once = invariant_values(p, mid, graph) if frozen_state else frozenset()
            for n in graph.nodes:
                if n.op == CALL_FUNCTION and n.name not in once:
                    total += node_cost(cost, n.target, n.args, n.kwargs, vals.get,
                                       vals.get(n.name))
    return total


class MeasuredCost:
    """A cost model of timings: ``(target, shapes and dtypes)`` -> µs, measured once each.

    Call it as any cost model; a call it has not timed is timed then (on the device of its
    inputs' fake values, with random tensors of their shapes) and remembered in this value
    only. Keep the value to reuse the timings (``saturate(p, rules, cost=m)`` twice).
    Falls back to ``roofline`` for a call that cannot run on random inputs."""

    def __init__(self, repeats: int = 5) -> None:
        self.repeats = repeats
        self.table: dict[tuple, float] = {}

    def __call__(self, target: Any, args: tuple, kwargs: dict, val: Any) -> float:
        if _free(target):
            return 0.0
        key = (target, _shape_key(args), _shape_key(tuple(kwargs.items())))
        found = self.table.get(key)
        if found is None:
            found = self.table[key] = self._time(target, args, kwargs, val)
        return found

    def _time(self, target: Any, args: tuple, kwargs: dict, val: Any) -> float:
        def real(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                shape = [d if isinstance(d, int) else 1 for d in x.shape]
                device = torch.device("cpu") if x.device.type == "meta" else x.device
                if x.dtype.is_floating_point:
                    return torch.rand(shape, dtype=x.dtype, device=device)
                if x.dtype == torch.bool:
                    return torch.ones(shape, dtype=x.dtype, device=device)
                return torch.zeros(shape, dtype=x.dtype, device=device)
            if isinstance(x, (list, tuple)):
                return type(x)(real(y) for y in x)
            return x

        try:
            a = real(args)
            k = {n: real(v) for n, v in kwargs.items()}
            target(*a, **k)  # warm up
            best = math.inf
            for _ in range(self.repeats):
                t0 = time.perf_counter()
                target(*a, **k)
                best = min(best, time.perf_counter() - t0)
            return best * 1e6
        except Exception:  # noqa: BLE001 - an operator that needs real data: the estimate
            return roofline(target, args, kwargs, val)


def measured_cost(repeats: int = 5) -> MeasuredCost:
    """A new ``MeasuredCost``: each distinct operator at its argument shapes and dtypes timed
    once (best of ``repeats`` runs, after one warm-up) the first time a cost is asked of it,
    on the device its fake inputs name; the timings live in the returned value, which the
    caller holds and passes again. O(1); each first call costs its runs."""
    return MeasuredCost(repeats)


def _shape_key(tree: Any) -> Any:
    if isinstance(tree, torch.Tensor):
        return ("T", tuple(int(d) if isinstance(d, int) else str(d) for d in tree.shape),
                str(tree.dtype), str(tree.device))
    if isinstance(tree, (tuple, list)):
        return tuple(_shape_key(x) for x in tree)
    if isinstance(tree, Ref):
        return ("R", tree.name)
    try:
        hash(tree)
    except TypeError:
        return repr(tree)
    return (type(tree).__name__, tree)
