"""``ir.memo.BoundedMemo``: values per (owner, key), the owner found by identity and held by its
entry, ``None`` a value like any other, at most ``size`` entries (emptied when full); and the
modules that keep their memos in one (their bounds, and a ``None`` kept as an answer)."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch

from ir.errors import PassError
from ir.memo import NOT_COMPUTED, BoundedMemo
from transforms.machinery import trace as tr
from transforms.rewrite import Rule, rule_check, sizes


class Owner:
    """An owner that compares equal to every other Owner and takes weak references."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Owner)

    __hash__ = None  # type: ignore[assignment]  # an owner needs no hash


def test_a_hit_is_the_value_kept_for_that_owner_and_key() -> None:
    memo: BoundedMemo[list[int]] = BoundedMemo(8)
    owner, value = Owner(), [1, 2]
    assert memo.put(owner, ("k", 1), value) is value
    assert memo.get(owner, ("k", 1)) is value
    assert memo.get(owner, ("k", 2)) is NOT_COMPUTED  # another key
    assert memo.get(Owner(), ("k", 1)) is NOT_COMPUTED  # an equal owner is another owner
    memo.put(owner, ("k", 1), [3])  # put again: replaced
    assert memo.get(owner, ("k", 1)) == [3] and len(memo) == 1


def test_the_entry_holds_its_owner_alive_until_the_memo_is_emptied() -> None:
    memo: BoundedMemo[str] = BoundedMemo(8)
    owner = Owner()
    ref = weakref.ref(owner)
    memo.put(owner, "k", "v")
    del owner
    gc.collect()
    assert ref() is not None  # its id cannot be reused while the entry lives
    assert memo.get(ref(), "k") == "v"
    memo.clear()
    gc.collect()
    assert ref() is None


def test_an_entry_found_by_id_whose_owner_is_another_object_is_not_a_hit() -> None:
    memo: BoundedMemo[str] = BoundedMemo(8)
    kept, asked = Owner(), Owner()
    memo.put(kept, "k", "kept's")
    # forge the one state a reused id would make: ``asked``'s id, ``kept``'s entry
    memo._table[(id(asked), "k")] = memo._table.pop((id(kept), "k"))
    assert memo.get(asked, "k") is NOT_COMPUTED


@pytest.mark.parametrize("value", [None, 0, False, (), ""])
def test_none_and_falsy_values_are_kept_apart_from_a_missing_one(value) -> None:
    memo: BoundedMemo[object] = BoundedMemo(8)
    owner = Owner()
    assert memo.get(owner, "k") is NOT_COMPUTED
    memo.put(owner, "k", value)
    assert memo.get(owner, "k") is value


def test_a_full_memo_is_emptied_before_a_put_and_never_holds_more_than_its_size() -> None:
    memo: BoundedMemo[int] = BoundedMemo(3)
    owners = [Owner() for _ in range(10)]
    for i, owner in enumerate(owners[:3]):
        memo.put(owner, "k", i)
    assert len(memo) == 3 and [memo.get(o, "k") for o in owners[:3]] == [0, 1, 2]
    memo.put(owners[3], "k", 3)
    assert len(memo) == 1
    assert memo.get(owners[0], "k") is NOT_COMPUTED and memo.get(owners[3], "k") == 3
    for i, owner in enumerate(owners):
        memo.put(owner, i, i)
        assert 1 <= len(memo) <= 3
        assert memo.get(owner, i) == i  # the value just put is always kept


def test_size_can_be_changed_and_a_memo_over_the_new_size_is_emptied() -> None:
    memo: BoundedMemo[int] = BoundedMemo(4)
    owner = Owner()
    for i in range(3):
        memo.put(owner, i, i)
    memo.size = 3  # still holds them all
    assert memo.size == 3 and len(memo) == 3
    memo.size = 2
    assert memo.size == 2 and len(memo) == 0
    for bad in (0, -1, 2.0, True, None):
        with pytest.raises(ValueError, match="at least one entry"):
            BoundedMemo(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="at least one entry"):
            memo.size = bad  # type: ignore[assignment]
    assert memo.size == 2


def test_clear_drops_every_entry_and_keys_are_a_snapshot_in_put_order() -> None:
    memo: BoundedMemo[int] = BoundedMemo(8)
    a, b = Owner(), Owner()
    memo.put(a, ("x", 1), 1)
    memo.put(b, ("y", 2), 2)
    memo.put(a, ("z", 3), 3)
    keys = memo.keys()
    assert keys == (("x", 1), ("y", 2), ("z", 3))
    memo.clear()
    assert len(memo) == 0 and memo.keys() == () and keys == (("x", 1), ("y", 2), ("z", 3))
    assert memo.get(a, ("x", 1)) is NOT_COMPUTED and not memo


def test_an_unhashable_owner_is_kept_an_unhashable_key_is_refused() -> None:
    memo: BoundedMemo[str] = BoundedMemo(8)
    owner: dict = {}
    memo.put(owner, "k", "v")
    assert memo.get(owner, "k") == "v" and memo.get({}, "k") is NOT_COMPUTED
    with pytest.raises(TypeError):
        memo.put(owner, ["unhashable"], "v")


def test_threads_never_answer_another_owners_value() -> None:
    memo: BoundedMemo[tuple] = BoundedMemo(16)
    wrong: list = []
    start = threading.Barrier(8)

    def work(n: int) -> None:
        owner = Owner()
        start.wait()
        for i in range(2000):
            key = i % 24
            found = memo.get(owner, key)
            if found is not NOT_COMPUTED and found != (n, key):
                wrong.append((n, key, found))
            memo.put(owner, key, (n, key))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong
    assert len(memo) <= 16 + len(threads)  # a racing put passes it by one per thread at most


# --- the modules' memos ------------------------------------------------------------------------


def test_the_modules_keep_their_memos_in_bounded_memos_of_their_documented_sizes() -> None:
    assert isinstance(tr._MEMO, BoundedMemo) and tr._MEMO.size == 512
    assert isinstance(sizes._MEMO, BoundedMemo) and sizes._MEMO.size == 256
    assert isinstance(rule_check._PATTERN_PROGRAMS, BoundedMemo)
    assert rule_check._PATTERN_PROGRAMS.size == 256


class _Sig:
    def key(self) -> tuple:
        return (((3,), torch.float32),)


class _PatternRule:
    def __init__(self) -> None:
        self.pattern = lambda x: x


def test_pattern_program_keeps_a_failed_export_as_none(monkeypatch) -> None:
    exported = []

    def failing(rule, sig, copies) -> None:
        exported.append(copies)

    monkeypatch.setattr(rule_check, "_PATTERN_PROGRAMS", BoundedMemo(4))
    monkeypatch.setattr(rule_check, "_exported_pattern", failing)
    rule, other = _PatternRule(), _PatternRule()
    assert rule_check.pattern_program(rule, _Sig()) is None
    assert rule_check.pattern_program(rule, _Sig()) is None
    assert exported == [False]  # the None was kept
    assert rule_check.pattern_program(rule, _Sig(), copies=True) is None
    assert rule_check.pattern_program(other, _Sig()) is None
    assert exported == [False, True, False]


def _doubled(x):
    return x * 2


def test_pattern_at_keeps_an_untraceable_pattern_as_none(monkeypatch) -> None:
    traced = []

    def failing(*a, **k):
        traced.append(a[2])
        raise PassError("cannot trace here")

    monkeypatch.setattr(sizes, "_MEMO", BoundedMemo(4))
    monkeypatch.setattr(sizes, "trace", failing)
    rule = Rule(_doubled, lambda x: x + x, (torch.randn(4),), name="doubled", trusted=True)
    shapes = (((5,), torch.float32),)
    assert sizes.pattern_at(rule, "core", shapes) is None
    assert sizes.pattern_at(rule, "core", shapes) is None
    assert traced == ["core"]  # the None was kept
    assert sizes.pattern_at(rule, "training", shapes) is None
    assert traced == ["core", "training"]
