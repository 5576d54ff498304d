"""The opset step of generated programs: one operator of the verified table, called as a
sample (or a model's form, ``ir.strategies.forms``) calls it.

``ir.strategies.opset_steps`` picks the rows and forms and makes their samples' arguments;
this module is the builder's side: it picks each tensor argument (an earlier value of its
layout, a new user input of it, new state where the sample's values must be kept), fake-runs
the call under the program's mode (``fake_call``), and adds the call, its ``getitem`` s and a
copy of each view it returns to the program through the builder ``b``. A step whose fake run
fails adds nothing. O(arguments) nodes.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any

import torch

from ir import signature as sg
from ir import state as stt
from ir.args import EMPTY_DICT, IDict, IList, Ref, iter_refs, ref
from ir.fake_run import guards_refused, hint
from ir.opset import TensorSpec, sample_args, written_at
from ir.printer import contiguous_strides
from ir.strategies.builder import ProgramBuilder, Scope, size_key
from ir.strategies.decoding import OPSET_STEP_BYTES
from ir.strategies.opset_steps import (
    FORM_CALLS,
    Plan,
    fake_call,
    form_units,
    is_channels_last,
    literal,
    own_samples,
    permutation_for,
    pick_form,
    pick_row,
    result_tensors,
    scatter,
    uninitialized,
)
from ir.strategies.vocabulary import STATE_INPUTS, base_name
from ir.torch_seam import fake_failures_unlogged, storage_identity

aten = torch.ops.aten

SYMBOLIC_OPSET = False
"""Whether the opset steps of a program with a symbolic batch try their samples at the symbolic
batch (else they call every row at its sample's sizes, and only the fixed vocabulary's values
are symbolic). Off: the laws ran a program whose opset steps took the symbolic batch at another
batch size and the process aborted in a later allocation (heap corruption from a kernel that
does not check what its fake run let pass, not yet found), so no row takes it until each row's
kernel is checked at other sizes on real tensors."""


def opset_step(b: ProgramBuilder, path: str, scope: Scope, vectors: list, a: Ref, y: int,
               z: int) -> Ref:
    """``opset``: one operator of the verified table called with the arguments of one of
    its samples (``ir.strategies.opset_steps``). Not in a preserved call (its new inputs
    would cross the boundary unsigned) nor in a module registered at two paths (its new
    state would be one path's only). Returns the result when it is a ``(batch, WIDTH)``
    float32 value of its own memory (later steps of the fixed vocabulary read it), else
    ``a``."""
    index = b.index_of[path]
    if not b.opset_rows or scope.preserved or b.sites[index] != 1:
        return b.op(aten.relu.default, (a,), shape=b.act())
    data = b.draw(OPSET_STEP_BYTES)
    # the row: the step's two bytes, the program's seed bytes and the step's number,
    # scattered (hypothesis's bytes favour small values and repeats, so a plain product
    # of them met a few hundred rows in a thousand draws); zero bytes decode to row 0.
    # Asked for (``always``, ``ops=``): uniform over the rows; by default half by how many
    # models use the row's operator, half uniform (``opset_steps.pick_row``)
    if b.asked:
        h = scatter(int.from_bytes(data), b.opset_seed, len(b.rows_used))
    else:
        h = b.mix = scatter(b.mix, int.from_bytes(data), len(b.rows_used))
    if b.asked and not any(data):
        at = 0
    elif b.asked:
        at = h % len(b.opset_rows)
    else:
        at = pick_row(b.row_weights, h)
    for _ in range(len(b.opset_rows)):  # a row this program has not called yet
        if at not in b.rows_used:
            break
        at = (at + 1) % len(b.opset_rows)
    b.rows_used.add(at)
    row, op, samples = b.opset_rows[at]
    # asked for, any sample of the row (its own, then the census's forms); by default its
    # own (the census's are the form calls below)
    n = len(samples) if b.asked else own_samples(row, samples) or len(samples)
    out = _opset_run(b, path, scope, a, row, op, samples[data[2] % n], data)
    # by default, a step calls up to ``FORM_CALLS`` forms of the census as well, each with
    # chance ``FORM_SHARE`` (how real models call an operator: ``ir.strategies.forms``),
    # each form once per program, their nodes outside the program's budget (counted, they
    # cut the steps that reach the table's rare rows); a step shrunk to zero bytes calls
    # none
    for k in range(0 if b.asked or not any(data) else FORM_CALLS):
        form = pick_form(b.on, scatter(h, k), b.forms_used)
        if form is None:
            continue
        b.forms_used.add(form)
        at, sample_at = form_units(b.on, None)[form]
        row, op, samples = b.opset_rows[at]
        before = len(b.nodes)
        out = _opset_run(b, path, scope, out, row, op, samples[sample_at], data)
        b.limit += len(b.nodes) - before
        b.max_nodes += len(b.nodes) - before
    return out


def _copy_of_view(b: ProgramBuilder, view: Ref, t: torch.Tensor) -> tuple[Ref, torch.Tensor]:
    """``clone(view)`` as a node and its fake value (contiguous unless ``t`` is dense in
    another order: ``clone`` keeps a dense layout)."""
    with fake_failures_unlogged():
        val = fake_call(b.mode, aten.clone.default, (view,), EMPTY_DICT,
                        lambda r: b.val_of[r.name])
    return b.add_node("clone", aten.clone.default, (view,), EMPTY_DICT, val), val


def _opset_run(b: ProgramBuilder, path: str, scope: Scope, a: Ref, row: Any, op: Any, sample: Any,
               data: bytes) -> Ref:
    """An opset step's call of ``op`` (of ``row``) with the arguments of ``sample``
    (``opset_step``), its tensors chosen by ``data``; ``opset_step``'s result, or ``a``."""
    choice = data[3]
    written = set(written_at(row, sample.args))
    reals, real_kwargs = sample_args(sample, seed=data[0] | data[1] << 8)
    legacy = [v for v in scope.vals if v not in b.crossing_only]
    # under ``symbolic_sizes``, first with the batch symbolic in every argument that can
    # take it (where ``SYMBOLIC_OPSET`` says so), then (an operator that cannot: its fake
    # run asks for a guard on the batch, or fails) with the sample's own sizes
    for symbolic in (True, False) if b.symbolic and SYMBOLIC_OPSET else (False,):
        found = _opset_call(b, path, row, op, sample, written, reals, real_kwargs, legacy,
                            choice, symbolic)
        if found is not None:
            break
    else:
        return a
    plan, args, kwargs, val, lookup = found
    results = result_tensors(val)
    if not results:
        return a
    b.commit(plan)
    node = b.add_node(base_name(op), op, tuple(args), kwargs, val)
    if written:  # state written: kept out of ``grad_regions`` bodies
        b.state_values.add(node.name)
    read = (lookup(r) for r in iter_refs((tuple(args), kwargs)))
    arg_storages = {storage_identity(v) for v in read
                    if isinstance(v, torch.Tensor)}
    out = a
    for ix, t in results:
        r = node if ix is None else b.add_node("getitem", operator.getitem, (node, ix),
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
            r, t = _copy_of_view(b, r, t)
        key = (size_key(t.shape), t.dtype, _stride_key(t))
        b.pool.setdefault(key, []).append(r)
        b.opset_results.append(r)
        if key == (b.act_key, torch.float32, None):
            out = r
    return out


def _opset_call(b: ProgramBuilder, path: str, row: Any, op: Any, sample: Any, written: set,
                reals: list, real_kwargs: dict, legacy: list[Ref], choice: int,
                symbolic: bool) -> tuple | None:
    """One try at an opset step's call (``opset_step``): its plan of new placeholders, its
    arguments and its fake run, committed to nothing; None when the fake run fails or
    resizes a written argument. With ``symbolic``, a new contiguous user input or an earlier
    value whose first size is the batch's hint takes the symbolic batch instead, and the
    fake run refuses every new guard (a guard would pin the batch to its hint)."""
    plan = Plan()
    planned: dict[str, Any] = {}

    def lookup(r: Ref) -> Any:
        return planned[r.name] if r.name in planned else b.val_of[r.name]

    def tensor_arg(spec: Any, real: torch.Tensor, pos: int, k: int) -> Ref:
        def state(kind: str, prefix: str) -> Ref:
            fqn_name = f"{prefix}{b.late_count}"
            b.late_count += 1
            fqn = f"{path}.{fqn_name}" if path else fqn_name
            name = b.fresh_name(STATE_INPUTS[kind][0] + fqn.replace(".", "_"))
            value = real.detach().clone(memory_format=torch.contiguous_format)
            if kind == stt.PARAMETER:
                value = torch.nn.Parameter(value, requires_grad=False)
            val = b.fake(tuple(spec.shape), spec.dtype)
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
        if not floating and not _fits_inputs(spec):
            return state(stt.CONSTANT, "opset_i")  # integer values of the spec's range
        stride = _layout(b, spec)
        shape = tuple(spec.shape)
        if symbolic and stride is None and shape and shape[0] == hint(b.batch):
            shape = (b.batch, *shape[1:])
        key = (size_key(shape), spec.dtype, stride)
        found = list(b.pool.get(key, ()))
        if key == (b.act_key, torch.float32, None):
            found += legacy
        bits = choice >> (k % 4) * 2
        if found and not bits & 1:
            return found[-1 - (bits >> 1) % len(found)]
        if floating and bits & 3 == 3 and stride is None:
            return state(stt.PARAMETER, "opset_w")
        return _new_input(b, spec, shape, stride, plan, planned)

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
        with guards_refused(b.mode), fake_failures_unlogged():
            val = fake_call(b.mode, op, args, kwargs, lookup)
    except Exception:  # noqa: BLE001 - no fake run (data-dependent shape, no kernel, a
        # guard on the batch): no step
        return None
    if any(_layout_key(v) != layouts[n] for n, v in planned.items()):
        return None  # it resized a written argument (``resize_``, ``set_``): a
        # placeholder's val would no longer be its state's shape
    return plan, args, kwargs, val, lookup


def _fits_inputs(spec: Any) -> bool:
    """An integer / bool spec whose range :func:`program_inputs`'s values fit."""
    if spec.dtype == torch.bool:
        return True
    return spec.low <= 0 and spec.high >= 10


def _layout(b: ProgramBuilder, spec: Any) -> tuple[int, ...] | None:
    """The strides an argument of ``spec`` gets (None: contiguous)."""
    if spec.stride is None or tuple(spec.stride) == contiguous_strides(spec.shape):
        return None
    if is_channels_last(tuple(spec.shape), tuple(spec.stride)):
        return tuple(spec.stride) if "channels_last" in b.on else None
    return tuple(spec.stride) if "strided_inputs" in b.on else None


def _stride_key(t: torch.Tensor) -> tuple | None:
    """``t``'s strides as a pool key (None: contiguous), read without a guard."""
    stride = size_key(t.stride())
    step: Any = 1
    contiguous = []
    for n in reversed(tuple(t.shape)):
        contiguous.append(step)
        step = step * (n if isinstance(n, torch.SymInt) else max(n, 1))
    return None if stride == size_key(reversed(contiguous)) else stride


def _new_input(b: ProgramBuilder, spec: Any, shape: tuple, stride: tuple[int, ...] | None,
               plan: Plan,
               planned: dict) -> Ref:
    """A new user input of ``spec``'s dtype and ``shape`` (``spec``'s, or with the symbolic
    batch first: then contiguous), positional after the others, of ``stride`` through a
    ``permute`` of a contiguous input or an ``as_strided`` view of a flat one."""
    name = b.fresh_name("x")
    perm = None if stride is None else permutation_for(shape, stride)
    if stride is None:
        val = b.fake(shape, spec.dtype)
    elif perm is not None:
        val = b.fake(tuple(shape[d] for d in perm), spec.dtype)
        inverse = tuple(perm.index(d) for d in range(len(shape)))
        target, args = aten.permute.default, (ref(name), IList(inverse))
    else:
        size = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0
        val = b.fake((size,), spec.dtype)
        target, args = aten.as_strided.default, (ref(name), IList(shape), IList(stride))
    plan.placeholders.append((sg.USER_INPUT, name, val, None))
    planned[name] = val
    if stride is None:
        return ref(name)
    view = b.fresh_name(base_name(target))
    view_val = fake_call(b.mode, target, args, EMPTY_DICT, lambda r: val)
    plan.layout.append((view, target, args, view_val))
    planned[view] = view_val
    return ref(view)


def _layout_key(t: torch.Tensor) -> tuple:
    """``t``'s sizes and strides as a key that compares without a guard."""
    return size_key(t.shape), size_key(t.stride())
