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
    (``_EDGE_READS``). ``programs(assumes=...)`` takes what a pass may assume of its values
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
    body's (``_scattered``), so every kind is about as likely under every hypothesis seed.
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
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
import operator
from collections.abc import Callable, Collection, Mapping
from types import MappingProxyType
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from pyrsistent import pmap

from ir import signature as sg
from ir import state as stt
from ir.args import EMPTY_DICT, IDict, IList, Ref, iter_refs, ref
from ir.effects import aliased_args
from ir.errors import InputError
from ir.fake_run import guards_refused, hint
from ir.graph import Graph
from ir.import_ep import holder_tree
from ir.module import PLAIN, SUBGRAPH, Module
from ir.module_stack import common_stack
from ir.node import CALL_FUNCTION, GET_ATTR, OUTPUT, PLACEHOLDER, Node
from ir.ops import is_mutating
from ir.opset import TensorSpec, sample_args, written_at
from ir.printer import contiguous_strides
from ir.program import NO_CONSTRAINTS, Program
from ir.state import Opaque, Slot
from ir.strategies import module_trees
from ir.strategies.opset_steps import (
    FORM_CALLS,
    OPSET_FEATURES,
    Plan,
    fake_call,
    form_units,
    is_channels_last,
    literal,
    opset_rows,
    own_samples,
    permutation_for,
    pick_form,
    pick_row,
    resolve_ops,
    result_tensors,
    row_weights,
    scatter,
    uninitialized,
)
from ir.strategies.values import KNOWN as _ASSUMPTIONS
from ir.torch_seam import (
    fake_failures_unlogged,
    new_fake,
    new_fake_mode,
    new_symbolic_size,
    op_schema,
    pytree,
    storage_identity,
)

__all__ = [
    "CROSSING_FEATURES",
    "DETERMINISTIC_FEATURES",
    "FEATURES",
    "OPT_IN_FEATURES",
    "ROOT_TYPE",
    "WIDTH",
    "check_features",
    "crossing_programs",
    "program_inputs",
    "programs",
]

WIDTH = 4
"""Feature width of every activation ``(batch, WIDTH)`` and every state vector ``(WIDTH,)``."""

ROOT_TYPE = "purefx.generated.Root"
"""The class name the root module's stack entries carry."""

FEATURES = (
    "nesting",
    "repeated_calls",
    "shared_modules",
    "tied_parameters",
    "matrices",
    "buffers",
    "non_persistent",
    "constants",
    "inplace_mutation",
    "functional_mutation",
    "input_mutation",
    "preserved_calls",
    "keyword_inputs",
    "pytree_outputs",
    "multi_result_ops",
    "kwargs_ops",
    "divergent_calls",
    "crossing_reads",
    "activations",
    "constant_builders",
    "random_ops",
    "inplace_copies",
    "large_linears",
    "repeated_subexpressions",
    "overwrites",
    "near_duplicates",
    "identities",
    "inplace_ops",
    # the motifs bugs need (state and alias traffic, everyday ops) and values at the edges
    "state_traffic",
    "view_writes",
    "clone_writes",
    "masks",
    "softmax",
    "int_math",
    "output_aliasing",
    # opt-in (drawn from their own bytes, so the default features' draws are as they were)
    "crossing_state",
    "stale_signatures",
    "grad_regions",
    "edge_values",
    # the opset steps (``ir.strategies.opset_steps``), drawn from their own bytes too
    *OPSET_FEATURES,
    # a symbolic batch (with the opset's flags)
    "symbolic_sizes",
    # values at the edges at the operands of ops (a motif, with the opset's flags too)
    "edge_operands",
)
"""Every feature :func:`programs` can switch on (the swarm draws a subset per example)."""

CROSSING_FEATURES = frozenset(
    {"preserved_calls", "crossing_reads", "crossing_state", "functional_mutation"}
)
"""The features :func:`crossing_programs` always switches on: preserved calls, the values and
the state that cross their boundaries outside their signatures, and the functional buffer
updates whose intermediate values ``insert_ivals`` writes back."""

OPT_IN_FEATURES = frozenset({"crossing_state", "stale_signatures", "grad_regions", "edge_values"})
"""Features drawn only when named in ``features`` (or ``always``): the last ones added, so that
``programs()`` draws what it drew before them (the examples the suite's derandomized tests
meet stay the same); and ``grad_regions`` puts nodes in a higher-order-op body, where a pass
written on the root graph does not look; ``edge_values`` puts inf and nan in state, where a
correct pass checked with a tolerance (fake quantization) differs from its input, until the
semantics law says what a tolerance means where the input's own output is not finite. Their flags are drawn after the others', and only
when one of them may be on."""

OPSET_SHARE = 8
"""The opset's share of the body steps: one in ``OPSET_SHARE`` calls the opset (and it is one
of the kinds the others draw among); a closing run of ``max_ops`` to ``2 max_ops`` opset steps
ends the root's body, cut where the program reaches ``max_nodes`` (the body leaves it
:data:`CLOSING_RESERVE`). One in four made a correct pass of the held-out suite
(``simplify_identities``) change 2 programs of 100: the fixed vocabulary's identities were too
rare."""

DETERMINISTIC_FEATURES = frozenset(FEATURES) - {"random_ops"} - OPT_IN_FEATURES
"""Every feature but ``random_ops`` (and the :data:`OPT_IN_FEATURES`): programs that compute the
same on every call. For a test that compares two runs without seeding them alike
(``lowering.pass_laws`` seeds both sides of its semantics law, and uses every feature)."""

SYMBOLIC_SPAN = 6
"""Under ``symbolic_sizes``, how far above its hint the batch's range reaches
(``Dim("batch", min=hint, max=hint + SYMBOLIC_SPAN)``)."""

SYMBOLIC_OPSET = False
"""Whether the opset steps of a program with a symbolic batch try their samples at the symbolic
batch (else they call every row at its sample's sizes, and only the fixed vocabulary's values
are symbolic). Off: the laws ran a program whose opset steps took the symbolic batch at another
batch size and the process aborted in a later allocation (heap corruption from a kernel that
does not check what its fake run let pass, not yet found), so no row takes it until each row's
kernel is checked at other sizes on real tensors."""

TARGETED_STEPS = 2
"""How many of the targeted features switched on get a step of their own at the root (the
first from a drawn start): two, so the opset's share of the body keeps its room (one for each
of eight features took the 200 default draws from 308-377 operators to 253-320)."""

LONE_INPUT_SHARE = 4
"""One step of the fixed vocabulary in ``LONE_INPUT_SHARE`` (outside preserved calls) reads a
new user input that nothing else reads, as a model's first layer reads its input, instead of
an earlier value. The inputs a program starts with are read by several steps (the first steps
read the latest values), so an op on an input read once, what a pass that treats a placeholder
as an intermediate gets wrong (``relu_`` of a user input), came up only where a far read
landed on an old input: 0 to 4 programs in 100, depending on the seed."""

_LONE_SALT = 8191
"""Salt of :meth:`_Builder._lone`'s hash (apart from the steps' own scattering)."""

CLOSING_RESERVE = 3
"""With the opset on, the body's ordinary steps stop at ``max_nodes - max_nodes //
CLOSING_RESERVE`` nodes, so the closing run of opset steps has room; the motif steps (one of
each feature switched on, at drawn places of the root's body) still run up to ``max_nodes``,
so the reserve takes nothing from the motifs that bugs need (cut at the reserve, a motif bug
of ``tests/laws/test_planted_motif_bugs.py`` was missed). Without it the
motif steps filled the default 60 nodes before the closing run in a third of the programs,
and 200 default draws reached 269 operators and 89 % of the models'
(``python -m bench.opset_coverage``)."""

HIDDEN = 256
"""Hidden width of the ``large_linears`` pair: ``(HIDDEN, WIDTH)`` and ``(WIDTH, HIDDEN)``
weights, 1024 elements each (what a pass that targets "large" linears looks for)."""

aten = torch.ops.aten
_UNARY = (aten.relu.default, aten.neg.default, aten.tanh.default, aten.sigmoid.default)
_ACTIVATIONS = (aten.gelu.default, aten.silu.default)
_RANDOM = (aten.rand_like.default, aten.randn_like.default, aten.rand.default)
_BUILDERS = (aten.arange.default, aten.ones.default, aten.full.default)
_CPU = torch.device("cpu")
_BINARY = (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor)
_INPLACE = (aten.add_.Tensor, aten.sub_.Tensor)
_FUNCTIONAL = (aten.add.Tensor, aten.sub.Tensor)
_SCALARS = (0.5, -1.0, 2.0, 0.25)
_IDENTITIES = ((aten.mul.Tensor, (1.0,)), (aten.add.Tensor, (0,)), (aten.sub.Tensor, (0.0,)),
               (aten.div.Tensor, (1.0,)), (aten.pow.Tensor_Scalar, (2,)), (aten.mul.Tensor, (2,)),
               (aten.clone.default, ()))
_READERS = ((aten.clone.default, ()), (aten.mul.Tensor, (1.0,)))  # (target, literals after x)
# the motif steps' tables: reads of a state vector (target, literals after it); views of a
# ``(batch, WIDTH)`` value and of a ``(WIDTH,)`` one (target, literals after it); in-place
# writes of a view (target, literals after it); comparisons that make a mask; guarded ops
# (nan, inf where the mask is off); fills of a masked position; logits ``a * scale + shift``
# (large ones overflow ``exp`` without the max subtracted, whatever the sign of ``a``; a
# softmax does not change with the shift); softmax targets; int64 ops
_STATE_READS = ((aten.mul.Tensor, (2.0,)), (aten.neg.default, ()), (aten.add.Tensor, (0.5,)),
                (aten.tanh.default, ()))
_VIEWS_2D = ((aten.slice.Tensor, (1, 0, 2)), (aten.select.int, (0, 0)),
             (aten.diagonal.default, ()), (aten.view.default, ("flat",)))
_VIEWS_1D = ((aten.slice.Tensor, (0, 0, 2)), (aten.select.int, (0, 1)),
             (aten.slice.Tensor, (0, 1, WIDTH, 2)), (aten.view.default, (IList((2, 2)),)))
_VIEW_WRITES = ((aten.add_.Tensor, (1.0,)), (aten.mul_.Tensor, (-2.0,)), (aten.fill_.Scalar, (0.5,)))
_MASKS = (aten.gt.Scalar, aten.lt.Scalar, aten.ge.Scalar, aten.le.Scalar)
_GUARDED = (aten.log.default, aten.sqrt.default, aten.reciprocal.default, aten.rsqrt.default)
_FILLS = (-math.inf, math.inf, -1e9, math.nan)
_LOGITS = ((1.0, 0.0), (1e3, 0.0), (16.0, 1e3), (0.125, 1e3))  # (scale, shift)
_SOFTMAX = ((aten.softmax.int, ()), (aten._softmax.default, (False,)),
            (aten.log_softmax.int, ()), (aten._log_softmax.default, (False,)))
_INT_OPS = (aten.mul.Tensor, aten.add.Tensor, aten.mul.Tensor, aten.sub.Tensor)
_EDGES = (math.inf, -math.inf, math.nan, -0.0, 1e30, 7e4, 1e-40, -3e38)
"""Values at the edges a state tensor holds under ``edge_values``: infinities, nan, a negative
zero, a value past ``float16``'s range (``7e4``) and past ``float32``'s square root, a
denormal, a value near ``float32``'s largest."""
_FLOAT32_MAX = torch.finfo(torch.float32).max
_POISONS = ((math.inf, -math.inf, math.nan), (_FLOAT32_MAX, -_FLOAT32_MAX), (-0.0, 1e-40, -1e-40))
"""The values ``edge_operands`` puts in a drawn value, one of each group: one not finite in
one column, ``float32``'s largest (of either sign: its ``exp`` or its double overflows) in
another, and a negative zero or a denormal where the value is past a threshold. So every
value it poisons holds each kind beside ordinary values, and each fast-math fold meets the
value it is wrong on: ``x * 0`` and ``x - x`` an infinity, ``x / x`` an infinity or a zero,
``log(exp(x))`` the largest finite, ``where`` by arithmetic an infinity on the branch it
turns away."""
_EDGE_FEATURES = frozenset({"edge_operands", "edge_values"})
_FINITE_ONLY = frozenset({"no_nans", "no_infs"})
"""Assumptions under which ``programs`` puts no value at an edge on purpose (inf and nan make
each other: ``inf - inf``)."""
_EDGE_SALT = 4099
"""Salt of the ``edge_operands`` step's choices (scattered with the body's mix)."""
_EDGE_READS: tuple[tuple[Any, tuple], ...] = (
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
positive; a tuple of targets is a chain (``log(exp(x))``). The first :data:`_FOLD_READS` rows
are the folds a fast-math pass makes (its first reader is one of them), the rest what models
also write: an op of one value twice, and literal ``0``, ``1``, ``-1``, ``inf``, ``nan`` as
the scalar of ``mul``, ``add``, ``div``, ``pow``, ``clamp``."""
_FOLD_READS = 6


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
    flags = draw(_FEATURE_BYTES)
    on = frozenset(f for f, b in zip(_BASE_FEATURES, flags) if f in allowed and b >= 128)
    if allowed & OPT_IN_FEATURES:
        flags = draw(_OPT_IN_BYTES)
        on |= {f for f, b in zip(_OPT_IN, flags) if f in allowed and b >= 128}
    if allowed & _FLAGGED_SET:
        flags = draw(_OPSET_FLAG_BYTES)
        # ``opset`` in seven draws of eight (its steps reach the table), ``symbolic_sizes`` in
        # one of four, ``edge_operands`` in three of eight (in half, the poison hid a
        # planted state bug under one seed of 20), the others in half
        on |= {f for f, b in zip(_FLAGGED, flags) if f in allowed and b >= _FLAG_AT.get(f, 128)}
    on |= always
    header = draw(_HEADER_BYTES)
    n_objects = draw(_count(max_modules, 1 if dense else 0))
    size = _RECORD * (n_objects + 1)
    records = draw(st.binary(min_size=size, max_size=size))
    return _Builder(draw, on, header, records, max_ops, max_nodes, dense, ops, asked,
                    assumes).build()


_OPSET_SET = frozenset(OPSET_FEATURES)
_FLAGGED = (*OPSET_FEATURES, "symbolic_sizes", "edge_operands")  # the features of the flag bytes
_FLAGGED_SET = frozenset(_FLAGGED)
_FLAG_AT = {"opset": 16, "symbolic_sizes": 192, "edge_operands": 160}  # a flag byte this high: on
_OPT_IN = tuple(f for f in FEATURES if f in OPT_IN_FEATURES)
_BASE_FEATURES = tuple(f for f in FEATURES if f not in OPT_IN_FEATURES and f not in _FLAGGED_SET)
_OPSET_FLAG_BYTES = st.binary(min_size=len(_FLAGGED), max_size=len(_FLAGGED))
_OPSET_STEP_BYTES = st.binary(min_size=4, max_size=4)
_FEATURE_BYTES = st.binary(min_size=len(_BASE_FEATURES), max_size=len(_BASE_FEATURES))
_OPT_IN_BYTES = st.binary(min_size=len(_OPT_IN), max_size=len(_OPT_IN))
_HEADER_BYTES = st.binary(min_size=6, max_size=6)
_OUTPUT_BYTES = st.binary(min_size=4, max_size=4)
_REGION_BYTES = st.binary(min_size=2, max_size=2)
_SET_GRAD = torch.ops.higher_order.wrap_with_set_grad_enabled
_STEP = 3  # bytes per body step: see ``_decode_step``
_RECORD = 7  # bytes per module object: see ``_Builder._objects``
_MOTIF_BYTES = st.binary(min_size=4 * 6, max_size=4 * 6)  # place and step bytes per motif
_MOTIF_SALT = 16381  # the place and step of a motif past the drawn bytes (``_draw_body``)


@functools.cache
def _count(most: int, least: int = 0) -> st.SearchStrategy[int]:
    return st.integers(least, most)


@functools.cache
def _body_bytes(most: int) -> st.SearchStrategy[bytes]:
    return st.binary(min_size=1 + _STEP * most, max_size=1 + _STEP * most)


# --- building -----------------------------------------------------------------------------------


class _Object:
    """One module object of the drawn model: its class, state and registered children."""

    def __init__(self, index: int, type_name: str, record: bytes) -> None:
        self.index = index
        self.type_name = type_name
        self.record = record
        self.state: list[tuple[str, str, tuple[int, ...]]] = []  # (name, kind, shape)
        self.children: list[tuple[str, int]] = []  # (registered name, object index)
        self.body: list[tuple[int, ...]] | None = None


class _Scope:
    """The values a body may read: all values so far, or a preserved call's own."""

    def __init__(self, vals: list[Ref], preserved: bool) -> None:
        self.vals = vals
        self.preserved = preserved


class _Builder:
    """Decodes one program from its draws; a local builder frozen once at the end."""

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
        self.draw = draw
        # the values at the edges the edge features may draw (``programs``' ``assumes``)
        signless = "no_signed_zeros" in assumes
        self.edges = tuple(v for v in _EDGES if not (signless and _is_negative_zero(v)))
        self.poisons = tuple(tuple(v for v in group if not (signless and _is_negative_zero(v)))
                             for group in _POISONS)
        # the opset steps: rows this program may draw, values by (shape, dtype, strides),
        # placeholders made during the body (spliced in at the end), results for the outputs
        self.opset_rows = opset_rows(on, ops) if "opset" in on else ()
        self.row_weights = row_weights(on, ops) if self.opset_rows else ()
        self.pool: dict[tuple, list[Ref]] = {}
        self.late_state: list[tuple[str, str, str]] = []  # (kind, fqn, input name)
        self.late_inputs: list[str] = []
        self.late_count = 0  # state the opset steps made (numbers their fqns)
        self.opset_results: list[Ref] = []
        self.motif_results: list[Ref] = []  # the motif steps' results (outside preserved calls)
        self.plain_results: list[Ref] = []  # the other steps' results (outside preserved calls)
        self.rows_used: set[int] = set()
        self.forms_used: set[int] = set()  # the census forms called (``_opset``)
        self.on = on
        self.dense = dense  # ``crossing_programs``: every call that can be preserved is
        # the opset asked for (``always``, ``ops=``): rows uniform over the table; else drawn
        # by the models' use of them (``_opset``)
        self.asked = asked
        self.max_ops = max_ops
        self.max_nodes = max_nodes
        # the body stops short of ``max_nodes`` where the closing run of opset steps follows
        # (``CLOSING_RESERVE``); the closing run may fill the rest
        self.limit = max_nodes - (max_nodes // CLOSING_RESERVE if self.opset_rows else 0)
        self.header = header
        # the batch: 1 to 3; under ``symbolic_sizes`` a symbolic size of hint 2 to 4 ranging
        # from its hint to ``SYMBOLIC_SPAN`` above (never below: an index constant the opset
        # steps made from a sample indexes the batch dim in range at every size of the range)
        self.batch: Any = 1 + header[0] % 3
        self.symbolic = "symbolic_sizes" in on
        self.ranges: dict = {}
        self.mode: Any = None  # the program's fake mode, made at its first val
        if self.symbolic:
            hint = 2 + header[0] % 3
            self.mode, self.batch, self.ranges = new_symbolic_size(
                "batch", hint, hint, hint + SYMBOLIC_SPAN)
        self.act_key = _size_key(self._act())
        self.rng = torch.Generator().manual_seed(header[1] | header[2] << 8)
        self.objects = self._objects(records)
        self.opset_seed = scatter(*header, *records)  # the opset steps' rows: see ``_opset``
        # and by default every byte drawn before the step, the features too: hypothesis's
        # draws repeat byte strings across examples, which picked one row in three again
        self.mix = scatter(self.opset_seed, *(i for i, f in enumerate(FEATURES) if f in on))
        self.nodes: list[Node] = []
        self.counts: dict[str, int] = {}
        self.taken: set[str] = set()
        self.frames: list[tuple[str, tuple[str, str]]] = [("L__self__", ("", ROOT_TYPE))]
        self.calls: dict[str, int] = {}
        self.signatures: dict[str, sg.CallSignature] = {}
        self.preserved_shapes: dict[str, tuple[int, int, bool]] = {}
        self.repeated_preserved: list[str] = []
        self.crossing_only: set[Ref] = set()  # values read across a preserved boundary unsigned
        self.current: dict[Any, Ref] = {}  # tensor id -> its value after the latest update
        self.mutated: dict[Any, tuple[str, str]] = {}  # tensor id -> (style, first fqn)
        self.styles: dict[Any, str] = {}
        self.input_current: dict[str, Ref] = {}
        self.input_styles: dict[str, str] = {}
        # the models' activations are everyday steps in every program (``activations`` adds
        # an activation of its own result and ``near_duplicates``' two ``gelu`` spellings)
        self.unary = _UNARY + _ACTIVATIONS
        self.large_read: set[str] = set()  # paths whose large linears a step has read
        # new values of state and inputs (update chains), values read into preserved calls
        # unsigned: kept out of ``grad_regions`` bodies
        self.state_values: set[str] = set()
        self.made_in: dict[str, tuple[int, str]] = {}  # value -> the call frame computing it
        self.last_read: Ref | None = None  # the first operand of the latest op
        self.val_of: dict[str, Any] = {}  # node name -> its val (a FakeTensor, or a tuple)

    # --- objects, paths and state ----------------------------------------------------------

    def _objects(self, records: bytes) -> list[_Object]:
        """Module objects from 6-byte records (the first is the root's):

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
        chunks = [records[i:i + _RECORD] for i in range(0, len(records), _RECORD)]
        objects = []
        for i, rec in enumerate(chunks):
            index = i - 1
            name = ROOT_TYPE if index < 0 else f"purefx.generated.M{rec[0] % (index + 1)}"
            obj = _Object(index, name, rec)
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
        if "crossing_state" not in self.on or not self._styles_on():
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
            prefix, input_kind = _STATE_INPUTS[kind]
            name = self._name(prefix + fqn.replace(".", "_"))
            self.input_of[fqn] = name
            self.inputs.append(sg.InputSpec(
                input_kind, name, fqn, persistent if kind == stt.BUFFER else None))
            self._placeholder(name, self._fake(shape))
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
        a value of :data:`_EDGES`, or (integer ones) past ``2**53``; the rest stay ordinary, so
        an inf or a nan reaches some columns of the outputs, not all."""
        pick = int(torch.randint(0, 2 * len(self.edges), (), generator=self.rng))
        at = int(torch.randint(0, value.numel(), (), generator=self.rng))
        if pick < len(self.edges):
            flat = value.view(-1)
            flat[at] = self.edges[pick] if value.is_floating_point() else 2**53 + 2 * pick + 1

    # --- nodes ------------------------------------------------------------------------------

    def _name(self, base: str) -> str:
        n = self.counts.get(base, 0)
        name = base if n == 0 else f"{base}_{n}"
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.counts[base] = n + 1
        self.taken.add(name)
        return name

    def _fake(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A new ``FakeTensor`` of ``shape`` and ``dtype`` in memory of its own, made under the
        program's own fake mode as ``torch.export`` makes its ``val`` s (never written). One
        per value: the guards read whether two values share memory from their ``val`` s
        (``transforms.rewrite.guards.shares_storage``), so values of one shape must not."""
        if self.mode is None:
            self.mode = new_fake_mode()
        return new_fake(self.mode, shape, dtype)  # ``torch.empty`` under the mode, undispatched

    def _aliasing_val(self, node: Node, shape: Any) -> Any:
        """The ``val`` of a node whose result may share an argument's memory (a view, an
        in-place write, a ``getitem``: ``ir.effects.aliased_args``): the operator run on its
        arguments' ``val`` s under the fake mode, so it shares their storage as export's
        does; a new value where that cannot run. O(arguments)."""
        if node.target is operator.getitem:
            return self.val_of[node.args[0].name][node.args[1]]
        try:
            return fake_call(self.mode, node.target, node.args, node.kwargs,
                             lambda r: self.val_of.get(r.name))
        except (RuntimeError, TypeError, ValueError, NotImplementedError):  # fake mode cannot
            # run it: a value of its own
            return self._val(shape)

    def _val(self, shape: Any) -> Any:
        if shape is None:
            return None
        if shape[0] == "sort":
            return (self._fake(shape[1]), self._fake(shape[1], torch.int64))
        if shape[0] == "dtype":
            return self._fake(shape[1], shape[2])
        return self._fake(shape)

    def _placeholder(self, name: str, val: Any) -> Ref:
        self.val_of[name] = val
        self.nodes.append(Node(PLACEHOLDER, name, name, meta=MappingProxyType({"val": val})))
        return ref(name)

    def _op(self, target: Any, args: tuple, kwargs: IDict = EMPTY_DICT, shape: Any = None) -> Ref:
        name = self._name(_base_name(target))
        bare = Node(CALL_FUNCTION, name, target, args, kwargs)
        val = (self._aliasing_val(bare, shape) if shape is not None and aliased_args(bare)
               else self._val(shape))
        self.last_read = next((r for r in args if isinstance(r, Ref)), self.last_read)
        return self._node(name, target, args, kwargs, val, named=True)

    def _full(self) -> bool:
        return len(self.nodes) >= self.limit

    # --- bodies -----------------------------------------------------------------------------

    def _draw_body(self, root: bool) -> list[tuple[int, ...]]:
        """A body: a step count, then three bytes per step (see ``_decode_step``).

        Fixed-size draws, so shrinking the count never misaligns the bytes after it.
        """
        most = 2 * self.max_ops if root else self.max_ops
        data = self.draw(_body_bytes(most))
        self.mix = scatter(self.mix, int.from_bytes(data))
        n = data[0] % (most + 1)
        steps = [
            _scattered(_decode_step(data[i], data[i + 1], data[i + 2]), self.mix, i)
            for i in range(1, 1 + _STEP * n, _STEP)
            if data[i] or data[i + 1] or data[i + 2]  # a zeroed step is no step: shrinking drops ops
        ]
        motifs = [k for f, k, _ in _STEP_FEATURES if f in _MOTIFS and f in self.on]
        if root:
            # one step of each motif switched on, at a drawn place of the root's body: a motif
            # is in every program whose feature is on, not only where the body's bytes pick it.
            # Drawn with no motif on too, so that switching one off does not move what is drawn
            # after (shrinking a feature off keeps the rest of the program)
            data = self.draw(_MOTIF_BYTES)
            for j, kind in enumerate(motifs):
                if 4 * j + 4 <= len(data):
                    at, a, b, c = data[4 * j:4 * j + 4]
                else:  # more motifs on than drawn places (the last one added, with all on):
                    # its bytes from the body's mix (bytes of its own would move every later
                    # draw of the programs that do not have it)
                    h = scatter(self.mix, _MOTIF_SALT, j)
                    at, a, b, c = h & 0xFF, h >> 8 & 0xFF, h >> 16 & 0xFF, h >> 24 & 0xFF
                steps.insert(at % (len(steps) + 1), (0, kind, *_decode_step(a, b, c)[2:]))
            # and one step of each feature users' passes target that is switched on (a
            # constant chain to fold, a random draw, a copy written in place, ...): a bug in
            # a pass that rewrites one meets it in every program with the feature, not in the
            # few whose body draws its kind among the others. Each feature has its own bytes;
            # two at most get a step (the features switched on, from a drawn start), so the
            # opset's share of the body keeps its room
            data = self.draw(_TARGETED_BYTES)
            on = [j for j, (feature, _) in enumerate(_TARGETED) if feature in self.on]
            start = data[0] % len(on) if on else 0
            for j in (on[start:] + on[:start])[:TARGETED_STEPS]:
                at, a, b, c = data[4 * j + 1:4 * j + 5]
                if not (a or b or c):
                    continue  # zeroed, as a body step: shrinking drops it
                _, _, x, y, z = _scattered(_decode_step(a, b, c), self.mix, 4096 + j)
                steps.insert(at % (len(steps) + 1), (0, _TARGETED[j][1], x, y, z))
        return steps

    def _run(self, index: int, path: str, scope: _Scope) -> None:
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
            if self._full():
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
            if self._full():
                return
            self._call(child, f"{path}.{name}" if path else name, scope, 0, 0, 0)

    def _call(self, index: int, path: str, scope: _Scope, x: int, y: int, z: int) -> None:
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
            if obj.record[6] >> 4 & 1 and (buffers and self._styles_on()
                                           or self.current != before[1]):
                # a call made for its writes alone (a statistics tracker): it writes a buffer
                # of its own from what it computed, and nothing after it reads its results,
                # only the state (what a dead-code pass must keep though they are unread)
                if self.current == before[1] and not self._full():
                    self._update(path, buffers[z % len(buffers)], scope.vals[-1], z)
                if self.current != before[1]:
                    for found, n in zip(results, before[0]):
                        del found[n:]
        self.frames.pop()

    def _run_preserved(
        self, index: int, path: str, call_name: str, scope: _Scope, x: int, y: int, z: int
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
        args = [_back(passable, o) for o in (x, y)[:n_args]]
        crossed = [v for v in scope.vals if v in self.crossing_only] if crossing & 4 else []
        if crossed:
            args[0] = crossed[-1]
        inner = _Scope(list(dict.fromkeys(args)), preserved=True)
        shared = None
        if crossing & 1:
            # outside -> inside: the caller computes a value of an argument, the call reads it
            frame = self.frames.pop()
            shared = self._op(_UNARY[z % len(_UNARY)], (args[0],), shape=self._act())
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
            self._update(path, buffer, args[0], z)
            self.frames.append(frame)
            value = self._read_state(path, buffer)
            inner.vals.append(self._op(aten.mul.Tensor, (args[0], value), shape=self._act()))
        self._run(index, path, inner)
        if buffer is not None and state & 2:
            # state out of it: the call updates its buffer last (its caller updates it again)
            self._update(path, buffer, inner.vals[-1], z)
        # distinct values: a value the body holds twice is one output, and a signature with
        # fewer outputs than its ``out_spec`` has leaves is no program (``outline`` raised on it)
        while len({v for v in inner.vals[start:] if v not in self.crossing_only}) < n_outs:
            inner.vals.append(self._op(aten.relu.default, (inner.vals[-1],), shape=self._act()))
        local = [v for v in inner.vals[start:] if v not in self.crossing_only]
        outs = list(dict.fromkeys(_back(local, o) for o in (x, y)[:n_outs]))
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
            target = aten.clone.default if clone else _UNARY[(y + z) % len(_UNARY)]
            crossed = self._op(target, (outs[0],), shape=self._act())
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
            self._update(path, buffer, outs[0], z >> 1)
            self.frames.append(frame)

    def _written_from_inside(self, rec: bytes) -> bool:
        """Whether the caller's write of a buffer crossing out of a preserved call
        (``crossing_state``) overwrites it with a value the call made and did not return (one
        such write in four, the bits scattered with the record)."""
        return scatter(self.opset_seed, *rec) >> 9 & 3 == 0

    def _overwrite_from_inside(self, path: str, name: str, scope: _Scope, outs: list[Ref]
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
                or "inplace_mutation" not in self._styles_on():
            return False
        made = self._op(aten.mean.dim, (outs[0], IList((0,))), shape=(WIDTH,))
        self.crossing_only.add(made)
        frame = self.frames.pop()
        self._update(path, name, outs[0], 0, overwrite=aten.copy_.default, delta=made)
        if self.dense and "stale_signatures" not in self.on:
            scope.vals.append(self._sum(outs[0], list(dict.fromkeys(outs))))
        self.frames.append(frame)
        return True

    def _lone(self, scope: _Scope, kind: int, x: int, y: int, z: int) -> bool:
        """Whether this step of the fixed vocabulary reads a new user input instead of an
        earlier value (one step in :data:`LONE_INPUT_SHARE`, decided by the step's bytes
        scattered with the body's mix; never in a preserved call, whose inputs its signature
        names)."""
        if scope.preserved:
            return False
        return scatter(self.mix, _LONE_SALT, kind, x, y, z) % LONE_INPUT_SHARE == 0

    def _lone_input(self) -> Ref:
        """A new user input of the activations' shape that only the step taking it reads
        (positional, after the others: spliced as the opset's new inputs are)."""
        name = self._name("x")
        self._placeholder(name, self._fake(self._act()))
        self.late_inputs.append(name)
        return ref(name)

    def _act(self) -> tuple[int, int]:
        return (self.batch, WIDTH)

    def _sum(self, first: Ref, rest: list[Ref]) -> Ref:
        """``first + rest[0] + ...``, one ``add`` per term, in the current frame."""
        for value in rest:
            first = self._op(aten.add.Tensor, (first, value), shape=self._act())
        return first

    def _step(self, obj: _Object, path: str, scope: _Scope, kind: int, x: int, y: int, z: int
              ) -> None:
        vectors = [s for s in obj.state if len(s[2]) == 1]
        matrices = [s for s in obj.state if s[2] == (WIDTH, WIDTH)]
        large = [s for s in obj.state if s[0] == "wl0"]
        buffers = [s for s in obj.state if s[1] == stt.BUFFER]
        # elementwise arithmetic is what models do most between their layers: ``binary`` is
        # drawn twice as often as any other kind
        kinds = ["unary", "binary", "binary"]
        if matrices:
            kinds.append("matmul")
        if buffers and self._styles_on():
            kinds.append("update")
        if "input_mutation" in self.on and not scope.preserved and self.user_inputs:
            kinds.append("input_update")
        if "multi_result_ops" in self.on:
            kinds.append("sort")
        if "kwargs_ops" in self.on:
            # as often as ``binary``: a keyword is what these programs are for
            kinds += ["alpha", "alpha"]
        kinds += [k for f, k, _ in _STEP_FEATURES if f in self.on and f not in _MOTIFS]
        motifs = [k for f, k, _ in _STEP_FEATURES if f in self.on and f in _MOTIFS]
        if motifs:  # the motifs switched on share one kind (one more forced in ``_draw_body``)
            kinds.append("motif")
        if large:
            kinds.append("mlp")
        if isinstance(kind, str):  # a motif step of the root's body (``_draw_body``)
            choice = kind
        else:
            choice = kinds[kind % len(kinds)]
            if choice == "motif":
                choice = motifs[kind // len(kinds) % len(motifs)]
        if "opset" in self.on and not isinstance(kind, str) and kind >= 256 - 256 // OPSET_SHARE:
            # one step of ``OPSET_SHARE`` calls the opset (besides its being one of the kinds
            # drawn among), and the closing run at the root some more: ``build``
            choice = "opset"
        a = _back(scope.vals, x)
        if not isinstance(kind, str) and choice != "opset" and self._lone(scope, kind, x, y, z):
            a = self._lone_input()
        act = self._act()
        if choice == "unary" and large and path not in self.large_read:
            choice = "mlp"  # a module's large linears are read by its first unary step
        if choice in _NEW_STEPS:
            out = _NEW_STEPS[choice](self, path, scope, vectors, a, y, z)
            scope.vals.append(out)
            if choice in _MOTIF_KINDS and not scope.preserved:
                self.motif_results.append(out)
            elif choice != "opset" and not scope.preserved:
                self.plain_results.append(out)
            return
        if choice == "unary":
            out = self._op(self.unary[y % len(self.unary)], (a,), shape=act)
            if "activations" in self.on and z >> 3 & 1:  # stacked: relu(relu(x)), gelu(gelu(x))
                out = self._op(self.unary[y % len(self.unary)], (out,), shape=act)
        elif choice in ("binary", "alpha"):
            other: Any
            source = z % 3 if vectors else z % 3 % 2 * 2
            if choice == "alpha" and source == 2 and vectors:
                # an ``alpha`` scales a bias more often than a literal (``add(x, b, alpha=)``
                # with ``b`` broadcast over the batch: where a compiler's broadcast path may
                # drop the keyword): two of the kind's steps in three with vectors of state
                source = 1
            if source == 0:
                other = _back(scope.vals, y)
            elif source == 1:
                other = self._read_state(path, vectors[y % len(vectors)][0])
            else:
                other = _SCALARS[y % len(_SCALARS)]
            # half the steps of two values take them the other way round (which operand
            # comes first, in the graph's order or its names', is what a pass may get wrong)
            operands = (other, a) if isinstance(other, Ref) and z >> 3 & 1 else (a, other)
            if choice == "alpha":
                kwargs = IDict((("alpha", _SCALARS[z % len(_SCALARS)]),))
                out = self._op(aten.add.Tensor, operands, kwargs, shape=act)
            else:
                target = _BINARY[y % len(_BINARY)]
                kwargs = EMPTY_DICT
                if "kwargs_ops" in self.on and target in _FUNCTIONAL:
                    # every add and sub of these programs scales ``other`` by an ``alpha`` (a
                    # keyword a pass may forget: not only the ``alpha`` kind's few steps; the
                    # programs without the feature keep the plain calls)
                    kwargs = IDict((("alpha", _SCALARS[y >> 2]),))
                out = self._op(target, operands, kwargs, shape=act)
        elif choice == "matmul":
            w = self._read_state(path, matrices[y % len(matrices)][0])
            if z % 3 == 0:
                out = self._op(aten.matmul.default, (a, w), shape=act)
            elif z % 3 == 1:
                wt = self._op(aten.t.default, (w,), shape=(WIDTH, WIDTH))
                out = self._op(aten.mm.default, (a, wt), shape=act)
            else:
                bias = (self._read_state(path, vectors[z % len(vectors)][0]),) if vectors else ()
                out = self._op(aten.linear.default, (a, w) + bias, shape=act)
        elif choice == "update":
            self._update(path, buffers[y % len(buffers)][0], a, z)
            return
        elif choice == "input_update":
            self._update_input(scope, self.user_inputs[y % len(self.user_inputs)], a, z)
            return
        else:  # sort: a multi-result op read through getitem
            pair = self._op(aten.sort.default, (a,), shape=("sort", act))
            out = self._op(operator.getitem, (pair, 0), shape=act)
        scope.vals.append(out)
        if not scope.preserved:
            self.plain_results.append(out)

    # --- the steps of the features that users' passes target --------------------------------
    # each returns the step's result, a ``(batch, WIDTH)`` value read by later steps

    def _build(self, path: str, scope: _Scope, vectors: list, a: Ref, y: int, z: int) -> Ref:
        """``constant_builders``: ``arange`` / ``ones`` / ``full`` of ``(WIDTH,)``, maybe an op on
        it (a scalar, a state vector (a buffer the program then updates), an activation),
        combined with ``a``, and then maybe the built value itself added too."""
        which = y % len(_BUILDERS)
        on_cpu = (("device", _CPU), ("pin_memory", False))
        if which == 0:
            k = self._op(aten.arange.default, (WIDTH,),
                         IDict((("dtype", torch.float32), *on_cpu)), shape=(WIDTH,))
        elif which == 1:
            k = self._op(aten.ones.default, (IList((WIDTH,)),), IDict(on_cpu), shape=(WIDTH,))
        else:
            fill = _SCALARS[z % len(_SCALARS)]
            k = self._op(aten.full.default, (IList((WIDTH,)), fill), IDict(on_cpu), shape=(WIDTH,))
        built, chain = k, z >> 2 & 3
        if chain == 1:
            k = self._op(aten.mul.Tensor, (k, _SCALARS[y >> 2]), shape=(WIDTH,))
        elif chain == 2 and vectors:
            # a buffer when there is one: a value a folder must not take for a constant
            pick = [v for v in vectors if v[1] == stt.BUFFER] or vectors
            name = pick[(y >> 2) % len(pick)][0]
            state = self._read_state(path, name)
            k = self._op(aten.add.Tensor, (k, state), shape=(WIDTH,))
            if pick[0][1] == stt.BUFFER and self._styles_on():
                self._update(path, name, a, z)  # and the program updates it
        elif chain:
            k = self._op(self.unary[(y >> 2) % len(self.unary)], (k,), shape=(WIDTH,))
        out = self._op(_BINARY[(y + z) % len(_BINARY)], (a, k), shape=self._act())
        if k is not built and (y >> 3 | z) & 1:  # three times in four the built value is
            # also read after the op on it: a chain whose inner value is read twice (a folder
            # that keeps only a chain's last value drops a value still read)
            out = self._op(aten.add.Tensor, (out, built), shape=self._act())
        return out

    def _random(self, path: str, scope: _Scope, vectors: list, a: Ref, y: int, z: int) -> Ref:
        """``random_ops``: ``rand_like`` / ``randn_like`` of ``a`` or ``rand`` of its shape,
        combined with ``a``; three times in four after an equal call that nothing reads (two
        equal calls, not equal values; a draw is never dead: it moves the generator on)."""
        target = _RANDOM[z % len(_RANDOM)]
        if target is aten.rand.default and self.symbolic:  # a symbolic size is no literal
            target = aten.rand_like.default

        def draw() -> Ref:
            if target is aten.rand.default:
                return self._op(target, (IList(self._act()),),
                                IDict((("device", _CPU), ("pin_memory", False))),
                                shape=self._act())
            return self._op(target, (a,), IDict((("pin_memory", False),)), shape=self._act())

        if z & 12:
            draw()
        return self._op(_BINARY[y % len(_BINARY)], (a, draw()), shape=self._act())

    def _copy(self, path: str, scope: _Scope, vectors: list, a: Ref, y: int, z: int) -> Ref:
        """``inplace_copies``: ``clone(a)`` written in place (``add_`` of a value or a scalar, or
        ``copy_`` of a value), sometimes after a copy that is kept as it is; later steps read
        the write's result, as in export's graphs."""
        if z >> 2 & 1:  # a copy kept beside the one written: equal calls, not equal values
            scope.vals.append(self._op(aten.clone.default, (a,), shape=self._act()))
        c = self._op(aten.clone.default, (a,), shape=self._act())
        if z % 3 == 2:
            return self._op(aten.copy_.default, (c, _back(scope.vals, y)), shape=self._act())
        other: Any = _back(scope.vals, y) if z % 3 == 0 else _SCALARS[y % len(_SCALARS)]
        return self._op(aten.add_.Tensor, (c, other), shape=self._act())

    def _mlp(self, path: str, scope: _Scope, vectors: list, a: Ref, y: int, z: int) -> Ref:
        """``large_linears``: ``linear(act(linear(a, wl0)), wl1)`` through ``HIDDEN`` features."""
        self.large_read.add(path)
        hidden = (self.batch, HIDDEN)
        h = self._op(aten.linear.default, (a, self._read_state(path, "wl0")), shape=hidden)
        h = self._op(self.unary[z % len(self.unary)], (h,), shape=hidden)
        return self._op(aten.linear.default, (h, self._read_state(path, "wl1")),
                        shape=self._act())

    def _twice(self, path: str, scope: _Scope, vectors: list, a: Ref, y: int, z: int) -> Ref:
        """``repeated_subexpressions``: one pure op of ``a`` computed twice and both results
        combined (an activation, or an op with a scalar; the second spelled ``2`` where the
        first says ``2.0`` when ``z`` says so: equal values on float tensors, other literals)."""
        variant = z % 3
        if variant == 0:
            target = self.unary[y % len(self.unary)]
            first = self._op(target, (a,), shape=self._act())
            second = self._op(target, (a,), shape=self._act())
        else:
            target = _BINARY[y % len(_BINARY)]
            scalar = _SCALARS[(y >> 2) % len(_SCALARS)]
            again: Any = scalar
            if variant == 2 and scalar == int(scalar):
                again = int(scalar)
            first = self._op(target, (a, scalar), shape=self._act())
            second = self._op(target, (a, again), shape=self._act())
        return self._op(_BINARY[z >> 2 & 1], (first, second), shape=self._act())

    def _overwrite(self, path: str, scope: _Scope, vectors: list, a: Ref, y: int, z: int) -> Ref:
        """``overwrites``: ``copy_`` of a new value into a buffer (``mean(a, [0])``, as
        ``self.buf.copy_(...)`` exports) or, in a program without preserved calls, into a user
        input (``a``); later reads of it see the write. Returns ``a``: the write's own result is
        read only through later reads of what it wrote (often by no one)."""
        buffers = [v[0] for v in vectors if v[1] == stt.BUFFER
                   and self.styles.get(self.tensor_of[self.fqns[(path, v[0])]],
                                       "inplace_mutation") == "inplace_mutation"]
        # not with preserved calls: transform(p, pipeline(keep_functional=True)) raises a
        # PassError on an input overwritten by copy_ after a preserved call (a purefx gap,
        # docs/known-gaps.md), and every law test of the pipeline would meet it
        inputs = [n for n in self.user_inputs if not scope.preserved
                  and "preserved_calls" not in self.on
                  and self.input_styles.get(n, "inplace_mutation") == "inplace_mutation"]
        if buffers and (z & 1 or not inputs):
            self._update(path, buffers[y % len(buffers)], a, z, aten.copy_.default)
        elif inputs:
            old, new = self._update_input(scope, inputs[y % len(inputs)], a, z,
                                          aten.copy_.default)
            if a == old:  # the input's old value is read no more
                return new
        else:
            return self._op(self.unary[y % len(self.unary)], (a,), shape=self._act())
        return a

    def _stacked(self, path: str, scope: _Scope, vectors: list, a: Ref, y: int, z: int
                 ) -> Ref:
        """``activations``: an activation of its own result, ``relu(relu(a))``,
        ``gelu(gelu(a))`` (what a pass that collapses idempotent activations rewrites)."""
        act = self.unary[(y + z) % len(self.unary)]
        return self._op(act, (self._op(act, (a,), shape=self._act()),), shape=self._act())

    def _near(self, path: str, scope: _Scope, vectors: list, a: Ref, y: int, z: int) -> Ref:
        """``near_duplicates``: two ops of ``a`` that differ only in a keyword, a literal or a
        dtype, their difference the result (zero where a pass merges them): ``add(a, b)`` and
        ``add(a, b, alpha=)``; ``a`` cast to ``float16`` and to ``bfloat16`` (each cast back);
        ``mean(a, [1], True)`` and ``mean(a, [0], True)``; with ``activations``, ``gelu(a)``
        and ``gelu(a, approximate='tanh')``."""
        act = self._act()
        variant = z % 4
        if variant == 3 and "activations" not in self.on:  # gelu is the activations' op
            variant = 0
        if variant == 0:
            b = _back(scope.vals, y)
            pair = (b, a) if z >> 2 & 1 else (a, b)  # either way round, as binary steps
            first = self._op(aten.add.Tensor, pair, shape=act)
            alpha = IDict((("alpha", _SCALARS[(y >> 2) % len(_SCALARS)]),))
            second = self._op(aten.add.Tensor, pair, alpha, shape=act)
        elif variant == 1:
            pair = []
            for dtype in (torch.float16, torch.bfloat16):
                low = self._op(aten._to_copy.default, (a,), IDict((("dtype", dtype),)),
                               shape=("dtype", act, dtype))
                pair.append(self._op(aten._to_copy.default, (low,),
                                     IDict((("dtype", torch.float32),)), shape=act))
            first, second = pair
        elif variant == 2:
            first = self._op(aten.mean.dim, (a, IList((1,)), True), shape=(act[0], 1))
            second = self._op(aten.mean.dim, (a, IList((0,)), True), shape=(1, WIDTH))
            return self._op(aten.add.Tensor, (first, second), shape=act)
        else:
            first = self._op(aten.gelu.default, (a,), shape=act)
            second = self._op(aten.gelu.default, (a,), IDict((("approximate", "tanh"),)),
                              shape=act)
        return self._op(aten.sub.Tensor, (first, second), shape=act)

    def _identity(self, path: str, scope: _Scope, vectors: list, a: Ref, y: int, z: int
                  ) -> Ref:
        """``identities``: one op an algebraic simplifier rewrites: ``mul(a, 1.0)``,
        ``add(a, 0)``, ``sub(a, 0.0)``, ``div(a, 1.0)``, ``pow(a, 2)``, ``mul(a, 2)``,
        ``clone(a)``."""
        target, literals = _IDENTITIES[z % len(_IDENTITIES)]
        return self._op(target, (a, *literals), shape=self._act())

    def _inplace(self, path: str, scope: _Scope, vectors: list, a: Ref, y: int, z: int) -> Ref:
        """``inplace_ops``: ``add_`` of ``a`` (or ``mul_`` of a scalar, or ``relu_``) on a value
        this call computed earlier (not an input, state, or a value a signature names: outside
        preserved calls only), which earlier ops may have read (half the time, what the latest
        op read); later reads see the write. Half the time a copy of it is taken just before
        the write (``clone``, or ``mul`` by ``1.0``) and is the step's result.
        Where there is none, ``relu(a)``."""
        here = (len(self.frames), self.frames[-1][0])
        inputs = set(self.input_current.values())
        mine = [v for v in scope.vals if self.made_in.get(v.name) == here
                and v not in inputs and v not in self.crossing_only] if not scope.preserved else []
        if not mine:
            return self._op(aten.relu.default, (a,), shape=self._act())
        v = mine[-1 - y % len(mine)]
        if z >> 2 & 1 and self.last_read in mine:  # what the op just before read
            v = self.last_read
        reader = None
        if z >> 3 & 1:  # a copy taken just before the write: ``y = x.clone(); x += a``
            target, literals = _READERS[(z >> 4) % len(_READERS)]
            reader = self._op(target, (v, *literals), shape=self._act())
        if z % 3 == 0:
            new = self._op(aten.add_.Tensor, (v, a), shape=self._act())
        elif z % 3 == 1:
            new = self._op(aten.mul_.Tensor, (v, _SCALARS[y % len(_SCALARS)]), shape=self._act())
        else:
            new = self._op(aten.relu_.default, (v,), shape=self._act())
        scope.vals[:] = [new if u == v else u for u in scope.vals]
        if reader is not None:
            scope.vals.append(new)
            return reader
        return new

    # --- the motif steps: state and alias traffic, everyday ops, values at the edges ---------

    def _mine(self, scope: _Scope) -> list[Ref]:
        """Values this call computed that may be written in place: not an input, state, or a
        value a signature names (none in a preserved call)."""
        if scope.preserved:
            return []
        here = (len(self.frames), self.frames[-1][0])
        inputs = set(self.input_current.values())
        return [v for v in scope.vals if self.made_in.get(v.name) == here
                and v not in inputs and v not in self.crossing_only]

    def _inplace_buffers(self, path: str, vectors: list) -> list[str]:
        """This module's buffers that may be written in place (their style is, or will be,
        ``inplace_mutation``)."""
        if "inplace_mutation" not in self.on:
            return []
        return [v[0] for v in vectors if v[1] == stt.BUFFER
                and self.styles.get(self.tensor_of[self.fqns[(path, v[0])]],
                                    "inplace_mutation") == "inplace_mutation"]

    def _wrote_buffer(self, path: str, name: str, *written: Ref) -> None:
        """Bookkeeping of a buffer written in place through ``written`` (a view of it): later
        reads read the buffer as they did (the same tensor), and no functional output."""
        fqn = self.fqns[(path, name)]
        tid = self.tensor_of[fqn]
        self.styles.setdefault(tid, "inplace_mutation")
        self.mutated.setdefault(tid, ("inplace_mutation", fqn))
        self.state_values.update(r.name for r in written)

    def _state_traffic(self, path: str, scope: _Scope, vectors: list, a: Ref, y: int, z: int
                       ) -> Ref:
        """``state_traffic``: a buffer of this module read (an op of the buffer alone, which
        a folder may take for a constant) around its own update by ``a``: read then written
        (the next call reads what this one wrote), written then read, or read, written and read
        again by an equal call (the same op of the same value where the update is in place and
        the read is of the buffer's value); the reads combined with ``a``. Without a buffer that
        can be updated, a read of a state vector (or ``relu(a)``)."""
        act = self._act()
        buffers = [v[0] for v in vectors if v[1] == stt.BUFFER]
        target, literals = _STATE_READS[(y >> 2) % len(_STATE_READS)]

        def read(name: str) -> Ref:
            return self._op(target, (self._read_state(path, name), *literals), shape=(WIDTH,))

        if not buffers or not self._styles_on():
            if not vectors:
                return self._op(aten.relu.default, (a,), shape=act)
            r = read(vectors[y % len(vectors)][0])
            return self._op(_BINARY[z % len(_BINARY)], (a, r), shape=act)
        name = buffers[y % len(buffers)]
        variant = z % 3
        if variant == 1:
            self._update(path, name, a, z >> 2)
        r = read(name)
        if variant != 1:
            self._update(path, name, a, z >> 2)
        if variant == 2:
            r = self._op(aten.add.Tensor, (r, read(name)), shape=(WIDTH,))
        return self._op(_BINARY[(z >> 2) % len(_BINARY)], (a, r), shape=act)

    def _view_write(self, path: str, scope: _Scope, vectors: list, a: Ref, y: int, z: int
                    ) -> Ref:
        """``view_writes``: a write through a view and a read of its base after it. The base is
        a copy of ``a`` (``clone``) or, half the time, a buffer of this module written in
        place; the view a ``slice``, ``select``, ``diagonal`` or ``view`` of it, written by
        ``add_`` / ``mul_`` / ``fill_``; the base then read by an op (three times in four an
        equal call before the write as well: what a CSE blind to writes through views merges),
        combined with ``a``."""
        act = self._act()
        buffers = self._inplace_buffers(path, vectors)
        name = buffers[y % len(buffers)] if buffers and z & 1 else None
        if name is not None:
            base, shape = self._read_state(path, name), (WIDTH,)
        else:
            base, shape = self._op(aten.clone.default, (a,), shape=act), act
        target, literals = _STATE_READS[(y >> 2) % len(_STATE_READS)]
        before = self._op(target, (base, *literals), shape=shape) if z & 6 else None
        views = _VIEWS_1D if len(shape) == 1 else _VIEWS_2D
        view, view_literals = views[y % len(views)]
        if view_literals == ("flat",):
            view_literals = (IList((-1,)),)  # a symbolic batch is no literal
        v = self._op(view, (base, *view_literals), shape=shape)
        write, write_literals = _VIEW_WRITES[(z >> 2) % len(_VIEW_WRITES)]
        w = self._op(write, (v, *write_literals), shape=shape)
        if name is not None:
            self._wrote_buffer(path, name, v, w)
        after = self._op(target, (base, *literals), shape=shape)
        out = self._op(_BINARY[z >> 3 & 1], (a, after), shape=act)
        if before is not None:
            out = self._op(aten.sub.Tensor, (out, before), shape=act)
        return out

    def _clone_write(self, path: str, scope: _Scope, vectors: list, a: Ref, y: int, z: int
                     ) -> Ref:
        """``clone_writes``: ``c = x.clone()`` (or ``x * 1.0``), then ``x`` written in place (``add_`` of ``a``,
        ``mul_`` of a scalar, ``copy_`` of ``a``), and ``c`` read after the write (it keeps
        the old value) next to the new ``x``. ``x`` is a value this call computed (later reads
        see the write) or, half the time where there is one, a buffer of this module (its
        update). Half the time a second ``clone(x)`` is taken and written itself: equal calls,
        one written, which a CSE must not merge."""
        act = self._act()
        buffers = self._inplace_buffers(path, vectors)
        if buffers and z >> 3 & 1:
            name = buffers[y % len(buffers)]
            c = self._op(aten.clone.default, (self._read_state(path, name),), shape=(WIDTH,))
            twin = None
            if z >> 2 & 1:
                twin = self._op(aten.clone.default, (self._read_state(path, name),),
                                shape=(WIDTH,))
                twin = self._op(aten.mul_.Tensor, (twin, -1.0), shape=(WIDTH,))
            self._update(path, name, a, z % 2 * 2)
            out = self._op(aten.sub.Tensor, (a, c), shape=act)
            out = self._op(aten.add.Tensor, (out, self._read_state(path, name)), shape=act)
            return out if twin is None else self._op(aten.add.Tensor, (out, twin), shape=act)
        mine = self._mine(scope)
        x = mine[-1 - y % len(mine)] if mine else self._op(aten.relu.default, (a,), shape=act)
        reader, literals = _READERS[(y >> 2) % len(_READERS)]
        c = self._op(reader, (x, *literals), shape=act)
        twin = None
        if z >> 2 & 1:
            twin = self._op(aten.clone.default, (x,), shape=act)
            twin = self._op(aten.add_.Tensor, (twin, a), shape=act)
        if z % 3 == 0:
            new = self._op(aten.add_.Tensor, (x, a), shape=act)
        elif z % 3 == 1:
            new = self._op(aten.mul_.Tensor, (x, _SCALARS[y % len(_SCALARS)]), shape=act)
        else:
            new = self._op(aten.copy_.default, (x, a), shape=act)
        scope.vals[:] = [new if u == x else u for u in scope.vals]
        out = self._op(_BINARY[(z >> 3) % 2], (c, new), shape=act)
        return out if twin is None else self._op(aten.add.Tensor, (out, twin), shape=act)

    def _where(self, path: str, scope: _Scope, vectors: list, a: Ref, y: int, z: int) -> Ref:
        """``masks``: ``where`` of a bool mask from a comparison with ``0``: a guarded op of
        ``d = a - b`` (``b`` an earlier value, or ``a``), ``where(d > 0, log(d), a)`` (``sqrt``,
        ``reciprocal``, ``rsqrt``: the branch holds nan or inf where the mask is off); a
        masked fill of ``a`` (``masked_fill`` or ``where`` with a
        scalar: ``-inf``, ``inf``, ``-1e9``, nan); or ``where(mask, a, b)`` of two values
        (``b`` an earlier value)."""
        act = self._act()
        b = _back(scope.vals, y)
        variant = z % 4
        if variant <= 1:  # a guarded op of ``a - b`` (of both signs): the mask says where
            d = self._op(aten.sub.Tensor, (a, b), shape=act)
            mask = self._op(aten.gt.Scalar, (d, 0.0), shape=("dtype", act, torch.bool))
            guarded = self._op(_GUARDED[(y >> 2) % len(_GUARDED)], (d,), shape=act)
            return self._op(aten.where.self, (mask, guarded, a), shape=act)
        mask = self._op(_MASKS[(y >> 2) % len(_MASKS)], (a, 0.0),
                        shape=("dtype", act, torch.bool))
        if variant == 2:
            fill = _FILLS[(z >> 2) % len(_FILLS)]
            if z >> 2 & 1:
                return self._op(aten.masked_fill.Scalar, (a, mask, fill), shape=act)
            return self._op(aten.where.ScalarOther, (mask, a, fill), shape=act)
        return self._op(aten.where.self, (mask, a, b), shape=act)

    def _softmax(self, path: str, scope: _Scope, vectors: list, a: Ref, y: int, z: int) -> Ref:
        """``softmax``: ``softmax`` / ``_softmax`` / ``log_softmax`` / ``_log_softmax`` of ``a``
        over its last or first dim, of logits ``a``, ``a * 1e3``, ``a * 16 + 1e3`` or ``a *
        0.125 + 1e3`` (large logits: ``exp`` overflows unless the max is subtracted), half the time
        after a masked fill with ``-inf`` where ``a > 0.5`` (attention's mask)."""
        act = self._act()
        scale, shift = _LOGITS[y % len(_LOGITS)]
        x = a if scale == 1.0 else self._op(aten.mul.Tensor, (a, scale), shape=act)
        if shift:
            x = self._op(aten.add.Tensor, (x, shift), shape=act)
        if z >> 2 & 1:
            mask = self._op(aten.gt.Scalar, (a, 0.5), shape=("dtype", act, torch.bool))
            x = self._op(aten.masked_fill.Scalar, (x, mask, float("-inf")), shape=act)
        target, literals = _SOFTMAX[z % len(_SOFTMAX)]
        dim = -1 if z >> 3 & 1 else (1, 0)[y >> 2 & 1]
        return self._op(target, (x, dim, *literals), shape=act)

    def _int_math(self, path: str, scope: _Scope, vectors: list, a: Ref, y: int, z: int
                  ) -> Ref:
        """``int_math``: int64 arithmetic. ``k = int64(a * 1000)`` (integers of ``(-1000,
        1000)``) and ``big``, an int64 constant of this module (``arange`` arithmetic where
        it can have none), combined by ``mul`` / ``add`` / ``sub``. Half the time (always
        with ``edge_values``) the constant is past ``2**53`` for ``add`` / ``sub`` and between
        ``2**46`` and ``2**52`` for ``mul`` (products past ``2**53``: a route through
        ``float64`` is wrong), else past ``2**31`` or below ``2**20``. The result's low digits (``remainder`` by 997) are cast back,
        scaled by ``2**-10`` and added to ``a``, so a wrong low bit reaches the output."""
        act = self._act()
        i64 = ("dtype", act, torch.int64)
        k = self._op(aten.mul.Tensor, (a, 1000.0), shape=act)
        k = self._op(aten._to_copy.default, (k,), IDict((("dtype", torch.int64),)), shape=i64)
        op = _INT_OPS[y % len(_INT_OPS)]
        magnitude = max(y >> 2 & 3, 2 if "edge_values" in self.on else 0)
        if magnitude >= 2:  # past 2**53: the operand (add, sub) or the product (mul)
            low, high = (2**53, 2**62) if op is not aten.mul.Tensor else (2**46, 2**52)
        else:  # past 2**31, or ordinary
            low, high = (2**31, 2**40) if magnitude else (2**10, 2**20)
        values = torch.randint(low, high, (WIDTH,), generator=self.rng, dtype=torch.int64)
        big = self._new_constant(path, scope, values)
        if big is None:
            step = int(values[0]) // WIDTH
            on_cpu = (("device", _CPU), ("pin_memory", False))
            ramp = self._op(aten.arange.default, (WIDTH,),
                            IDict((("dtype", torch.int64), *on_cpu)), shape=("dtype", (WIDTH,),
                                                                            torch.int64))
            ramp = self._op(aten.mul.Tensor, (ramp, step), shape=("dtype", (WIDTH,), torch.int64))
            big = self._op(aten.add.Tensor, (ramp, int(values[1]) | 1),
                           shape=("dtype", (WIDTH,), torch.int64))
        r = self._op(op, (big, k) if z & 1 else (k, big), shape=i64)
        r = self._op(aten.remainder.Scalar, (r, 997), shape=i64)
        f = self._op(aten._to_copy.default, (r,), IDict((("dtype", torch.float32),)), shape=act)
        f = self._op(aten.mul.Tensor, (f, 2.0**-10), shape=act)
        return self._op(aten.add.Tensor, (a, f), shape=act)

    def _edge_operands(self, path: str, scope: _Scope, vectors: list, a: Ref, y: int, z: int
                       ) -> Ref:
        """``edge_operands``: ``a`` poisoned at drawn positions, then read. One column of ``a``
        (``where(arange(WIDTH) == k, edge, a)``) holds inf, -inf or nan, another column
        (``where`` again, or ``masked_fill``) ``float32``'s largest of either sign, and the
        positions where ``a`` is past ``0.5`` (``masked_fill``) ``-0.0`` or a denormal
        (:data:`_POISONS`, less what ``programs``' ``assumes`` excludes). So the
        value is ordinary at some positions and at an edge at others, as a model's is after an
        overflow, a masked fill or a division by zero; it joins the values later steps read
        (the opset's too), and three readers here read it: two folds fast-math makes (``x *
        0``, ``x - x``, ``x / x``, ``log(exp(x))``, ``where`` with it on either branch), the
        first the step's result, and any reader of :data:`_EDGE_READS` (an op of the value
        twice, a literal edge scalar of ``mul`` / ``add`` / ``div`` / ``pow`` / ``clamp``);
        the other two are values of their own, which outputs return when nothing reads them. Choices scattered with the body's mix,
        as a body step's are (a motif step's bytes are drawn raw). O(1) nodes."""
        act = self._act()
        h = scatter(self.mix, _EDGE_SALT, y, z, len(self.nodes))
        nonfinite, large, small = self.poisons
        first = h % WIDTH
        second = (first + 1 + (h >> 2) % (WIDTH - 1)) % WIDTH
        on_cpu = (("device", _CPU), ("pin_memory", False))
        columns = self._op(aten.arange.default, (WIDTH,),
                           IDict((("dtype", torch.int64), *on_cpu)),
                           shape=("dtype", (WIDTH,), torch.int64))
        column = ("dtype", (WIDTH,), torch.bool)
        x = a
        # where ``a`` is past a threshold: some rows, not all (first, so that the columns'
        # edges stay whatever ``a`` holds; ``small`` is empty where ``assumes`` leaves none)
        if small:
            past = self._op(aten.gt.Scalar, (a, 0.5), shape=("dtype", act, torch.bool))
            x = self._op(aten.masked_fill.Scalar, (x, past, small[(h >> 10) % len(small)]),
                         shape=act)
        mask = self._op(aten.eq.Scalar, (columns, first), shape=column)
        x = self._op(aten.where.ScalarSelf, (mask, nonfinite[(h >> 4) % len(nonfinite)], x),
                     shape=act)
        at = self._op(aten.eq.Scalar, (columns, second), shape=column)
        edge = large[(h >> 6) % len(large)]
        if h >> 9 & 1:
            x = self._op(aten.where.ScalarSelf, (at, edge, x), shape=act)
        else:
            x = self._op(aten.masked_fill.Scalar, (x, at, edge), shape=act)
        earlier = scope.vals[:]
        other = _back(earlier, (h >> 11) % 4)
        scope.vals.append(x)
        positive: list[Ref] = []

        def read(row: tuple[Any, tuple]) -> Ref:
            target, template = row
            if "mask" in template and not positive:
                positive.append(self._op(aten.gt.Scalar, (other, 0.0),
                                         shape=("dtype", act, torch.bool)))
            args = tuple(x if t == "x" else other if t == "other" else positive[0]
                         if t == "mask" else t for t in template)
            if isinstance(target, tuple):  # a chain: ``log(exp(x))``
                value = x
                for step in target:
                    value = self._op(step, (value,), shape=act)
                return value
            return self._op(target, args, shape=act)

        fold = (h >> 13) % _FOLD_READS
        folded = read(_EDGE_READS[fold])
        for row in (_EDGE_READS[(fold + 1 + (h >> 16) % (_FOLD_READS - 1)) % _FOLD_READS],
                    _EDGE_READS[(h >> 19) % len(_EDGE_READS)]):
            again = read(row)
            scope.vals.append(again)
            if not scope.preserved:
                self.motif_results.append(again)
        return folded

    def _new_constant(self, path: str, scope: _Scope, value: torch.Tensor) -> Ref | None:
        """A new constant of the module at ``path`` holding ``value`` (its placeholder), as the
        opset steps add state; ``None`` in a preserved call or a module at two paths (its new
        state would cross the boundary unsigned, or be one path's only)."""
        if scope.preserved or self.sites[self.index_of[path]] != 1:
            return None
        fqn_name = f"int{self.late_count}"
        self.late_count += 1
        fqn = f"{path}.{fqn_name}" if path else fqn_name
        name = self._name(_STATE_INPUTS[stt.CONSTANT][0] + fqn.replace(".", "_"))
        plan = Plan()
        plan.placeholders.append((stt.CONSTANT, name, self._fake(tuple(value.shape),
                                                                 value.dtype), (fqn, value)))
        self._commit(plan)
        return ref(name)

    # --- the opset steps (``ir.strategies.opset_steps``) ------------------------------------

    def _opset(self, path: str, scope: _Scope, vectors: list, a: Ref, y: int, z: int) -> Ref:
        """``opset``: one operator of the verified table called with the arguments of one of
        its samples (``ir.strategies.opset_steps``). Not in a preserved call (its new inputs
        would cross the boundary unsigned) nor in a module registered at two paths (its new
        state would be one path's only). Returns the result when it is a ``(batch, WIDTH)``
        float32 value of its own memory (later steps of the fixed vocabulary read it), else
        ``a``."""
        index = self.index_of[path]
        if not self.opset_rows or scope.preserved or self.sites[index] != 1:
            return self._op(aten.relu.default, (a,), shape=self._act())
        data = self.draw(_OPSET_STEP_BYTES)
        # the row: the step's two bytes, the program's seed bytes and the step's number,
        # scattered (hypothesis's bytes favour small values and repeats, so a plain product
        # of them met a few hundred rows in a thousand draws); zero bytes decode to row 0.
        # Asked for (``always``, ``ops=``): uniform over the rows; by default half by how many
        # models use the row's operator, half uniform (``opset_steps.pick_row``)
        if self.asked:
            h = scatter(int.from_bytes(data), self.opset_seed, len(self.rows_used))
        else:
            h = self.mix = scatter(self.mix, int.from_bytes(data), len(self.rows_used))
        if self.asked and not any(data):
            at = 0
        elif self.asked:
            at = h % len(self.opset_rows)
        else:
            at = pick_row(self.row_weights, h)
        for _ in range(len(self.opset_rows)):  # a row this program has not called yet
            if at not in self.rows_used:
                break
            at = (at + 1) % len(self.opset_rows)
        self.rows_used.add(at)
        row, op, samples = self.opset_rows[at]
        # asked for, any sample of the row (its own, then the census's forms); by default its
        # own (the census's are the form calls below)
        n = len(samples) if self.asked else own_samples(row, samples) or len(samples)
        out = self._opset_run(path, scope, a, row, op, samples[data[2] % n], data)
        # by default, a step calls up to ``FORM_CALLS`` forms of the census as well, each with
        # chance ``FORM_SHARE`` (how real models call an operator: ``ir.strategies.forms``),
        # each form once per program, their nodes outside the program's budget (counted, they
        # cut the steps that reach the table's rare rows); a step shrunk to zero bytes calls
        # none
        for k in range(0 if self.asked or not any(data) else FORM_CALLS):
            form = pick_form(self.on, scatter(h, k), self.forms_used)
            if form is None:
                continue
            self.forms_used.add(form)
            at, sample_at = form_units(self.on, None)[form]
            row, op, samples = self.opset_rows[at]
            before = len(self.nodes)
            out = self._opset_run(path, scope, out, row, op, samples[sample_at], data)
            self.limit += len(self.nodes) - before
            self.max_nodes += len(self.nodes) - before
        return out

    def _copy_of_view(self, view: Ref, t: torch.Tensor) -> tuple[Ref, torch.Tensor]:
        """``clone(view)`` as a node and its fake value (contiguous unless ``t`` is dense in
        another order: ``clone`` keeps a dense layout)."""
        with fake_failures_unlogged():
            val = fake_call(self.mode, aten.clone.default, (view,), EMPTY_DICT,
                            lambda r: self.val_of[r.name])
        return self._node("clone", aten.clone.default, (view,), EMPTY_DICT, val), val

    def _opset_run(self, path: str, scope: _Scope, a: Ref, row: Any, op: Any, sample: Any,
                   data: bytes) -> Ref:
        """An opset step's call of ``op`` (of ``row``) with the arguments of ``sample``
        (``_opset``), its tensors chosen by ``data``; ``_opset``'s result, or ``a``."""
        choice = data[3]
        written = set(written_at(row, sample.args))
        reals, real_kwargs = sample_args(sample, seed=data[0] | data[1] << 8)
        legacy = [v for v in scope.vals if v not in self.crossing_only]
        # under ``symbolic_sizes``, first with the batch symbolic in every argument that can
        # take it (where ``SYMBOLIC_OPSET`` says so), then (an operator that cannot: its fake
        # run asks for a guard on the batch, or fails) with the sample's own sizes
        for symbolic in (True, False) if self.symbolic and SYMBOLIC_OPSET else (False,):
            found = self._opset_call(path, row, op, sample, written, reals, real_kwargs, legacy,
                                     choice, symbolic)
            if found is not None:
                break
        else:
            return a
        plan, args, kwargs, val, lookup = found
        results = result_tensors(val)
        if not results:
            return a
        self._commit(plan)
        node = self._node(_base_name(op), op, tuple(args), kwargs, val)
        if written:  # state written: kept out of ``grad_regions`` bodies
            self.state_values.add(node.name)
        arg_storages = {storage_identity(v) for v in (lookup(r) for r in iter_refs((tuple(args), kwargs)))
                        if isinstance(v, torch.Tensor)}
        out = a
        for ix, t in results:
            r = node if ix is None else self._node("getitem", operator.getitem, (node, ix),
                                                    EMPTY_DICT, t)
            of_an_argument = storage_identity(t) in arg_storages
            if uninitialized(row) or (of_an_argument and written):
                # memory no one wrote (``empty``), or the written argument (read as it is):
                # never read on, never an output
                continue
            if of_an_argument:
                # a view of an argument (``view``, ``transpose``, ``select``, ...): read on as
                # models read their views, through a copy of its own memory taken at once (a
                # later in-place step writes pool values; a view in the pool would carry that
                # write to its base, an input's or state's): a pass that gets a view's shape
                # or offset wrong changes what is read, and an output
                r, t = self._copy_of_view(r, t)
            key = (_size_key(t.shape), t.dtype, self._stride_key(t))
            self.pool.setdefault(key, []).append(r)
            self.opset_results.append(r)
            if key == (self.act_key, torch.float32, None):
                out = r
        return out

    def _opset_call(self, path: str, row: Any, op: Any, sample: Any, written: set,
                    reals: list, real_kwargs: dict, legacy: list[Ref], choice: int,
                    symbolic: bool) -> tuple | None:
        """One try at an opset step's call (``_opset``): its plan of new placeholders, its
        arguments and its fake run, committed to nothing; None when the fake run fails or
        resizes a written argument. With ``symbolic``, a new contiguous user input or an earlier
        value whose first size is the batch's hint takes the symbolic batch instead, and the
        fake run refuses every new guard (a guard would pin the batch to its hint)."""
        plan = Plan()
        planned: dict[str, Any] = {}

        def lookup(r: Ref) -> Any:
            return planned[r.name] if r.name in planned else self.val_of[r.name]

        def tensor_arg(spec: Any, real: torch.Tensor, pos: int, k: int) -> Ref:
            def state(kind: str, prefix: str) -> Ref:
                fqn_name = f"{prefix}{self.late_count}"
                self.late_count += 1
                fqn = f"{path}.{fqn_name}" if path else fqn_name
                name = self._name(_STATE_INPUTS[kind][0] + fqn.replace(".", "_"))
                value = real.detach().clone(memory_format=torch.contiguous_format)
                if kind == stt.PARAMETER:
                    value = torch.nn.Parameter(value, requires_grad=False)
                val = self._fake(tuple(spec.shape), spec.dtype)
                plan.placeholders.append((kind, name, val, (fqn, value)))
                planned[name] = val
                return ref(name)

            if pos in written:
                return state(stt.BUFFER, "opset_b")
            if spec.values is not None:
                return state(stt.CONSTANT, "opset_c")
            floating = spec.dtype.is_floating_point
            if floating and (spec.low > -1.0 or spec.high < 1.0):
                # a domain narrower than ``program_inputs``' [-1, 1) (``normal``'s std >= 0):
                # the sample's own values, never an input or an earlier value
                return state(stt.PARAMETER, "opset_w")
            if not floating and not self._fits_inputs(spec):
                return state(stt.CONSTANT, "opset_i")  # integer values of the spec's range
            stride = self._layout(spec)
            shape = tuple(spec.shape)
            if symbolic and stride is None and shape and shape[0] == hint(self.batch):
                shape = (self.batch, *shape[1:])
            key = (_size_key(shape), spec.dtype, stride)
            found = list(self.pool.get(key, ()))
            if key == (self.act_key, torch.float32, None):
                found += legacy
            bits = choice >> (k % 4) * 2
            if found and not bits & 1:
                return found[-1 - (bits >> 1) % len(found)]
            if floating and bits & 3 == 3 and stride is None:
                return state(stt.PARAMETER, "opset_w")
            return self._new_input(spec, shape, stride, plan, planned)

        tensors = itertools.count()  # the tensor arguments' running number (``tensor_arg``'s k)

        def argument(a_: Any, real: Any, pos: int) -> Any:
            if isinstance(a_, TensorSpec):
                return tensor_arg(a_, real, pos, next(tensors))
            if (pos >= 0 and isinstance(a_, (tuple, list)) and a_
                    and all(isinstance(x, TensorSpec) for x in a_)):
                return IList(tuple(tensor_arg(spec, real[j], pos, next(tensors))
                                   for j, spec in enumerate(a_)))
            return literal(a_)

        args = tuple(argument(a_, reals[pos], pos) for pos, a_ in enumerate(sample.args))
        kwargs = IDict(tuple((key_, argument(v, real_kwargs[key_], -1))
                             for key_, v in sample.kwargs))
        layouts = {n: _layout_key(v) for n, v in planned.items()}
        try:
            with guards_refused(self.mode), fake_failures_unlogged():
                val = fake_call(self.mode, op, args, kwargs, lookup)
        except Exception:  # noqa: BLE001 - no fake run (data-dependent shape, no kernel, a
            # guard on the batch): no step
            return None
        if any(_layout_key(v) != layouts[n] for n, v in planned.items()):
            return None  # it resized a written argument (``resize_``, ``set_``): a
            # placeholder's val would no longer be its state's shape
        return plan, args, kwargs, val, lookup

    def _fits_inputs(self, spec: Any) -> bool:
        """An integer / bool spec whose range :func:`program_inputs`'s values fit."""
        if spec.dtype == torch.bool:
            return True
        return spec.low <= 0 and spec.high >= 10

    def _layout(self, spec: Any) -> tuple[int, ...] | None:
        """The strides an argument of ``spec`` gets (None: contiguous)."""
        if spec.stride is None or tuple(spec.stride) == contiguous_strides(spec.shape):
            return None
        if is_channels_last(tuple(spec.shape), tuple(spec.stride)):
            return tuple(spec.stride) if "channels_last" in self.on else None
        return tuple(spec.stride) if "strided_inputs" in self.on else None

    def _stride_key(self, t: torch.Tensor) -> tuple | None:
        """``t``'s strides as a pool key (None: contiguous), read without a guard."""
        stride = _size_key(t.stride())
        step: Any = 1
        contiguous = []
        for n in reversed(tuple(t.shape)):
            contiguous.append(step)
            step = step * (n if isinstance(n, torch.SymInt) else max(n, 1))
        return None if stride == _size_key(reversed(contiguous)) else stride

    def _new_input(self, spec: Any, shape: tuple, stride: tuple[int, ...] | None, plan: Plan,
                   planned: dict) -> Ref:
        """A new user input of ``spec``'s dtype and ``shape`` (``spec``'s, or with the symbolic
        batch first: then contiguous), positional after the others, of ``stride`` through a
        ``permute`` of a contiguous input or an ``as_strided`` view of a flat one."""
        name = self._name("x")
        perm = None if stride is None else permutation_for(shape, stride)
        if stride is None:
            val = self._fake(shape, spec.dtype)
        elif perm is not None:
            val = self._fake(tuple(shape[d] for d in perm), spec.dtype)
            inverse = tuple(perm.index(d) for d in range(len(shape)))
            target, args = aten.permute.default, (ref(name), IList(inverse))
        else:
            size = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0
            val = self._fake((size,), spec.dtype)
            target, args = aten.as_strided.default, (ref(name), IList(shape), IList(stride))
        plan.placeholders.append((sg.USER_INPUT, name, val, None))
        planned[name] = val
        if stride is None:
            return ref(name)
        view = self._name(_base_name(target))
        view_val = fake_call(self.mode, target, args, EMPTY_DICT, lambda r: val)
        plan.layout.append((view, target, args, view_val))
        planned[view] = view_val
        return ref(view)

    def _commit(self, plan: Plan) -> None:
        """Add a step's placeholders (state, inputs) and layout nodes to the program."""
        for kind, name, val, extra in plan.placeholders:
            self._placeholder(name, val)
            if kind == sg.USER_INPUT:
                self.late_inputs.append(name)
                continue
            fqn, tensor = extra
            self.tensors[fqn] = Opaque(tensor)
            self.state[fqn] = Slot(kind, fqn, True, kind == stt.PARAMETER and tensor.requires_grad)
            self.tensor_of[fqn] = ("opset", fqn)
            self.input_of[fqn] = name
            self.late_state.append((kind, fqn, name))
            self.state_values.add(name)
        for name, target, args, val in plan.layout:
            self._node(name, target, args, EMPTY_DICT, val, named=True)

    def _node(self, base: str, target: Any, args: tuple, kwargs: IDict, val: Any,
              named: bool = False) -> Ref:
        name = base if named else self._name(base)
        self.val_of[name] = val
        meta = {"nn_module_stack": dict(self.frames), "val": val}
        self.made_in[name] = len(self.frames), self.frames[-1][0]
        self.nodes.append(Node(CALL_FUNCTION, name, target, args, kwargs, MappingProxyType(meta)))
        return ref(name)

    def _splice_late(self, names: list[str], positional: int) -> list[str]:
        """Move the placeholders the opset steps made to where ``import_ep`` puts them: state
        after the state of its kind, user inputs after the positional ones. Returns the user
        input names in order."""
        if not self.late_state and not self.late_inputs:
            return names
        order = (sg.PARAMETER, sg.BUFFER, sg.CONSTANT_TENSOR)
        specs = [s for s in self.inputs if s.kind != sg.USER_INPUT]
        for kind, fqn, name in self.late_state:
            k = _STATE_INPUTS[kind][1]
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

    def _styles_on(self) -> tuple[str, ...]:
        return tuple(s for s in ("inplace_mutation", "functional_mutation") if s in self.on)

    def _read_state(self, path: str, name: str) -> Ref:
        fqn = self.fqns[(path, name)]
        found = self.current.get(self.tensor_of[fqn])
        return found if found is not None else ref(self.input_of[fqn])

    def _update(self, path: str, name: str, a: Ref, z: int, overwrite: Any = None,
                delta: Ref | None = None) -> None:
        """An update of state ``name`` by ``mean(a, [0])`` in the style its tensor has (drawn
        by ``z`` at its first update), or ``overwrite`` (``copy_``) of it in place; ``delta``:
        the value to update it by, made already (in another frame), instead of that mean."""
        fqn = self.fqns[(path, name)]
        tid = self.tensor_of[fqn]
        styles = ("inplace_mutation",) if overwrite is not None else self._styles_on()
        style = self.styles.setdefault(tid, styles[z % len(styles)])
        old = self._read_state(path, name)
        if delta is None:
            delta = self._op(aten.mean.dim, (a, IList((0,))), shape=(WIDTH,))
        ops = _INPLACE if style == "inplace_mutation" else _FUNCTIONAL
        new = self._op(overwrite or ops[z // 2 % len(ops)], (old, delta), shape=(WIDTH,))
        self.state_values.add(new.name)
        self.current[tid] = new
        self.mutated.setdefault(tid, (style, fqn))

    def _update_input(self, scope: _Scope, name: str, a: Ref, z: int, overwrite: Any = None
                      ) -> tuple[Ref, Ref]:
        """User input ``name`` plus ``a`` in the style the input has (drawn by ``z`` at its
        first update), or ``overwrite`` (``copy_``) of ``a`` into it; its old and new value."""
        styles = ("inplace_mutation", "functional_mutation")[:1 if overwrite else 2]
        style = self.input_styles.setdefault(name, styles[z % len(styles)])
        old = self.input_current.get(name, ref(name))
        target = aten.add_.Tensor if style == "inplace_mutation" else aten.add.Tensor
        new = self._op(overwrite or target, (old, a), shape=self._act())
        self.state_values.add(new.name)
        # as export writes them, later reads take the new value: the in-place result (the same
        # tensor) or, in a functionalized program, the functional one
        scope.vals[:] = [new if v == old else v for v in scope.vals]
        self.input_current[name] = new
        return old, new

    # --- the whole program ------------------------------------------------------------------

    def build(self) -> Program:
        on = self.on
        self._make_state()
        n_inputs = 1 + self.header[4] % 3
        n_keywords = self.header[5] % n_inputs if "keyword_inputs" in on else 0
        positional = n_inputs - n_keywords
        names = [self._name(f"x{i}") for i in range(positional)]
        names += [self._name(f"z{i}") for i in range(n_keywords)]
        self.user_inputs = names
        for name in names:
            self._placeholder(name, self._fake(self._act()))
            self.inputs.append(sg.InputSpec(sg.USER_INPUT, name))
        scope = _Scope([ref(n) for n in names], preserved=False)
        self._run(-1, "", scope)
        if self.opset_rows:  # and a closing run of opset steps at the end of the root's body
            closing = self.max_ops + self.draw(_count(self.max_ops))
            self.limit = self.max_nodes
            for _ in range(closing):
                if self._full():
                    break
                scope.vals.append(self._opset("", scope, [], scope.vals[-1], 0, 0))
        names = self._splice_late(names, positional)
        positional += len(self.late_inputs)
        data = self.draw(_OUTPUT_BYTES)
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
        self.nodes.append(Node(OUTPUT, self._name("output"), "output", (tuple(values),)))
        modules: dict[str, Module] = {}
        if "grad_regions" in on:
            self._grad_region(self.draw(_REGION_BYTES), modules)
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
        attr = Node(GET_ATTR, self._name("body"), mid,
                    meta=MappingProxyType({"nn_module_stack": stack}))
        hop_meta = {"nn_module_stack": stack, "val": tuple(n.meta["val"] for n in results)}
        hop = Node(CALL_FUNCTION, self._name("wrap_with_set_grad_enabled"), _SET_GRAD,
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

    def _outputs(self, scope: _Scope, data: bytes) -> tuple[tuple, tuple, tuple]:
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
        user = [scope.vals[-1]] + [_back(scope.vals, o) for o in data[2:2 + data[0] % 3]]
        extra = data[1] % 4 if "output_aliasing" in self.on else 0
        if extra == 1:  # one value returned twice
            user.append(user[0])
        elif extra == 2:  # a fresh copy of a value returned beside it
            user.append(self._op(aten.clone.default, (user[0],), shape=self._act()))
        elif extra == 3:  # a view of a value returned beside it
            flat = IList((-1,))  # a symbolic batch is no literal
            user.append(self._op(aten.view.default, (user[0], flat), shape=(self.batch * WIDTH,)))
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


# the step kinds of the features users' passes target, in the order they join the step kinds:
# (feature, step kind, the step's method)
_STEP_FEATURES = (
    ("constant_builders", "build", _Builder._build),
    ("random_ops", "random", _Builder._random),
    ("inplace_copies", "copy", _Builder._copy),
    ("repeated_subexpressions", "twice", _Builder._twice),
    ("overwrites", "overwrite", _Builder._overwrite),
    ("near_duplicates", "near", _Builder._near),
    ("identities", "identity", _Builder._identity),
    ("activations", "stacked", _Builder._stacked),
    ("inplace_ops", "inplace", _Builder._inplace),
    ("state_traffic", "state", _Builder._state_traffic),
    ("view_writes", "view_write", _Builder._view_write),
    ("clone_writes", "clone_write", _Builder._clone_write),
    ("masks", "where", _Builder._where),
    ("softmax", "softmax", _Builder._softmax),
    ("int_math", "int_math", _Builder._int_math),
    ("edge_operands", "edge_operand", _Builder._edge_operands),
    ("opset", "opset", _Builder._opset),
)
_MOTIFS = frozenset({"state_traffic", "view_writes", "clone_writes", "masks", "softmax",
                     "int_math", "edge_operands"})
"""Step features whose kinds are drawn twice as often as the others' (the state and alias
traffic and the everyday ops that bugs need)."""
_MOTIF_KINDS = frozenset(k for f, k, _ in _STEP_FEATURES if f in _MOTIFS)
_NEW_STEPS = {kind: step for _, kind, step in _STEP_FEATURES} | {"mlp": _Builder._mlp}
_TARGETED = tuple((f, k) for f, k, _ in _STEP_FEATURES if f not in _MOTIFS and f != "opset")
"""The step features users' passes target (not the motifs, not the opset): each switched on
gets one step at a drawn place of the root's body (``_draw_body``)."""
_TARGETED_BYTES = st.binary(min_size=1 + 4 * len(_TARGETED), max_size=1 + 4 * len(_TARGETED))


def _decode_step(a: int, b: int, c: int) -> tuple[int, ...]:
    """``(is_call, kind, x, y, z)`` from three bytes (``(0, 0, 0)`` is skipped by the caller).

    ``is_call``: call a child (when the module has one) instead of an op; ``kind``: which op
    among those available here; ``x``: back-offset of the first operand; ``y``, ``z``: the
    second operand / op variant / child, each taken modulo what is available. Half the steps
    (bit 7 of ``a`` clear) read one of the two latest values, so chains of ops, and what they
    compute, reach the outputs more often than uniform offsets would let them.
    """
    return (a & 1, c, a >> 1 if a & 128 else a >> 1 & 1, b & 15, b >> 4)


def _scattered(step: tuple[int, ...], mix: int, at: int) -> tuple[int, ...]:
    """``step`` with its kind, ``y`` and ``z`` taken from its bytes scattered with the
    body's ``mix`` and its place ``at`` (``is_call`` and the back-offset ``x`` stay as drawn).

    Hypothesis draws small bytes and repeats far more often than others, and how much so
    varies from one run to the next: read as they are, the kinds of a run's steps cluster
    (one seed drew ``gelu`` in 2 programs of 100, another in 25), so a bug that needs one
    kind was caught under some seeds and missed under others. Scattered, every kind is
    about equally likely under every seed. A zeroed step is still skipped by the caller, so
    shrinking still drops steps. O(1)."""
    is_call, kind, x, y, z = step
    h = scatter(mix, at, kind, y, z)
    return is_call, h & 0xFF, x, h >> 8 & 15, h >> 12 & 15


def _size_key(sizes: Any) -> tuple:
    """``sizes`` as a hashable key that compares without a guard: a symbolic size as its
    expression's text, an int as itself. O(len(sizes))."""
    return tuple(str(n.node.expr) if isinstance(n, torch.SymInt) else int(n) for n in sizes)


def _layout_key(t: torch.Tensor) -> tuple:
    return _size_key(t.shape), _size_key(t.stride())


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


def _back(vals: list[Ref], offset: int) -> Ref:
    """The value ``offset`` places back from the most recent one (modulo how many there are)."""
    return vals[-1 - offset % len(vals)]


_STATE_INPUTS = {
    stt.PARAMETER: ("p_", sg.PARAMETER),
    stt.BUFFER: ("b_", sg.BUFFER),
    stt.CONSTANT: ("c_", sg.CONSTANT_TENSOR),
}


@functools.cache
def _base_name(target: Any) -> str:
    """What a node of ``target`` is named after: ``getitem``, or the operator's schema name
    (``add_`` for ``aten.add_.Tensor``). Memoized per target."""
    return "getitem" if target is operator.getitem else op_schema(target).name.split("::")[-1]


# --- inputs -------------------------------------------------------------------------------------


def program_inputs(
    program: Program, seed: int = 0, sizes: Mapping[str, int] | None = None,
    *, floating: Callable[[tuple[int, ...], torch.dtype], torch.Tensor] | None = None,
) -> tuple[tuple, dict]:
    """Fresh example ``(args, kwargs)`` for ``lower(program)``, deterministic in ``seed``.

    One tensor per user-input placeholder of the root graph, of the shape and dtype its
    ``meta["val"]`` gives (uniform in ``[-1, 1)`` for floating types, ``0..9`` for integer
    ones; a symbolic size takes its hint, or with ``sizes`` (symbol name -> size, ``{"s0": 9}``)
    its expression at those sizes when they give each of its symbols), arranged by the root
    call signature's ``in_spec``
    (positional only when the program has none). ``floating(shape, dtype)``, when given, makes
    each floating tensor in place of a draw from ``seed``. An input
    export recorded as ``None`` (its ``val``) is ``None``. Works on any Program whose root
    keeps ``import_ep``'s placeholders, so also after passes. Raises ``InputError`` naming the
    placeholder whose ``meta["val"]`` says nothing about its value.
    """
    graph = program.root_module.graph
    users = {s.name for s in program.signature.user_inputs()}
    gen = torch.Generator().manual_seed(seed)
    leaves = []
    for node in graph.placeholders:
        if node.name not in users:
            continue
        leaves.append(_example_value(node, gen, sizes, floating))
    sig = program.call_signatures.get("")
    if sig is None:
        return tuple(leaves), {}
    if sig.in_spec.num_leaves != len(leaves):
        raise InputError(
            f"the root in_spec takes {sig.in_spec.num_leaves} inputs but the root graph has "
            f"{len(leaves)} user-input placeholders"
        )
    args, kwargs = pytree.tree_unflatten(leaves, sig.in_spec)
    return tuple(args), dict(kwargs)


def _example_value(node: Node, gen: torch.Generator, sizes: Mapping[str, int] | None,
                   floating: Callable[[tuple[int, ...], torch.dtype], torch.Tensor] | None,
                   ) -> Any:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        shape = tuple(_size(d, sizes) for d in val.shape)
        if val.dtype.is_floating_point and floating is not None:
            return floating(shape, val.dtype)
        if val.dtype.is_floating_point:
            return torch.rand(shape, generator=gen).to(val.dtype) * 2 - 1
        if val.dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=gen).bool()
        return torch.randint(0, 10, shape, generator=gen).to(val.dtype)
    if isinstance(val, (torch.SymInt, int)) and not isinstance(val, bool):
        return _size(val, sizes)
    if isinstance(val, (float, bool, str)) or (val is None and "val" in node.meta):
        return val
    raise InputError(
        f"placeholder {node.name!r} has meta['val'] {val!r}; cannot make an example input for it"
    )


def _size(d: Any, sizes: Mapping[str, int] | None) -> int:
    """``d`` at ``sizes`` (its expression, when they give each of its symbols), else its hint."""
    if sizes and isinstance(d, torch.SymInt):
        expr = d.node.expr
        free = getattr(expr, "free_symbols", ())
        if free and all(str(s) in sizes for s in free):
            return int(expr.xreplace({s: sizes[str(s)] for s in free}))
    return int(hint(d))
