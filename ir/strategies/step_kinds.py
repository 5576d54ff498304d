"""What a generated program's body steps may be, and how often: the step kinds as data.

One row per kind of body step of ``ir.strategies.programs``: its name, the function that
builds it (``ir.strategies.vocabulary_steps``, ``ir.strategies.motifs``,
``ir.strategies.opset_calls``), the feature that switches it on, its weight among the kinds a
body draws (a kind of weight 2 is drawn twice as often as one of weight 1), its role, and
what else it needs of the module and the scope it runs in. A new kind of step is a function
and a row (the decoder's ``_step`` names two kinds only: the first ``unary`` step of a module
with the large linears' pair is ``mlp``, and ``opset`` has a share of its own besides).

Roles say where a kind is drawn besides the body's draws among the kinds available
(:func:`pick_kind`):

``PLAIN``
    only there.
``TARGETED``
    what users' passes rewrite: also one step of its own at a drawn place of the root's body,
    for ``TARGETED_STEPS`` of the features switched on (``programs._Decoder._draw_body``).
``MOTIF``
    what bugs need (state and alias traffic, everyday ops, values at the edges): the motifs
    switched on share one slot of the body's draws, and each also has a step of its own at a
    drawn place of the root's body.
``OPSET``
    a call of the verified table: also one body step in ``OPSET_SHARE``, and the closing run
    of the root's body.

The order of the rows is the order of the kinds a body draws among: a step's kind byte picks
entry ``byte mod entries``. A row added keeps each other kind's share of the draws (its weight
over the total); which kind one byte picks moves, as any change of the table moves the program
a given byte string decodes to (a new ``TARGETED`` row also adds four bytes to the targeted
steps' draw).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ir import state as stt
from ir.strategies import motifs, vocabulary_steps
from ir.strategies.builder import ProgramBuilder, Scope
from ir.strategies.opset_calls import opset_step
from ir.strategies.vocabulary import WIDTH

PLAIN = "plain"
TARGETED = "targeted"
MOTIF = "motif"
OPSET = "opset"
MOTIF_SLOT = "motif"
"""The one entry of the body's kinds that the motifs switched on share."""


def _anywhere(b: ProgramBuilder, state: list, scope: Scope) -> bool:
    return True


def _has_matrices(b: ProgramBuilder, state: list, scope: Scope) -> bool:
    return any(s[2] == (WIDTH, WIDTH) for s in state)


def _has_updatable_buffers(b: ProgramBuilder, state: list, scope: Scope) -> bool:
    return any(s[1] == stt.BUFFER for s in state) and bool(b.styles_on())


def _has_user_inputs(b: ProgramBuilder, state: list, scope: Scope) -> bool:
    # never in a preserved call: its inputs are what its signature names
    return not scope.preserved and bool(b.user_inputs)


def _has_large_linears(b: ProgramBuilder, state: list, scope: Scope) -> bool:
    return any(s[0] == "wl0" for s in state)


@attrs.frozen
class StepKind:
    """One kind of body step: ``step(b, path, scope, vectors, a, y, z)`` builds it (returns
    the value later steps read, or ``None`` for a write); drawn where ``feature`` (if any) is
    on and ``needs(b, module state, scope)`` holds, ``weight`` times among the body's kinds
    (a ``MOTIF`` row shares one entry with the other motifs)."""

    kind: str
    step: Callable[..., Any]
    role: str = PLAIN
    feature: str | None = None
    weight: int = 1
    needs: Callable[[Any, list, Any], bool] = _anywhere


STEP_KINDS: tuple[StepKind, ...] = (
    # the fixed vocabulary: elementwise arithmetic is what models do most between their
    # layers (``binary`` twice as often as any other kind), and a keyword is what
    # ``kwargs_ops`` programs are for (``alpha`` as often as ``binary``)
    StepKind("unary", vocabulary_steps.unary),
    StepKind("binary", vocabulary_steps.binary, weight=2),
    StepKind("matmul", vocabulary_steps.matmul, needs=_has_matrices),
    StepKind("update", vocabulary_steps.update_buffer, needs=_has_updatable_buffers),
    StepKind("input_update", vocabulary_steps.update_input, feature="input_mutation",
             needs=_has_user_inputs),
    StepKind("sort", vocabulary_steps.sort, feature="multi_result_ops"),
    StepKind("alpha", vocabulary_steps.alpha, feature="kwargs_ops", weight=2),
    # what users' passes target
    StepKind("build", motifs.constant_builders, TARGETED, "constant_builders"),
    StepKind("random", motifs.random_ops, TARGETED, "random_ops"),
    StepKind("copy", motifs.inplace_copies, TARGETED, "inplace_copies"),
    StepKind("twice", motifs.repeated_subexpressions, TARGETED, "repeated_subexpressions"),
    StepKind("overwrite", motifs.overwrites, TARGETED, "overwrites"),
    StepKind("near", motifs.near_duplicates, TARGETED, "near_duplicates"),
    StepKind("identity", motifs.identities, TARGETED, "identities"),
    StepKind("stacked", motifs.activations, TARGETED, "activations"),
    StepKind("inplace", motifs.inplace_ops, TARGETED, "inplace_ops"),
    StepKind("opset", opset_step, OPSET, "opset"),
    # the motifs bugs need (one shared entry among the body's kinds)
    StepKind("state", motifs.state_traffic, MOTIF, "state_traffic"),
    StepKind("view_write", motifs.view_writes, MOTIF, "view_writes"),
    StepKind("clone_write", motifs.clone_writes, MOTIF, "clone_writes"),
    StepKind("where", motifs.masks, MOTIF, "masks"),
    StepKind("softmax", motifs.softmax, MOTIF, "softmax"),
    StepKind("int_math", motifs.int_math, MOTIF, "int_math"),
    StepKind("edge_operand", motifs.edge_operands, MOTIF, "edge_operands"),
    # a module's large linears (also the first ``unary`` step of a module that has them)
    StepKind("mlp", motifs.large_linears, feature="large_linears", needs=_has_large_linears),
)
"""Every kind of body step, in the order a body draws among them."""

KIND: dict[str, StepKind] = {row.kind: row for row in STEP_KINDS}
"""Each row by its kind."""

MOTIFS: tuple[StepKind, ...] = tuple(row for row in STEP_KINDS if row.role == MOTIF)
"""The motif rows, in order (the root's body has a step of each switched on)."""

TARGETS: tuple[StepKind, ...] = tuple(row for row in STEP_KINDS if row.role == TARGETED)
"""The targeted rows, in order (each has bytes of its own for its step at the root)."""


def pick_kind(b: ProgramBuilder, state: list, scope: Scope, kind: int,
              table: tuple[StepKind, ...] = STEP_KINDS) -> str:
    """The kind of the body step whose kind byte is ``kind``: entry ``kind`` (modulo their
    number) of the kinds of ``table`` available at a module of ``state`` in ``scope`` (``b.on``
    the features switched on), each row ``weight`` times; the motifs' shared entry picks
    among the motifs switched on by the byte's higher part. O(rows)."""
    kinds: list[str] = []
    motifs_on: list[str] = []
    for row in table:
        if row.feature is not None and row.feature not in b.on:
            continue
        if not row.needs(b, state, scope):
            continue
        if row.role == MOTIF:
            if not motifs_on:
                kinds.append(MOTIF_SLOT)
            motifs_on.append(row.kind)
        else:
            kinds.extend([row.kind] * row.weight)
    choice = kinds[kind % len(kinds)]
    if choice == MOTIF_SLOT:
        choice = motifs_on[kind // len(kinds) % len(motifs_on)]
    return choice
