"""The kernel's nodes that carry a node's meta (``WorkingGraph.make_carrying``, ``carried``,
``built``; ``make`` and ``copy`` name through it) and the modules that make their nodes through it (every pass, split and lowering step):
names after the policy, meta as given with ``val`` / ``nn_module_stack`` set when asked, the
listener told; and no module of ``transforms/`` or ``lowering/`` but the kernel and five named
exceptions names, makes or assembles a node by itself."""

from __future__ import annotations

import ast
from pathlib import Path

import torch
from kernel_support import Heard, relu_mul_graph

from ir.node import CALL_FUNCTION, GET_ATTR, PLACEHOLDER
from transforms import kernel as kn

aten = torch.ops.aten
ROOT = Path(__file__).resolve().parents[1]





def test_make_carrying_names_after_the_policy_carries_the_meta_and_is_heard():
    graph = relu_mul_graph()
    relu = graph.node("relu")
    heard = Heard()
    w = kn.WorkingGraph(graph, indexed=False, listener=heard)
    a = w.make_carrying(CALL_FUNCTION, aten.neg.default, (relu.ref,), meta=relu.meta)
    b = w.make_carrying(CALL_FUNCTION, aten.neg.default, (relu.ref,), base="relu")
    c = w.make_carrying(PLACEHOLDER, "given", name="given", meta=relu.meta, val=7, stack=None)
    assert (a.name, b.name, c.name) == ("neg", "relu_1", "given")
    assert dict(a.meta) == dict(relu.meta)  # the meta whole, not ``new_meta``'s three entries
    assert dict(b.meta) == {}
    assert c.meta["val"] == 7 and c.meta["nn_module_stack"] is None
    assert c.meta.get("stack_trace") == relu.meta.get("stack_trace")
    assert relu.meta["val"] is not c.meta["val"]  # the anchor's meta is never written
    assert heard.events == [("emitted", "neg"), ("emitted", "relu_1"), ("emitted", "given")]
    assert {"neg", "relu_1", "given"} <= w.made
    assert "neg" not in w.node  # made, not placed


def test_make_and_copy_name_through_make_carrying():
    graph = relu_mul_graph()
    relu = graph.node("relu")
    heard = Heard()
    w = kn.WorkingGraph(graph, indexed=False, listener=heard)
    made = w.make(CALL_FUNCTION, aten.neg.default, (relu.ref,), {}, val=3, anchor_meta=relu.meta)
    assert dict(made.meta) == dict(kn.new_meta(3, None, relu.meta))
    copied = w.copy(relu)
    assert (made.name, copied.name, copied.meta is relu.meta) == ("neg", "relu_1", True)
    assert heard.events == [("emitted", "neg"), ("emitted", "relu_1")]
    assert {"neg", "relu_1"} <= w.made


def test_carried_keeps_the_meta_object_when_nothing_is_set_and_copies_it_otherwise():
    relu = relu_mul_graph().node("relu")
    same = kn.carried(GET_ATTR, "w", "a.w", meta=relu.meta)
    assert same.meta is relu.meta
    dicted = kn.carried(GET_ATTR, "w", "a.w", meta={"val": 1})
    assert dict(dicted.meta) == {"val": 1}
    with_val = kn.carried(GET_ATTR, "w", "a.w", meta=relu.meta, val=None)
    assert "val" in with_val.meta and with_val.meta["val"] is None  # set as given
    assert relu.meta["val"] is not None


def test_built_assembles_the_nodes_in_order():
    graph = relu_mul_graph()
    again = kn.built(n for n in graph.nodes)
    assert again == graph and again is not graph


def test_a_streamed_graph_rebuilt_with_its_own_nodes_is_the_graph_itself():
    graph = relu_mul_graph()
    w = kn.WorkingGraph(graph, indexed=False)
    for n in graph.nodes:
        w.add(n)
    assert w.finish() == (graph, {})


#: every module of ``transforms/`` and ``lowering/`` makes its IR nodes through the kernel (issue
#: 52): none names a node (``fresh_name``), makes one by hand (``new_node``, ``Node(...)``) or
#: assembles a graph (``Graph(...)``, ``Graph.of``) but the kernel itself and these, each for the
#: reason given
NOT_KERNEL_DRIVERS = {
    "transforms/kernel.py": "the kernel: the one place that names, makes and assembles",
    "transforms/rewrite/ematch.py": "a match's witnesses: stand-in nodes of a rule's example "
                                    "inputs for the fake run of a guard, never in a program",
    "lowering/pass_laws.py": "the purity law's snapshot: a copy made apart from the code it "
                             "checks, so that a kernel bug cannot hide in both",
    "lowering/like.py": "programs_like's variants: a state write and an extra reader spliced "
                        "into a user's program (names through ir.names, as a parser would)",
    "lowering/law_targets.py": "the probe programs: generated programs (one call of each table "
                               "form), made as ir.strategies makes its draws, not an edit of a "
                               "pass's program",
    "lowering/fuzz/repro.py": "the repro script's Python variable names, no IR node",
}
KERNEL_DRIVERS = tuple(
    path for folder in ("transforms", "lowering")
    for path in sorted(str(p.relative_to(ROOT)) for p in (ROOT / folder).rglob("*.py"))
    if path not in NOT_KERNEL_DRIVERS
)
_FORBIDDEN_CALLS = {"fresh_name", "new_node", "Node", "Graph"}


def _forbidden(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in _FORBIDDEN_CALLS:
            found.append(f"{f.id}() at line {node.lineno}")
        elif (isinstance(f, ast.Attribute) and f.attr == "of" and isinstance(f.value, ast.Name)
              and f.value.id == "Graph"):
            found.append(f"Graph.of() at line {node.lineno}")
    return found


def test_the_kernel_drivers_neither_name_nor_make_nor_assemble_by_themselves():
    assert "transforms/passes/outline.py" in KERNEL_DRIVERS and len(KERNEL_DRIVERS) > 100
    found = {p: _forbidden(ROOT / p) for p in KERNEL_DRIVERS}
    assert {p: f for p, f in found.items() if f} == {}


def test_each_named_exception_still_makes_nodes_by_itself():
    """An exception that no longer needs its place on the list leaves it."""
    assert {p for p in NOT_KERNEL_DRIVERS if not _forbidden(ROOT / p)} == set()


def test_the_forbidden_call_finder_has_teeth(tmp_path: Path):
    probe = tmp_path / "probe.py"
    probe.write_text("g = Graph.of(nodes)\nn = fresh_name('a', taken)\nm = Node('x', 'y', 1)\n")
    assert _forbidden(probe) == ["Graph.of() at line 1", "fresh_name() at line 2",
                                 "Node() at line 3"]
