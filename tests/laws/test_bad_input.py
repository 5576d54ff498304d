"""Bad input raises a purefx error (DESIGN.md, law 8): never ``AssertionError``, ``KeyError`` or
a wrong result. Malformed programs are made by breaking generated ones in one place each."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lawcases import PIPELINE, examples, valid

from ir import Graph, Node, PurefxError, VerifyError, ref, verify
from ir.program import Program
from ir.strategies import programs
from lowering import lower
from transforms import inline, transform
from transforms.passes.outline import outline


def _root(p: Program, nodes) -> Program:
    graph = Graph(tuple(nodes))
    return p.replace(modules=p.modules.set(p.root, p.root_module.replace(graphs=(graph,))))


def _computing(p: Program) -> list[int]:
    return [i for i, n in enumerate(p.root_module.graph.nodes)
            if n.op in ("call_function", "call_module")]


def dangling_read(p: Program, i: int) -> Program:
    """A node reads a value no node defines."""
    nodes = list(p.root_module.graph.nodes)
    n = nodes[i]
    nodes[i] = n.replace(args=(ref("nowhere"),) + n.args[1:])
    return _root(p, nodes)


def renamed_definition(p: Program, i: int) -> Program:
    """A node that is read (the first one from ``i`` on; else the last) is renamed and its
    readers are not."""
    graph = p.root_module.graph
    nodes = list(graph.nodes)
    users = graph.users()
    read = [j for j in _computing(p) if users[nodes[j].name]]
    if not read:  # renaming a value nobody reads leaves the program well formed
        return dangling_read(p, i)
    j = next((j for j in read if j >= i), read[-1])
    nodes[j] = nodes[j].replace(name=nodes[j].name + "_renamed")
    return _root(p, nodes)


def defined_twice(p: Program, i: int) -> Program:
    """Two nodes have one name."""
    nodes = list(p.root_module.graph.nodes)
    nodes.insert(i + 1, nodes[i])
    return _root(p, nodes)


def read_before_definition(p: Program, i: int) -> Program:
    """A node moves before the placeholders."""
    nodes = list(p.root_module.graph.nodes)
    return _root(p, [nodes[i]] + nodes[:i] + nodes[i + 1:])


def missing_callee(p: Program, i: int) -> Program:
    """A ``call_module`` (or another node, turned into one) names no submodule."""
    nodes = list(p.root_module.graph.nodes)
    nodes[i] = Node("call_module", nodes[i].name, "no_such_module", nodes[i].args)
    return _root(p, nodes)


def lost_input_spec(p: Program, i: int) -> Program:
    """The signature no longer lists the last placeholder."""
    sig = p.signature
    return p.replace(signature=sig.__class__(sig.inputs[:-1], sig.outputs))


CORRUPTIONS = (dangling_read, renamed_definition, defined_twice, read_before_definition,
               missing_callee, lost_input_spec)


@st.composite
def malformed(draw, base):
    p = draw(base)
    spots = _computing(p)
    if not spots:
        return lost_input_spec(p, 0)
    corrupt = draw(st.sampled_from(CORRUPTIONS))
    return corrupt(p, draw(st.sampled_from(spots)))


FLAT = malformed(programs())
OUTLINED = malformed(valid(outline))


def raises_purefx_or_returns(fn, p) -> None:
    try:
        fn(p)
    except PurefxError:
        pass
    except Exception as e:  # noqa: BLE001 - any other error breaks the law
        pytest.fail(f"{getattr(fn, '__name__', fn)} raised {type(e).__name__}: {e}, not a "
                    "purefx error")


@pytest.mark.parametrize("source", ["flat", "outlined"])
def test_verify_and_lower_reject_malformed_programs(source):
    @settings(max_examples=examples(60))
    @given(FLAT if source == "flat" else OUTLINED)
    def rejected(p):
        with pytest.raises(VerifyError):
            verify(p)
        with pytest.raises(PurefxError):
            lower(p)
        with pytest.raises(PurefxError):
            transform(p, check=True)

    rejected()


@pytest.mark.parametrize("fn", PIPELINE + (inline, transform), ids=lambda f: f.__name__)
@pytest.mark.parametrize("source", ["flat", "outlined"])
def test_passes_raise_purefx_errors_on_malformed_programs(fn, source):
    @settings(max_examples=examples(40))
    @given(FLAT if source == "flat" else OUTLINED)
    def only_purefx_errors(p):
        raises_purefx_or_returns(fn, p)

    only_purefx_errors()


@settings(max_examples=examples(30))
@given(programs())
def test_outline_names_a_node_without_a_module_stack(p):
    nodes = list(p.root_module.graph.nodes)
    spots = _computing(p)
    if not spots:
        return
    i = spots[0]
    nodes[i] = nodes[i].replace(meta={})
    with pytest.raises(PurefxError, match=nodes[i].name):
        outline(_root(p, nodes))
