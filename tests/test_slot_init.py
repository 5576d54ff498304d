"""``ir.slot_init``: the generated constructors build what attrs' own ``__init__`` builds."""

from __future__ import annotations

import copy
import pickle

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ir.args import IDict, IList, Ref, ref
from ir.graph import Graph
from ir.module_stack import Frame
from ir.node import CALL_FUNCTION, Node, new_node
from ir.slot_init import slot_constructor, slot_init


def _example_class() -> type:
    """A new attrs class of every field kind slot_init handles (each call: another class)."""

    @attrs.frozen(cache_hash=True)
    class Example:
        a: int
        b: tuple = ()
        c: list = attrs.field(factory=list, eq=False)
        d: str = attrs.field(default="d", kw_only=True)
        e: int = attrs.field(default=7, init=False)

    return Example


_Plain = _example_class()  # built by attrs' own __init__
_Fast = slot_init(_example_class())


def _fields(x: object) -> dict:
    return {f.name: getattr(x, f.name) for f in attrs.fields(type(x))}


@given(st.integers(), st.tuples(st.integers()), st.text(max_size=3))
def test_generated_init_sets_every_field_as_attrs_does(a: int, b: tuple, d: str) -> None:
    plain, fast = _Plain(a, b, d=d), _Fast(a, b, d=d)
    assert _fields(plain) == _fields(fast)
    assert fast.e == 7 and fast.c == [] and fast.c is not _Fast(a).c  # a new list per instance
    assert hash(fast) == hash(_Fast(a, b, [1], d=d))  # c takes no part in eq/hash
    assert slot_constructor(_Fast)(a, b, d=d) == fast
    # the cached hash is a plain int (attrs' is an int subclass the collector tracks)
    assert type(fast._attrs_cached_hash) is int and hash(fast) == fast._attrs_cached_hash
    assert copy.copy(fast)._attrs_cached_hash is None  # a copy hashes again


def test_defaults_and_bad_calls() -> None:
    assert _fields(_Fast(1)) == _fields(_Plain(1))
    with pytest.raises(TypeError):
        _Fast()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _Fast(1, (), [], "d")  # type: ignore[misc]  # d is keyword-only
    with pytest.raises(TypeError):
        _Fast(1, e=3)  # type: ignore[call-arg]  # e is not an init argument
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        _Fast(1).a = 2  # type: ignore[misc]


def test_classes_attrs_must_build_keep_their_init() -> None:
    @attrs.frozen
    class Checked:
        a: int = attrs.field(validator=attrs.validators.instance_of(int))

    @attrs.frozen
    class Converted:
        a: int = attrs.field(converter=int)

    @attrs.frozen
    class PostInit:
        a: int

        def __attrs_post_init__(self) -> None:
            object.__setattr__(self, "a", self.a * 2)

    for cls in (Checked, Converted, PostInit):
        init = cls.__init__
        assert slot_init(cls).__init__ is init
        assert slot_constructor(cls) is cls
    with pytest.raises(TypeError):
        Checked("x")
    assert Converted("3").a == 3 and PostInit(2).a == 4


def test_ir_values_built_fast_equal_copy_and_pickle() -> None:
    node = new_node(CALL_FUNCTION, "y", len, (ref("x"), IList((1,))), IDict((("k", 2),)))
    assert node == Node(CALL_FUNCTION, "y", len, (ref("x"), IList((1,))), IDict((("k", 2),)))
    assert node.inputs() == (ref("x"),)
    assert node.replace(name="z").name == "z" and node.replace(name="y") is node
    for value in (Ref("x"), Frame("k", "a.b", "T", 1), IList((1, 2))):
        assert copy.deepcopy(value) == value
        assert pickle.loads(pickle.dumps(value)) == value
        assert hash(pickle.loads(pickle.dumps(value))) == hash(value)
    with_meta = node.with_meta(val=1)
    assert with_meta == node and hash(with_meta) == hash(node)  # meta takes no part
    graph = Graph((node,))
    assert Graph((node,)) == graph and graph.by_name()["y"] is node
