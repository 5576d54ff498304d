"""Observing an operator on real tensors: from calls to the facts of one ``OpEntry``.

The one observation of purefx, shared by the verified table's builder (``ir.opset_build``, over
the calls it recorded) and by the analysis for an operator the table lacks (``ir.op_known``,
over the values of the node that met it):

- ``observe`` runs one call (a ``Sample``) on fresh real tensors (``opset.run_call``: under two
  seeds of torch's generators, and for the builder once more under the first) and keeps what it did
  (``Seen``): the arguments it wrote (``_version`` moved or values changed), the results that
  share storage with arguments, whether its results depend on the seed or differ under one;
- ``entry_of`` turns the calls seen into an ``OpEntry``: every write seen (conditioned on the
  bool argument that separates the calls that write from those that do not), the schema's
  declared writes and aliases (a row is never less conservative than its schema), the aliases
  seen, random when tagged ``nondeterministic_seeded`` or seen to be;
- ``sample_of`` makes a ``Sample`` from a call's values (fake or real tensors, symbolic sizes
  at their hints, literals), or says why it cannot (``Unobservable``).

**Why the schema alone is not enough, even for aten.** A schema declares the writes of its
``Tensor(a!)`` arguments, but not every write: ``aten.batch_norm``, ``aten.instance_norm`` and
``aten._batch_norm_impl_index`` write the running statistics with no ``!`` in their schemas, and
nothing in a schema says an operator is random (``nondeterministic_seeded`` is a tag, and a
custom operator has none). So declared facts are a floor, and what a call does is observed.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import torch

from ir.opset import normal_args, run_sample, same_results
from ir.opset_entry import OpEntry, Sample, TensorSpec, Write
from ir.torch_seam import OpOverload, op_schema

__all__ = [
    "MAX_ELEMENTS",
    "Seen",
    "Unobservable",
    "declared_writes",
    "entry_of",
    "observe",
    "sample_of",
    "schema_aliases",
    "value_ranges",
]


class Unobservable(Exception):
    """A call that cannot be made on real tensors; its message says why, in words that follow
    "purefx could not observe it" (``"a size of argument 0 has no value"``)."""


@attrs.frozen
class Seen:
    """What observing one call of an operator found (``observe``)."""

    sample: Sample
    args: tuple  #: the sample's arguments normalized (schema order, defaults filled)
    written: frozenset[int]
    aliases: frozenset[tuple[int, int]]
    seeded: bool  #: results differ between two seeds
    unstable: bool  #: results differ under one seed


def observe(op: OpOverload, samples: list[Sample], device: Any = "cpu", *,
            again: bool = True) -> tuple[Seen | None, str]:
    """Run the first of ``samples`` that ``op`` accepts, on ``device``, on fresh tensors: under
    seed 0 of torch's generators, under seed 1 (results that differ: ``seeded``) and, when
    ``again``, under seed 0 once more (results that differ: ``unstable``); the caller's
    generator state is restored. Without ``again`` an operator that differs under one seed is
    still seen random where its two runs differ. Returns ``(Seen, "")``, or ``(None, why)``
    when every sample raises (``why``: the last error, one line). O(runs x samples x the
    call)."""
    why = "no sample to run"
    for sample in samples:
        try:
            first = run_sample(op, sample, seed=0, device=device)
            other = run_sample(op, sample, seed=1, device=device)
            same = run_sample(op, sample, seed=0, device=device) if again else first
        except Exception as err:  # noqa: BLE001 - values it refuses: try the next sample
            text = str(err).strip()
            why = f"it raised {type(err).__name__}" + (
                f": {text.splitlines()[0][:160]}" if text else "")
            continue
        return Seen(sample, normal_args(op, sample), first.written, first.aliases,
                    not same_results(first.results, other.results),
                    not same_results(first.results, same.results)), ""
    return None, why


def declared_writes(op: OpOverload) -> tuple[int, ...]:
    """The positions of the arguments ``op``'s schema declares written (``Tensor(a!)``)."""
    return tuple(i for i, a in enumerate(op_schema(op).arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


def schema_aliases(op: OpOverload) -> set[tuple[int, int]]:
    """``(result, argument)`` pairs the schema's alias annotations tie (``Tensor(a)``)."""
    schema = op_schema(op)
    found = set()
    for r, ret in enumerate(schema.returns):
        if ret.alias_info is None:
            continue
        sets = ret.alias_info.before_set
        for i, a in enumerate(schema.arguments):
            if a.alias_info is None:
                continue
            # ``Tensor(a)[]``: the list's items hold the set, the list's own is empty
            if a.alias_info.before_set & sets or (not sets and not a.alias_info.is_write):
                found.add((r, i))
    return found


def entry_of(op: OpOverload, seen: list[Seen], *, source: str, levels: frozenset[str] = (
        frozenset()), effectful: bool = False, state_outputs: tuple = ()) -> OpEntry:
    """The row of ``op`` that the calls ``seen`` (at least one) show, plus its schema's declared
    facts: writes (each conditioned on the bool argument that separates the calls that write
    it from those that do not; always, where none does), aliases, randomness (tagged, or seen:
    an uninitialized factory, ``empty*``, is not random), the hidden facts in words, at most
    two samples. ``source``, ``levels``, ``effectful`` and ``state_outputs`` are the caller's.

    **Laws:** every write and alias a call of ``seen`` showed is in the row, and holds at that
    call's arguments (``opset.written_at``); the schema's writes and aliases are in the row.
    O(seen x arguments)."""
    writes, notes = _write_facts(op, seen)
    aliases = schema_aliases(op) | {a for s in seen for a in s.aliases}
    uninitialized = "empty" in op.__name__
    random = torch.Tag.nondeterministic_seeded in op.tags or (not uninitialized and any(
        s.seeded or s.unstable for s in seen))
    return OpEntry(
        str(op),
        writes=writes,
        aliases=tuple(sorted(aliases)),
        random=random,
        effectful=effectful,
        state_outputs=state_outputs,
        hidden=_hidden(op, writes, aliases, notes),
        levels=frozenset(levels),
        samples=_pick(seen),
        source=source,
    )


def _is_tensor(value: Any) -> bool:
    return isinstance(value, TensorSpec) or (
        type(value) is tuple and any(isinstance(v, TensorSpec) for v in value))


def _write_facts(op: OpOverload, seen: list[Seen]) -> tuple[tuple[Write, ...], list[str]]:
    declared = set(declared_writes(op))
    positions = sorted(declared | {i for s in seen for i in s.written})
    writes: list[Write] = []
    notes: list[str] = []
    for p in positions:
        with_arg = [s for s in seen if p < len(s.args) and _is_tensor(s.args[p])]
        yes = [s for s in with_arg if p in s.written]
        no = [s for s in with_arg if p not in s.written]
        when: tuple = ()
        if yes and no:
            when = _separating_bool(yes, no)
            if not when and p not in declared:
                notes.append(f"argument {p} written by some calls only, with no bool argument "
                             "to tell them apart: counted as always written")
        writes.append(Write(p, when))
    return tuple(writes), notes


def _separating_bool(yes: list[Seen], no: list[Seen]) -> tuple:
    for q in range(min(len(s.args) for s in [*yes, *no])):
        values = {s.args[q] for s in yes if type(s.args[q]) is bool}
        if len(values) != 1 or not all(type(s.args[q]) is bool for s in [*yes, *no]):
            continue
        (v,) = values
        if all(s.args[q] is not v for s in no):
            return ((q, v),)
    return ()


def _hidden(op: OpOverload, writes: tuple[Write, ...], aliases: set, notes: list[str]) -> str:
    names = [a.name for a in op_schema(op).arguments]
    declared_w, declared_a = set(declared_writes(op)), schema_aliases(op)
    parts = []
    for w in writes:
        if w.arg in declared_w:
            continue
        cond = " and ".join(f"{names[q]} ({q}) is {v}" for q, v in w.when)
        parts.append(f"writes {names[w.arg]} ({w.arg})" + (f" when {cond}" if cond else ""))
    for r, i in sorted(aliases - declared_a):
        parts.append(f"result {r} may share storage with {names[i]} ({i})")
    return "; ".join(parts + notes)


def _pick(seen: list[Seen]) -> tuple[Sample, ...]:
    """At most two samples: one per distinct set of written arguments first, then by order;
    samples with drawn values and small tensors preferred."""
    def size(s: Seen) -> int:
        return sum(math.prod(t.shape) for t in _specs(s.sample))
    ordered = sorted(seen, key=lambda s: (any(
        t.values is not None and t.dtype.is_floating_point for t in _specs(s.sample)), size(s)))
    chosen: list[Seen] = []
    for s in ordered:
        if all(c.written != s.written for c in chosen):
            chosen.append(s)
    for s in ordered:
        if len(chosen) >= 2:
            break
        if s not in chosen and all(c.sample != s.sample for c in chosen):
            chosen.append(s)
    return tuple(c.sample for c in chosen[:2])


def _specs(sample: Sample) -> list[TensorSpec]:
    out: list[TensorSpec] = []
    for v in [*sample.args, *(v for _, v in sample.kwargs)]:
        if isinstance(v, TensorSpec):
            out.append(v)
        elif type(v) is tuple:
            out.extend(x for x in v if isinstance(x, TensorSpec))
    return out


# --- a call's values as a sample --------------------------------------------------------------

MAX_ELEMENTS = 1 << 22
"""The most tensor elements (all arguments together) a call is observed at: larger calls are
not run (their sizes do not change which facts a call shows: ``ir.ops.observe_facts`` on
smaller examples of the same dtypes and ranks covers them)."""
_LITERALS = (bool, int, float, complex, str, type(None), torch.dtype, torch.device, torch.layout,
             torch.memory_format)
_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def sample_of(args: tuple, kwargs: dict) -> tuple[Sample, Any]:
    """``(Sample, device)`` for a call whose arguments are ``args`` and ``kwargs`` (fake, meta or
    real tensors, lists of them, symbolic scalars, literals): each tensor a ``TensorSpec`` of
    its shape, dtype and strides (symbolic sizes at their hints), values drawn; the device of
    its first tensor (``cpu`` for meta tensors, or none). Raises ``Unobservable`` (why) for a
    value that cannot be made: a size without a hint, a sparse or quantized tensor, a device
    this machine lacks, an argument that is no tensor, list or literal (a generator, a script
    object), tensors of more than ``MAX_ELEMENTS`` elements in all. O(arguments)."""
    devices: list[Any] = []

    def spec(v: Any, where: str) -> Any:
        if isinstance(v, torch.Tensor):
            if v.layout != torch.strided or v.is_quantized:
                raise Unobservable(f"{where} is a {v.layout} tensor")
            devices.append(v.device)
            return TensorSpec(_ints(v.shape, where), v.dtype,
                              None if _contiguous(v) else _ints(v.stride(), where))
        if isinstance(v, _SYMBOLIC):
            value = v.node.hint
            if value is None:
                raise Unobservable(f"{where} is a symbolic value without a hint")
            return value
        if isinstance(v, (list, tuple)):
            return tuple(spec(x, where) for x in v)
        if isinstance(v, _LITERALS):
            return v
        raise Unobservable(f"{where} is a {type(v).__name__}, which purefx cannot make")

    sample = Sample(tuple(spec(a, f"argument {i}") for i, a in enumerate(args)),
                    tuple((k, spec(v, f"argument {k!r}")) for k, v in kwargs.items()))
    elements = sum(math.prod(t.shape) for t in _specs(sample))
    if elements > MAX_ELEMENTS:
        raise Unobservable(
            f"its tensors hold {elements} elements, more than the {MAX_ELEMENTS} purefx runs an "
            "operator on to observe it: observe it on smaller examples with "
            "ir.ops.observe_facts")
    device = next((d for d in devices if d.type != "meta"), torch.device("cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise Unobservable(f"its values are on {device}, which this machine lacks")
    if device.type not in ("cpu", "cuda"):
        raise Unobservable(f"its values are on {device}")
    return sample, device


def _ints(sizes: Any, where: str) -> tuple[int, ...]:
    out = []
    for d in sizes:
        value = d.node.hint if isinstance(d, torch.SymInt) else d
        if value is None:
            raise Unobservable(f"a size of {where} is symbolic without a hint")
        out.append(int(value))
    return tuple(out)


def _contiguous(t: torch.Tensor) -> bool:
    expected = 1
    for size, stride in reversed(list(zip(_ints(t.shape, ""), _ints(t.stride(), "")))):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def value_ranges(sample: Sample) -> list[Sample]:
    """``sample`` and the same call with values drawn in ``[0, 1)`` (integers: zeros): the
    second for operators that refuse negative values or indices. O(arguments)."""
    def narrow(v: Any) -> Any:
        if isinstance(v, TensorSpec):
            return attrs.evolve(v, low=0.0, high=1.0)
        if type(v) is tuple:
            return tuple(narrow(x) for x in v)
        return v
    other = Sample(tuple(narrow(a) for a in sample.args),
                   tuple((k, narrow(v)) for k, v in sample.kwargs))
    return [sample, other]
