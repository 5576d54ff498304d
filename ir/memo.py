"""Memos: values derived from a value, computed once and never part of its identity.

Three helpers, one rule: a memo is a pure function of what it is keyed by, so it may be dropped
at any time and recomputed, and it never changes what that value is.

- :class:`memoized` is for data the IR owns: a method of an attrs frozen class (``Node``,
  ``Graph``, ``Module``, ``Program``) turned into a read-only attribute computed on first read and
  stored in one private slot. The memo takes no part in ``==``, ``hash``, ``repr``,
  ``attrs.evolve`` (a new value starts empty), pickling or ``copy``/``deepcopy`` (the copy
  recomputes it: a memo that holds objects of the original, or their ``id``, never goes stale
  in a copy).
- :class:`WeakMemo` is for data other modules derive from an IR value (``ir.alpha``'s keys, the
  lowering's caches): a function of one IR value, remembered per value *by identity* and held
  only as long as the value lives. Nothing is written into the value.
- :class:`BoundedMemo` is for answers derived from an object that need not be an IR value nor
  support weak references (an operator, a rule's function, a rule's traces) together with a
  hashable key: found by the object's identity and the key, the object held by its entry (so
  its ``id`` is never reused while the entry lives), at most ``size`` entries, all dropped at
  once when full (the traces of ``transforms.machinery.trace``, the patterns of
  ``transforms.rewrite.sizes`` and ``transforms.rewrite.rule_check``; ``ir.ops.facts`` keeps
  the same shape written inline, its hit being on every pass's hot path).

All are safe under threads: two threads that compute a memo at once get equal results (and
from a ``WeakMemo``, one object: the first stored).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from types import MemberDescriptorType
from typing import Any, Generic, TypeVar

import attrs

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

_OBJECT_SETATTR = object.__setattr__  # past the frozen class's __setattr__, as attrs' __init__


class _Unset:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<not computed>"


# What a memo's field holds until the memo is computed. A hot accessor may read the field itself
# (``found = self._memo_x``; ``self.x`` when it is ``NOT_COMPUTED``) to save a call per read.
# Also what ``BoundedMemo.get`` answers for a value not kept (``None`` may be a value kept).
NOT_COMPUTED: Any = _Unset()


class memoized(property, Generic[T]):
    """Decorator: ``@memoized def name(self) -> T`` makes ``obj.name`` a value computed once.

    For methods of attrs frozen classes (``@attrs.frozen``). The memo is stored in a private
    field of its own, ``_memo_<name>``, that this decorator adds to the class before attrs builds
    it: ``init=False``, ``eq=False``, ``repr=False`` (so not hashed either), and attrs' slotted
    class makes it a slot. The class also gets a ``__reduce__`` that rebuilds a value from its
    ``init`` fields, so ``copy``, ``deepcopy`` and pickling drop every memo, as ``attrs.evolve``
    does: a copy computes its own from its own objects, never reads a memo that held the
    original's. The first read calls the method and stores its result; later reads return that
    object. Assigning the attribute raises ``AttributeError`` (a ``property`` without a setter).

    Contract of the method: a pure function of the instance's fields. It may return a mutable
    table only as a cache of answers derived the same way (``Program.resolve``).

    Threads: two threads that read the memo for the first time at once may both run the method;
    each gets its own result, and the results are equal (the method is pure); one of them stays.
    No lock is taken: storing a slot is atomic, and a pure memo needs nothing more.

    Complexity: the method's cost once per instance; O(1) per later read (a property call; an
    accessor on a hot path may read the field directly, see ``NOT_COMPUTED``).
    """

    def __init__(self, method: Callable[[Any], T]) -> None:
        storage = f"_memo_{method.__name__.lstrip('_')}"

        def get(obj: Any) -> T:
            found = getattr(obj, storage)  # not ``attrgetter``: dynamo traces ``getattr``
            if found is NOT_COMPUTED:
                found = method(obj)
                _OBJECT_SETATTR(obj, storage, found)
            return found

        get.__name__, get.__qualname__ = method.__name__, method.__qualname__
        super().__init__(get, None, None, method.__doc__)
        self.method, self.storage = method, storage

    def __set_name__(self, owner: type, name: str) -> None:
        if name != self.method.__name__:
            raise TypeError(f"@memoized {self.method.__qualname__} is bound to another name, {name}")
        held = owner.__dict__.get(self.storage)
        if isinstance(held, MemberDescriptorType):
            return  # attrs is building the slotted class from the class already prepared here
        if held is not None:
            raise TypeError(
                f"{owner.__qualname__}.{self.storage} is taken: @memoized {name} stores there"
            )
        owner.__annotations__[self.storage] = "Any"
        setattr(owner, self.storage, attrs.field(default=NOT_COMPUTED, init=False, eq=False, repr=False))
        reduce = owner.__dict__.get("__reduce__")
        if reduce is None:
            owner.__reduce__ = _reduce_without_memos  # type: ignore[method-assign]
        elif reduce is not _reduce_without_memos:
            raise TypeError(f"@memoized {owner.__qualname__}.{name}: the class defines __reduce__")


def _reduce_without_memos(self: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """``copy``/``pickle`` support for a class with memos: rebuild from the ``init`` fields."""
    kind = type(self)
    kept = {}
    for field in attrs.fields(kind):
        if field.init:
            kept[field.alias] = getattr(self, field.name)
        elif not field.name.startswith("_memo_"):
            raise TypeError(f"cannot copy a {kind.__qualname__}: field {field.name} is not init")
    return _rebuild, (kind, kept)


def _rebuild(kind: type, fields: dict[str, Any]) -> Any:
    return kind(**fields)


class WeakMemo(Generic[K, V]):
    """``memo(key)``: ``compute(key)``, computed once per live ``key`` object and held weakly.

    Entries are found by the key's identity, never by ``==``: two equal IR values are two entries
    (a memo may depend on object identities inside its key, e.g. a table by ``id`` of the tree
    specs a graph holds). An entry goes when its key is garbage collected; the key must support
    weak references (attrs classes do by default) and the value must not refer to the key (it
    would keep the key alive for as long as the memo lives).

    Threads: two threads that compute an entry at once both get the value stored first.
    Complexity: O(1) per call after the first for a key, plus ``compute``'s cost once.
    """

    __slots__ = ("__weakref__", "_compute", "_forget", "_table")

    def __init__(self, compute: Callable[[K], V]) -> None:
        self._compute = compute
        table: dict[int, tuple[weakref.KeyedRef, V]] = {}

        def forget(dead: weakref.KeyedRef) -> None:
            # Runs while the key is being freed, before its id can be reused by another object.
            held = table.get(dead.key)
            if held is not None and held[0] is dead:
                del table[dead.key]

        self._table, self._forget = table, forget

    def __call__(self, key: K) -> V:
        entry = self._table.get(id(key))
        if entry is not None and entry[0]() is key:
            return entry[1]
        return self._store(key, self._compute(key))

    def __len__(self) -> int:
        """Number of entries held (those whose key is still alive)."""
        return len(self._table)

    def _store(self, key: K, value: V) -> V:
        # An entry under ``id(key)`` is ``key``'s: an entry goes before its key's id is free.
        # ``setdefault`` is one atomic step, so the first store wins without a lock.
        ident = id(key)
        return self._table.setdefault(ident, (weakref.KeyedRef(key, self._forget, ident), value))[1]


class BoundedMemo(Generic[V]):
    """A memo of values per ``(owner, key)``, the owner found by identity: at most ``size`` entries.

    ``memo.put(owner, key, value)`` keeps ``value``; ``memo.get(owner, key)`` answers it, or
    ``NOT_COMPUTED`` when none is kept, so ``None`` is a value like any other (a failed trace
    remembered as ``None``). An entry is found by ``id(owner)`` and ``key`` (hashed, compared
    with ``==``) and holds ``owner`` itself: while the entry lives the owner lives, so its
    ``id`` is no other object's, and a hit is an entry whose owner ``is`` the one asked about.
    The owner needs neither ``__hash__`` nor weak references (an ``OpOverload`` hashes in
    Python code; a function from ``functools.partial`` takes no weak reference). The cost of
    holding owners: up to ``size`` of them stay alive until the memo is emptied, so owners
    should be objects that live anyway (operators, a rule's functions) or small.

    The bound: a ``put`` into a full memo first empties it (no order is kept, no entry is
    evicted alone), so ``len(memo) <= size`` after every ``put``. ``size`` may be changed (tests
    lower it); a memo holding more than the new size is emptied at once.

    Laws: ``put(o, k, v)`` then ``get(o, k)`` is ``v`` (the same object) until the memo is
    emptied or ``(o, k)`` put again; ``get(o2, k)`` for another live object ``o2`` never answers
    ``o``'s value; emptying changes no answer of a memo whose values are a pure function of
    ``(owner, key)``, only its cost (that is the contract of a caller's values).

    Threads: each ``get``, ``put`` and ``clear`` reads or writes the table in single dict
    operations, atomic under the GIL; no lock is taken. Two threads that miss at once both
    compute the value (equal values, by the contract) and both put it, the last stored stays;
    a ``put`` racing another may pass the bound by one entry per thread, until the next ``put``
    that finds the memo full.

    Complexity: ``get`` O(1) plus hashing ``key``; ``put`` O(1), O(entries) when it empties the
    memo; ``clear`` and ``keys`` O(entries); memory O(size).
    """

    __slots__ = ("_limit", "_table")

    def __init__(self, size: int) -> None:
        """An empty memo of at most ``size`` entries (an int >= 1; ``ValueError`` otherwise)."""
        self._table: dict[tuple[int, Hashable], tuple[object, V]] = {}
        self._limit = _bound(size)

    @property
    def size(self) -> int:
        """The most entries held after a ``put``. Settable; a memo holding more is emptied."""
        return self._limit

    @size.setter
    def size(self, size: int) -> None:
        self._limit = _bound(size)
        if len(self._table) > self._limit:
            self._table.clear()

    def get(self, owner: object, key: Hashable) -> V | _Unset:
        """The value kept for ``key`` on behalf of ``owner`` itself (by identity), or
        ``NOT_COMPUTED`` when none is. Test the answer with ``is NOT_COMPUTED``: a kept value may
        be ``None`` or falsy. O(1) plus hashing ``key``."""
        entry = self._table.get((id(owner), key))
        if entry is not None and entry[0] is owner:
            return entry[1]
        return NOT_COMPUTED

    def put(self, owner: object, key: Hashable, value: V) -> V:
        """Keep ``value`` for ``key`` on behalf of ``owner`` (held alive by the entry), emptying
        the memo first when it holds ``size`` entries; a value kept for ``(owner, key)`` before
        is replaced. Returns ``value``. O(1), O(entries) when the memo is emptied."""
        table = self._table
        if len(table) >= self._limit:
            table.clear()
        table[(id(owner), key)] = (owner, value)
        return value

    def clear(self) -> None:
        """Drop every entry (and with them the owners they held). O(entries)."""
        self._table.clear()

    def keys(self) -> tuple[Hashable, ...]:
        """The keys of the entries held, as passed to ``put`` (without their owners), in the
        order they were put: a snapshot, for tests and inspection. O(entries)."""
        return tuple(key for _, key in list(self._table))

    def __len__(self) -> int:
        """Number of entries held. O(1)."""
        return len(self._table)


def _bound(size: int) -> int:
    if type(size) is not int or size < 1:
        raise ValueError(f"a BoundedMemo holds at least one entry; size={size!r}")
    return size
