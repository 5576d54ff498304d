"""Fast tier of purefx's hypothesis strategies: Programs generated directly as IR.

:func:`programs` draws flat Programs shaped exactly like :func:`ir.import_ep` output: a root
module with one graph whose placeholders are the state inputs (parameters, then buffers, then
constants: one per state fqn, aliases included, as non-strict export lists them) and then the
user inputs; ``call_function`` nodes on ``torch.ops.aten`` overloads that carry
``meta["nn_module_stack"]`` (so ``outline`` can rebuild the module tree) and ``meta["val"]``
(``FakeTensor`` s of one fake mode per program, as export makes them, so every operator with a
fake implementation runs on them); holder modules at every module path; state slots over a table of real small tensors; the root
call signature ``""`` with its pytree ``in_spec`` / ``out_spec``. No tracing, no export: about
900 programs per second on one core, hypothesis included (a dozen draws per program; see
``tests/laws/test_strategies_programs.py``), against about 150 per second through every law of
``lowering.pass_laws`` (which lowers and runs each program twice).

Every program is valid by construction: each operand is a *back-offset* into the values defined
so far in its scope (taken modulo their number) and each choice among alternatives is an index
taken modulo the alternatives available where it is used, so any choice sequence, and in
particular every shrink hypothesis tries, decodes to a program that ``ir.verify``-s, lowers and
runs. There is no ``filter`` and no ``assume``.

What is covered (each behind a *feature*, see :data:`FEATURES`)
    Module trees of up to ``max_modules`` module objects (``nesting``), repeated calls
    (``repeated_calls``, stack keys ``key@1``), a module registered under a second name, so that
    two paths name one object and all its state is aliased (``shared_modules``), tied parameters
    of different modules (``tied_parameters``), parameters with and without ``requires_grad``,
    matrices read by ``matmul``/``mm``/``linear`` (``matrices``), buffer reads (``buffers``),
    non-persistent buffers (``non_persistent``), tensor constants (``constants``), in-place
    buffer updates ``aten.add_`` on the buffer's current value (``inplace_mutation``), functional
    buffer updates with a ``buffer_mutation`` output as ``run_decompositions()`` leaves them
    (``functional_mutation``), in-place and functional mutation of user inputs
    (``input_mutation``), preserved call signatures (``preserved_calls``), keyword user inputs
    (``keyword_inputs``), pytree outputs: lists, dicts, nesting (``pytree_outputs``), a
    multi-result op read through ``getitem`` (``multi_result_ops``), keyword arguments
    (``kwargs_ops``), calls of one module whose bodies differ (``divergent_calls``), values that
    cross a preserved call's boundary outside its signature as export shares them
    (``crossing_reads``): one the caller computes from an argument and the call reads, one the
    call computes from its output (a no-op ``clone`` or an op) and the caller reads or passes
    on as an argument of a later preserved call (call -> call: a sibling, or a repeated call),
    or a preserved parent returns; under :func:`crossing_programs` the call reads every
    argument and the caller every output as well, so no signature name looks stale, unless
    ``stale_signatures``: then (and now and then in :func:`programs`) the call may leave an
    argument unread, and its caller an output, next to the value that crosses unsigned, as a
    signature looks whose names ``run_decompositions`` left stale (what
    ``repair_call_signatures`` renames). State that crosses a preserved call's boundary
    (``crossing_state``, with a buffer update style): the caller updates a buffer of the called
    module before the call, which reads it first, or the call updates it last and the caller
    updates it again after the call (export's functional values of one buffer, made on both
    sides of the boundary: what ``insert_ivals`` writes back), in one such write in four
    overwriting it in place with a value the call made and did not return (eager's
    ``self.sub.b.copy_(z)`` of a ``z`` made inside ``sub``). A ``torch.no_grad()`` region, a
    run of nodes as the body of a ``wrap_with_set_grad_enabled`` call that mostly spans module
    calls (``grad_regions``: what ``split_hop_bodies`` splits). The last three are opt-in
    (:data:`OPT_IN_FEATURES`).
    What users' passes target (each of these features switched on has one step at a drawn
    place of the root's body, as the motifs below do, besides the steps the body draws among
    all kinds): an activation of its own result, ``relu(relu(x))``,
    ``gelu(gelu(x))`` (``activations``; ``gelu`` and ``silu`` themselves are among every
    program's unary steps, as they are in models); constant
    builders ``arange`` / ``ones`` / ``full`` and ops on them, some also reading a state vector
    (``constant_builders``); random ops ``rand_like`` / ``randn_like`` / ``rand``
    (``random_ops``, some drawn and never read); copies written in place, ``clone`` then
    ``add_`` / ``copy_`` (``inplace_copies``); a pair of linears through ``HIDDEN`` features, 1024 weights each
    (``large_linears``); one pure op computed twice, sometimes with ``2`` for ``2.0``
    (``repeated_subexpressions``); a ``copy_`` of a new value into a buffer or a user input, the
    write's result often read by no one (``overwrites``); two ops of the same operands that
    differ only in a literal, a keyword or a dtype: ``add`` with and without ``alpha``, casts to
    ``float16`` and ``bfloat16``, ``mean`` over another dim, exact and tanh ``gelu``
    (``near_duplicates``); ops an algebraic simplifier rewrites: ``x * 1``, ``x + 0``,
    ``x - 0``, ``x / 1``, ``x ** 2``, ``x * 2``, ``clone(x)`` (``identities``); in-place ops on a value the
    module computed earlier, which other ops may have read before the write (``x += y``,
    ``ReLU(inplace=True)``; ``inplace_ops``).

    What bugs need (the *motifs*; a program with one of their features on has one step of it
    at a drawn place of the root's body, more are drawn among the body's steps, and the
    latest results nothing reads are returned, so what they compute reaches an output):
    state traffic, a buffer read (by an op of the buffer alone) before its update, after it,
    or before and after it by equal calls; the semantics law's second call sees the first's
    writes (``state_traffic``); a write through a view (``slice``, ``select``, ``diagonal``,
    ``view`` written by ``add_`` / ``mul_`` / ``fill_``) of a fresh copy or of a buffer, and
    the base read after it, mostly by a call equal to one before it (``view_writes``); a copy
    (``clone``, ``x * 1.0``) of a computed value or a buffer, then the source written in
    place and the copy read after, sometimes beside a second copy that is written itself
    (``clone_writes``); ``where`` with a bool mask from a comparison: a guarded op
    ``where(d > 0, log(d), a)`` whose other branch holds nan or inf, a masked fill with
    ``-inf`` / ``inf`` / nan, two values (``masks``); ``softmax`` / ``log_softmax`` (and their
    ``_``-prefixed core forms) over a dim, on logits as they are, times ``1e3``, or shifted by
    ``1e3`` (``exp`` overflows unless the max is subtracted), sometimes after a ``-inf``
    mask (``softmax``); int64 ``mul`` / ``add`` / ``sub`` of an int64 constant and of
    ``int64(a * 1000)``, past ``2**53`` half the time (a route through ``float64`` is wrong),
    their low digits (``remainder``) read back into the activations (``int_math``). Values
    at the edges at the operands of ops (``edge_operands``, on in three draws of eight, with its
    flag among the opset's): a drawn value poisoned at drawn positions, one column inf,
    -inf or nan, another ``float32``'s largest of either sign, and where the value is past
    ``0.5`` a ``-0.0`` or a denormal (``where(arange(WIDTH) == k, edge, x)``,
    ``masked_fill``), so that it is at an edge at some positions and ordinary at others;
    later steps read it (the opset's rows too: it is a value like any other), and the step
    reads it with two of the folds fast-math makes (``x * 0``, ``x - x``, ``x / x``,
    ``log(exp(x))``, ``where`` with it on either branch) and one more reader: an op of the
    value twice (``x + x``, ``maximum(x, x)``) or a literal ``0``, ``1``, ``-1``, ``inf``,
    ``nan`` as the scalar of ``mul`` / ``add`` / ``div`` / ``pow`` / ``clamp``
    (``EDGE_READS``). ``programs(assumes=...)`` takes what a pass may assume of its values
    (``no_nans`` or ``no_infs``: no edge put anywhere on purpose; ``no_signed_zeros``: no
    ``-0.0``). Values
    at the edges of state (``edge_values``, opt-in: ``always={"edge_values"}``; a correct pass checked
    with a tolerance differs where the input's output is not finite): half the buffers and
    constants hold one of inf, -inf, nan,
    ``-0.0``, ``1e30``, ``7e4`` (past ``float16``), ``1e-40`` (a denormal), ``-3e38``, and
    the int64 constants are past ``2**53``; user inputs stay ordinary (``program_inputs``
    makes them from the program alone, uniform in ``[-1, 1)``), so an edge value reaches some
    columns of the outputs, not all. Outputs that alias (``output_aliasing``): one value
    returned twice, a fresh copy of it, or a ``view`` of it beside it.
    Ops: ``relu``, ``neg``, ``tanh``, ``sigmoid``, ``gelu``, ``silu``, ``add``, ``sub``, ``mul`` (with a value, a
    state vector or a scalar), ``add(..., alpha=)``, ``matmul``, ``t`` + ``mm``, ``linear``,
    ``mean.dim``, ``add_``, ``sub_``, ``sort`` + ``getitem``, ``where``, ``masked_fill``,
    ``gt`` / ``lt`` / ``ge`` / ``le``, ``log``, ``sqrt``, ``reciprocal``, ``rsqrt``,
    ``softmax``, ``log_softmax``, ``remainder``, ``slice``, ``select``, ``diagonal``,
    ``view``, ``fill_``, ``mul_``, and those above. As in export's
    graphs, a value read after an in-place update is the update's result (the same tensor), and
    after a functional update the new value. Half the steps read one of the two latest values,
    and the first user output is the latest value, so what the ops compute mostly reaches the
    outputs (a law that compares outputs sees it); in seven programs of eight the latest three
    results of the root's steps that nothing reads are returned too (the eighth keeps its dead
    code for the passes that remove it). ``binary`` steps are drawn twice as often as any other
    kind (elementwise arithmetic is what models do most between layers); a step of two values
    takes them either way round, and under ``kwargs_ops`` the ``alpha`` kind is drawn as
    often as ``binary``, every ``add`` / ``sub`` step carries an ``alpha``, and two ``alpha``
    steps in three with state vectors in reach scale a broadcast vector (a bias). A step's kind and operands come from its bytes scattered with the
    body's (``scattered``), so every kind is about as likely under every hypothesis seed.
    One step of the fixed vocabulary in four outside preserved calls
    (:data:`LONE_INPUT_SHARE`) reads a new user input that nothing else reads, as a model's
    first layer reads its input (an op on an input read once: a pass that takes a placeholder
    for an intermediate writes it). A module call in two (``record[6]`` bit 4) is made for its
    writes alone where the module has a buffer and a write style is on: it updates a buffer of
    its own from what it computed, and nothing after it reads its results (a statistics
    tracker: what a dead-code pass must keep though every result of the call is unread).

    The verified operator table (``opset``, ``ir.strategies.opset_steps``), on by default in
    fifteen draws of sixteen as a bounded share of the steps (one body step in eight, and a
    closing run of ``max_ops`` to ``2 max_ops`` steps at the end of the root's body, cut at
    ``max_nodes``; the body's ordinary steps stop a third short of ``max_nodes``, its motif
    steps at ``max_nodes``, :data:`CLOSING_RESERVE`, so the closing run has room; the fixed
    vocabulary still makes most of each program): steps that call any row of ``ir.opset.table()`` (or those ``ops=``
    names) with the arguments of one of its samples. By default a row is drawn by how many of
    the test zoo's models use its operator (``opset_steps.row_weights``: 10 % in proportion
    to use, 15 % evenly among the used operators, 75 % uniform over every row, so each stays
    reachable; each row's weight divided by the share of the swarm's feature sets that let a
    program draw it, so over the swarm a random row or an in-place variant is drawn about as
    often as its share says) and called with one of its own samples, and up to two forms of
    the census of how real models call each operator besides (``ir.strategies.forms``,
    ``opset_steps.pick_form``); asked for (``always={"opset"}``, ``ops=``) rows uniformly,
    each with any of its samples and forms, and with each sample's variants that turn a
    one-signed floating operand to its other sign (``ir.strategies.signed_samples``). The
    arguments: written tensors are new buffers of the calling module, exact-valued tensors
    (indices) new constants, floating ones earlier values of the same shape, dtype and strides
    or new user inputs (strided through a ``permute`` / ``as_strided`` of a contiguous input),
    each node's ``val`` the operator run on its arguments' vals; with the features of
    :data:`ir.strategies.opset_steps.OPSET_FEATURES` (strided and channels-last arguments,
    integer, bool, ``float16`` / ``bfloat16`` samples, train-mode norms, in-place variants, core
    aten rows; random rows under ``random_ops``). A ``(batch, WIDTH)`` float32 result joins the
    values the fixed vocabulary reads; a result that is a view of an argument is read through a
    ``clone`` taken at once (as models read their views on: a pass that gets a view's shape
    wrong changes what follows); up to three results nothing reads are returned.

    A symbolic batch (``symbolic_sizes``, one draw in four): the batch is a ``SymInt`` of the
    program's one shape env with hint ``h`` (2 to 4) and range ``[h, h + SYMBOLIC_SPAN]``
    (``Dim("batch", min=h, max=h + 6)``; ``Program.range_constraints`` holds it), so the laws
    also run the program at other batch sizes (``lowering.pass_laws.other_sizes``). The opset
    steps call their rows at the samples' sizes (see :data:`SYMBOLIC_OPSET`).

Not covered, and why
    Effect tokens and ``with_effects`` (the only effectful aten op, ``aten._print``, prints;
    the opset steps draw no effectful row);
    higher-order ops but the set-grad one of ``grad_regions``; dynamic sizes other than the
    batch, and sizes read as values (``sym_size``); custom objects;
    strict-export identity keys for shared modules (a call through the second name then looks
    like a repeated call of the first, which ``repeated_calls`` covers); non-nesting module
    stacks; keyword arguments of preserved calls (export passes module arguments positionally
    unless asked otherwise). Without ``crossing_reads``, preserved calls read only their
    arguments, their own state and what they compute, and export only what they compute, as a
    module under ``preserve_module_call_signature`` does; as torch.export requires, only a module at one
    path is preserved, and all its calls have one signature shape.

:func:`crossing_programs` draws the same programs with the crossing features always on and
every module that can be preserved preserved with something crossing its boundary, so that the
preserved-call stages change most draws (the law tests of ``rematerialize`` and
``insert_ivals`` run on it).

Every activation the fixed vocabulary reads is a float32 ``(batch, WIDTH)`` tensor and every state tensor ``(WIDTH,)`` or
``(WIDTH, WIDTH)`` (but the ``large_linears`` pair, read only by its own step), so any op
composes with any other.
Where the parts are: this module holds the strategies and the decoder (module tree, state,
bodies, calls, preserved calls, grad regions, outputs). Which features a draw switches on and
how often each kind of step is drawn is ``ir.strategies.swarm``; the kinds of body step, one
row each (its builder function, feature, weight, role), ``ir.strategies.step_kinds``; the
operators and literals the steps call, ``ir.strategies.vocabulary``; the steps,
``ir.strategies.vocabulary_steps``, ``ir.strategies.motifs`` and ``ir.strategies.opset_calls``;
the program under construction they build through, ``ir.strategies.builder``; how bytes become
choices, ``ir.strategies.decoding``; example inputs, ``ir.strategies.input_values``.
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
import operator
from collections.abc import Collection
from types import MappingProxyType
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from pyrsistent import pmap

from ir import signature as sg
from ir import state as stt
from ir.args import EMPTY_DICT, IList, Ref, ref
from ir.graph import Graph
from ir.import_ep import holder_tree
from ir.module import PLAIN, SUBGRAPH, Module
from ir.module_stack import common_stack
from ir.node import CALL_FUNCTION, GET_ATTR, OUTPUT, PLACEHOLDER, Node
from ir.ops import is_mutating
from ir.program import NO_CONSTRAINTS, Program
from ir.state import Opaque, Slot
from ir.strategies import module_trees
from ir.strategies.builder import ROOT_TYPE, ModuleObject, ProgramBuilder, Scope
from ir.strategies.decoding import (
    HEADER_BYTES,
    LONE_SALT,
    MOTIF_BYTES,
    MOTIF_SALT,
    OUTPUT_BYTES,
    RECORD,
    REGION_BYTES,
    STEP,
    back,
    body_bytes,
    count,
    decode_step,
    scattered,
)
from ir.strategies.input_values import program_inputs
from ir.strategies.opset_calls import SYMBOLIC_OPSET, opset_step
from ir.strategies.opset_steps import (
    OPSET_FEATURES,
    opset_rows,
    resolve_ops,
    row_weights,
    scatter,
)
from ir.strategies.step_kinds import KIND, MOTIF, MOTIFS, OPSET, TARGETS, pick_kind
from ir.strategies.swarm import (
    CLOSING_RESERVE,
    CROSSING_FEATURES,
    DETERMINISTIC_FEATURES,
    FEATURES,
    LONE_INPUT_SHARE,
    OPSET_SHARE,
    OPT_IN_FEATURES,
    TARGETED_STEPS,
    switched_on,
)
from ir.strategies.values import KNOWN as _ASSUMPTIONS
from ir.strategies.vocabulary import (
    EDGES,
    HIDDEN,
    POISONS,
    STATE_INPUTS,
    UNARY,
    WIDTH,
)
from ir.torch_seam import (
    new_symbolic_size,
    pytree,
)

__all__ = [
    "CLOSING_RESERVE",
    "CROSSING_FEATURES",
    "DETERMINISTIC_FEATURES",
    "FEATURES",
    "HIDDEN",
    "LONE_INPUT_SHARE",
    "OPSET_SHARE",
    "OPT_IN_FEATURES",
    "ROOT_TYPE",
    "SYMBOLIC_OPSET",
    "SYMBOLIC_SPAN",
    "TARGETED_STEPS",
    "WIDTH",
    "check_features",
    "crossing_programs",
    "program_inputs",
    "programs",
]

aten = torch.ops.aten

SYMBOLIC_SPAN = 6
"""Under ``symbolic_sizes``, how far above its hint the batch's range reaches
(``Dim("batch", min=hint, max=hint + SYMBOLIC_SPAN)``)."""

_EDGE_FEATURES = frozenset({"edge_operands", "edge_values"})
_FINITE_ONLY = frozenset({"no_nans", "no_infs"})
"""Assumptions under which ``programs`` puts no value at an edge on purpose (inf and nan make
each other: ``inf - inf``)."""


# --- argument checks ----------------------------------------------------------------------------


def check_features(name: str, value: object) -> frozenset[str]:
    """``value`` as a frozenset of feature names (every one of :data:`FEATURES` for ``None``);
    ``InvalidArgument`` naming ``name`` otherwise."""
    found = module_trees.check_features(name, value, FEATURES)
    return frozenset(FEATURES) if found is None else found


# --- the strategy -------------------------------------------------------------------------------


def programs(
    *,
    features: Collection[str] | None = None,
    always: Collection[str] = (),
    max_modules: int = 4,
    max_ops: int = 6,
    max_nodes: int = 60,
    ops: Collection[Any] | None = None,
    assumes: Collection[str] = (),
) -> st.SearchStrategy[Program]:
    """Flat Programs shaped like ``import_ep`` output, valid by construction.

    Parameters:
        features: the features that may be switched on (default: all of :data:`FEATURES` but
            the :data:`OPT_IN_FEATURES`).
            Each example draws its own subset (swarm testing), so one run mixes sparse and dense
            programs and shrinking switches features off.
        always: features switched on in every example (e.g. ``{"grad_regions"}`` for a pass
            that rewrites what only that feature makes).
        max_modules: most module objects below the root (each may sit under several paths).
        max_ops: most steps (ops or child calls) in one module body.
        max_nodes: the graph stops growing past about this many nodes (calls left are skipped).
        ops: the operators the ``opset`` steps may call (``OpOverload`` s, packets or row names
            of ``ir.opset.table()``; default: every row). ``InvalidArgument`` for one without a
            row. The fixed vocabulary's steps are drawn as well.
        assumes: what the pass under test may assume of the values it sees, out of
            ``transforms.rewrite.ASSUMPTIONS`` (as a fast-math rule declares it). ``"no_nans"``
            or ``"no_infs"``: no value is put at an edge on purpose (``edge_operands`` and
            ``edge_values`` are off: a poisoned program would break what the pass may
            assume); ``"no_signed_zeros"``: those features put no ``-0.0`` anywhere.
            ``InvalidArgument`` for another name, or where ``always`` names a feature the
            assumptions switch off.

    Generates a ``Program`` that ``ir.verify``-s and that ``lowering.lower`` turns into a module
    whose ``forward(*args, **kwargs)`` accepts :func:`program_inputs`. Shrinks towards fewer
    features, fewer modules (a flat root), fewer and shallower calls, fewer ops, ``relu`` of the
    most recent value, one user input of batch 1 and a single output; every shrink is a valid
    program, because operands are back-offsets and choices are taken modulo what is available,
    and a zeroed step is no step at all.
    """
    return _checked(features, always, max_modules, max_ops, max_nodes, crossing=False, ops=ops,
                    assumes=assumes)


def crossing_programs(
    *,
    features: Collection[str] | None = None,
    always: Collection[str] = CROSSING_FEATURES,
    max_modules: int = 4,
    max_ops: int = 6,
    max_nodes: int = 60,
) -> st.SearchStrategy[Program]:
    """Flat Programs, as :func:`programs` draws them, whose values and state cross preserved
    call boundaries in most draws: the input the preserved-call stages (``rematerialize``,
    ``insert_ivals``) have work on.

    Parameters are :func:`programs`'s, and ``always``: the features always on (default
    :data:`CROSSING_FEATURES`; the swarm draws the rest from ``features``, and e.g.
    ``CROSSING_FEATURES | {"stale_signatures"}`` gives ``repair_call_signatures`` work in every
    draw with a value crossing out of a call). The root has at least one module below it;
    every module object at one path is preserved (``preserved_calls``); and every preserved call
    has a value crossing its boundary unsigned (``crossing_reads``: into it, out of it or both,
    as its record says, both when it says neither) and, when its module has a buffer, state
    crossing it (``crossing_state``: the call updates the buffer and its caller updates it again
    after, and, as its record says, its caller updated it before the call, which reads it
    first). Nine in ten draws or more give ``rematerialize``, seven in ten ``insert_ivals``,
    something to rewrite (measured in ``tests/laws/test_remat_laws.py``), against one or two
    in a hundred of :func:`programs`.

    Shrinks as :func:`programs` does, towards one preserved module called once with values
    and state crossing both ways (a module below the root is kept; a module registered twice,
    ``shared_modules``, is not preserved, and a graph that fills up, ``max_nodes``, before the
    first call has none).
    """
    return _checked(features, always, max_modules, max_ops, max_nodes, crossing=True)


def _checked(
    features: Collection[str] | None, always: Collection[str], max_modules: int, max_ops: int,
    max_nodes: int, *, crossing: bool, ops: Collection[Any] | None = None,
    assumes: Collection[str] = (),
) -> st.SearchStrategy[Program]:
    """``_programs`` for :func:`programs` and :func:`crossing_programs`, their arguments
    checked (a crossing program has a module below the root); with no ``features``, every
    default feature (the opt-in ones off); ``assumes`` switching the edge features off, or
    narrowing what they draw (:func:`programs`)."""
    allowed = check_features("features", features)
    forced = check_features("always", always)
    if features is None:
        allowed -= OPT_IN_FEATURES
    granted = _check_assumes(assumes)
    if granted & _FINITE_ONLY:  # no value at an edge on purpose (``programs``)
        refused = sorted(forced & _EDGE_FEATURES)
        if refused:
            raise InvalidArgument(
                f"always names {refused}, which put nan and inf in the program, but assumes "
                f"{sorted(granted & _FINITE_ONLY)} says the values are finite; leave them out")
        allowed -= _EDGE_FEATURES
    asked = ops is not None or "opset" in forced
    if asked:  # naming operators asks for the opset steps
        allowed |= _OPSET_SET
        forced |= {"opset"}
    module_trees.check_int_range("max_modules", max_modules, 1 if crossing else 0, 16)
    module_trees.check_int_range("max_ops", max_ops, 0, 32)
    module_trees.check_int_range("max_nodes", max_nodes, 1, 10_000)
    return _programs(allowed, max_modules, max_ops, max_nodes, forced, crossing, resolve_ops(ops),
                     asked, granted)


def _check_assumes(assumes: object) -> frozenset[str]:
    """``assumes`` as a frozenset of names out of ``transforms.rewrite.ASSUMPTIONS``;
    ``InvalidArgument`` naming the argument otherwise (a bare string is refused, not split)."""
    if isinstance(assumes, str) or not isinstance(assumes, Collection) or not set(
            assumes) <= _ASSUMPTIONS:
        raise InvalidArgument(f"assumes must be a collection of names out of "
                              f"{sorted(_ASSUMPTIONS)}, got {assumes!r}")
    return frozenset(assumes)


@st.composite
def _programs(
    draw: st.DrawFn,
    allowed: frozenset[str],
    max_modules: int,
    max_ops: int,
    max_nodes: int,
    always: frozenset[str],
    dense: bool,
    ops: frozenset[str] | None = None,
    asked: bool = False,
    assumes: frozenset[str] = frozenset(),
) -> Program:
    # Few draws, each a byte string decoded totally: hypothesis spends about 70 us per draw, so
    # the number of draws, not the decoding, sets the generation rate. Every byte shrinks towards
    # 0, which decodes to the simplest choice (feature off, no state, root parent, relu, ...).
    on = switched_on(draw, allowed, always)
    header = draw(HEADER_BYTES)
    n_objects = draw(count(max_modules, 1 if dense else 0))
    size = RECORD * (n_objects + 1)
    records = draw(st.binary(min_size=size, max_size=size))
    return _Decoder(draw, on, header, records, max_ops, max_nodes, dense, ops, asked,
                    assumes).build()


_OPSET_SET = frozenset(OPSET_FEATURES)
_SET_GRAD = torch.ops.higher_order.wrap_with_set_grad_enabled


# --- building -----------------------------------------------------------------------------------


class _Decoder(ProgramBuilder):
    """Decodes one program from its draws: the module tree and its state from the records,
    then the root's body, the calls and the outputs; each body step one row of
    ``ir.strategies.step_kinds``' table, built through the :class:`ProgramBuilder` it is."""

    def __init__(
        self,
        draw: st.DrawFn,
        on: frozenset[str],
        header: bytes,
        records: bytes,
        max_ops: int,
        max_nodes: int,
        dense: bool = False,
        ops: frozenset[str] | None = None,
        asked: bool = False,
        assumes: frozenset[str] = frozenset(),
    ) -> None:
        signless = "no_signed_zeros" in assumes
        rows = opset_rows(on, ops) if "opset" in on else ()
        # the batch: 1 to 3; under ``symbolic_sizes`` a symbolic size of hint 2 to 4 ranging
        # from its hint to ``SYMBOLIC_SPAN`` above (never below: an index constant the opset
        # steps made from a sample indexes the batch dim in range at every size of the range)
        batch: Any = 1 + header[0] % 3
        mode: Any = None
        self.ranges: dict = {}
        if "symbolic_sizes" in on:
            at = 2 + header[0] % 3
            mode, batch, self.ranges = new_symbolic_size("batch", at, at, at + SYMBOLIC_SPAN)
        super().__init__(
            draw, on, batch=batch, mode=mode, max_nodes=max_nodes,
            # the body stops short of ``max_nodes`` where the closing run of opset steps
            # follows (``CLOSING_RESERVE``); the closing run may fill the rest
            limit=max_nodes - (max_nodes // CLOSING_RESERVE if rows else 0),
            rng=torch.Generator().manual_seed(header[1] | header[2] << 8),
            edges=tuple(v for v in EDGES if not (signless and _is_negative_zero(v))),
            poisons=tuple(tuple(v for v in group if not (signless and _is_negative_zero(v)))
                          for group in POISONS),
            opset_rows=rows, row_weights=row_weights(on, ops) if rows else (), asked=asked)
        self.dense = dense  # ``crossing_programs``: every call that can be preserved is
        self.max_ops = max_ops
        self.header = header
        self.calls: dict[str, int] = {}
        self.signatures: dict[str, sg.CallSignature] = {}
        self.preserved_shapes: dict[str, tuple[int, int, bool]] = {}
        self.repeated_preserved: list[str] = []
        self.objects = self._objects(records)
        self.opset_seed = scatter(*header, *records)  # the opset steps' rows: see ``opset_step``
        # and by default every byte drawn before the step, the features too: hypothesis's
        # draws repeat byte strings across examples, which picked one row in three again
        self.mix = scatter(self.opset_seed, *(i for i, f in enumerate(FEATURES) if f in on))

    # --- objects, paths and state ----------------------------------------------------------

    def _objects(self, records: bytes) -> list[ModuleObject]:
        """Module objects from 7-byte records (the first is the root's):

        0. class: ``M{byte % (index + 1)}`` (classes repeat across objects);
        1. parameters: count ``% 3``; bits 2-3 matrix, 4-5 ``requires_grad``, 6 preserved
           calls, 7 divergent calls;
        2. buffers: count ``% 3``; bits 2-3 non-persistent, bit 4 one constant, bits 5-6 values
           crossing a preserved call of it unsigned (bit 5 into it, bit 6 out of it), bit 7 its
           preserved calls may be passed a value made inside an earlier preserved call, and
           return one made inside a preserved call they make;
        3. parent: ``byte % (index + 1) - 1`` (-1 is the root), so the tree is acyclic;
        4. second registration: bit 0 on, parent ``(byte >> 1) % (index + 1) - 1``;
           bits 6-7 both set: children are called only by steps (else, and always under
           ``crossing_programs``, each is called once, in order, after the steps that did not
           call it);
        5. ties: bits 0-1 tie parameter 0 / 1 to an earlier one, chosen by ``byte >> 2``; bit 7:
           the value crossing out of a preserved call is a no-op ``clone`` (else an op);
        6. bit 0: a ``large_linears`` pair of parameters ``wl0`` ``(HIDDEN, WIDTH)`` and ``wl1``
           ``(WIDTH, HIDDEN)`` (the root always has one with the feature); bit 1: with ``repeated_calls``, each child is called once more
           at the end of the body; bits 2-3: with ``crossing_state``, a buffer of a preserved
           call of it crosses the boundary (bit 2 into it, bit 3 out of it; the object has at
           least one buffer).
        """
        on = self.on
        chunks = [records[i:i + RECORD] for i in range(0, len(records), RECORD)]
        objects = []
        for i, rec in enumerate(chunks):
            index = i - 1
            name = ROOT_TYPE if index < 0 else f"purefx.generated.M{rec[0] % (index + 1)}"
            obj = ModuleObject(index, name, rec)
            for j in range(rec[1] % 3):
                matrix = "matrices" in on and rec[1] >> (2 + j) & 1
                obj.state.append((f"w{j}", stt.PARAMETER, (WIDTH, WIDTH) if matrix else (WIDTH,)))
            if "large_linears" in on and (index < 0 or rec[6] & 1):
                obj.state.append(("wl0", stt.PARAMETER, (HIDDEN, WIDTH)))
                obj.state.append(("wl1", stt.PARAMETER, (WIDTH, HIDDEN)))
            if "buffers" in on or "inplace_mutation" in on or "functional_mutation" in on:
                n_buffers = rec[2] % 3
                if index >= 0 and self._state_crossing(rec):
                    n_buffers = max(n_buffers, 1)
                for j in range(n_buffers):
                    obj.state.append((f"b{j}", stt.BUFFER, (WIDTH,)))
            if "constants" in on and rec[2] >> 4 & 1:
                obj.state.append(("c0", stt.CONSTANT, (WIDTH,)))
            objects.append(obj)
            if index < 0:
                continue
            parent = rec[3] % (index + 1) - 1 if "nesting" in on else -1
            objects[parent + 1].children.append((f"m{index}", index))
            if "shared_modules" in on and rec[4] & 1:
                again = (rec[4] >> 1) % (index + 1) - 1 if "nesting" in on else -1
                objects[again + 1].children.append((f"s{index}", index))
        return objects

    def _value_crossing(self, rec: bytes) -> int:
        """``crossing_reads`` bits of a preserved call (1 into it, 2 out of it, 4 call -> call);
        under ``crossing_programs`` never without one of 1 and 2."""
        if "crossing_reads" not in self.on or not rec[2]:
            return 0
        # the bits scattered with the record (a zeroed byte still means none): read raw, they
        # sat in the byte's high bits, which hypothesis rarely sets, so a parent returning what
        # its preserved child made came up in 1 program of 500
        bits = scatter(self.opset_seed, *rec) >> 5 & 7
        return bits | 3 if self.dense and not bits & 3 else bits

    def _state_crossing(self, rec: bytes) -> int:
        """``crossing_state`` bits of a preserved call (1 into it, 2 out of it); under
        ``crossing_programs`` always out of it (a value on each side of the boundary). Needs a
        buffer update style to write the state with."""
        if "crossing_state" not in self.on or not self.styles_on():
            return 0
        bits = rec[6] >> 2 & 3
        return bits | 2 if self.dense else bits

    def _paths(self) -> list[tuple[str, int]]:
        """Every (path, object index) from the root, depth first in registration order."""
        found: list[tuple[str, int]] = [("", -1)]

        def visit(path: str, index: int) -> None:
            for name, child in self.objects[index + 1].children:
                sub = f"{path}.{name}" if path else name
                found.append((sub, child))
                visit(sub, child)

        visit("", -1)
        return found

    def _identities(self) -> dict[tuple[int, str], tuple[int, str]]:
        """``(object, state name) -> the (object, name) whose tensor it is``: tied parameters."""
        identity: dict[tuple[int, str], tuple[int, str]] = {}
        earlier: list[tuple[int, str, tuple[int, ...]]] = []
        for obj in self.objects:
            rec = obj.record
            for j, (name, kind, shape) in enumerate(obj.state):
                if kind != stt.PARAMETER:
                    continue
                identity[(obj.index, name)] = (obj.index, name)
                if "tied_parameters" in self.on and rec[5] >> j & 1:
                    same = [(i, n) for i, n, s in earlier if s == shape]
                    if same:
                        identity[(obj.index, name)] = identity[same[(rec[5] >> 2) % len(same)]]
            earlier += [(obj.index, n, s) for n, k, s in obj.state if k == stt.PARAMETER]
        return identity

    def _make_state(self) -> None:
        """State fqns (parameters, buffers, constants; each in path order), tensors, inputs."""
        self.paths = self._paths()
        self.index_of = dict(self.paths)
        # how many paths reach each object (export cannot preserve a module at two paths)
        self.sites = collections.Counter(index for _, index in self.paths)
        identity = self._identities()
        self.fqns: dict[tuple[str, str], str] = {}
        rows = []
        for kind in (stt.PARAMETER, stt.BUFFER, stt.CONSTANT):
            for path, index in self.paths:
                obj = self.objects[index + 1]
                for j, (name, k, shape) in enumerate(obj.state):
                    if k != kind:
                        continue
                    fqn = f"{path}.{name}" if path else name
                    self.fqns[(path, name)] = fqn
                    tid = identity.get((index, name), (index, name))
                    rows.append((fqn, kind, tid, shape, obj.record, j))
        self.state: dict[str, Slot] = {}
        self.tensors: dict[str, Opaque] = {}
        self.tensor_of: dict[str, Any] = {}
        self.input_of: dict[str, str] = {}
        self.inputs: list[sg.InputSpec] = []
        key_of: dict[Any, str] = {}
        for fqn, kind, tid, shape, rec, j in rows:
            grad = kind == stt.PARAMETER and bool(rec[1] >> (4 + j) & 1)
            persistent = not (
                "non_persistent" in self.on and kind == stt.BUFFER and rec[2] >> (2 + j % 2) & 1
            )
            key = key_of.get(tid)
            if key is None:
                key = key_of[tid] = fqn
                self.tensors[key] = Opaque(self._tensor(kind, shape, grad))
            owner = self.state.get(key)
            if owner is not None:  # an alias registers as its tensor's first fqn does
                grad, persistent = owner.requires_grad, owner.persistent
            self.tensor_of[fqn] = tid
            self.state[fqn] = Slot(kind, key, persistent, grad)
            prefix, input_kind = STATE_INPUTS[kind]
            name = self.fresh_name(prefix + fqn.replace(".", "_"))
            self.input_of[fqn] = name
            self.inputs.append(sg.InputSpec(
                input_kind, name, fqn, persistent if kind == stt.BUFFER else None))
            self.placeholder(name, self.fake(shape))
        self.state_order = tuple(fqn for fqn, *_ in rows)

    def _tensor(self, kind: str, shape: tuple[int, ...], requires_grad: bool) -> torch.Tensor:
        # matrices get infinity-norm at most 1, so values stay finite through long chains
        bound = 1.0 / shape[-1] if len(shape) == 2 else 1.0
        value = torch.empty(shape).uniform_(-bound, bound, generator=self.rng)
        if kind == stt.PARAMETER:
            return torch.nn.Parameter(value, requires_grad=requires_grad)
        if "edge_values" in self.on:
            self._edge(value)
        return value

    def _edge(self, value: torch.Tensor) -> None:
        """``edge_values``: one entry of half the buffers and constants (floating ones) set to
        a value of :data:`EDGES`, or (integer ones) past ``2**53``; the rest stay ordinary, so
        an inf or a nan reaches some columns of the outputs, not all."""
        pick = int(torch.randint(0, 2 * len(self.edges), (), generator=self.rng))
        at = int(torch.randint(0, value.numel(), (), generator=self.rng))
        if pick < len(self.edges):
            flat = value.view(-1)
            flat[at] = self.edges[pick] if value.is_floating_point() else 2**53 + 2 * pick + 1

    # --- bodies -----------------------------------------------------------------------------

    def _draw_body(self, root: bool) -> list[tuple[int, ...]]:
        """A body: a step count, then three bytes per step (see ``decode_step``).

        Fixed-size draws, so shrinking the count never misaligns the bytes after it.
        """
        most = 2 * self.max_ops if root else self.max_ops
        data = self.draw(body_bytes(most))
        self.mix = scatter(self.mix, int.from_bytes(data))
        n = data[0] % (most + 1)
        steps = [
            scattered(decode_step(data[i], data[i + 1], data[i + 2]), self.mix, i)
            for i in range(1, 1 + STEP * n, STEP)
            if data[i] or data[i + 1] or data[i + 2]  # a zeroed step is no step: shrinking drops ops
        ]
        motifs = [row.kind for row in MOTIFS if row.feature in self.on]
        if root:
            # one step of each motif switched on, at a drawn place of the root's body: a motif
            # is in every program whose feature is on, not only where the body's bytes pick it.
            # Drawn with no motif on too, so that switching one off does not move what is drawn
            # after (shrinking a feature off keeps the rest of the program)
            data = self.draw(MOTIF_BYTES)
            for j, kind in enumerate(motifs):
                if 4 * j + 4 <= len(data):
                    at, a, b, c = data[4 * j:4 * j + 4]
                else:  # more motifs on than drawn places (the last one added, with all on):
                    # its bytes from the body's mix (bytes of its own would move every later
                    # draw of the programs that do not have it)
                    h = scatter(self.mix, MOTIF_SALT, j)
                    at, a, b, c = h & 0xFF, h >> 8 & 0xFF, h >> 16 & 0xFF, h >> 24 & 0xFF
                steps.insert(at % (len(steps) + 1), (0, kind, *decode_step(a, b, c)[2:]))
            # and one step of each feature users' passes target that is switched on (a
            # constant chain to fold, a random draw, a copy written in place, ...): a bug in
            # a pass that rewrites one meets it in every program with the feature, not in the
            # few whose body draws its kind among the others. Each feature has its own bytes;
            # two at most get a step (the features switched on, from a drawn start), so the
            # opset's share of the body keeps its room
            data = self.draw(_TARGETED_BYTES)
            on = [j for j, row in enumerate(TARGETS) if row.feature in self.on]
            start = data[0] % len(on) if on else 0
            for j in (on[start:] + on[:start])[:TARGETED_STEPS]:
                at, a, b, c = data[4 * j + 1:4 * j + 5]
                if not (a or b or c):
                    continue  # zeroed, as a body step: shrinking drops it
                _, _, x, y, z = scattered(decode_step(a, b, c), self.mix, 4096 + j)
                steps.insert(at % (len(steps) + 1), (0, TARGETS[j].kind, x, y, z))
        return steps

    def _run(self, index: int, path: str, scope: Scope) -> None:
        """Run one call's body: its steps, and a call of every child not called by a step
        (unless the object's record says it calls children only from steps)."""
        obj = self.objects[index + 1]
        body = obj.body
        if body is None:
            body = obj.body = self._draw_body(index < 0)
        elif "divergent_calls" in self.on and obj.record[1] >> 7:
            body = self._draw_body(index < 0)  # this call runs other code (data-dependent)
        kids = obj.children
        pending = 0  # children before this one have had their implicit call
        for is_call, kind, x, y, z in body:
            if self.full():
                if kind in _MOTIF_KINDS and len(self.nodes) < self.max_nodes:
                    pass  # a motif step: the reserve is the opset's share, not the motifs'
                elif any(step[1] in _MOTIF_KINDS for step in body):
                    continue  # motif steps may follow (a targeted step keeps to the limit)
                else:
                    return
            if is_call and kids:
                if pending < len(kids):
                    name, child = kids[pending]
                    pending += 1
                else:
                    name, child = kids[y % len(kids)]
                self._call(child, f"{path}.{name}" if path else name, scope, x, y, z)
            else:
                self._step(obj, path, scope, kind, x, y, z)
        if obj.record[4] >> 6 == 3 and not self.dense:
            return
        # then, with the record's bit, each child called once more, on the latest value
        again = kids if "repeated_calls" in self.on and obj.record[6] >> 1 & 1 else []
        for name, child in kids[pending:] + again:
            if self.full():
                return
            self._call(child, f"{path}.{name}" if path else name, scope, 0, 0, 0)

    def _call(self, index: int, path: str, scope: Scope, x: int, y: int, z: int) -> None:
        n = self.calls.get(path, 0)
        if n and "repeated_calls" not in self.on:
            return
        self.calls[path] = n + 1
        obj = self.objects[index + 1]
        key = "L__self__" + path + (f"@{n}" if n else "")
        call_name = path if n == 0 else f"{path}@{n}"
        self.frames.append((key, (path, obj.type_name)))
        preserve = self.dense or obj.record[1] >> 6 & 1
        if "preserved_calls" in self.on and preserve and self.sites[index] == 1:
            self._run_preserved(index, path, call_name, scope, x, y, z)
            if n:
                self.repeated_preserved.append(call_name)
        else:
            results = (scope.vals, self.plain_results, self.motif_results, self.opset_results)
            before = [len(r) for r in results], dict(self.current)
            self._run(index, path, scope)
            buffers = [s[0] for s in obj.state if s[1] == stt.BUFFER]
            if obj.record[6] >> 4 & 1 and (buffers and self.styles_on()
                                           or self.current != before[1]):
                # a call made for its writes alone (a statistics tracker): it writes a buffer
                # of its own from what it computed, and nothing after it reads its results,
                # only the state (what a dead-code pass must keep though they are unread)
                if self.current == before[1] and not self.full():
                    self.update(path, buffers[z % len(buffers)], scope.vals[-1], z)
                if self.current != before[1]:
                    for found, n in zip(results, before[0]):
                        del found[n:]
        self.frames.pop()

    def _run_preserved(
        self, index: int, path: str, call_name: str, scope: Scope, x: int, y: int, z: int
    ) -> None:
        """A call under ``preserve_module_call_signature``: it reads its positional arguments,
        its state and what it computes, and returns some of what it computes. Every call of
        one path has the same number of arguments and outputs (export requires one in_spec and
        out_spec per preserved module); the same value may be passed twice."""
        n_args, n_outs, as_tuple = self.preserved_shapes.setdefault(
            path, (1 + z % 2, 1 + (z >> 1) % 2, bool(z >> 2 & 1))
        )
        # a value that crosses a boundary unsigned is never returned by a preserved call; it is
        # passed to one (as its first argument, the latest such value) only when the callee's
        # record says so (call -> call: the caller, which cannot read it, recomputes it from
        # the other call's output)
        obj = self.objects[index + 1]
        crossing = self._value_crossing(obj.record)
        state = self._state_crossing(obj.record)
        buffers = [s[0] for s in obj.state if s[1] == stt.BUFFER]
        buffer = buffers[z % len(buffers)] if state and buffers else None
        passable = [v for v in scope.vals if v not in self.crossing_only] or scope.vals[:1]
        args = [back(passable, o) for o in (x, y)[:n_args]]
        crossed = [v for v in scope.vals if v in self.crossing_only] if crossing & 4 else []
        if crossed:
            args[0] = crossed[-1]
        inner = Scope(list(dict.fromkeys(args)), preserved=True)
        shared = None
        if crossing & 1:
            # outside -> inside: the caller computes a value of an argument, the call reads it
            frame = self.frames.pop()
            shared = self.op(UNARY[z % len(UNARY)], (args[0],), shape=self.act())
            self.state_values.add(shared.name)  # (not in a grad region: read across unsigned)
            inner.vals.append(shared)
            self.frames.append(frame)
        start = len(inner.vals)
        if shared is not None and self.dense and "stale_signatures" not in self.on:
            # the call reads it and every argument: the signature names what the call uses, so
            # ``repair_call_signatures`` takes no name of it for stale
            inner.vals.append(self._sum(shared, inner.vals[:start - 1]))
        if buffer is not None and state & 1:
            # state into it: the caller updates the call's buffer, and the call reads it first
            frame = self.frames.pop()
            self.update(path, buffer, args[0], z)
            self.frames.append(frame)
            value = self.read_state(path, buffer)
            inner.vals.append(self.op(aten.mul.Tensor, (args[0], value), shape=self.act()))
        self._run(index, path, inner)
        if buffer is not None and state & 2:
            # state out of it: the call updates its buffer last (its caller updates it again)
            self.update(path, buffer, inner.vals[-1], z)
        # distinct values: a value the body holds twice is one output, and a signature with
        # fewer outputs than its ``out_spec`` has leaves is no program (``outline`` raised on it)
        while len({v for v in inner.vals[start:] if v not in self.crossing_only}) < n_outs:
            inner.vals.append(self.op(aten.relu.default, (inner.vals[-1],), shape=self.act()))
        local = [v for v in inner.vals[start:] if v not in self.crossing_only]
        outs = list(dict.fromkeys(back(local, o) for o in (x, y)[:n_outs]))
        outs += [v for v in reversed(local) if v not in outs][: n_outs - len(outs)]
        inner_crossed = [v for v in inner.vals[start:] if v in self.crossing_only]
        if crossing & 4 and inner_crossed:
            # it also returns a value a preserved call it made computed inside (it recomputes it)
            outs[-1] = inner_crossed[-1]
        self.signatures[call_name] = sg.CallSignature(
            inputs=tuple(sg.ArgSpec(sg.TENSOR, r.name) for r in args),
            outputs=tuple(sg.ArgSpec(sg.TENSOR, r.name) for r in outs),
            in_spec=_spec(("args", n_args, ())),
            out_spec=_spec(("tuple", n_outs) if n_outs > 1 or as_tuple else ("leaf",)),
        )
        scope.vals.extend(outs)
        if crossing & 2:
            # inside -> outside: the call computes a value of its output that it does not return
            # (a no-op clone or an op), and the caller reads it
            clone = obj.record[5] >> 7 & 1
            target = aten.clone.default if clone else UNARY[(y + z) % len(UNARY)]
            crossed = self.op(target, (outs[0],), shape=self.act())
            self.crossing_only.add(crossed)
            scope.vals.append(crossed)
            if self.dense and "stale_signatures" not in self.on:
                # the caller reads it and every output (none is unused, so none looks stale)
                frame = self.frames.pop()
                scope.vals.append(self._sum(crossed, list(dict.fromkeys(outs))))
                self.frames.append(frame)
        if buffer is not None and state & 2 and not (
                self._written_from_inside(obj.record)
                and self._overwrite_from_inside(path, buffer, scope, outs)):
            frame = self.frames.pop()
            self.update(path, buffer, outs[0], z >> 1)
            self.frames.append(frame)

    def _written_from_inside(self, rec: bytes) -> bool:
        """Whether the caller's write of a buffer crossing out of a preserved call
        (``crossing_state``) overwrites it with a value the call made and did not return (one
        such write in four, the bits scattered with the record)."""
        return scatter(self.opset_seed, *rec) >> 9 & 3 == 0

    def _overwrite_from_inside(self, path: str, name: str, scope: Scope, outs: list[Ref]
                               ) -> bool:
        """In the preserved call now running: ``made = mean(outs[0], [0])``, unsigned; then, in
        its caller, state ``name`` overwritten in place with it (``copy_(old, made)``): a value
        crossing out of the call into the caller's write, as eager's
        ``self.sub.b.copy_(z)`` of a ``z`` made inside ``sub``. ``False`` (nothing made) where
        the state's update style is functional (a functional write of ``made`` is written back
        in the call that makes it, no crossing). In a dense program without
        ``stale_signatures`` the caller also reads every output (none looks stale)."""
        tid = self.tensor_of[self.fqns[(path, name)]]
        if self.styles.get(tid, "inplace_mutation") != "inplace_mutation" \
                or "inplace_mutation" not in self.styles_on():
            return False
        made = self.op(aten.mean.dim, (outs[0], IList((0,))), shape=(WIDTH,))
        self.crossing_only.add(made)
        frame = self.frames.pop()
        self.update(path, name, outs[0], 0, overwrite=aten.copy_.default, delta=made)
        if self.dense and "stale_signatures" not in self.on:
            scope.vals.append(self._sum(outs[0], list(dict.fromkeys(outs))))
        self.frames.append(frame)
        return True

    def _lone(self, scope: Scope, kind: int, x: int, y: int, z: int) -> bool:
        """Whether this step of the fixed vocabulary reads a new user input instead of an
        earlier value (one step in :data:`LONE_INPUT_SHARE`, decided by the step's bytes
        scattered with the body's mix; never in a preserved call, whose inputs its signature
        names)."""
        if scope.preserved:
            return False
        return scatter(self.mix, LONE_SALT, kind, x, y, z) % LONE_INPUT_SHARE == 0

    def _lone_input(self) -> Ref:
        """A new user input of the activations' shape that only the step taking it reads
        (positional, after the others: spliced as the opset's new inputs are)."""
        name = self.fresh_name("x")
        self.placeholder(name, self.fake(self.act()))
        self.late_inputs.append(name)
        return ref(name)

    def _sum(self, first: Ref, rest: list[Ref]) -> Ref:
        """``first + rest[0] + ...``, one ``add`` per term, in the current frame."""
        for value in rest:
            first = self.op(aten.add.Tensor, (first, value), shape=self.act())
        return first

    def _step(self, obj: ModuleObject, path: str, scope: Scope, kind: int | str, x: int, y: int,
              z: int) -> None:
        """One body step: of kind ``kind`` where the root's body placed a motif or targeted
        step (a string), else the kind its byte picks among those available here
        (``step_kinds.pick_kind``), or the opset for one step in :data:`OPSET_SHARE`; its
        first operand ``x`` places back, or a new user input (:meth:`_lone`). The step's
        value joins the scope, and the results the outputs may return. O(rows + the step's
        nodes)."""
        drawn = not isinstance(kind, str)
        choice = pick_kind(self, obj.state, scope, kind) if drawn else kind
        if "opset" in self.on and drawn and kind >= 256 - 256 // OPSET_SHARE:
            # one step of ``OPSET_SHARE`` calls the opset (besides its being one of the kinds
            # drawn among), and the closing run at the root some more: ``build``
            choice = "opset"
        a = back(scope.vals, x)
        if drawn and choice != "opset" and self._lone(scope, kind, x, y, z):
            a = self._lone_input()
        if (choice == "unary" and path not in self.large_read
                and KIND["mlp"].needs(self, obj.state, scope)):
            choice = "mlp"  # a module's large linears are read by its first unary step
        row = KIND[choice]
        vectors = [s for s in obj.state if len(s[2]) == 1]
        out = row.step(self, path, scope, vectors, a, y, z)
        if out is None:  # a write of state or an input: later steps read it through them
            return
        scope.vals.append(out)
        if scope.preserved:
            return
        if row.role == MOTIF:
            self.motif_results.append(out)
        elif row.role != OPSET:
            self.plain_results.append(out)

    def _splice_late(self, names: list[str], positional: int) -> list[str]:
        """Move the placeholders the opset steps made to where ``import_ep`` puts them: state
        after the state of its kind, user inputs after the positional ones. Returns the user
        input names in order."""
        if not self.late_state and not self.late_inputs:
            return names
        order = (sg.PARAMETER, sg.BUFFER, sg.CONSTANT_TENSOR)
        specs = [s for s in self.inputs if s.kind != sg.USER_INPUT]
        for kind, fqn, name in self.late_state:
            k = STATE_INPUTS[kind][1]
            spec = sg.InputSpec(k, name, fqn, True if k == sg.BUFFER else None)
            at = max((i + 1 for i, s in enumerate(specs) if order.index(s.kind) <= order.index(k)),
                     default=0)
            specs.insert(at, spec)
        users = names[:positional] + self.late_inputs + names[positional:]
        specs += [sg.InputSpec(sg.USER_INPUT, n) for n in users]
        self.inputs = specs
        self.state_order = tuple(s.target for s in specs if s.kind != sg.USER_INPUT)
        placeholders = {n.name: n for n in self.nodes if n.op == PLACEHOLDER}
        rest = [n for n in self.nodes if n.op != PLACEHOLDER]
        self.nodes = [placeholders[s.name] for s in specs] + rest
        return users

    # --- the whole program ------------------------------------------------------------------

    def build(self) -> Program:
        on = self.on
        self._make_state()
        n_inputs = 1 + self.header[4] % 3
        n_keywords = self.header[5] % n_inputs if "keyword_inputs" in on else 0
        positional = n_inputs - n_keywords
        names = [self.fresh_name(f"x{i}") for i in range(positional)]
        names += [self.fresh_name(f"z{i}") for i in range(n_keywords)]
        self.user_inputs = names
        for name in names:
            self.placeholder(name, self.fake(self.act()))
            self.inputs.append(sg.InputSpec(sg.USER_INPUT, name))
        scope = Scope([ref(n) for n in names], preserved=False)
        self._run(-1, "", scope)
        if self.opset_rows:  # and a closing run of opset steps at the end of the root's body
            closing = self.max_ops + self.draw(count(self.max_ops))
            self.limit = self.max_nodes
            for _ in range(closing):
                if self.full():
                    break
                scope.vals.append(opset_step(self, "", scope, [], scope.vals[-1], 0, 0))
        names = self._splice_late(names, positional)
        positional += len(self.late_inputs)
        data = self.draw(OUTPUT_BYTES)
        mutations, user, out_specs = self._outputs(scope, data)
        shape = data[0] >> 2 & 3 if "pytree_outputs" in on else 0
        root_sig = sg.CallSignature(
            inputs=(),
            outputs=(),
            in_spec=_spec(("args", positional, tuple(names[positional:]))),
            out_spec=_spec(_output_tree(shape, len(user))),
            forward_arg_names=tuple(names),
        )
        self.signatures[""] = root_sig
        values = mutations + user
        self.nodes.append(Node(OUTPUT, self.fresh_name("output"), "output", (tuple(values),)))
        modules: dict[str, Module] = {}
        if "grad_regions" in on:
            self._grad_region(self.draw(REGION_BYTES), modules)
        call_order = tuple(p for p, _ in self.paths) + tuple(self.repeated_preserved)
        # class names by path, as import_ep reads them: from the module stacks of the nodes, the
        # root graph's and then the bodies' (a module called only inside a region)
        body_nodes = [n for m in modules.values() for g in m.graphs for n in g.nodes]
        types: dict[str, str] = {}
        for n in (*self.nodes, *body_nodes):
            for path, t in n.meta.get("nn_module_stack", {}).values():
                types.setdefault(path, t)
        bodies = tuple((mid, mid) for mid, m in modules.items() if m.kind == SUBGRAPH)
        children = holder_tree(call_order, self.state_order, types, modules)
        modules[""] = Module(type_name=ROOT_TYPE, kind=PLAIN, children=children + bodies,
                             graphs=(Graph(tuple(self.nodes)),))
        return Program(
            root="",
            modules=pmap(modules),
            state=pmap(self.state),
            state_order=self.state_order,
            tensors=pmap(self.tensors),
            signature=sg.ExportSignature(tuple(self.inputs), out_specs),
            call_signatures=pmap(self.signatures),
            call_order=call_order,
            range_constraints=Opaque(self.ranges) if self.ranges else NO_CONSTRAINTS,
        )

    def _grad_region(self, data: bytes, modules: dict[str, Module]) -> None:
        """``grad_regions``: a run of up to nine root-graph nodes, from the node ``data`` picks
        (mostly one just before the module stack changes, or the next that may join a run),
        becomes the body of a ``wrap_with_set_grad_enabled(False, body, *inputs)`` call,
        as export writes ``with torch.no_grad():`` (the ``get_attr`` of the body, the call and
        its ``getitem`` results carry the stack the run's nodes share; the body's nodes keep their own stacks, so one body may
        span module calls). The run stops before a node that mutates, updates state or an
        input, runs in a preserved call or is read inside one unsigned, or leaves a result that
        is not a tensor. Each result
        read after the run is a ``getitem`` under its own name (the body's nodes keep theirs)."""
        nodes = self.nodes
        first = next((i for i, n in enumerate(nodes) if n.op == CALL_FUNCTION), None)
        if first is None:
            return
        # mostly a run that crosses from one module call into another (what the split cuts)
        edges = [i for i in range(first, len(nodes) - 2)
                 if nodes[i].meta.get("nn_module_stack") != nodes[i + 1].meta.get("nn_module_stack")]
        if edges and data[1] & 3:
            start = max(first, edges[data[0] % len(edges)] - (data[1] >> 2) % 3)
        else:
            start = first + data[0] % (len(nodes) - 1 - first)
        while start < len(nodes) - 1 and not self._may_run_without_grad(nodes[start]):
            start += 1
        run = list(itertools.takewhile(self._may_run_without_grad,
                                       nodes[start:start + 2 + (data[1] >> 4) % 8]))
        # a result read after the run must be a tensor (``sort``'s pair is read by its getitem)
        named = {a.name for sig in self.signatures.values() for a in sig.inputs + sig.outputs}
        while True:
            read_after = {r.name for n in nodes[start + len(run):] for r in n.inputs()} | named
            if all(n.name not in read_after or isinstance(n.meta.get("val"), torch.Tensor)
                   for n in run):
                break
            run.pop()
        if not run:
            return
        inside = {n.name for n in run}
        inputs = list(dict.fromkeys(r.name for n in run for r in n.inputs() if r.name not in inside))
        results = [n for n in run if n.name in read_after]
        if not results:
            return
        defined = {n.name: n for n in nodes}
        body = [Node(PLACEHOLDER, name, name, meta=MappingProxyType(
            {"val": defined[name].meta.get("val")})) for name in inputs]
        body += run
        body.append(Node(OUTPUT, "output", "output", (tuple(n.ref for n in results),)))
        mid = "submod_1"
        modules[mid] = Module(type_name=None, kind=SUBGRAPH, graphs=(Graph(tuple(body)),))
        stack = common_stack([n.meta["nn_module_stack"] for n in run])
        attr = Node(GET_ATTR, self.fresh_name("body"), mid,
                    meta=MappingProxyType({"nn_module_stack": stack}))
        hop_meta = {"nn_module_stack": stack, "val": tuple(n.meta["val"] for n in results)}
        hop = Node(CALL_FUNCTION, self.fresh_name("wrap_with_set_grad_enabled"), _SET_GRAD,
                   (False, attr.ref, *(ref(name) for name in inputs)), EMPTY_DICT,
                   MappingProxyType(hop_meta))
        items = [
            Node(CALL_FUNCTION, n.name, operator.getitem, (hop.ref, k), EMPTY_DICT,
                 MappingProxyType({"nn_module_stack": stack, "val": n.meta["val"]}))
            for k, n in enumerate(results)
        ]
        self.nodes = nodes[:start] + [attr, hop, *items] + nodes[start + len(run):]

    def _may_run_without_grad(self, node: Node) -> bool:
        if node.op != CALL_FUNCTION or is_mutating(node.target) or node.name in self.state_values:
            return False
        stack = node.meta.get("nn_module_stack", {})
        calls = (key[len("L__self__"):] for key in stack)
        return not any(call and call in self.signatures for call in calls)

    def _outputs(self, scope: Scope, data: bytes) -> tuple[tuple, tuple, tuple]:
        """Buffer mutations (state order), input mutations (input order), then 1 to 3 user
        outputs: the latest value, then values picked by back-offsets from ``data``; as
        ``(mutation values, user values, every output's spec)``."""
        specs: list[sg.OutputSpec] = []
        mutations: list[Ref] = []
        for fqn in self.state_order:
            found = self.mutated.get(self.tensor_of[fqn])
            if found and found[0] == "functional_mutation" and found[1] == fqn:
                value = self.current[self.tensor_of[fqn]]
                mutations.append(value)
                specs.append(sg.OutputSpec(sg.BUFFER_MUTATION, value.name, fqn))
        for name in self.user_inputs:
            if self.input_styles.get(name) == "functional_mutation":
                value = self.input_current[name]
                mutations.append(value)
                specs.append(sg.OutputSpec(sg.USER_INPUT_MUTATION, value.name, name))
        # the first is the latest value (what the body computed last is what it returns)
        user = [scope.vals[-1]] + [back(scope.vals, o) for o in data[2:2 + data[0] % 3]]
        extra = data[1] % 4 if "output_aliasing" in self.on else 0
        if extra == 1:  # one value returned twice
            user.append(user[0])
        elif extra == 2:  # a fresh copy of a value returned beside it
            user.append(self.op(aten.clone.default, (user[0],), shape=self.act()))
        elif extra == 3:  # a view of a value returned beside it
            flat = IList((-1,))  # a symbolic batch is no literal
            user.append(self.op(aten.view.default, (user[0], flat), shape=(self.batch * WIDTH,)))
        if self.opset_results:  # the opset steps' latest results that nothing reads
            read = {r.name for n in self.nodes for r in n.inputs()} | {v.name for v in user}
            unread = [r for r in reversed(self.opset_results) if r.name not in read]
            user += unread[:3]
        if self.motif_results:  # and the motif steps' (what they compute reaches an output)
            read = {r.name for n in self.nodes for r in n.inputs()} | {v.name for v in user}
            unread = [r for r in reversed(self.motif_results) if r.name not in read]
            user += list(dict.fromkeys(unread))[:3]
        if self.plain_results and data[1] >> 2 & 7:  # seven programs in eight: and the other
            # steps' (an op whose result nothing reads is dead code, and a bug in how a pass
            # rewrites it changes no output; the eighth keeps its dead code for the passes
            # that remove it, as do the unread results past the latest three)
            read = {r.name for n in self.nodes for r in n.inputs()} | {v.name for v in user}
            unread = [r for r in reversed(self.plain_results) if r.name not in read]
            user += list(dict.fromkeys(unread))[:3]
        specs += [sg.OutputSpec(sg.USER_OUTPUT, v.name) for v in user]
        return tuple(mutations), tuple(user), tuple(specs)


_TARGETED_BYTES = st.binary(min_size=1 + 4 * len(TARGETS), max_size=1 + 4 * len(TARGETS))
"""The bytes of the targeted steps at the root: a start, then place and step bytes per row of
``step_kinds.TARGETS``."""
_MOTIF_KINDS = frozenset(row.kind for row in MOTIFS)


def _output_tree(shape: int, n: int) -> tuple:
    """The user output structure: a leaf or tuple, a list, a dict, or ``(y0, [y1, ...])``."""
    if shape == 0:
        return ("leaf",) if n == 1 else ("tuple", n)
    return (("list", "dict", "nested")[shape - 1], n)


@functools.cache
def _spec(shape: tuple) -> pytree.TreeSpec:
    """The pytree spec of a structure described by ``shape`` (memoized: specs are immutable)."""
    leaf = _LEAF
    if shape[0] == "args":
        _, n, keywords = shape
        tree: Any = ((leaf,) * n, {k: leaf for k in keywords})
    elif shape[0] == "leaf":
        tree = leaf
    elif shape[0] == "tuple":
        tree = (leaf,) * shape[1]
    elif shape[0] == "list":
        tree = [leaf] * shape[1]
    elif shape[0] == "dict":
        tree = {f"y{i}": leaf for i in range(shape[1])}
    else:
        tree = (leaf, [leaf] * (shape[1] - 1))
    return pytree.tree_structure(tree)


_LEAF = object()


def _is_negative_zero(v: float) -> bool:
    return v == 0 and math.copysign(1.0, v) < 0
