"""The kernel's door for graphs named anew (``transforms.kernel``): ``WorkingGraph.take_only``,
``copy``, ``renamed`` and new inputs (``make_carrying(PLACEHOLDER, ...)``), ``fresh_id`` and the fx naming policy
(``FxWorkingGraph``), which ``inline``, ``split_by_tags``, the stage split and ``export_ep``'s
lifted state name through; and ``restacked``'s graph, which has one output node."""

from __future__ import annotations

import operator
from types import MappingProxyType

import torch

from ir import import_ep, verify
from ir.args import EMPTY_DICT, Ref
from ir.graph import Graph
from ir.names import Names
from ir.node import CALL_FUNCTION, OUTPUT, PLACEHOLDER, Node
from transforms import kernel as kn
from transforms import transform
from transforms.passes.inlining import inline_with_calls, restacked

aten = torch.ops.aten


def _graph() -> Graph:
    x = Node(PLACEHOLDER, "x", "x", meta=MappingProxyType({"val": 1}))
    relu = Node(CALL_FUNCTION, "relu", aten.relu.default, (Ref("x"),),
                meta=MappingProxyType({"tag": "a"}))
    out = Node(OUTPUT, "output", "output", ((Ref("relu"),),))
    return Graph((x, relu, out))


def test_copies_keep_their_names_where_free_and_their_meta():
    g = _graph()
    heard = kn.Drawn()
    w = kn.WorkingGraph(g, indexed=False, listener=heard)
    w.take_only(("output",))
    relu = g.nodes[1]
    first = w.copy(relu)
    second = w.copy(relu, args=(Ref("relu"),))
    assert (first.name, second.name) == ("relu", "relu_1")
    assert second.args == (Ref("relu"),) and second.meta["tag"] == "a"
    assert w.copy(g.nodes[0], "output").name == "output_1"  # the output's name stays taken
    assert heard.names == ["relu", "relu_1", "output_1"]


def test_a_renamed_node_is_read_by_its_new_name_by_the_nodes_kept_after_it():
    g = _graph()
    w = kn.WorkingGraph(g, indexed=False)
    x, relu, out = g.nodes
    w.keep(w.renamed(x, w.fresh("x")))  # "x" is taken: the input's name
    w.keep(relu)
    w.keep(out)
    new = w.finish()[0]
    assert [n.name for n in new.nodes] == ["x_1", "relu", "output"]
    assert new.nodes[1].args == (Ref("x_1"),)
    assert w.renamed(relu, "relu") is relu


def test_a_placeholder_is_named_fresh_its_target_its_name_its_meta_as_given():
    g = _graph()
    w = kn.WorkingGraph(g, indexed=False)
    made = w.make_carrying(PLACEHOLDER, base="x", meta={"val": 2})
    assert (made.op, made.name, made.target) == (PLACEHOLDER, "x_1", "x_1")
    assert dict(made.meta) == {"val": 2} and "x_1" in w.made
    assert w.make_carrying(PLACEHOLDER, base="p_w").name == "p_w"
    given = w.make_carrying(PLACEHOLDER, base="ignored", name="given")
    assert (given.name, given.target) == ("given", "given")


def test_fresh_id_draws_after_the_base():
    taken = Names(("a", "b"))
    assert [kn.fresh_id("a", taken), kn.fresh_id("a", taken), kn.fresh_id("c", taken)] == [
        "a_1", "a_2", "c"
    ]
    assert {"a_1", "a_2", "c"} <= taken


def test_an_fx_working_graph_names_as_torch_fx_does():
    g = _graph()
    w = kn.FxWorkingGraph(g)
    call = w.make("call_module", "sub", (Ref("x"),), EMPTY_DICT, base="sub")
    items = [
        w.make(CALL_FUNCTION, operator.getitem, (call.ref, i), EMPTY_DICT, base="getitem")
        for i in range(2)
    ]
    assert [n.name for n in items] == ["getitem", "getitem_1"]
    assert w.fresh("input") == "input_1"  # a builtin: fx never gives it as is
    assert w.fresh("a.b") == "a_b"
    assert w.copy(g.nodes[1]).name == "relu"


class _Inner(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) + 1


class _Top(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = _Inner()
        self.b = _Inner()

    def forward(self, x):
        return self.b(self.a(x)) * 2


def test_restacked_graph_has_one_output_node():
    p = transform(import_ep(torch.export.export(_Top(), (torch.randn(2, 3),))))
    flat, chains = inline_with_calls(p)
    q = restacked(flat, chains, p)
    graph = q.root_module.graph
    assert [n.op for n in graph.nodes].count(OUTPUT) == 1
    assert len(graph.nodes) == len(flat.root_module.graph.nodes)
    verify(q)


def test_read_as_rewires_later_readers_and_keeps_the_node():
    g = _graph()
    w = kn.WorkingGraph(g, indexed=False)
    x, relu, out = g.nodes
    y = w.make_carrying(PLACEHOLDER, base="y")
    w.add(x)
    w.add(y)
    w.read_as("x", y.ref)
    w.keep(relu)
    w.keep(out)
    new, renames = w.finish()
    assert [n.name for n in new.nodes] == ["x", "y", "relu", "output"]
    assert new.nodes[2].args == (Ref("y"),) and renames == {}


def test_a_copy_that_changes_nothing_is_the_node_itself():
    g = _graph()
    w = kn.WorkingGraph(g, indexed=False)
    w.take_only()
    for n in g.nodes:
        w.add(w.copy(n))
    assert w.finish()[0] is g
