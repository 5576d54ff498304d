"""The kernel's door for the default pipeline's drivers: ``WorkingGraph.derive`` (a node that
stands for another, its meta kept), ``read_as(rename=True)`` (later readers read a new value),
``returning`` (a new graph picked from the input) and ``fresh_id``."""

from __future__ import annotations

import torch
from kernel_support import Heard, relu_mul_graph

from ir.args import EMPTY_DICT as EMPTY
from ir.args import ref
from ir.names import Names
from ir.node import CALL_FUNCTION, GET_ATTR, OUTPUT, PLACEHOLDER
from transforms import kernel as kn

aten = torch.ops.aten





def test_derive_keeps_the_anchors_meta_puts_the_changes_over_it_and_names_by_the_policy():
    graph = relu_mul_graph()
    heard = Heard()
    w = kn.WorkingGraph(graph, indexed=False, listener=heard)
    relu = graph.node("relu")
    a = w.derive(relu, target=aten.neg.default)
    b = w.derive(relu, base="relu", meta={"val": None, "extra": 1})
    c = w.derive(relu, name="mine", op=GET_ATTR, target="t", args=(), kwargs=EMPTY)
    assert (a.name, b.name, c.name) == ("neg", "relu_1", "mine")
    assert a.meta is relu.meta and a.args == relu.args  # no change asked: the anchor's meta
    assert b.meta["val"] is None and b.meta["extra"] == 1
    assert b.meta["nn_module_stack"] == relu.meta["nn_module_stack"]
    assert "extra" not in relu.meta  # the anchor is never written
    assert (c.op, c.target, c.args) == (GET_ATTR, "t", ())
    assert {"neg", "relu_1", "mine"} <= w.made and "mine" in w.taken
    assert heard.events == [("emitted", "neg"), ("emitted", "relu_1"), ("emitted", "mine")]


def test_read_as_renaming_rewires_only_the_readers_placed_after_and_records_the_rename():
    graph = relu_mul_graph()
    heard = Heard()
    w = kn.WorkingGraph(graph, indexed=False, listener=heard)
    relu = graph.node("relu")
    for n in graph.nodes:
        w.keep(n)
        if n.name == "relu":
            neg = w.derive(relu, target=aten.neg.default, args=(relu.ref,))
            w.add(neg)
            w.read_as("relu", neg.ref, rename=True)
    out, renames = w.finish()
    assert renames == {"relu": "neg"}
    assert [n.name for n in out.nodes].index("relu") < [n.name for n in out.nodes].index("neg")
    assert out.node("neg").args[0].name == "relu"  # placed before: still reads the old value
    assert out.node("mul").args[0].name == "neg"
    assert ("replaced", "relu", "neg") in heard.events


def test_returning_picks_a_new_graph_with_a_fresh_output_among_the_names_placed():
    graph = relu_mul_graph()
    w = kn.WorkingGraph(graph, indexed=False)
    relu = graph.node("relu")
    w.add(w.derive(relu, name="relu", op=PLACEHOLDER, target="relu", args=(), kwargs=EMPTY))
    w.add(graph.node("mul"))
    piece = w.returning((ref("mul"),))
    assert [(n.op, n.name) for n in piece.nodes] == [
        (PLACEHOLDER, "relu"), (CALL_FUNCTION, "mul"), (OUTPUT, "output")
    ]
    assert piece.outputs == (ref("mul"),)
    w2 = kn.WorkingGraph(graph, indexed=False)
    w2.add(w2.derive(relu, name="output", op=PLACEHOLDER, target="output", args=(),
                     kwargs=EMPTY))
    assert w2.returning(ref("output")).nodes[-1].name == "output_1"


def test_fresh_id_draws_after_the_base_among_the_names_beside():
    taken = Names(["body", "body_1"])
    assert kn.fresh_id("body", taken) == "body_2"
    assert kn.fresh_id("peer", taken) == "peer"
    assert {"body_2", "peer"} <= taken
