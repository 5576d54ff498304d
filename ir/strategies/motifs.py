"""The steps of the features users' passes target, and the motifs bugs need.

Each function is one kind of body step of ``ir.strategies.programs``: it reads the value ``a``
(and ``y``, ``z``: its variant, taken modulo what is available), adds its nodes through the
builder ``b`` at module ``path`` (whose state vectors are ``vectors``) in ``scope``, and
returns a ``(batch, WIDTH)`` value later steps read. Each is named after the feature that
switches it on (``ir.strategies.step_kinds`` has the table: kind, feature, weight); its
operators and literals are rows of ``ir.strategies.vocabulary``. O(1) nodes each.

The targeted features (``constant_builders`` to ``inplace_ops``) are what users' passes
rewrite (``large_linears`` too, drawn among the plain kinds where a module has the pair); the
motifs (``state_traffic`` to ``edge_operands``) are the state and alias traffic, the everyday
ops and the values at the edges that bugs need.
"""

from __future__ import annotations

from typing import Any

import torch

from ir import state as stt
from ir.args import IDict, IList, Ref
from ir.strategies.builder import ProgramBuilder, Scope
from ir.strategies.decoding import EDGE_SALT, back
from ir.strategies.opset_steps import scatter
from ir.strategies.vocabulary import (
    BINARY,
    BUILDERS,
    CPU,
    EDGE_READS,
    FILLS,
    FOLD_READS,
    GUARDED,
    HIDDEN,
    IDENTITIES,
    INT_OPS,
    LOGITS,
    MASKS,
    RANDOM,
    READERS,
    SCALARS,
    SOFTMAX,
    STATE_READS,
    VIEW_WRITES,
    VIEWS_1D,
    VIEWS_2D,
    WIDTH,
)

aten = torch.ops.aten


def constant_builders(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
                      z: int) -> Ref:
    """``constant_builders``: ``arange`` / ``ones`` / ``full`` of ``(WIDTH,)``, maybe an op on
    it (a scalar, a state vector (a buffer the program then updates), an activation),
    combined with ``a``, and then maybe the built value itself added too."""
    which = y % len(BUILDERS)
    on_cpu = (("device", CPU), ("pin_memory", False))
    if which == 0:
        k = b.op(aten.arange.default, (WIDTH,),
                 IDict((("dtype", torch.float32), *on_cpu)), shape=(WIDTH,))
    elif which == 1:
        k = b.op(aten.ones.default, (IList((WIDTH,)),), IDict(on_cpu), shape=(WIDTH,))
    else:
        fill = SCALARS[z % len(SCALARS)]
        k = b.op(aten.full.default, (IList((WIDTH,)), fill), IDict(on_cpu), shape=(WIDTH,))
    built, chain = k, z >> 2 & 3
    if chain == 1:
        k = b.op(aten.mul.Tensor, (k, SCALARS[y >> 2]), shape=(WIDTH,))
    elif chain == 2 and vectors:
        # a buffer when there is one: a value a folder must not take for a constant
        pick = [v for v in vectors if v[1] == stt.BUFFER] or vectors
        name = pick[(y >> 2) % len(pick)][0]
        state = b.read_state(path, name)
        k = b.op(aten.add.Tensor, (k, state), shape=(WIDTH,))
        if pick[0][1] == stt.BUFFER and b.styles_on():
            b.update(path, name, a, z)  # and the program updates it
    elif chain:
        k = b.op(b.unary[(y >> 2) % len(b.unary)], (k,), shape=(WIDTH,))
    out = b.op(BINARY[(y + z) % len(BINARY)], (a, k), shape=b.act())
    if k is not built and (y >> 3 | z) & 1:  # three times in four the built value is
        # also read after the op on it: a chain whose inner value is read twice (a folder
        # that keeps only a chain's last value drops a value still read)
        out = b.op(aten.add.Tensor, (out, built), shape=b.act())
    return out


def random_ops(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
               z: int) -> Ref:
    """``random_ops``: ``rand_like`` / ``randn_like`` of ``a`` or ``rand`` of its shape,
    combined with ``a``; three times in four after an equal call that nothing reads (two
    equal calls, not equal values; a draw is never dead: it moves the generator on)."""
    target = RANDOM[z % len(RANDOM)]
    if target is aten.rand.default and b.symbolic:  # a symbolic size is no literal
        target = aten.rand_like.default

    def draw() -> Ref:
        if target is aten.rand.default:
            return b.op(target, (IList(b.act()),),
                        IDict((("device", CPU), ("pin_memory", False))),
                        shape=b.act())
        return b.op(target, (a,), IDict((("pin_memory", False),)), shape=b.act())

    if z & 12:
        draw()
    return b.op(BINARY[y % len(BINARY)], (a, draw()), shape=b.act())


def inplace_copies(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
                   z: int) -> Ref:
    """``inplace_copies``: ``clone(a)`` written in place (``add_`` of a value or a scalar, or
    ``copy_`` of a value), sometimes after a copy that is kept as it is; later steps read
    the write's result, as in export's graphs."""
    if z >> 2 & 1:  # a copy kept beside the one written: equal calls, not equal values
        scope.vals.append(b.op(aten.clone.default, (a,), shape=b.act()))
    c = b.op(aten.clone.default, (a,), shape=b.act())
    if z % 3 == 2:
        return b.op(aten.copy_.default, (c, back(scope.vals, y)), shape=b.act())
    other: Any = back(scope.vals, y) if z % 3 == 0 else SCALARS[y % len(SCALARS)]
    return b.op(aten.add_.Tensor, (c, other), shape=b.act())


def large_linears(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
                  z: int) -> Ref:
    """``large_linears``: ``linear(act(linear(a, wl0)), wl1)`` through ``HIDDEN`` features."""
    b.large_read.add(path)
    hidden = (b.batch, HIDDEN)
    h = b.op(aten.linear.default, (a, b.read_state(path, "wl0")), shape=hidden)
    h = b.op(b.unary[z % len(b.unary)], (h,), shape=hidden)
    return b.op(aten.linear.default, (h, b.read_state(path, "wl1")),
                shape=b.act())


def repeated_subexpressions(b: ProgramBuilder, path: str, scope: Scope, vectors: list,
                            a: Ref, y: int, z: int) -> Ref:
    """``repeated_subexpressions``: one pure op of ``a`` computed twice and both results
    combined (an activation, or an op with a scalar; the second spelled ``2`` where the
    first says ``2.0`` when ``z`` says so: equal values on float tensors, other literals)."""
    variant = z % 3
    if variant == 0:
        target = b.unary[y % len(b.unary)]
        first = b.op(target, (a,), shape=b.act())
        second = b.op(target, (a,), shape=b.act())
    else:
        target = BINARY[y % len(BINARY)]
        scalar = SCALARS[(y >> 2) % len(SCALARS)]
        again: Any = scalar
        if variant == 2 and scalar == int(scalar):
            again = int(scalar)
        first = b.op(target, (a, scalar), shape=b.act())
        second = b.op(target, (a, again), shape=b.act())
    return b.op(BINARY[z >> 2 & 1], (first, second), shape=b.act())


def overwrites(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
               z: int) -> Ref:
    """``overwrites``: ``copy_`` of a new value into a buffer (``mean(a, [0])``, as
    ``self.buf.copy_(...)`` exports) or, in a program without preserved calls, into a user
    input (``a``); later reads of it see the write. Returns ``a``: the write's own result is
    read only through later reads of what it wrote (often by no one)."""
    buffers = [v[0] for v in vectors if v[1] == stt.BUFFER
               and b.styles.get(b.tensor_of[b.fqns[(path, v[0])]],
                                "inplace_mutation") == "inplace_mutation"]
    # not with preserved calls: transform(p, pipeline(keep_functional=True)) raises a
    # PassError on an input overwritten by copy_ after a preserved call (a purefx gap,
    # docs/known-gaps.md), and every law test of the pipeline would meet it
    inputs = [n for n in b.user_inputs if not scope.preserved
              and "preserved_calls" not in b.on
              and b.input_styles.get(n, "inplace_mutation") == "inplace_mutation"]
    if buffers and (z & 1 or not inputs):
        b.update(path, buffers[y % len(buffers)], a, z, aten.copy_.default)
    elif inputs:
        old, new = b.update_input(scope, inputs[y % len(inputs)], a, z,
                                  aten.copy_.default)
        if a == old:  # the input's old value is read no more
            return new
    else:
        return b.op(b.unary[y % len(b.unary)], (a,), shape=b.act())
    return a


def activations(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
                z: int) -> Ref:
    """``activations``: an activation of its own result, ``relu(relu(a))``,
    ``gelu(gelu(a))`` (what a pass that collapses idempotent activations rewrites)."""
    act = b.unary[(y + z) % len(b.unary)]
    return b.op(act, (b.op(act, (a,), shape=b.act()),), shape=b.act())


def near_duplicates(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
                    z: int) -> Ref:
    """``near_duplicates``: two ops of ``a`` that differ only in a keyword, a literal or a
    dtype, their difference the result (zero where a pass merges them): ``add(a, other)`` and
    ``add(a, other, alpha=)``; ``a`` cast to ``float16`` and to ``bfloat16`` (each cast back);
    ``mean(a, [1], True)`` and ``mean(a, [0], True)``; with ``activations``, ``gelu(a)``
    and ``gelu(a, approximate='tanh')``."""
    act = b.act()
    variant = z % 4
    if variant == 3 and "activations" not in b.on:  # gelu is the activations' op
        variant = 0
    if variant == 0:
        other = back(scope.vals, y)
        pair = (other, a) if z >> 2 & 1 else (a, other)  # either way round, as binary steps
        first = b.op(aten.add.Tensor, pair, shape=act)
        alpha = IDict((("alpha", SCALARS[(y >> 2) % len(SCALARS)]),))
        second = b.op(aten.add.Tensor, pair, alpha, shape=act)
    elif variant == 1:
        pair = []
        for dtype in (torch.float16, torch.bfloat16):
            low = b.op(aten._to_copy.default, (a,), IDict((("dtype", dtype),)),
                       shape=("dtype", act, dtype))
            pair.append(b.op(aten._to_copy.default, (low,),
                             IDict((("dtype", torch.float32),)), shape=act))
        first, second = pair
    elif variant == 2:
        first = b.op(aten.mean.dim, (a, IList((1,)), True), shape=(act[0], 1))
        second = b.op(aten.mean.dim, (a, IList((0,)), True), shape=(1, WIDTH))
        return b.op(aten.add.Tensor, (first, second), shape=act)
    else:
        first = b.op(aten.gelu.default, (a,), shape=act)
        second = b.op(aten.gelu.default, (a,), IDict((("approximate", "tanh"),)),
                      shape=act)
    return b.op(aten.sub.Tensor, (first, second), shape=act)


def identities(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
               z: int) -> Ref:
    """``identities``: one op an algebraic simplifier rewrites: ``mul(a, 1.0)``,
    ``add(a, 0)``, ``sub(a, 0.0)``, ``div(a, 1.0)``, ``pow(a, 2)``, ``mul(a, 2)``,
    ``clone(a)``."""
    target, literals = IDENTITIES[z % len(IDENTITIES)]
    return b.op(target, (a, *literals), shape=b.act())


def inplace_ops(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
                z: int) -> Ref:
    """``inplace_ops``: ``add_`` of ``a`` (or ``mul_`` of a scalar, or ``relu_``) on a value
    this call computed earlier (not an input, state, or a value a signature names: outside
    preserved calls only), which earlier ops may have read (half the time, what the latest
    op read); later reads see the write. Half the time a copy of it is taken just before
    the write (``clone``, or ``mul`` by ``1.0``) and is the step's result.
    Where there is none, ``relu(a)``."""
    mine = _mine(b, scope)
    if not mine:
        return b.op(aten.relu.default, (a,), shape=b.act())
    v = mine[-1 - y % len(mine)]
    if z >> 2 & 1 and b.last_read in mine:  # what the op just before read
        v = b.last_read
    reader = None
    if z >> 3 & 1:  # a copy taken just before the write: ``y = x.clone(); x += a``
        target, literals = READERS[(z >> 4) % len(READERS)]
        reader = b.op(target, (v, *literals), shape=b.act())
    if z % 3 == 0:
        new = b.op(aten.add_.Tensor, (v, a), shape=b.act())
    elif z % 3 == 1:
        new = b.op(aten.mul_.Tensor, (v, SCALARS[y % len(SCALARS)]), shape=b.act())
    else:
        new = b.op(aten.relu_.default, (v,), shape=b.act())
    scope.vals[:] = [new if u == v else u for u in scope.vals]
    if reader is not None:
        scope.vals.append(new)
        return reader
    return new


def _mine(b: ProgramBuilder, scope: Scope) -> list[Ref]:
    """Values this call computed that may be written in place: not an input, state, or a
    value a signature names (none in a preserved call)."""
    if scope.preserved:
        return []
    here = (len(b.frames), b.frames[-1][0])
    inputs = set(b.input_current.values())
    return [v for v in scope.vals if b.made_in.get(v.name) == here
            and v not in inputs and v not in b.crossing_only]


def _inplace_buffers(b: ProgramBuilder, path: str, vectors: list) -> list[str]:
    """This module's buffers that may be written in place (their style is, or will be,
    ``inplace_mutation``)."""
    if "inplace_mutation" not in b.on:
        return []
    return [v[0] for v in vectors if v[1] == stt.BUFFER
            and b.styles.get(b.tensor_of[b.fqns[(path, v[0])]],
                             "inplace_mutation") == "inplace_mutation"]


def _wrote_buffer(b: ProgramBuilder, path: str, name: str, *written: Ref) -> None:
    """Bookkeeping of a buffer written in place through ``written`` (a view of it): later
    reads read the buffer as they did (the same tensor), and no functional output."""
    fqn = b.fqns[(path, name)]
    tid = b.tensor_of[fqn]
    b.styles.setdefault(tid, "inplace_mutation")
    b.mutated.setdefault(tid, ("inplace_mutation", fqn))
    b.state_values.update(r.name for r in written)


def state_traffic(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
                  z: int) -> Ref:
    """``state_traffic``: a buffer of this module read (an op of the buffer alone, which
    a folder may take for a constant) around its own update by ``a``: read then written
    (the next call reads what this one wrote), written then read, or read, written and read
    again by an equal call (the same op of the same value where the update is in place and
    the read is of the buffer's value); the reads combined with ``a``. Without a buffer that
    can be updated, a read of a state vector (or ``relu(a)``)."""
    act = b.act()
    buffers = [v[0] for v in vectors if v[1] == stt.BUFFER]
    target, literals = STATE_READS[(y >> 2) % len(STATE_READS)]

    def read(name: str) -> Ref:
        return b.op(target, (b.read_state(path, name), *literals), shape=(WIDTH,))

    if not buffers or not b.styles_on():
        if not vectors:
            return b.op(aten.relu.default, (a,), shape=act)
        r = read(vectors[y % len(vectors)][0])
        return b.op(BINARY[z % len(BINARY)], (a, r), shape=act)
    name = buffers[y % len(buffers)]
    variant = z % 3
    if variant == 1:
        b.update(path, name, a, z >> 2)
    r = read(name)
    if variant != 1:
        b.update(path, name, a, z >> 2)
    if variant == 2:
        r = b.op(aten.add.Tensor, (r, read(name)), shape=(WIDTH,))
    return b.op(BINARY[(z >> 2) % len(BINARY)], (a, r), shape=act)


def view_writes(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
                z: int) -> Ref:
    """``view_writes``: a write through a view and a read of its base after it. The base is
    a copy of ``a`` (``clone``) or, half the time, a buffer of this module written in
    place; the view a ``slice``, ``select``, ``diagonal`` or ``view`` of it, written by
    ``add_`` / ``mul_`` / ``fill_``; the base then read by an op (three times in four an
    equal call before the write as well: what a CSE blind to writes through views merges),
    combined with ``a``."""
    act = b.act()
    buffers = _inplace_buffers(b, path, vectors)
    name = buffers[y % len(buffers)] if buffers and z & 1 else None
    if name is not None:
        base, shape = b.read_state(path, name), (WIDTH,)
    else:
        base, shape = b.op(aten.clone.default, (a,), shape=act), act
    target, literals = STATE_READS[(y >> 2) % len(STATE_READS)]
    before = b.op(target, (base, *literals), shape=shape) if z & 6 else None
    views = VIEWS_1D if len(shape) == 1 else VIEWS_2D
    view, view_literals = views[y % len(views)]
    if view_literals == ("flat",):
        view_literals = (IList((-1,)),)  # a symbolic batch is no literal
    v = b.op(view, (base, *view_literals), shape=shape)
    write, write_literals = VIEW_WRITES[(z >> 2) % len(VIEW_WRITES)]
    w = b.op(write, (v, *write_literals), shape=shape)
    if name is not None:
        _wrote_buffer(b, path, name, v, w)
    after = b.op(target, (base, *literals), shape=shape)
    out = b.op(BINARY[z >> 3 & 1], (a, after), shape=act)
    if before is not None:
        out = b.op(aten.sub.Tensor, (out, before), shape=act)
    return out


def clone_writes(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
                 z: int) -> Ref:
    """``clone_writes``: ``c = x.clone()`` (or ``x * 1.0``), then ``x`` written in place
    (``add_`` of ``a``, ``mul_`` of a scalar, ``copy_`` of ``a``), and ``c`` read after the
    write (it keeps the old value) next to the new ``x``. ``x`` is a value this call computed
    (later reads see the write) or, half the time where there is one, a buffer of this module
    (its update). Half the time a second ``clone(x)`` is taken and written itself: equal calls,
    one written, which a CSE must not merge."""
    act = b.act()
    buffers = _inplace_buffers(b, path, vectors)
    if buffers and z >> 3 & 1:
        name = buffers[y % len(buffers)]
        c = b.op(aten.clone.default, (b.read_state(path, name),), shape=(WIDTH,))
        twin = None
        if z >> 2 & 1:
            twin = b.op(aten.clone.default, (b.read_state(path, name),),
                        shape=(WIDTH,))
            twin = b.op(aten.mul_.Tensor, (twin, -1.0), shape=(WIDTH,))
        b.update(path, name, a, z % 2 * 2)
        out = b.op(aten.sub.Tensor, (a, c), shape=act)
        out = b.op(aten.add.Tensor, (out, b.read_state(path, name)), shape=act)
        return out if twin is None else b.op(aten.add.Tensor, (out, twin), shape=act)
    mine = _mine(b, scope)
    x = mine[-1 - y % len(mine)] if mine else b.op(aten.relu.default, (a,), shape=act)
    reader, literals = READERS[(y >> 2) % len(READERS)]
    c = b.op(reader, (x, *literals), shape=act)
    twin = None
    if z >> 2 & 1:
        twin = b.op(aten.clone.default, (x,), shape=act)
        twin = b.op(aten.add_.Tensor, (twin, a), shape=act)
    if z % 3 == 0:
        new = b.op(aten.add_.Tensor, (x, a), shape=act)
    elif z % 3 == 1:
        new = b.op(aten.mul_.Tensor, (x, SCALARS[y % len(SCALARS)]), shape=act)
    else:
        new = b.op(aten.copy_.default, (x, a), shape=act)
    scope.vals[:] = [new if u == x else u for u in scope.vals]
    out = b.op(BINARY[(z >> 3) % 2], (c, new), shape=act)
    return out if twin is None else b.op(aten.add.Tensor, (out, twin), shape=act)


def masks(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
          z: int) -> Ref:
    """``masks``: ``where`` of a bool mask from a comparison with ``0``: a guarded op of
    ``d = a - other`` (``other`` an earlier value, or ``a``), ``where(d > 0, log(d), a)`` (``sqrt``,
    ``reciprocal``, ``rsqrt``: the branch holds nan or inf where the mask is off); a
    masked fill of ``a`` (``masked_fill`` or ``where`` with a
    scalar: ``-inf``, ``inf``, ``-1e9``, nan); or ``where(mask, a, other)`` of two
    values (``other`` an earlier value)."""
    act = b.act()
    other = back(scope.vals, y)
    variant = z % 4
    if variant <= 1:  # a guarded op of ``a - other`` (of both signs): the mask says where
        d = b.op(aten.sub.Tensor, (a, other), shape=act)
        mask = b.op(aten.gt.Scalar, (d, 0.0), shape=("dtype", act, torch.bool))
        guarded = b.op(GUARDED[(y >> 2) % len(GUARDED)], (d,), shape=act)
        return b.op(aten.where.self, (mask, guarded, a), shape=act)
    mask = b.op(MASKS[(y >> 2) % len(MASKS)], (a, 0.0),
                shape=("dtype", act, torch.bool))
    if variant == 2:
        fill = FILLS[(z >> 2) % len(FILLS)]
        if z >> 2 & 1:
            return b.op(aten.masked_fill.Scalar, (a, mask, fill), shape=act)
        return b.op(aten.where.ScalarOther, (mask, a, fill), shape=act)
    return b.op(aten.where.self, (mask, a, other), shape=act)


def softmax(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
            z: int) -> Ref:
    """``softmax``: ``softmax`` / ``_softmax`` / ``log_softmax`` / ``_log_softmax`` of ``a``
    over its last or first dim, of logits ``a``, ``a * 1e3``, ``a * 16 + 1e3`` or ``a *
    0.125 + 1e3`` (large logits: ``exp`` overflows unless the max is subtracted), half the time
    after a masked fill with ``-inf`` where ``a > 0.5`` (attention's mask)."""
    act = b.act()
    scale, shift = LOGITS[y % len(LOGITS)]
    x = a if scale == 1.0 else b.op(aten.mul.Tensor, (a, scale), shape=act)
    if shift:
        x = b.op(aten.add.Tensor, (x, shift), shape=act)
    if z >> 2 & 1:
        mask = b.op(aten.gt.Scalar, (a, 0.5), shape=("dtype", act, torch.bool))
        x = b.op(aten.masked_fill.Scalar, (x, mask, float("-inf")), shape=act)
    target, literals = SOFTMAX[z % len(SOFTMAX)]
    dim = -1 if z >> 3 & 1 else (1, 0)[y >> 2 & 1]
    return b.op(target, (x, dim, *literals), shape=act)


def int_math(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
             z: int) -> Ref:
    """``int_math``: int64 arithmetic. ``k = int64(a * 1000)`` (integers of ``(-1000,
    1000)``) and ``big``, an int64 constant of this module (``arange`` arithmetic where
    it can have none), combined by ``mul`` / ``add`` / ``sub``. Half the time (always
    with ``edge_values``) the constant is past ``2**53`` for ``add`` / ``sub`` and between
    ``2**46`` and ``2**52`` for ``mul`` (products past ``2**53``: a route through
    ``float64`` is wrong), else past ``2**31`` or below ``2**20``. The result's low digits
    (``remainder`` by 997) are cast back,
    scaled by ``2**-10`` and added to ``a``, so a wrong low bit reaches the output."""
    act = b.act()
    i64 = ("dtype", act, torch.int64)
    k = b.op(aten.mul.Tensor, (a, 1000.0), shape=act)
    k = b.op(aten._to_copy.default, (k,), IDict((("dtype", torch.int64),)), shape=i64)
    op = INT_OPS[y % len(INT_OPS)]
    magnitude = max(y >> 2 & 3, 2 if "edge_values" in b.on else 0)
    if magnitude >= 2:  # past 2**53: the operand (add, sub) or the product (mul)
        low, high = (2**53, 2**62) if op is not aten.mul.Tensor else (2**46, 2**52)
    else:  # past 2**31, or ordinary
        low, high = (2**31, 2**40) if magnitude else (2**10, 2**20)
    values = torch.randint(low, high, (WIDTH,), generator=b.rng, dtype=torch.int64)
    big = b.new_constant(path, scope, values)
    if big is None:
        step = int(values[0]) // WIDTH
        on_cpu = (("device", CPU), ("pin_memory", False))
        ramp = b.op(aten.arange.default, (WIDTH,),
                    IDict((("dtype", torch.int64), *on_cpu)), shape=("dtype", (WIDTH,),
                                                                     torch.int64))
        ramp = b.op(aten.mul.Tensor, (ramp, step), shape=("dtype", (WIDTH,), torch.int64))
        big = b.op(aten.add.Tensor, (ramp, int(values[1]) | 1),
                   shape=("dtype", (WIDTH,), torch.int64))
    r = b.op(op, (big, k) if z & 1 else (k, big), shape=i64)
    r = b.op(aten.remainder.Scalar, (r, 997), shape=i64)
    f = b.op(aten._to_copy.default, (r,), IDict((("dtype", torch.float32),)), shape=act)
    f = b.op(aten.mul.Tensor, (f, 2.0**-10), shape=act)
    return b.op(aten.add.Tensor, (a, f), shape=act)


def edge_operands(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
                  z: int) -> Ref:
    """``edge_operands``: ``a`` poisoned at drawn positions, then read. One column of ``a``
    (``where(arange(WIDTH) == k, edge, a)``) holds inf, -inf or nan, another column
    (``where`` again, or ``masked_fill``) ``float32``'s largest of either sign, and the
    positions where ``a`` is past ``0.5`` (``masked_fill``) ``-0.0`` or a denormal
    (:data:`POISONS`, less what ``programs``' ``assumes`` excludes). So the
    value is ordinary at some positions and at an edge at others, as a model's is after an
    overflow, a masked fill or a division by zero; it joins the values later steps read
    (the opset's too), and three readers here read it: two folds fast-math makes (``x *
    0``, ``x - x``, ``x / x``, ``log(exp(x))``, ``where`` with it on either branch), the
    first the step's result, and any reader of :data:`EDGE_READS` (an op of the value
    twice, a literal edge scalar of ``mul`` / ``add`` / ``div`` / ``pow`` / ``clamp``);
    the other two are values of their own, which outputs return when nothing reads them.
    Choices scattered with the body's mix,
    as a body step's are (a motif step's bytes are drawn raw). O(1) nodes."""
    act = b.act()
    h = scatter(b.mix, EDGE_SALT, y, z, len(b.nodes))
    nonfinite, large, small = b.poisons
    first = h % WIDTH
    second = (first + 1 + (h >> 2) % (WIDTH - 1)) % WIDTH
    on_cpu = (("device", CPU), ("pin_memory", False))
    columns = b.op(aten.arange.default, (WIDTH,),
                   IDict((("dtype", torch.int64), *on_cpu)),
                   shape=("dtype", (WIDTH,), torch.int64))
    column = ("dtype", (WIDTH,), torch.bool)
    x = a
    # where ``a`` is past a threshold: some rows, not all (first, so that the columns'
    # edges stay whatever ``a`` holds; ``small`` is empty where ``assumes`` leaves none)
    if small:
        past = b.op(aten.gt.Scalar, (a, 0.5), shape=("dtype", act, torch.bool))
        x = b.op(aten.masked_fill.Scalar, (x, past, small[(h >> 10) % len(small)]),
                 shape=act)
    mask = b.op(aten.eq.Scalar, (columns, first), shape=column)
    x = b.op(aten.where.ScalarSelf, (mask, nonfinite[(h >> 4) % len(nonfinite)], x),
             shape=act)
    at = b.op(aten.eq.Scalar, (columns, second), shape=column)
    edge = large[(h >> 6) % len(large)]
    if h >> 9 & 1:
        x = b.op(aten.where.ScalarSelf, (at, edge, x), shape=act)
    else:
        x = b.op(aten.masked_fill.Scalar, (x, at, edge), shape=act)
    earlier = scope.vals[:]
    other = back(earlier, (h >> 11) % 4)
    scope.vals.append(x)
    positive: list[Ref] = []

    def read(row: tuple[Any, tuple]) -> Ref:
        target, template = row
        if "mask" in template and not positive:
            positive.append(b.op(aten.gt.Scalar, (other, 0.0),
                                 shape=("dtype", act, torch.bool)))
        args = tuple(x if t == "x" else other if t == "other" else positive[0]
                     if t == "mask" else t for t in template)
        if isinstance(target, tuple):  # a chain: ``log(exp(x))``
            value = x
            for step in target:
                value = b.op(step, (value,), shape=act)
            return value
        return b.op(target, args, shape=act)

    fold = (h >> 13) % FOLD_READS
    folded = read(EDGE_READS[fold])
    for row in (EDGE_READS[(fold + 1 + (h >> 16) % (FOLD_READS - 1)) % FOLD_READS],
                EDGE_READS[(h >> 19) % len(EDGE_READS)]):
        again = read(row)
        scope.vals.append(again)
        if not scope.preserved:
            b.motif_results.append(again)
    return folded
