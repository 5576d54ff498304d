"""The verified operator table: what each aten operator writes, aliases and draws, observed on
real tensors.

One row (``OpEntry``; the row values live in ``ir.opset_entry``) per ``OpOverload``, generated
by ``ir.opset_build`` into ``ir/opset_table.py`` and checked against torch by ``check_entry`` (a
test runs it over the whole table, so a torch release that changes an operator fails a test). A
row says which arguments the operator writes in place, under which argument values
(``Write.when``: ``aten.batch_norm`` writes its running statistics only when ``training`` is
true, although its schema declares no write), which results may share storage with which
arguments, whether it draws random numbers, and which results are new values of state
(``state_outputs``). Each row carries up to two ``Sample``s: real calls of the operator,
recorded from exported programs, that ``sample_args`` turns into fresh tensors.

An operator the table lacks has no facts here: ``entry`` answers ``None``, and the analysis
(``ir.ops.facts``) asks ``ir.op_known`` (declared, or observed on a call purefx met, with this
module's ``run_call``); where that knows nothing either, ``ir.effects`` treats it as writing and
aliasing every tensor argument, impure and never foldable.

``table()`` is built once, on first use, from ``ir.opset_table.ROWS``; everything here is a
pure function of the table and its arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs
import torch

from ir.opset_entry import OpEntry, Sample, TensorSpec, Write
from ir.torch_seam import OpOverload, op_schema, storage_identity, tensor_version

__all__ = [
    "OpEntry",
    "Sample",
    "TensorSpec",
    "Write",
    "check_entry",
    "entry",
    "normal_args",
    "positions_written",
    "resolve",
    "run_call",
    "run_sample",
    "same_results",
    "sample_args",
    "table",
    "written_at",
]

# --- the table ------------------------------------------------------------------------------------

_TABLE: list[Mapping[str, OpEntry]] = []
_BY_ID: dict[int, tuple[Any, OpEntry | None]] = {}


def table() -> Mapping[str, OpEntry]:
    """Every row of the table by name (``"aten.add.Tensor"``), read-only; built once from
    ``ir.opset_table.ROWS`` on first use. O(rows) once, then O(1)."""
    if not _TABLE:
        from ir.opset_table import ROWS

        _TABLE.append(MappingProxyType({e.name: e for e in ROWS}))
    return _TABLE[0]


def entry(target: Any) -> OpEntry | None:
    """The row of ``target``, an ``OpOverload``; ``None`` for an overload the table lacks and
    for any other target. ``None`` means no facts: the analysis then assumes the worst (writes
    and aliases every tensor argument, impure). Memoized by identity (each entry holds its
    target, so an id is never reused while the entry lives). O(1) after the first call."""
    hit = _BY_ID.get(id(target))
    if hit is not None and hit[0] is target:
        return hit[1]
    found = table().get(str(target)) if isinstance(target, OpOverload) else None
    _BY_ID[id(target)] = (target, found)
    return found


def written_at(e: OpEntry, args: tuple) -> tuple[int, ...]:
    """The positions ``e``'s operator writes when called with ``args`` (normalized: schema
    order, defaults filled). A condition on an argument that is not a literal (a value
    computed in the graph, a position past ``args``) counts as holding, so the answer is never
    smaller than what the call writes.

    **Laws:** ``set(written_at(e, args)) <= {w.arg for w in e.writes}``; with no literal
    arguments, every position of ``e.writes``. O(writes x conditions)."""
    return positions_written(e.writes, args)


def positions_written(writes: tuple[Write, ...], args: tuple) -> tuple[int, ...]:
    """``written_at`` for a row's ``writes`` alone (``ir.ops.OpFacts.writes``)."""
    found: list[int] = []
    for w in writes:
        if w.arg not in found and all(_may_hold(args, at, value) for at, value in w.when):
            found.append(w.arg)
    return tuple(found)


_LITERALS = (bool, int, float, str, type(None))


def _may_hold(args: tuple, at: int, value: Any) -> bool:
    if at >= len(args) or type(args[at]) not in _LITERALS:
        return True
    return args[at] == value and type(args[at]) is type(value)


# --- real arguments -------------------------------------------------------------------------------


def sample_args(sample: Sample, *, seed: int = 0, device: Any = "cpu") -> tuple[tuple, dict]:
    """Fresh real tensors for ``sample``: ``(args, kwargs)`` to call the operator with. Values
    are drawn from a generator seeded with ``seed`` (the same seed, the same values), or
    taken from ``TensorSpec.values``; strided specs get their strides (over a storage just
    large enough). O(total elements)."""
    gen = torch.Generator().manual_seed(seed)
    make = lambda a: _materialize(a, gen, device)
    return tuple(make(a) for a in sample.args), {k: make(v) for k, v in sample.kwargs}


def _materialize(arg: Any, gen: torch.Generator, device: Any) -> Any:
    if isinstance(arg, TensorSpec):
        return _tensor(arg, gen, device)
    if type(arg) is tuple:
        return [_materialize(a, gen, device) for a in arg]
    return arg


def _tensor(spec: TensorSpec, gen: torch.Generator, device: Any) -> torch.Tensor:
    if spec.stride is None:
        extent = 1
        for d in spec.shape:
            extent *= d
    else:
        extent = 1 + sum((d - 1) * s for d, s in zip(spec.shape, spec.stride)) if all(
            spec.shape) else 0
    if spec.values is not None:
        flat = torch.tensor(spec.values, dtype=spec.dtype)
        base = flat if spec.stride is None else _spread(flat, spec, extent)
    else:
        base = _draw(spec, extent, gen)
    if spec.stride is None:
        out = base.reshape(spec.shape).clone()  # no view: ``detach_``, ``resize_`` refuse views
    else:
        out = base.as_strided(spec.shape, spec.stride)
    return out.to(device)


def _spread(flat: torch.Tensor, spec: TensorSpec, extent: int) -> torch.Tensor:
    """A storage of ``extent`` elements whose strided view holds ``flat`` in order."""
    base = torch.zeros(max(extent, 0), dtype=spec.dtype)
    if flat.numel():
        base.as_strided(spec.shape, spec.stride).copy_(flat.reshape(spec.shape))
    return base


def _draw(spec: TensorSpec, n: int, gen: torch.Generator) -> torch.Tensor:
    dtype = spec.dtype
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=gen).bool()
    if dtype.is_complex:
        parts = torch.rand(n, 2, generator=gen, dtype=torch.float64)
        real = spec.low + (spec.high - spec.low) * parts
        return torch.complex(real[:, 0], real[:, 1]).to(dtype)
    if dtype.is_floating_point:
        u = torch.rand(n, generator=gen, dtype=torch.float64)
        return (spec.low + (spec.high - spec.low) * u).to(dtype)
    low, high = int(spec.low), max(int(spec.high), int(spec.low) + 1)
    return torch.randint(low, high, (n,), generator=gen).to(dtype)


# --- observing the operator -----------------------------------------------------------------------


@attrs.frozen
class Observed:
    """What one call of an operator did to real tensors: the argument positions whose
    ``_version`` moved, the ``(result index, argument position)`` pairs that share storage,
    and the results (flattened, for comparisons)."""

    written: frozenset[int]
    aliases: frozenset[tuple[int, int]]
    results: tuple


def run_sample(op: OpOverload, sample: Sample, *, seed: int = 0, data_seed: int = 0,
               device: Any = "cpu") -> Observed:
    """Call ``op`` on fresh tensors made from ``sample`` (``sample_args`` with ``data_seed``,
    on ``device``) and observe it (``run_call``). Raises whatever the operator raises.
    O(the call)."""
    args, kwargs = sample_args(sample, seed=data_seed, device=device)
    return run_call(op, args, kwargs, seed=seed)


def run_call(op: OpOverload, args: tuple, kwargs: dict, *, seed: int = 0) -> Observed:
    """Call ``op(*args, **kwargs)`` on real tensors, torch's generators (CPU and the devices
    of the arguments) seeded with ``seed`` and restored after, and observe it: which tensor
    arguments (by schema position, keywords too) it wrote (their ``_version`` counter moved,
    or their values changed: ``native_batch_norm`` updates its running statistics without
    bumping the counter) and which results share a storage with which arguments. The one
    observation of one call, for the table's builder (``run_sample``) and for operators the
    table lacks (``ir.op_observe``). Writes the arguments as the operator does; raises
    whatever it raises. O(the call)."""
    position = {a.name: i for i, a in enumerate(op_schema(op).arguments)}
    given = [*enumerate(args), *((position.get(k, -1), v) for k, v in kwargs.items())]
    before = [(i, [(t, tensor_version(t), t.clone()) for t in _tensors(a)]) for i, a in given]
    devices = sorted({t.device.index or 0 for _, ts in before for t, _, _ in ts
                      if t.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        out = op(*args, **kwargs)
    written = frozenset(
        i for i, ts in before
        if any(tensor_version(t) != v or not same_results((t,), (old,)) for t, v, old in ts)
    )
    storages = [
        (i, {storage_identity(t) for t in _tensors(a) if t.untyped_storage().nbytes()})
        for i, a in given
    ]
    returns = out if isinstance(out, tuple) else (out,)
    aliases = frozenset(
        (r, i)
        for r, value in enumerate(returns)
        for t in _tensors(value)
        if t.untyped_storage().nbytes()
        for i, ids in storages
        if storage_identity(t) in ids
    )
    flat = tuple(t for value in returns for t in _tensors(value))
    return Observed(written, aliases, flat)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def same_results(a: tuple, b: tuple) -> bool:
    """Whether two tuples of tensors have equal shapes, dtypes and values (NaN equal to NaN;
    sparse and quantized tensors' values are not compared). O(elements)."""
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and _equal(x.detach(), y.detach())
        for x, y in zip(a, b)
    )


def _equal(x: torch.Tensor, y: torch.Tensor) -> bool:
    if x.is_quantized or x.layout != torch.strided or y.layout != torch.strided:
        return True  # values not compared
    if x.is_floating_point() or x.is_complex():
        return torch.equal(torch.isnan(x), torch.isnan(y)) and torch.equal(
            torch.nan_to_num(x), torch.nan_to_num(y))
    return torch.equal(x, y)


def resolve(name: str) -> OpOverload | None:
    """The ``OpOverload`` named ``name`` (``"aten.add.Tensor"``) in this torch, or ``None``."""
    namespace, _, rest = name.partition(".")
    packet, _, overload = rest.rpartition(".")
    found = getattr(getattr(getattr(torch.ops, namespace, None), packet, None), overload, None)
    return found if isinstance(found, OpOverload) else None


def check_entry(e: OpEntry) -> tuple[str, ...]:
    """The contradictions between ``e`` and torch, found by running each of its samples on
    fresh real tensors (``run_sample``): an argument the call writes that ``written_at`` does
    not name for that call (a hidden or dropped write, a condition too narrow); a result that
    shares storage with an argument ``aliases`` does not pair it with; an operator not marked
    random whose results differ between runs under two seeds of torch's generator; a sample
    the operator now refuses; a row whose operator this torch lacks. ``()`` when torch agrees.

    Only facts that would make the analysis unsafe are contradictions: a write, an alias or
    randomness the row claims and a sample does not show (a condition wider than needed, a
    view that copies on this input) is conservative, not wrong.

    **Laws:** ``()`` for every row the builder wrote, on the torch it was built with; a row
    that lacks a write or an alias one of its samples shows gives a non-empty answer.
    O(samples x the operator's cost)."""
    op = resolve(e.name)
    if op is None:
        return (f"{e.name}: no such operator in torch {torch.__version__}",)
    found: list[str] = []
    declared_aliases = set(e.aliases)
    uninitialized = "empty" in op.__name__
    for k, sample in enumerate(e.samples):
        try:
            first = run_sample(op, sample, seed=0)
            again = None if e.random or uninitialized else run_sample(op, sample, seed=1)
        except Exception as err:  # noqa: BLE001 - the operator refuses its own sample
            found.append(f"{e.name}: sample {k} raises {type(err).__name__}: {err}"[:300])
            continue
        expected = set(written_at(e, normal_args(op, sample)))
        for i in sorted(first.written - expected):
            found.append(f"{e.name}: sample {k} writes argument {i}, not in the facts")
        for r, i in sorted(first.aliases - declared_aliases):
            found.append(f"{e.name}: sample {k} result {r} shares storage with argument {i}, "
                         "not in the facts")
        if again is not None and not same_results(first.results, again.results):
            found.append(f"{e.name}: sample {k} gives other results under another seed, the "
                         "facts say deterministic")
    return tuple(found)


def normal_args(op: OpOverload, sample: Sample) -> tuple:
    """``sample``'s arguments in schema order with defaults filled, keywords by name (tensors
    as their ``TensorSpec``s): the form ``written_at`` reads. O(schema arguments)."""
    schema = op_schema(op)
    given = dict(sample.kwargs)
    out = list(sample.args)
    for a in schema.arguments[len(out):]:
        if a.name in given:
            out.append(given[a.name])
        elif a.has_default_value():
            out.append(a.default_value)
        else:
            break
    return tuple(out)
