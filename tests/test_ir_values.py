"""The IR's values: immutability, exact equality without meta, alpha keys, arguments trees."""

from __future__ import annotations

import copy
import pickle

import attrs
import pytest
from pyrsistent import pmap

from ir import (
    EMPTY_DICT,
    Graph,
    IDict,
    IList,
    ISlice,
    Module,
    Node,
    Program,
    alpha_equivalent,
    format_program,
    graph_key,
    ref,
)
from ir.args import freeze, iter_refs, map_refs, thaw
from ir.names import Names, fresh_name
from ir.signature import USER_INPUT, USER_OUTPUT, ExportSignature, InputSpec, OutputSpec


def _chain(names: tuple[str, str, str], meta: dict | None = None) -> Graph:
    x, y, out = names
    return Graph(
        (
            Node("placeholder", x, x),
            Node("call_function", y, "relu", (ref(x),), meta=meta or {}),
            Node("output", out, "output", ((ref(y),),)),
        )
    )


def test_nodes_are_frozen():
    node = Node("placeholder", "x", "x")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        node.name = "y"


def test_equality_and_hash_ignore_meta():
    a = _chain(("x", "y", "out"), {"stack_trace": "here"})
    b = _chain(("x", "y", "out"), {"stack_trace": "elsewhere"})
    assert a == b and hash(a) == hash(b)


def test_names_count_for_equality_but_not_for_alpha_key():
    a = _chain(("x", "y", "out"))
    b = _chain(("u", "v", "out"))
    assert a != b
    assert graph_key(a) == graph_key(b)


def test_alpha_key_sees_targets_and_wiring():
    a = _chain(("x", "y", "out"))
    other_op = Graph((a.nodes[0], a.nodes[1].replace(target="tanh"), a.nodes[2]))
    assert graph_key(a) != graph_key(other_op)


@pytest.mark.parametrize(
    ("one", "other"),
    [(2, 2.0), (1, True), (0.0, -0.0), (0, False), (1.0, 1 + 0j), (0j, complex(0.0, -0.0))],
)
@pytest.mark.parametrize("where", ["arg", "nested", "kwarg", "no_inputs"])
def test_alpha_key_tells_equal_numbers_of_other_types_apart(one, other, where):
    def graph(value):
        if where == "no_inputs":
            body = Node("call_function", "y", "full", (IList((2,)), value))
        elif where == "kwarg":
            body = Node("call_function", "y", "mul", (ref("x"),), IDict((("other", value),)))
        elif where == "nested":
            body = Node("call_function", "y", "mul", (ref("x"), IList((value, ISlice(0, value, None)))))
        else:
            body = Node("call_function", "y", "mul", (ref("x"), value))
        return Graph((Node("placeholder", "x", "x"), body, Node("output", "o", "output", ((ref("y"),),))))

    assert one == other  # Python calls them equal; the code they give computes differently
    assert graph_key(graph(one)) != graph_key(graph(other))
    assert graph_key(graph(one)) == graph_key(graph(copy.copy(one)))


def test_alpha_key_copies_and_pickles_equal():
    key = graph_key(_chain(("x", "y", "out")))
    assert copy.deepcopy(key) == key
    assert pickle.loads(pickle.dumps(key)) == key


def test_replace_returns_self_when_nothing_changes():
    node = Node("call_function", "y", "relu", (ref("x"),))
    assert node.replace(name="y") is node
    assert node.replace(name="z") is not node


def test_args_keep_list_tuple_dict_distinction():
    tree = ([1, (2, 3)], {"a": [4]}, slice(1, None, 2))
    frozen = freeze(tree, lambda leaf: leaf)
    assert frozen == (IList((1, (2, 3))), IDict((("a", IList((4,))),)), ISlice(1, None, 2))
    hash(frozen)
    assert thaw(frozen, lambda r: r) == tree
    assert type(thaw(frozen, lambda r: r)[0]) is list


def test_map_refs_shares_unchanged_subtrees():
    tree = (ref("a"), IList((1, 2)), IDict((("k", ref("b")),)))
    assert map_refs(tree, lambda r: r) is tree
    renamed = map_refs(tree, lambda r: ref(r.name + "2"))
    assert [r.name for r in iter_refs(renamed)] == ["a2", "b2"]
    assert renamed[1] is tree[1]


def test_refs_are_interned():
    assert ref("abc") is ref("abc")


def _program(graph: Graph) -> Program:
    return Program(
        root="",
        modules=pmap({"": Module(type_name="M", graphs=(graph,))}),
        signature=ExportSignature(
            (InputSpec(USER_INPUT, graph.nodes[0].name),), (OutputSpec(USER_OUTPUT, graph.nodes[1].name),)
        ),
    )


def test_program_alpha_equivalence_and_printer():
    a = _program(_chain(("x", "y", "out")))
    b = _program(_chain(("u", "v", "out")))
    assert a != b
    assert alpha_equivalent(a, b)
    text = format_program(a, vals=False)
    assert "%y = call_function[relu](%x)" in text
    assert text == format_program(_program(_chain(("x", "y", "out"))), vals=False)


def test_empty_dict_is_shared_default():
    assert Node("placeholder", "x", "x").kwargs is EMPTY_DICT


def test_fresh_names_skip_taken_ones_and_remember_where_they_stopped():
    taken = Names({"copy_", "copy__1", "x"})
    got = [fresh_name("copy_", taken) for _ in range(3)]
    assert got == ["copy__2", "copy__3", "copy__4"]
    assert taken.counters["copy_"] == 5
    assert fresh_name("y", taken) == "y" and fresh_name("", taken) == "_"
    assert {"copy__2", "copy__3", "copy__4", "y", "_"} <= taken


def test_fresh_name_refuses_a_plain_set():
    with pytest.raises(TypeError, match="Names"):
        fresh_name("a", {"a"})
