"""Memos: values derived from an immutable IR value, computed once and never part of its identity.

Two helpers, one rule: a memo is a pure function of a frozen value, so it may be dropped at any
time and recomputed, and it never changes what the value is.

- :class:`memoized` is for data the IR owns: a method of an attrs frozen slotted class (``Node``,
  ``Graph``, ``Module``, ``Program``) turned into a read-only attribute computed on first read and
  stored in a slot of its own. The slot is not an attrs field, so it takes no part in ``==``,
  ``hash``, ``repr``, ``attrs.evolve`` (a new value starts empty), pickling or ``copy``/
  ``deepcopy`` (the copy recomputes it: a memo that holds objects of the original, or their
  ``id``, can never go stale in a copy).
- :class:`WeakMemo` is for data other modules derive from an IR value (``ir.alpha``'s keys, the
  lowering's caches): a function of one IR value, remembered per value *by identity* and held
  only as long as the value lives. Nothing is written into the value.

Both are safe under threads: two threads that compute a memo at once both return the value the
first of them stored (the computation runs outside any lock; a lock only guards the store).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from functools import cached_property
from types import MemberDescriptorType
from typing import Any, Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

# Guards only the check-and-store of a computed memo (never a computation): reentrant because a
# store allocates, and an allocation may run a garbage collection that drops another entry.
_STORE = threading.RLock()


class memoized(cached_property, Generic[T]):
    """Decorator: ``@memoized def name(self) -> T`` makes ``obj.name`` a value computed once.

    For methods of attrs frozen slotted classes (``@attrs.frozen``): attrs gives each memo a slot
    of its own, named after it (attrs turns ``functools.cached_property``, which this extends,
    into a slot read by plain attribute access: after the first read it costs what reading a
    field costs). The first read calls the method and stores its result; later reads return that
    object. Assigning or deleting the attribute raises, as for any field of a frozen class.

    Contract of the method: a pure function of the instance's fields (the memo is dropped by
    ``evolve``, pickling and copying, and recomputed on demand). It may return a mutable table
    only as a cache that holds answers derived the same way (``Program.resolve``).

    Threads: two threads that read the memo for the first time at once may both run the method;
    both get the result stored first (first store wins), so they see one object.

    Complexity: the method's cost once per instance; O(1) per later read.
    """

    def __init__(self, method: Callable[[Any], T]) -> None:
        name = method.__name__
        super().__init__(_first_store_wins(method, name))
        self.__doc__ = method.__doc__
        self.method = method


def _first_store_wins(method: Callable[[Any], T], name: str) -> Callable[[Any], T]:
    """``method`` wrapped so that the slot ``name`` gets one value, the first one computed."""

    def compute(obj: Any) -> T:
        slot = getattr(type(obj), name, None)
        if not isinstance(slot, MemberDescriptorType):
            raise TypeError(
                f"@memoized {method.__qualname__} needs an attrs slotted class (@attrs.frozen); "
                f"{type(obj).__qualname__}.{name} is not a slot"
            )
        value = method(obj)
        with _STORE:
            try:
                return slot.__get__(obj)  # another thread stored it first
            except AttributeError:
                slot.__set__(obj, value)
                return value

    compute.__name__ = name
    compute.__qualname__ = method.__qualname__
    compute.__doc__ = method.__doc__
    compute.__annotations__ = dict(getattr(method, "__annotations__", {}))
    return compute


class WeakMemo(Generic[K, V]):
    """``memo(key)``: ``compute(key)``, computed once per live ``key`` object and held weakly.

    Entries are found by the key's identity, never by ``==``: two equal IR values are two entries
    (a memo may depend on object identities inside its key, e.g. a table by ``id`` of the tree
    specs a graph holds). An entry goes when its key is garbage collected; the key must support
    weak references (attrs classes do by default) and the value must not refer to the key (it
    would keep the key alive for as long as the memo lives).

    Threads: first store wins, as for :class:`memoized`. Complexity: O(1) per call after the
    first for a key, plus ``compute``'s cost once.
    """

    __slots__ = ("__weakref__", "_compute", "_table")

    def __init__(self, compute: Callable[[K], V]) -> None:
        self._compute = compute
        self._table: dict[int, tuple[weakref.ref, V]] = {}

    def __call__(self, key: K) -> V:
        entry = self._table.get(id(key))
        if entry is not None and entry[0]() is key:
            return entry[1]
        return self._store(key, self._compute(key))

    def __len__(self) -> int:
        """Number of entries held (those whose key is still alive)."""
        return len(self._table)

    def _store(self, key: K, value: V) -> V:
        ident = id(key)
        table = self._table

        def forget(dead: weakref.ref) -> None:
            # Runs while the key is being freed, before its id can be reused: no lock needed.
            held = table.get(ident)
            if held is not None and held[0] is dead:
                del table[ident]

        with _STORE:
            held = table.get(ident)
            if held is not None and held[0]() is key:
                return held[1]
            table[ident] = (weakref.ref(key, forget), value)
        return value
