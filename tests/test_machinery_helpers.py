"""The small machinery helpers several passes share: ``with_root_graph`` (a flat pass puts its
root graph back), ``table_as`` (a new module table with the unchanged entries shared),
``part_frames`` / ``outline_parts`` (the cut ``split_by_tags`` and ``split_stages`` share) and
``common_prefix`` (how many calls two chains share)."""

from __future__ import annotations

from ir import parse_program
from ir.graph import Graph
from ir.module import Module
from ir.module_stack import Frame
from transforms.machinery.each_graph import with_root_graph
from transforms.machinery.frames import common_prefix, part_frames
from transforms.machinery.module_table import table_as
from transforms.passes.outline import outline_parts

P = parse_program("""\
program:
  inputs:
    %x: user_input
  outputs:
    %b: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %a = call_function[aten.relu.default](%x)
      %b = call_function[aten.neg.default](%a)
      return (%b,)""")


def test_with_root_graph_is_the_input_for_its_own_graph_and_swaps_another():
    graph = P.root_module.graph
    assert with_root_graph(P, graph) is P
    other = Graph.of(graph.nodes)
    q = with_root_graph(P, other)
    assert q is not P and q.root_module.graph is other
    assert P.root_module.graph is graph  # the input is not changed


def test_table_as_shares_what_is_unchanged_and_drops_what_is_gone():
    table = dict(P.module_table())
    assert table_as(P, table) is P.modules
    table["extra"] = Module()
    grown = table_as(P, table)
    assert set(grown) == {*P.modules, "extra"} and grown[P.root] is P.modules[P.root]
    shrunk = table_as(P.replace(modules=grown), {P.root: P.root_module})
    assert set(shrunk) == {P.root} and shrunk[P.root] is P.root_module


def test_part_frames_puts_each_part_in_its_own_call():
    frames_of = part_frames({"a": 0, "b": 1}, ("first", "second"))
    by_name = P.root_module.graph.by_name()
    assert frames_of(by_name["a"]) == (Frame("first", "first", None, 0),)
    assert frames_of(by_name["b"]) == (Frame("second", "second", None, 0),)
    assert frames_of(by_name["x"]) is None  # no part: it stays where it is


def test_outline_parts_gives_each_part_its_graph_and_none_for_an_empty_part():
    outlined, graphs = outline_parts(P, {"a": 0, "b": 1}, ("first", "second", "empty"))
    assert [n.target for n in outlined.root_module.graph.nodes if n.op == "call_module"] == [
        "first", "second",
    ]
    first, second, empty = graphs
    assert [n.name for n in first.nodes if n.op == "call_function"] == ["a"]
    assert [n.name for n in second.nodes if n.op == "call_function"] == ["b"]
    assert empty is None


def test_common_prefix_counts_the_shared_leading_calls():
    assert common_prefix(("a", "b", "c"), ("a", "b", "d")) == 2
    assert common_prefix(("a",), ("a", "b")) == 1
    assert common_prefix((), ("a",)) == 0
    assert common_prefix(["x"], ("y",)) == 0
