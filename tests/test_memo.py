"""``ir.memo``: memos on frozen IR values, and the weak side tables of the layers above.

A memo is computed once, takes no part in what a value is (``==``, ``hash``, ``repr``, its
pickled state), is dropped by ``evolve``, ``copy``, ``deepcopy`` and pickling (a copy computes its
own, from its own objects), and two threads that compute it at once get equal results. The lowering
keeps its caches in its own weak maps: lowering a program writes nothing into its IR values but
the IR's own memos.
"""

from __future__ import annotations

import copy
import gc
import pickle
import threading
import weakref
from typing import Any

import attrs
import pytest

from ir import import_ep
from ir.alpha import graph_key, interned_key
from ir.graph import Graph
from ir.memo import NOT_COMPUTED, WeakMemo, memoized
from ir.module import Module
from ir.node import CALL_FUNCTION, OUTPUT, PLACEHOLDER, Node
from ir.program import Program
from lowering import lower
from tests.zoo import CASES, export_case
from transforms import transform

_MISSING = object()


@attrs.frozen(cache_hash=True)
class Pair:
    """A frozen slotted class with one memo that counts how often it is computed."""

    left: int
    right: tuple = ()
    calls: list = attrs.field(factory=list, eq=False, repr=False)

    @memoized
    def total(self) -> list[int]:
        """A fresh list each time it is computed, so that identity tells computations apart."""
        self.calls.append(1)
        return [self.left, *self.right]


def stored(obj: Any, name: str) -> Any:
    """What memo ``name`` of ``obj`` holds, without computing it (``_MISSING`` when empty)."""
    held = getattr(obj, getattr(type(obj), name).storage)
    return _MISSING if held is NOT_COMPUTED else held


def memo_names(cls: type) -> set[str]:
    """The names of the memos of ``cls``."""
    return {name for name in dir(cls) if isinstance(getattr(cls, name, None), memoized)}


def slot_values(obj: Any) -> dict[str, Any]:
    """Every slot of ``obj`` (fields, memo fields, hash cache) and what it holds, or ``_MISSING``."""
    slots = {s for c in type(obj).__mro__ for s in getattr(c, "__slots__", ())} - {"__weakref__"}
    return {s: getattr(obj, s, _MISSING) for s in slots}


def small_graph() -> Graph:
    x = Node(PLACEHOLDER, "x", "x")
    y = Node(CALL_FUNCTION, "y", "aten.relu", (x.ref,))
    return Graph.of([x, y, Node(OUTPUT, "output", "output", ((y.ref,),))])


# --- memoized ------------------------------------------------------------------------------------


def test_memo_is_computed_once_and_stored_in_its_slot() -> None:
    p = Pair(1, (2,))
    assert stored(p, "total") is _MISSING
    first = p.total
    assert p.total is first and first == [1, 2]
    assert stored(p, "total") is first
    assert len(p.calls) == 1
    assert memo_names(Pair) == {"total"}
    assert not hasattr(p, "__dict__")
    memo_field = attrs.fields(Pair)._memo_total
    assert not (memo_field.init or memo_field.eq or memo_field.repr)


def test_memo_is_not_part_of_eq_hash_repr_or_state() -> None:
    computed, fresh = Pair(1, (2,)), Pair(1, (2,))
    _ = computed.total
    assert computed == fresh and hash(computed) == hash(fresh)
    assert repr(computed) == repr(fresh) == "Pair(left=1, right=(2,))"
    assert "total" not in {a.name for a in attrs.fields(Pair)}
    assert attrs.asdict(computed, filter=lambda a, v: a.eq) == {"left": 1, "right": (2,)}
    _, (kind, fields) = computed.__reduce__()  # what copy and pickle carry
    assert kind is Pair and fields == {"left": 1, "right": (2,), "calls": [1]}


def test_memo_cannot_be_assigned_or_deleted() -> None:
    p = Pair(1)
    _ = p.total
    with pytest.raises(AttributeError):
        p.total = [9]  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del p.total
    with pytest.raises(AttributeError):
        p._memo_total = [9]
    assert p.total == [1]


@pytest.mark.parametrize(
    "duplicate",
    [copy.copy, copy.deepcopy, lambda v: pickle.loads(pickle.dumps(v))],
    ids=["copy", "deepcopy", "pickle"],
)
def test_copies_drop_the_memo_and_recompute_their_own(duplicate) -> None:
    p = Pair(3, (4,))
    original = p.total
    twin = duplicate(p)
    assert twin == p
    assert stored(twin, "total") is _MISSING
    assert twin.total == original and twin.total is not original
    assert p.total is original


def test_evolve_drops_the_memo() -> None:
    p = Pair(1, (2,))
    _ = p.total
    changed = attrs.evolve(p, left=5)
    assert stored(changed, "total") is _MISSING
    assert changed.total == [5, 2]
    same = attrs.evolve(p)
    assert stored(same, "total") is _MISSING and same.total == [1, 2]


def test_threads_computing_at_once_get_equal_results() -> None:
    arrived = threading.Barrier(2, timeout=10)

    @attrs.frozen
    class Slow:
        x: int

        @memoized
        def value(self) -> list[int]:
            arrived.wait()  # both threads are inside the computation before either stores
            return [self.x]

    s = Slow(7)
    got: list[Any] = [None, None]

    def read(i: int) -> None:
        got[i] = s.value

    threads = [threading.Thread(target=read, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got[0] == got[1] == [7]
    assert stored(s, "value") in (got[0], got[1]) and s.value is stored(s, "value")


def test_memoized_refuses_a_class_that_copies_its_own_way() -> None:
    with pytest.raises((TypeError, RuntimeError)) as info:  # 3.11 wraps it in a RuntimeError

        @attrs.frozen
        class Own:
            x: int

            def __reduce__(self):
                return Own, (self.x,)

            @memoized
            def value(self) -> int:
                return self.x

    assert "defines __reduce__" in f"{info.value} {info.value.__cause__}"


# --- the IR's memos ------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [Node, Graph, Module, Program])
def test_ir_values_have_memos_and_weak_references(cls: type) -> None:
    assert memo_names(cls)
    assert "__weakref__" in {s for c in cls.__mro__ for s in getattr(c, "__slots__", ())}
    private = {a.name for a in attrs.fields(cls) if a.name.startswith("_")}
    assert private == {getattr(cls, m).storage for m in memo_names(cls)}, "a private field"


def test_graph_memos_are_dropped_by_copy_and_evolve() -> None:
    # IR values hold read-only meta (mappingproxy): copy.copy and evolve, not deepcopy or pickle
    g = small_graph()
    assert g.by_name()["y"] is g.nodes[1] and g.users()["x"] == ("y",)
    assert g.nodes[1].inputs() == (g.nodes[0].ref,) and g.placeholders == (g.nodes[0],)
    for twin in (copy.copy(g), attrs.evolve(g), Graph.of(g.nodes)):
        assert twin == g
        assert all(stored(twin, name) is _MISSING for name in memo_names(Graph))
        assert twin.by_name() == g.by_name() and twin.by_name() is not g.by_name()


def test_program_memos_are_dropped_by_copy_and_replace() -> None:
    p = import_ep(export_case(CASES["mlp_nested"]))
    child = p.root_module.children[0][0]
    table, resolved = p.module_table(), p.resolve(child)
    twin = copy.copy(p)
    assert all(stored(twin, name) is _MISSING for name in memo_names(Program))
    assert twin.module_table() == table and twin.module_table() is not table
    assert twin.resolve(child) == resolved is not None
    moved = p.replace(call_order=(*p.call_order, "x"))
    assert all(stored(moved, name) is _MISSING for name in memo_names(Program))


# --- WeakMemo ------------------------------------------------------------------------------------


def test_weak_memo_is_by_identity_and_held_weakly() -> None:
    calls: list[Graph] = []

    def count(g: Graph) -> int:
        calls.append(g)
        return len(g)

    memo: WeakMemo[Graph, int] = WeakMemo(count)
    a, b = small_graph(), small_graph()
    assert a == b and a is not b
    assert memo(a) == memo(a) == memo(b) == 3
    assert len(calls) == 2 and calls[0] is a and calls[1] is b  # equal values, two entries
    del calls[:]
    dead = weakref.ref(a)
    del a
    gc.collect()
    assert dead() is None and len(memo) == 1


def test_weak_memo_first_store_wins_across_threads() -> None:
    arrived = threading.Barrier(2, timeout=10)

    def slow(g: Graph) -> list[int]:
        arrived.wait()
        return [len(g)]

    memo: WeakMemo[Graph, list[int]] = WeakMemo(slow)
    g = small_graph()
    got: list[Any] = [None, None]

    def read(i: int) -> None:
        got[i] = memo(g)

    threads = [threading.Thread(target=read, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got[0] == [3] and got[0] is got[1] is memo(g)


def test_alpha_keys_are_not_written_into_the_graph() -> None:
    g = small_graph()
    before = {name: stored(g, name) for name in memo_names(Graph)}
    key = graph_key(g)
    assert interned_key(g).key == key and interned_key(copy.copy(g)) is interned_key(g)
    assert {name: stored(g, name) for name in memo_names(Graph)} == before


# --- lowering writes nothing into the IR ---------------------------------------------------------


def _ir_values(p: Program) -> list[Any]:
    found: list[Any] = [p]
    for mid in p.modules:
        module = p.modules[mid]
        found.append(module)
        for graph in module.graphs:
            found.append(graph)
            found.extend(graph.nodes)
    return found


def _snapshot(value: Any) -> dict[str, Any]:
    return slot_values(value)


@pytest.mark.parametrize("name", ["preserve_nested", "repeated_diff_flag", "tied_weights"])
def test_lower_writes_no_private_field_of_the_ir(name: str) -> None:
    p = transform(import_ep(export_case(CASES[name])))
    values = _ir_values(p)
    before = [_snapshot(v) for v in values]
    lower(p)
    for value, then in zip(values, before):
        now = _snapshot(value)
        assert now.keys() == then.keys()
        memos = {getattr(type(value), m).storage: m for m in memo_names(type(value))}
        for slot, was in then.items():
            if slot in memos and was is NOT_COMPUTED:
                continue  # a memo the lowering asked the IR for: checked below
            assert now[slot] is was, f"lower changed {type(value).__name__}.{slot}"
        for slot, memo in memos.items():
            if then[slot] is NOT_COMPUTED and now[slot] is not NOT_COMPUTED:
                _check_memo_is_the_irs_own(value, memo, now[slot])


def _check_memo_is_the_irs_own(value: Any, memo: str, held: Any) -> None:
    """A memo set during ``lower`` holds what the IR computes for itself, nothing foreign."""
    fresh = copy.copy(value)
    if isinstance(value, Program) and memo == "_resolved":  # a cache of resolve's answers
        for (path, start), mid in held.items():
            assert fresh.resolve(path, start) == mid
        return
    assert getattr(fresh, memo) == held, f"{type(value).__name__}.{memo} holds foreign data"
