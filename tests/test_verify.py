"""``verify`` names the node or module at fault."""

from __future__ import annotations

import pytest
from pyrsistent import pmap

from ir import Graph, Module, Node, Program, VerifyError, ref, verify
from ir.signature import USER_INPUT, USER_OUTPUT, ExportSignature, InputSpec, OutputSpec


def _program(nodes, children=(), extra=None) -> Program:
    modules = {"": Module(type_name="M", children=children, graphs=(Graph(tuple(nodes)),))}
    modules.update(extra or {})
    return Program(
        root="",
        modules=pmap(modules),
        signature=ExportSignature((InputSpec(USER_INPUT, "x"),), (OutputSpec(USER_OUTPUT, "y"),)),
    )


X = Node("placeholder", "x", "x")


def test_well_formed_program_passes():
    p = _program([X, Node("call_function", "y", "relu", (ref("x"),)), Node("output", "o", "output", ((ref("y"),),))])
    assert verify(p) is p


def test_use_before_definition_names_the_node():
    nodes = [X, Node("call_function", "y", "relu", (ref("z"),)), Node("output", "o", "output", ((ref("y"),),))]
    with pytest.raises(VerifyError, match="'y'.*%z before it is defined"):
        verify(_program(nodes))


def test_duplicate_name():
    nodes = [X, Node("call_function", "x", "relu", (ref("x"),)), Node("output", "o", "output", ((ref("x"),),))]
    with pytest.raises(VerifyError, match="defined twice"):
        verify(_program(nodes))


def test_missing_output():
    with pytest.raises(VerifyError, match="does not end with an output"):
        verify(_program([X]))


def test_call_module_to_missing_child():
    nodes = [X, Node("call_module", "y", "sub", (ref("x"),)), Node("output", "o", "output", ((ref("y"),),))]
    with pytest.raises(VerifyError, match="calls 'sub', which is not a submodule"):
        verify(_program(nodes))


def test_call_module_arity():
    sub = Module(graphs=(Graph((Node("placeholder", "a", "a"), Node("placeholder", "b", "b"), Node("output", "o", "output", ((ref("a"),),)))),))
    nodes = [X, Node("call_module", "y", "sub", (ref("x"),)), Node("output", "o", "output", ((ref("y"),),))]
    with pytest.raises(VerifyError, match="passes 1 arguments to 'sub'"):
        verify(_program(nodes, children=(("sub", "sub"),), extra={"sub": sub}))


def test_get_attr_of_missing_state():
    nodes = [X, Node("get_attr", "w", "weight"), Node("call_function", "y", "add", (ref("x"), ref("w"))), Node("output", "o", "output", ((ref("y"),),))]
    with pytest.raises(VerifyError, match="reads 'weight', which is neither state nor a submodule"):
        verify(_program(nodes))


def test_module_cycle():
    nodes = [X, Node("output", "o", "output", ((ref("x"),),))]
    p = _program(nodes, children=(("me", ""),))
    with pytest.raises(VerifyError, match="contains itself"):
        verify(p)


def test_signature_mismatch():
    nodes = [Node("placeholder", "q", "q"), Node("output", "o", "output", ((ref("q"),),))]
    with pytest.raises(VerifyError, match="do not match the input specs"):
        verify(_program(nodes))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (InputSpec("bogus", "x"), "unknown kind 'bogus'"),
        (InputSpec("parameter", "x", "w"), "reads parameter 'w', which is not state"),
        (InputSpec(USER_INPUT, "x", "w"), "has target 'w'; it takes none"),
    ],
)
def test_input_specs_must_fit_their_kind(spec, message):
    nodes = [X, Node("call_function", "y", "relu", (ref("x"),)), Node("output", "o", "output", ((ref("y"),),))]
    p = _program(nodes)
    bad = p.replace(signature=ExportSignature((spec,), p.signature.outputs))
    with pytest.raises(VerifyError, match=message):
        verify(bad)


def test_output_specs_must_have_a_known_kind():
    nodes = [X, Node("call_function", "y", "relu", (ref("x"),)), Node("output", "o", "output", ((ref("y"),),))]
    p = _program(nodes)
    bad = p.replace(signature=ExportSignature(p.signature.inputs, (OutputSpec("bogus", "y"),)))
    with pytest.raises(VerifyError, match="unknown kind 'bogus'"):
        verify(bad)


# --- module graphs are checked once per alpha key, and every graph's reads and calls ---------


def _child_graph(*nodes):
    return Graph((Node("placeholder", "a", "a"), *nodes))


def _two_children(first: Graph, second: Graph, state_of_second: bool = True) -> Program:
    """The root calls children ``c0`` and ``c1`` (graphs ``first`` and ``second``) in turn."""
    from ir.state import BUFFER, Opaque, Slot

    root = [
        X,
        Node("call_module", "y0", "c0", (ref("x"),)),
        Node("call_module", "y", "c1", (ref("y0"),)),
        Node("output", "o", "output", ((ref("y"),),)),
    ]
    fqns = ["c0.w"] + (["c1.w"] if state_of_second else [])
    return Program(
        root="",
        modules=pmap({
            "": Module(type_name="M", children=(("c0", "c0"), ("c1", "c1")), graphs=(Graph(tuple(root)),)),
            "c0": Module(graphs=(first,)),
            "c1": Module(graphs=(second,)),
        }),
        state=pmap({f: Slot(BUFFER, "t", True, False) for f in fqns}),
        state_order=tuple(fqns),
        tensors=pmap({"t": Opaque(object())}),
        signature=ExportSignature((InputSpec(USER_INPUT, "x"),), (OutputSpec(USER_OUTPUT, "y"),)),
    )


def _reads_w(names=("w", "s", "o")):
    w, s, o = names
    return _child_graph(
        Node("get_attr", w, "w"),
        Node("call_function", s, "add", (ref("a"), ref(w))),
        Node("output", o, "output", ((ref(s),),)),
    )


def test_equal_module_graphs_both_pass():
    p = _two_children(_reads_w(), _reads_w(("w2", "s2", "o2")))
    assert verify(p) is p


def test_a_repeated_name_is_found_in_a_graph_whose_key_passed_before():
    # same alpha key as the first child's graph (each read names the last definition of its
    # name), but ``w`` is defined twice
    twice = _child_graph(
        Node("get_attr", "w", "w"),
        Node("call_function", "w", "add", (ref("a"), ref("a"))),
        Node("output", "o", "output", ((ref("w"),),)),
    )
    once = _child_graph(
        Node("get_attr", "w0", "w"),
        Node("call_function", "w", "add", (ref("a"), ref("a"))),
        Node("output", "o", "output", ((ref("w"),),)),
    )
    from ir.alpha import graph_key

    assert graph_key(once) == graph_key(twice)
    assert verify(_two_children(once, once)) is not None
    with pytest.raises(VerifyError, match="'w' is defined twice in module 'c1'"):
        verify(_two_children(once, twice))


def test_reads_are_checked_in_every_graph_of_a_key():
    p = _two_children(_reads_w(), _reads_w(("w2", "s2", "o2")), state_of_second=False)
    with pytest.raises(VerifyError, match="'w2' in module 'c1' reads 'w', which is neither state"):
        verify(p)


def test_a_literal_never_stands_for_a_read_in_the_alpha_key():
    from ir.alpha import graph_key

    read = _child_graph(
        Node("call_function", "s", "add", (ref("a"), ref("a"))),
        Node("output", "o", "output", ((ref("s"),),)),
    )
    for literal in (("#", 0), ("free", "a")):
        spelled = _child_graph(
            Node("call_function", "s", "add", (ref("a"), literal)),
            Node("output", "o", "output", ((ref("s"),),)),
        )
        assert graph_key(spelled) != graph_key(read)
    undefined = _child_graph(
        Node("call_function", "s", "add", (ref("a"), ref("nowhere"))),
        Node("output", "o", "output", ((ref("s"),),)),
    )
    spelled = _child_graph(
        Node("call_function", "s", "add", (ref("a"), ("free", "nowhere"))),
        Node("output", "o", "output", ((ref("s"),),)),
    )
    assert graph_key(spelled) != graph_key(undefined)
    verify(_two_children(spelled, spelled))
    with pytest.raises(VerifyError, match="reads %nowhere before it is defined"):
        verify(_two_children(spelled, undefined))
