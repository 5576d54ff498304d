"""Immutable argument trees.

Node arguments are trees of ``Ref`` leaves (values produced by other nodes) and literals. fx treats
lists, tuples and dicts differently, so the tree keeps the distinction losslessly: a Python ``tuple``
stands for a tuple, ``IList`` for a list and ``IDict`` for a dict. Every tree is hashable.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs

from ir.slot_init import slot_constructor, slot_init


@slot_init
@attrs.frozen(cache_hash=True)
class Ref:
    """A reference to the value a node produces, by the node's unique name in its graph."""

    name: str

    def __repr__(self) -> str:
        return f"%{self.name}"


_new_ref = slot_constructor(Ref)


class _NameRef(weakref.ref):
    """A weak reference to a ``Ref`` that remembers its name (``weakref.KeyedRef`` without its
    Python-level constructor: interning misses are hot during import)."""

    __slots__ = ("key",)


# name -> weak reference to its live Ref; an entry goes when its Ref is collected, so the table
# holds only names some live program uses.
_REFS: dict[str, _NameRef] = {}


def ref(name: str) -> Ref:
    """The interned ``Ref`` for ``name``: while one is alive, every call returns that object
    (refs of one name are one object, so comparing them stops at identity). Refs are held weakly:
    names of programs that are gone take no memory. O(1).
    """
    held = _REFS.get(name)
    if held is not None:
        found = held()
        if found is not None:
            return found
    found = _new_ref(name)
    held = _REFS[name] = _NameRef(found, _forget)
    held.key = name
    return found


def _forget(held: _NameRef, refs: dict = _REFS) -> None:
    """Drop a collected Ref's entry (unless a new Ref of that name took it meanwhile). The table
    is bound at definition: at interpreter exit the module's globals may already be gone."""
    if refs.get(held.key) is held:
        refs.pop(held.key, None)


@slot_init
@attrs.frozen(cache_hash=True)
class IList:
    """An immutable stand-in for a Python ``list`` argument."""

    items: tuple = ()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        return self.items[index]

    def __repr__(self) -> str:
        return "[" + ", ".join(map(repr, self.items)) + "]"


@slot_init
@attrs.frozen(cache_hash=True)
class IDict:
    """An immutable, insertion-ordered stand-in for a Python ``dict`` argument."""

    items: tuple = ()

    def keys(self) -> tuple:
        return tuple(k for k, _ in self.items)

    def values(self) -> tuple:
        return tuple(v for _, v in self.items)

    def get(self, key: Any, default: Any = None) -> Any:
        for k, v in self.items:
            if k == key:
                return v
        return default

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k!r}: {v!r}" for k, v in self.items) + "}"


EMPTY_DICT = IDict(())


@slot_init
@attrs.frozen(cache_hash=True)
class ISlice:
    """An immutable, hashable stand-in for a ``slice`` literal (not hashable before Python 3.12)."""

    start: Any
    stop: Any
    step: Any


def map_refs(tree: Any, fn: Callable[[Ref], Any]) -> Any:
    """Return ``tree`` with every ``Ref`` leaf replaced by ``fn(ref)``; same object if unchanged."""
    kind = type(tree)
    if kind is Ref:
        return fn(tree)
    if kind is tuple:
        return _map_tuple(tree, fn)
    if kind is IList:
        mapped = _map_tuple(tree.items, fn)
        return tree if mapped is tree.items else IList(mapped)
    if kind is IDict:
        mapped = tuple((k, map_refs(v, fn)) for k, v in tree.items)
        if all(a[1] is b[1] for a, b in zip(mapped, tree.items)):
            return tree
        return IDict(mapped)
    if kind is ISlice:
        parts = map_refs((tree.start, tree.stop, tree.step), fn)
        return tree if parts == (tree.start, tree.stop, tree.step) else ISlice(*parts)
    return tree


def map_refs_in(tree: Any, table: Mapping[str, Any], missing: Callable[[Ref], Any]) -> Any:
    """``map_refs`` that replaces each ``Ref`` by ``table[ref.name]``, or by ``missing(ref)``
    where the table has no (or a ``None``) entry. A flat tuple, the common argument tree, is
    mapped without a call per leaf. Same object if unchanged. O(leaves)."""
    get = table.get

    def one(r: Ref) -> Any:
        found = get(r.name)
        return found if found is not None else missing(r)

    if type(tree) is not tuple:
        return map_refs(tree, one)
    changed = None
    for i, item in enumerate(tree):
        kind = type(item)
        if kind is Ref:
            new = get(item.name)
            if new is None:
                new = missing(item)
        elif kind in NESTED:
            new = map_refs(item, one)
        else:
            continue
        if new is not item:
            if changed is None:
                changed = list(tree)
            changed[i] = new
    return tree if changed is None else tuple(changed)


def _map_tuple(items: tuple, fn: Callable[[Ref], Any]) -> tuple:
    changed = False
    mapped = []
    for item in items:
        kind = type(item)
        if kind is Ref:
            new = fn(item)
        elif kind in NESTED:
            new = map_refs(item, fn)
        else:
            new = item
        changed = changed or new is not item
        mapped.append(new)
    return tuple(mapped) if changed else items


def iter_refs(tree: Any) -> Iterator[Ref]:
    """Yield every ``Ref`` leaf of ``tree``, left to right."""
    found: list[Ref] = []
    collect_refs(tree, found)
    return iter(found)


def collect_refs(tree: Any, into: list[Ref]) -> None:
    """Append every ``Ref`` leaf of ``tree`` to ``into``, left to right."""
    kind = type(tree)
    if kind is Ref:
        into.append(tree)
    elif kind is tuple or kind is IList:
        for item in tree:
            if type(item) is Ref:
                into.append(item)
            elif type(item) in NESTED:
                collect_refs(item, into)
    elif kind is IDict:
        for _, value in tree.items:
            collect_refs(value, into)
    elif kind is ISlice:
        collect_refs((tree.start, tree.stop, tree.step), into)


def freeze(obj: Any, on_leaf: Callable[[Any], Any]) -> Any:
    """Turn a mutable Python argument tree into an immutable one.

    ``on_leaf`` is called on every non-container leaf and returns its frozen form (for fx nodes:
    a ``Ref``). Lists become ``IList``, dicts ``IDict``, tuples stay tuples (namedtuples become
    plain tuples, as fx stores them).
    """
    shape = _SHAPES.get(type(obj))
    if shape is None:
        shape = _shape_of(type(obj))
    if shape is _LEAF:
        return on_leaf(obj)
    if shape is _TUPLE:
        return tuple([freeze(x, on_leaf) for x in obj])
    if shape is _LIST:
        return IList(tuple([freeze(x, on_leaf) for x in obj]))
    if shape is _DICT:
        return IDict(tuple([(k, freeze(v, on_leaf)) for k, v in obj.items()]))
    return ISlice(*(freeze(x, on_leaf) for x in (obj.start, obj.stop, obj.step)))


_LEAF, _TUPLE, _LIST, _DICT, _SLICE = "leaf", "tuple", "list", "dict", "slice"
_SHAPES: dict[type, str] = {}


def _shape_of(kind: type) -> str:
    """How ``freeze`` treats values of type ``kind`` (decided once per type)."""
    if issubclass(kind, (list, tuple)) and not _is_leaf_sequence(kind):
        shape = _LIST if issubclass(kind, list) else _TUPLE
    elif issubclass(kind, dict):
        shape = _DICT
    elif issubclass(kind, slice):
        shape = _SLICE
    else:
        shape = _LEAF
    _SHAPES[kind] = shape
    return shape


def thaw(tree: Any, on_ref: Callable[[Ref], Any]) -> Any:
    """Inverse of ``freeze``: build mutable lists/dicts back, mapping each ``Ref`` by ``on_ref``."""
    if type(tree) is Ref:
        return on_ref(tree)
    if type(tree) is tuple:
        return tuple(thaw(x, on_ref) for x in tree)
    if type(tree) is IList:
        return [thaw(x, on_ref) for x in tree.items]
    if type(tree) is IDict:
        return {k: thaw(v, on_ref) for k, v in tree.items}
    if type(tree) is ISlice:
        return slice(*(thaw(x, on_ref) for x in (tree.start, tree.stop, tree.step)))
    return tree


# the argument-tree kinds that may hold refs below them
NESTED = frozenset((tuple, IList, IDict, ISlice))


def _is_leaf_sequence(kind: type) -> bool:
    # torch.Size is a tuple subclass that fx keeps as a literal.
    return kind.__name__ == "Size"
