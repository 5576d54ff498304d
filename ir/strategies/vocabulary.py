"""The fixed vocabulary of generated programs: what their steps call, with what literals.

Data, not code: the operators each kind of step of ``ir.strategies.programs`` picks among
(``UNARY``, ``BINARY``, ...), the literals it passes, the tables its motifs read (views,
in-place writes, masks, softmax targets, the edge values and the readers of a poisoned value),
the widths every activation and state tensor has, and how a node of an operator is named. A
new operator or literal of a step is a new entry here; which entry a step takes is decided by
its bytes, taken modulo the table's length (``ir.strategies.decoding``).
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any

import torch

from ir import signature as sg
from ir import state as stt
from ir.args import IList
from ir.torch_seam import op_schema

WIDTH = 4
"""Feature width of every activation ``(batch, WIDTH)`` and every state vector ``(WIDTH,)``."""

HIDDEN = 256
"""Hidden width of the ``large_linears`` pair: ``(HIDDEN, WIDTH)`` and ``(WIDTH, HIDDEN)``
weights, 1024 elements each (what a pass that targets "large" linears looks for)."""

aten = torch.ops.aten
UNARY = (aten.relu.default, aten.neg.default, aten.tanh.default, aten.sigmoid.default)
ACTIVATIONS = (aten.gelu.default, aten.silu.default)
RANDOM = (aten.rand_like.default, aten.randn_like.default, aten.rand.default)
BUILDERS = (aten.arange.default, aten.ones.default, aten.full.default)
CPU = torch.device("cpu")
BINARY = (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor)
INPLACE = (aten.add_.Tensor, aten.sub_.Tensor)
FUNCTIONAL = (aten.add.Tensor, aten.sub.Tensor)
SCALARS = (0.5, -1.0, 2.0, 0.25)
IDENTITIES = ((aten.mul.Tensor, (1.0,)), (aten.add.Tensor, (0,)), (aten.sub.Tensor, (0.0,)),
              (aten.div.Tensor, (1.0,)), (aten.pow.Tensor_Scalar, (2,)), (aten.mul.Tensor, (2,)),
              (aten.clone.default, ()))
READERS = ((aten.clone.default, ()), (aten.mul.Tensor, (1.0,)))  # (target, literals after x)
# the motif steps' tables: reads of a state vector (target, literals after it); views of a
# ``(batch, WIDTH)`` value and of a ``(WIDTH,)`` one (target, literals after it); in-place
# writes of a view (target, literals after it); comparisons that make a mask; guarded ops
# (nan, inf where the mask is off); fills of a masked position; logits ``a * scale + shift``
# (large ones overflow ``exp`` without the max subtracted, whatever the sign of ``a``; a
# softmax does not change with the shift); softmax targets; int64 ops
STATE_READS = ((aten.mul.Tensor, (2.0,)), (aten.neg.default, ()), (aten.add.Tensor, (0.5,)),
               (aten.tanh.default, ()))
VIEWS_2D = ((aten.slice.Tensor, (1, 0, 2)), (aten.select.int, (0, 0)),
            (aten.diagonal.default, ()), (aten.view.default, ("flat",)))
VIEWS_1D = ((aten.slice.Tensor, (0, 0, 2)), (aten.select.int, (0, 1)),
            (aten.slice.Tensor, (0, 1, WIDTH, 2)), (aten.view.default, (IList((2, 2)),)))
VIEW_WRITES = ((aten.add_.Tensor, (1.0,)), (aten.mul_.Tensor, (-2.0,)), (aten.fill_.Scalar, (0.5,)))
MASKS = (aten.gt.Scalar, aten.lt.Scalar, aten.ge.Scalar, aten.le.Scalar)
GUARDED = (aten.log.default, aten.sqrt.default, aten.reciprocal.default, aten.rsqrt.default)
FILLS = (-math.inf, math.inf, -1e9, math.nan)
LOGITS = ((1.0, 0.0), (1e3, 0.0), (16.0, 1e3), (0.125, 1e3))  # (scale, shift)
SOFTMAX = ((aten.softmax.int, ()), (aten._softmax.default, (False,)),
           (aten.log_softmax.int, ()), (aten._log_softmax.default, (False,)))
INT_OPS = (aten.mul.Tensor, aten.add.Tensor, aten.mul.Tensor, aten.sub.Tensor)
EDGES = (math.inf, -math.inf, math.nan, -0.0, 1e30, 7e4, 1e-40, -3e38)
"""Values at the edges a state tensor holds under ``edge_values``: infinities, nan, a negative
zero, a value past ``float16``'s range (``7e4``) and past ``float32``'s square root, a
denormal, a value near ``float32``'s largest."""
FLOAT32_MAX = torch.finfo(torch.float32).max
POISONS = ((math.inf, -math.inf, math.nan), (FLOAT32_MAX, -FLOAT32_MAX), (-0.0, 1e-40, -1e-40))
"""The values ``edge_operands`` puts in a drawn value, one of each group: one not finite in
one column, ``float32``'s largest (of either sign: its ``exp`` or its double overflows) in
another, and a negative zero or a denormal where the value is past a threshold. So every
value it poisons holds each kind beside ordinary values, and each fast-math fold meets the
value it is wrong on: ``x * 0`` and ``x - x`` an infinity, ``x / x`` an infinity or a zero,
``log(exp(x))`` the largest finite, ``where`` by arithmetic an infinity on the branch it
turns away."""
EDGE_READS: tuple[tuple[Any, tuple], ...] = (
    # the folds fast-math gets wrong on a value at an edge (the step's first reader is one)
    (aten.mul.Tensor, ("x", 0.0)),
    (aten.sub.Tensor, ("x", "x")),
    (aten.div.Tensor, ("x", "x")),
    ((aten.exp.default, aten.log.default), ("x",)),
    (aten.where.self, ("mask", "x", "other")),
    (aten.where.self, ("mask", "other", "x")),
    (aten.mul.Tensor, ("x", 0)),
    # an op of the value twice, and literal edges as a model writes them (its second reader)
    (aten.add.Tensor, ("x", "x")),
    (aten.mul.Tensor, ("x", "x")),
    (aten.maximum.default, ("x", "x")),
    (aten.mul.Tensor, ("x", 1)),
    (aten.mul.Tensor, ("x", -1.0)),
    (aten.mul.Tensor, ("x", math.inf)),
    (aten.add.Tensor, ("x", 0)),
    (aten.add.Tensor, ("x", math.nan)),
    (aten.div.Tensor, ("x", 1.0)),
    (aten.div.Tensor, ("x", -1)),
    (aten.div.Tensor, ("x", 0.0)),
    (aten.div.Tensor, ("x", math.inf)),
    (aten.pow.Tensor_Scalar, ("x", 0)),
    (aten.pow.Tensor_Scalar, ("x", 1)),
    (aten.pow.Tensor_Scalar, ("x", -1)),
    (aten.pow.Tensor_Scalar, ("x", 0.5)),
    (aten.clamp.default, ("x", 0)),
    (aten.clamp.default, ("x", None, 1.0)),
    (aten.clamp.default, ("x", -math.inf, math.inf)),
)
"""What the ``edge_operands`` step reads a poisoned value ``x`` with: ``(target, arguments)``,
``"x"`` the poisoned value, ``"other"`` an earlier value, ``"mask"`` where that one is
positive; a tuple of targets is a chain (``log(exp(x))``). The first :data:`FOLD_READS` rows
are the folds a fast-math pass makes (its first reader is one of them), the rest what models
also write: an op of one value twice, and literal ``0``, ``1``, ``-1``, ``inf``, ``nan`` as
the scalar of ``mul``, ``add``, ``div``, ``pow``, ``clamp``."""
FOLD_READS = 6

STATE_INPUTS = {
    stt.PARAMETER: ("p_", sg.PARAMETER),
    stt.BUFFER: ("b_", sg.BUFFER),
    stt.CONSTANT: ("c_", sg.CONSTANT_TENSOR),
}


@functools.cache
def base_name(target: Any) -> str:
    """What a node of ``target`` is named after: ``getitem``, or the operator's schema name
    (``add_`` for ``aten.add_.Tensor``). Memoized per target."""
    return "getitem" if target is operator.getitem else op_schema(target).name.split("::")[-1]
