"""The fixed vocabulary's steps: what every generated program's bodies are mostly made of.

Each function is one kind of body step of ``ir.strategies.programs``, with the signature of
the motif steps (``ir.strategies.motifs``): it reads ``a`` (and ``y``, ``z``: its variant,
taken modulo what is available), adds its nodes through the builder ``b`` at module ``path``
in ``scope``, and returns a ``(batch, WIDTH)`` value later steps read, or ``None`` where the
step writes state or an input (later steps read the write through the state's value). Which
kinds a body draws among, and how often, is the table of ``ir.strategies.step_kinds``. O(1)
nodes each.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from ir import state as stt
from ir.args import EMPTY_DICT, IDict, Ref
from ir.strategies.builder import ProgramBuilder, Scope
from ir.strategies.decoding import back
from ir.strategies.vocabulary import BINARY, FUNCTIONAL, SCALARS, WIDTH

aten = torch.ops.aten


def unary(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
          z: int) -> Ref:
    """An activation of ``a`` (``relu``, ``neg``, ``tanh``, ``sigmoid``, ``gelu``, ``silu``);
    with ``activations``, half the time of its own result as well."""
    act = b.act()
    out = b.op(b.unary[y % len(b.unary)], (a,), shape=act)
    if "activations" in b.on and z >> 3 & 1:  # stacked: relu(relu(x)), gelu(gelu(x))
        out = b.op(b.unary[y % len(b.unary)], (out,), shape=act)
    return out


def binary(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
           z: int) -> Ref:
    """``add`` / ``sub`` / ``mul`` of ``a`` and an earlier value, a state vector or a scalar
    (either way round); with ``kwargs_ops``, every ``add`` and ``sub`` scaled by an
    ``alpha``."""
    return _of_two(b, path, scope, vectors, a, y, z, scaled=False)


def alpha(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
          z: int) -> Ref:
    """``kwargs_ops``: ``add(a, other, alpha=)``, ``other`` as :func:`binary` draws it, a
    state vector (a bias broadcast over the batch) two times in three where there is one."""
    return _of_two(b, path, scope, vectors, a, y, z, scaled=True)


def _of_two(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int, z: int,
            scaled: bool) -> Ref:
    act = b.act()
    other: Any
    source = z % 3 if vectors else z % 3 % 2 * 2
    if scaled and source == 2 and vectors:
        # an ``alpha`` scales a bias more often than a literal (``add(x, bias, alpha=)``
        # with ``bias`` broadcast over the batch: where a compiler's broadcast path may drop the
        # keyword)
        source = 1
    if source == 0:
        other = back(scope.vals, y)
    elif source == 1:
        other = b.read_state(path, vectors[y % len(vectors)][0])
    else:
        other = SCALARS[y % len(SCALARS)]
    # half the steps of two values take them the other way round (which operand comes
    # first, in the graph's order or its names', is what a pass may get wrong)
    operands = (other, a) if isinstance(other, Ref) and z >> 3 & 1 else (a, other)
    if scaled:
        kwargs = IDict((("alpha", SCALARS[z % len(SCALARS)]),))
        return b.op(aten.add.Tensor, operands, kwargs, shape=act)
    target = BINARY[y % len(BINARY)]
    kwargs = EMPTY_DICT
    if "kwargs_ops" in b.on and target in FUNCTIONAL:
        # every add and sub of these programs scales ``other`` by an ``alpha`` (a keyword a
        # pass may forget: not only the ``alpha`` kind's few steps; the programs without the
        # feature keep the plain calls)
        kwargs = IDict((("alpha", SCALARS[y >> 2]),))
    return b.op(target, operands, kwargs, shape=act)


def matmul(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
           z: int) -> Ref:
    """``matrices``: ``a`` times a ``(WIDTH, WIDTH)`` parameter of the module: ``matmul``,
    ``mm`` of its transpose, or ``linear`` (with a state vector for bias where there is
    one)."""
    act = b.act()
    matrices = [s for s in b.module_state(path) if s[2] == (WIDTH, WIDTH)]
    w = b.read_state(path, matrices[y % len(matrices)][0])
    if z % 3 == 0:
        return b.op(aten.matmul.default, (a, w), shape=act)
    if z % 3 == 1:
        wt = b.op(aten.t.default, (w,), shape=(WIDTH, WIDTH))
        return b.op(aten.mm.default, (a, wt), shape=act)
    bias = (b.read_state(path, vectors[z % len(vectors)][0]),) if vectors else ()
    return b.op(aten.linear.default, (a, w) + bias, shape=act)


def update_buffer(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
                  z: int) -> None:
    """A buffer of the module updated by ``mean(a, [0])``, in the style its tensor has."""
    buffers = [s for s in b.module_state(path) if s[1] == stt.BUFFER]
    b.update(path, buffers[y % len(buffers)][0], a, z)


def update_input(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
                 z: int) -> None:
    """``input_mutation``: a user input plus ``a``, in place or functionally."""
    b.update_input(scope, b.user_inputs[y % len(b.user_inputs)], a, z)


def sort(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
         z: int) -> Ref:
    """``multi_result_ops``: ``sort(a)``, its values read through ``getitem``."""
    act = b.act()
    pair = b.op(aten.sort.default, (a,), shape=("sort", act))
    return b.op(operator.getitem, (pair, 0), shape=act)
