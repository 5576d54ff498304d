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
