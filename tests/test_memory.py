"""Bounded memory: lowering program after program keeps no trace of the programs that are gone.

Interned refs, forward-signature classes, compiled and direct code (shared by alpha key) and the
``linecache`` entries of generated source are all held weakly: a soak test lowers hundreds of
distinct programs and shows flat memory, and dropping a lowered module frees its code.
"""

from __future__ import annotations

import gc
import itertools
import linecache
import tracemalloc
import weakref

import torch
from pyrsistent import pmap

from ir import Graph, Module, Node, Program, ref
from ir import args as ir_args
from ir.signature import USER_INPUT, USER_OUTPUT, ExportSignature, InputSpec, OutputSpec
from lowering import LoweredDispatcher, lower
from lowering.modules import LoweredModule

_OPS = (
    torch.ops.aten.relu.default,
    torch.ops.aten.neg.default,
    torch.ops.aten.sigmoid.default,
    torch.ops.aten.tanh.default,
    torch.ops.aten.abs.default,
)


def _chain(prefix: str, seed: int, length: int) -> Graph:
    """A child graph: one input named after ``prefix``, then ``length`` unary ops picked by
    ``seed``, so that every seed gives another graph (another alpha key, other names)."""
    nodes = [Node("placeholder", f"{prefix}_in", f"{prefix}_in")]
    previous = f"{prefix}_in"
    for step in range(length):
        op = _OPS[(seed // len(_OPS) ** step) % len(_OPS)]
        name = f"{prefix}_v{step}"
        nodes.append(Node("call_function", name, op, (ref(previous),)))
        previous = name
    nodes.append(Node("output", "output", "output", (ref(previous),)))
    return Graph(tuple(nodes))


def distinct_program(i: int) -> Program:
    """Program ``i``: a root that calls child ``blk`` twice, with two different graphs (a
    dispatcher); graphs, node names and the child's forward signature differ for every ``i``."""
    length = 2 + i % 4
    child = Module(
        type_name=f"Block{i}",
        graphs=(_chain(f"p{i}", i, length), _chain(f"q{i}", i + 7, length + 1)),
    )
    root_nodes = (
        Node("placeholder", "x", "x"),
        Node("call_module", "a", "blk", (ref("x"),)),
        Node("call_module", "b", "blk@1", (ref("a"),)),
        Node("call_function", "y", torch.ops.aten.add.Tensor, (ref("a"), ref("b"))),
        Node("output", "output", "output", ((ref("y"),),)),
    )
    root = Module(type_name="Root", children=(("blk", "blk"),), graphs=(Graph(root_nodes),))
    return Program(
        root="",
        modules=pmap({"": root, "blk": child}),
        signature=ExportSignature((InputSpec(USER_INPUT, "x"),), (OutputSpec(USER_OUTPUT, "y"),)),
    )


def _lower_and_run(i: int, x: torch.Tensor) -> None:
    m = lower(distinct_program(i), interpreter=i % 5 == 0)
    assert isinstance(m.blk, LoweredDispatcher)
    out = m(x)
    assert out[0].shape == x.shape
    if i % 3 == 0:
        m.blk.register_forward_hook(lambda mod, args, result: None)  # module by module
        m(x)


def test_soak_lowering_distinct_programs_keeps_memory_flat() -> None:
    """Lower 400 distinct programs; memory after the 100th must stay flat. A leak adds blocks
    program after program; a process-wide table that doubles once (``linecache``, the weakref
    finalizer registry, the interning tables, sized by what earlier tests left) is one block
    replaced by a larger one. So the growth counted is that of the allocation sites whose number
    of live blocks changed by more than one. A leak grows in both halves of the measured run;
    what earlier tests in the same process left (free lists, caches still filling to their
    bound) settles once, so the smaller half's growth is the one judged (seen: up to 15 KB in
    one half after other tests, under 5 KB in the other)."""
    x = torch.linspace(-1, 1, 6)
    marks = (100, 250, 400)
    snapshots = {}
    gc.collect()
    tracemalloc.start()
    try:
        for i in range(marks[-1] + 1):
            if i in marks:
                gc.collect()
                snapshots[i] = tracemalloc.take_snapshot()
            if i < marks[-1]:
                _lower_and_run(i, x)
    finally:
        tracemalloc.stop()
    grown = []
    for a, b in itertools.pairwise(marks):
        changes = snapshots[b].compare_to(snapshots[a], "lineno")
        grown.append(sum(c.size_diff for c in changes if abs(c.count_diff) > 1))
    # under 100 bytes per program in each half (measured alone: below zero; with strong caches,
    # ~6 KB per program: one linecache entry, class or compiled function left behind costs KBs)
    assert min(grown) < 100 * (marks[1] - marks[0]), f"grew by {grown} bytes"


def test_dropping_a_lowered_module_frees_its_code_and_source() -> None:
    m = lower(distinct_program(10_001))
    m(torch.ones(3))
    m.blk.register_forward_hook(lambda mod, args, result: None)
    m(torch.ones(3))  # compiles the root's module-by-module code too
    functions = [m.__dict__["_direct"], m.__dict__["_code"], *m.blk._codes, *m.blk._direct]
    files = [f.__code__.co_filename for f in functions]
    assert all(name in linecache.cache for name in files)
    lowered_class = type(m.blk)
    assert lowered_class is not LoweredModule and lowered_class.__base__ is LoweredDispatcher
    held = [weakref.ref(f) for f in functions] + [weakref.ref(lowered_class)]
    names = [n.name for g in m.blk.__dict__["_ir_graphs"] for n in g.nodes]
    del m, functions, lowered_class
    gc.collect()
    assert [h() for h in held] == [None] * len(held)
    assert not any(name in linecache.cache for name in files)
    assert not any(name in ir_args._REFS for name in names)


def test_refs_are_interned_while_alive() -> None:
    first = ref("test_memory_name")
    assert ref("test_memory_name") is first
    del first
    gc.collect()
    assert "test_memory_name" not in ir_args._REFS
