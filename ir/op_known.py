"""The facts of operators the verified table lacks: declared by the user, or observed on the
values of a call purefx meets, and kept.

``ir.ops.facts`` answers an ``OpOverload`` from the verified table (``ir.opset``) first; for one
the table lacks it asks ``known(op)`` here:

1. **declared** facts (``declare``, public as ``ir.ops.register_facts``): an explicit user
   action, scoped by the ``Declared`` handle it returns (``unregister()``, or a ``with``
   block); never for an operator of the table;
2. **observed** facts: the first time purefx meets a call of the operator with values (a node
   imported by ``import_ep``, a node a pass emits, a replacement a rule builds: each one's
   fake run, ``meet``), it makes real tensors of the call's shapes, dtypes and strides, runs
   the operator twice, under two seeds (``ir.op_observe.observe``: the builder's own
   observation) and keeps
   what the calls did; a call with other literal arguments or tensor kinds is observed too
   (up to ``MAX_CALLS`` per operator), and the facts are derived from all the calls seen
   (``ir.op_observe.entry_of``: a write seen under one value of a bool argument only is
   conditioned on it). ``observe_now`` (public as ``ir.ops.observe_facts``) observes given
   example arguments explicitly.

Observed facts are kept in a bounded memo (``MEMO_SIZE`` operators, emptied when full) keyed by
the operator's name, schema and torch's version, and in the store on disk
(``ir.fact_store``: the verdict store's ``operators/`` directory), so a new process reads them
without running the operator. An operator that could not be observed (no values, a size without
a hint, it raised on made-up tensors, a device this machine lacks, a side effect registered
with torch) has no facts: the analysis stays conservative (it writes and aliases every tensor
argument), and ``why_unknown`` says why, for the one message of ``ir.ops.unknown_facts``.

The facts of one call do not depend on what was met before: a call's own key is observed before
its facts are read wherever purefx has its values. Only the memo and the store change here, and
only from unknown to what torch showed; ``generation()`` moves on each change so that
``ir.ops.facts``' own memo is refreshed.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.fx

from ir import fact_store
from ir.args import Ref, thaw
from ir.errors import OperatorFactsError
from ir.op_observe import (
    Seen,
    Unobservable,
    declared_writes,
    entry_of,
    observe,
    sample_of,
    schema_aliases,
    value_ranges,
)
from ir.opset import entry, normal_args
from ir.opset_entry import OpEntry, Sample, TensorSpec, Write
from ir.torch_seam import OpOverload, has_effects, op_schema, real_tensors, torch_side_effectful

__all__ = [
    "DECLARED",
    "MAX_CALLS",
    "MEMO_SIZE",
    "OBSERVED",
    "Declared",
    "call_key",
    "declare",
    "declared",
    "forget",
    "generation",
    "known",
    "meet",
    "meet_node",
    "meet_refs",
    "observe_now",
    "store_path",
    "stored",
    "why_unknown",
]

MEMO_SIZE = 1024  #: operators whose observed facts (or failures) the memo holds
MAX_CALLS = 8  #: calls of other literal arguments or tensor kinds observed per operator
OBSERVED = "observed"  #: ``OpEntry.source`` of observed facts
DECLARED = "declared"  #: ``OpEntry.source`` of declared facts


@attrs.frozen
class _Record:
    """What is known of one operator: the calls seen, their keys, the facts they give."""

    seen: tuple[Seen, ...]
    keys: frozenset[str]
    facts: OpEntry


_LOCK = threading.RLock()
_OBSERVED: dict[tuple[str, str, str], _Record] = {}
_FAILED: dict[tuple[str, str, str], str] = {}
_TRIED: set[tuple[tuple[str, str, str], str]] = set()  # calls whose observation raised
_ABSENT: set[tuple[str, str, str]] = set()  # operators the store had no entry for
_DECLARED: dict[str, tuple[Any, OpEntry]] = {}
_GENERATION = [0]


def generation() -> int:
    """A number that moves whenever ``known``'s answer for some operator may change (a fact
    observed, declared or withdrawn). O(1)."""
    return _GENERATION[0]


def _key(op: OpOverload, version: str | None = None) -> tuple[str, str, str]:
    return (str(op), str(op_schema(op)), torch.__version__ if version is None else version)


def known(op: Any) -> OpEntry | None:
    """The facts of ``op``, an ``OpOverload`` the verified table lacks: declared (first), else
    observed (the memo, else the store on disk), else ``None`` (nothing known: the analysis is
    conservative). ``None`` for any other target. O(1) on a memo hit; a file read on a miss."""
    if not isinstance(op, OpOverload):
        return None
    found = _DECLARED.get(str(op))
    if found is not None and found[0] is op:
        return found[1]
    record = _record(op)
    return None if record is None else record.facts


def _record(op: OpOverload, version: str | None = None) -> _Record | None:
    key = _key(op, version)
    hit = _OBSERVED.get(key)
    if hit is not None:
        return hit
    if key in _ABSENT:
        return None
    record = _read(op, key)
    if record is not None:
        _keep(key, record)
    else:
        with _LOCK:
            if len(_ABSENT) >= MEMO_SIZE:
                _ABSENT.clear()
            _ABSENT.add(key)  # not read again in this process until observed here
    return record


def _keep(key: tuple[str, str, str], record: _Record) -> None:
    with _LOCK:
        if len(_OBSERVED) >= MEMO_SIZE:
            _OBSERVED.clear()
        _OBSERVED[key] = record
        _FAILED.pop(key, None)
        _ABSENT.discard(key)
        _GENERATION[0] += 1


def _fail(key: tuple[str, str, str], why: str) -> None:
    with _LOCK:
        if len(_FAILED) >= MEMO_SIZE:
            _FAILED.clear()
        _FAILED[key] = why


def why_unknown(op: Any) -> str:
    """Why ``op`` has no facts, in words that follow "purefx could not observe it": what the
    last observation met (``"it raised RuntimeError: ..."``), or that purefx has not met a
    call of it with values. O(1)."""
    if isinstance(op, OpOverload):
        why = _FAILED.get(_key(op))
        if why:
            return why
    return "purefx has met no call of it with values to run it on"


# --- meeting a call ----------------------------------------------------------------------------


def meet(op: Any, args: Any, kwargs: Any) -> None:
    """``op`` is called with ``args`` and ``kwargs`` (values: fake, meta or real tensors,
    symbolic sizes, literals): observe it when it is an ``OpOverload`` the verified table
    lacks, with no declared facts, whose facts do not cover a call of this key yet (its literal
    arguments and tensor kinds: ``call_key``), and ``MAX_CALLS`` are not reached. The call's
    tensors are made anew (never the values given, which are not touched). A call that cannot
    be observed is noted (``why_unknown``) when nothing else is known of ``op``. Never raises
    for the operator's sake. O(1) for an operator already covered; else two runs of it on
    small tensors plus a file write."""
    if not isinstance(op, OpOverload) or entry(op) is not None:
        return
    if str(op) in _DECLARED and _DECLARED[str(op)][0] is op:
        return
    _observe_call(op, tuple(args), dict(kwargs or {}))


def meet_refs(op: Any, args: Any, kwargs: Any, val_of: Callable[[Ref], Any]) -> None:
    """``meet`` for a call whose arguments hold ``Ref`` s (a node's), each read by ``val_of``
    (a value it does not know: the call is not observed, and that is noted). O(1) for an
    operator of the table; else as ``meet``."""
    if not isinstance(op, OpOverload) or entry(op) is not None:
        return
    missing: list[str] = []

    def read(r: Ref) -> Any:
        v = val_of(r)
        if v is None:
            missing.append(r.name)
        return v

    values, keywords = thaw(args, read), thaw(kwargs, read)
    if missing:
        if _record(op) is None:
            _fail(_key(op), f"the value of %{missing[0]} is unknown")
        return
    meet(op, values, keywords)


def meet_node(op: Any, args: Any, kwargs: Any) -> None:
    """``meet`` for an fx node's call: its arguments hold ``torch.fx.Node`` s, each read as its
    ``meta["val"]`` (a node without one: not observed, and that is noted). For ``import_ep``.
    O(1) for an operator of the table; else as ``meet``."""
    if not isinstance(op, OpOverload) or entry(op) is not None:
        return
    missing: list[str] = []

    def read(n: torch.fx.Node) -> Any:
        v = n.meta.get("val")
        if v is None:
            missing.append(n.name)
        return v

    values, keywords = torch.fx.node.map_arg((args, dict(kwargs)), read)
    if missing:
        if _record(op) is None:
            _fail(_key(op), f"the value of %{missing[0]} is unknown")
        return
    meet(op, values, keywords)


def _observe_call(op: OpOverload, args: tuple, kwargs: dict) -> OpEntry | None:
    key = _key(op)
    record = _record(op)
    try:
        if has_effects(op) or torch_side_effectful(op):
            raise Unobservable("it is registered with a side effect, and purefx does not run "
                               "such operators")
        sample, device = sample_of(args, kwargs)
    except Unobservable as why:
        if record is None:
            _fail(key, str(why))
        return None
    call = call_key(sample)
    if record is not None and (call in record.keys or len(record.keys) >= MAX_CALLS):
        return record.facts
    if (key, call) in _TRIED:
        return None if record is None else record.facts
    with real_tensors():
        seen, why = observe(op, value_ranges(sample), device, again=False)
    if seen is None:
        with _LOCK:
            if len(_TRIED) >= MEMO_SIZE:
                _TRIED.clear()
            _TRIED.add((key, call))  # not run again at this key: it raises there
        if record is None:
            _fail(key, f"{why}, on tensors made of its call's shapes and dtypes")
        return None if record is None else record.facts
    seen_all = (*(record.seen if record is not None else ()), seen)
    made = _made(op, seen_all)
    _keep(key, made)
    _write(op, key, made)
    return made.facts


def _made(op: OpOverload, seen: tuple[Seen, ...]) -> _Record:
    return _Record(seen, frozenset(call_key(s.sample) for s in seen),
                   entry_of(op, list(seen), source=OBSERVED))


def call_key(sample: Sample) -> str:
    """What makes two calls of one operator worth observing both: their literal arguments and
    their tensors' dtypes, ranks and contiguity (not their sizes). O(arguments)."""
    def part(v: Any) -> Any:
        if isinstance(v, TensorSpec):
            return ("T", str(v.dtype), len(v.shape), v.stride is None)
        if type(v) is tuple:
            return tuple(part(x) for x in v)
        return (type(v).__name__, repr(v))
    return repr((tuple(part(a) for a in sample.args),
                 tuple((k, part(v)) for k, v in sample.kwargs)))


def observe_now(op: OpOverload, args: Iterable[Any] = (), kwargs: dict | None = None,
                ) -> OpEntry:
    """Observe ``op`` on a call with ``args`` and ``kwargs`` (example values: real or fake
    tensors, literals; only their shapes, dtypes, strides and devices are used) now, keep the
    facts (memo and store) and return them. Raises ``OperatorFactsError`` naming ``op`` and why when
    ``op`` is no ``OpOverload``, is in the verified table, has declared facts, or cannot be
    observed on these arguments. O(two runs of ``op``)."""
    if not isinstance(op, OpOverload):
        raise OperatorFactsError(
            f"observe_facts: {op!r} is not an operator overload "
            "(torch.ops.<namespace>.<name>.<overload>)")
    if entry(op) is not None:
        raise OperatorFactsError(
            f"observe_facts: {op} is in the verified operator table; its facts are known")
    if str(op) in _DECLARED:
        raise OperatorFactsError(
            f"observe_facts: {op} has declared facts; unregister them first")
    found = _observe_call(op, tuple(args), dict(kwargs or {}))
    if found is None:
        raise OperatorFactsError(
            f"observe_facts: purefx could not observe {op} on these arguments "
            f"({why_unknown(op)})")
    return found


def forget(op: OpOverload | None = None) -> None:
    """Drop the memo's observed facts and failures of ``op`` (every operator when ``None``);
    the store on disk is left as it is. For a custom operator whose implementation changed
    under the same name and schema (remove its store entry too: ``store_path``), and for
    tests. O(memo size)."""
    with _LOCK:
        _ABSENT.clear()
        if op is None:
            _OBSERVED.clear()
            _FAILED.clear()
            _TRIED.clear()
        else:
            for k in [k for k in _OBSERVED if k[0] == str(op)]:
                del _OBSERVED[k]
            for k in [k for k in _FAILED if k[0] == str(op)]:
                del _FAILED[k]
            for k in [k for k in _TRIED if k[0][0] == str(op)]:
                _TRIED.discard(k)
        _GENERATION[0] += 1


# --- declared facts -------------------------------------------------------------------------------


@attrs.define(eq=False)
class Declared:
    """The handle of declared facts (``declare``): ``unregister()`` withdraws them (then the
    operator is unknown again, or observed); a ``with`` block withdraws them on exit."""

    op: Any
    facts: OpEntry

    def unregister(self) -> None:
        """Withdraw these facts (a no-op when they were withdrawn or replaced already)."""
        with _LOCK:
            held = _DECLARED.get(str(self.op))
            if held is not None and held[1] is self.facts:
                del _DECLARED[str(self.op)]
                _GENERATION[0] += 1

    def __enter__(self) -> Declared:  # noqa: PYI034 - a final class
        return self

    def __exit__(self, *exc: object) -> None:
        self.unregister()


def declare(op: Any, *, written: Iterable[int | str] = (), aliases: Iterable[
        tuple[int, int | str]] = (), random: bool = False, effectful: bool = False) -> Declared:
    """Declare the facts of ``op``, an ``OpOverload`` the verified table lacks (a custom
    operator): the arguments it writes in place (positions or names), the ``(result index,
    argument)`` pairs whose storage may be shared, whether it draws random numbers or has a
    side effect. Its schema's declared writes and aliases (``Tensor(a!)``, ``Tensor(a)``) are
    added: a declaration is never less conservative than the schema. Declared facts win over
    observed ones and hold until the returned handle is unregistered; a second declaration
    replaces the first. Raises ``OperatorFactsError`` (naming ``op`` and the argument) for an operator
    of the table, a target that is no ``OpOverload``, or an argument its schema lacks.
    O(arguments)."""
    if not isinstance(op, OpOverload):
        raise OperatorFactsError(
            f"register_facts: {op!r} is not an operator overload "
            "(torch.ops.<namespace>.<name>.<overload>)")
    if entry(op) is not None:
        raise OperatorFactsError(
            f"register_facts: {op} is in the verified operator table; its facts are "
            "observed there and cannot be declared")
    names = [a.name for a in op_schema(op).arguments]
    results = len(op_schema(op).returns)

    def position(a: int | str) -> int:
        if isinstance(a, str) and a in names:
            return names.index(a)
        if type(a) is int and 0 <= a < len(names):
            return a
        raise OperatorFactsError(f"register_facts: {op} has no argument {a!r} (its arguments: "
                         f"{', '.join(names) or 'none'})")

    pairs = set()
    for r, a in aliases:
        if type(r) is not int or not 0 <= r < results:
            raise OperatorFactsError(
                f"register_facts: {op} has no result {r!r} ({results} results)")
        pairs.add((r, position(a)))
    wrote = sorted({position(a) for a in written} | set(declared_writes(op)))
    facts = OpEntry(str(op), writes=tuple(Write(p) for p in wrote),
                    aliases=tuple(sorted(pairs | schema_aliases(op))), random=bool(random),
                    effectful=bool(effectful), source=DECLARED)
    with _LOCK:
        _DECLARED[str(op)] = (op, facts)
        _GENERATION[0] += 1
    return Declared(op, facts)


def declared(op: Any) -> OpEntry | None:
    """The declared facts of ``op``, or ``None``. O(1)."""
    found = _DECLARED.get(str(op)) if isinstance(op, OpOverload) else None
    return found[1] if found is not None and found[0] is op else None


# --- the store on disk ----------------------------------------------------------------------------


def store_path(op: OpOverload, version: str | None = None) -> Path | None:
    """The file of ``op``'s observed facts in the store (``None`` when the store is off):
    named by the sha256 of its name, schema and torch's version (``version``). O(1)."""
    base = fact_store.operators_directory()
    if base is None:
        return None
    digest = hashlib.sha256("\n".join(_key(op, version)).encode()).hexdigest()
    return base / f"{digest}.json"


def stored(op: OpOverload, version: str | None = None) -> OpEntry | None:
    """The observed facts the store on disk holds for ``op`` under torch version ``version``
    (this torch's by default), derived again from the calls kept; ``None`` when there are none
    to trust (missing, corrupt, of another operator, schema or version). Reads no memo, runs
    nothing. O(file size)."""
    if not isinstance(op, OpOverload):
        return None
    record = _read(op, _key(op, version))
    return None if record is None else record.facts


def _read(op: OpOverload, key: tuple[str, str, str]) -> _Record | None:
    path = store_path(op, key[2])
    body = None if path is None else fact_store.read_json(path)
    if body is None or body.get("format") != fact_store.OPERATORS_FORMAT:
        return None
    if (body.get("op"), body.get("schema"), body.get("torch")) != key:
        return None
    calls = body.get("calls")
    if not isinstance(calls, list) or not calls or len(calls) > MAX_CALLS:
        return None
    try:
        seen = tuple(_seen(op, c) for c in calls)
    except (ValueError, TypeError, KeyError):
        return None
    return _made(op, seen)


def _seen(op: OpOverload, c: Any) -> Seen:
    sample = fact_store.decode_sample(c["sample"])
    written, aliases = c["written"], c["aliases"]
    if not (all(type(i) is int for i in written) and all(
            isinstance(p, list) and len(p) == 2 and all(type(i) is int for i in p)
            for p in aliases) and type(c["seeded"]) is bool and type(c["unstable"]) is bool):
        raise ValueError("not a call")
    return Seen(sample, normal_args(op, sample), frozenset(written),
                frozenset((r, i) for r, i in aliases), c["seeded"], c["unstable"])


def _write(op: OpOverload, key: tuple[str, str, str], record: _Record) -> None:
    path = store_path(op, key[2])
    if path is None:
        return
    try:
        calls = [{"sample": fact_store.encode_sample(s.sample), "written": sorted(s.written),
                  "aliases": sorted([r, i] for r, i in s.aliases), "seeded": s.seeded,
                  "unstable": s.unstable} for s in record.seen]
    except ValueError:
        return  # a value the store cannot spell: kept in memory only
    fact_store.write_json(path, {"format": fact_store.OPERATORS_FORMAT, "op": key[0],
                                 "schema": key[1], "torch": key[2], "calls": calls})
