"""Deduplication: calls of one module whose graphs are alpha-equivalent share one graph."""

from __future__ import annotations

import operator

from ir.alpha import interned_key
from ir.graph import Graph
from ir.module import ModuleId, call_target, split_call_target
from ir.node import CALL_MODULE
from ir.program import Program
from ir.returned_values import output_value
from transforms import kernel as kn

_GRAPHS = operator.attrgetter("graphs")


def deduplicate(program: Program) -> Program:
    """Merge the graph variants of each module that are equal modulo node names.

    Each module keeps one graph per distinct alpha key (first occurrence first); callers of a
    merged variant are redirected (``foo@2`` becomes ``foo`` when variant 2 equals variant 0).
    Different modules are never merged: they are different objects with different state. A
    redirected call keeps the ``val`` of its own call (the output value of the graph it was
    traced with, ``ir.returned_values.output_value``), since the kept graph may hold other shapes.

    **Laws:** idempotent; never adds modules or graphs; the lowered module computes the same.
    Complexity: O(n): one alpha key per graph (hashed once, no pairwise comparison); O(modules)
    when no module has two graphs (the program is returned as it is).
    """
    if max(map(len, map(_GRAPHS, program.module_table().values())), default=0) < 2:
        return program  # no module has two graphs: nothing to merge, no call to redirect
    remap: dict[ModuleId, dict[int, int]] = {}
    modules = program.modules.evolver()
    for mid in _post_order(program):
        mod = program.module_table()[mid]
        graphs = tuple(_retarget(program, mid, g, remap) for g in mod.graphs) if remap else (
            mod.graphs
        )
        if mid != program.root and len(graphs) > 1:
            first: dict[tuple, int] = {}
            unique: list[Graph] = []
            mapping: dict[int, int] = {}
            for i, graph in enumerate(graphs):
                key = (interned_key(graph), len(graph.placeholders))
                if key not in first:
                    first[key] = len(unique)
                    unique.append(graph)
                mapping[i] = first[key]
            if len(unique) < len(graphs):
                remap[mid] = mapping
                graphs = tuple(unique)
        if any(a is not b for a, b in zip(graphs, mod.graphs)) or len(graphs) != len(mod.graphs):
            modules[mid] = mod.replace(graphs=graphs)
    if not remap:
        return program
    return program.replace(modules=modules.persistent())


def _post_order(program: Program) -> list[ModuleId]:
    """Every module with graphs, each once, children before their parents."""
    order: dict[ModuleId, None] = {}

    def visit(mid: ModuleId) -> None:
        for _, child in program.module_table()[mid].children:
            if child not in order:
                visit(child)
        if program.module_table()[mid].graphs:
            order.setdefault(mid, None)

    visit(program.root)
    return list(order)


def _retarget(program: Program, mid: ModuleId, graph: Graph, remap: dict) -> Graph:
    """``graph`` streamed through a ``kernel.WorkingGraph``, each call of a merged variant
    made again (``make_carrying``: its name and meta) calling the variant kept; the graph
    itself when none does. O(nodes)."""
    w = kn.WorkingGraph(graph, indexed=False)
    for node in graph.nodes:
        if node.op == CALL_MODULE:
            path, k = split_call_target(node.target)
            child = program.resolve(path, mid)
            mapping = remap.get(child)
            if mapping is not None and mapping[k] != k:
                val = kn.KEEP
                if "val" not in node.meta:  # the dropped graph k says what this call returns
                    val = output_value(program, child, program.module_table()[child].graphs[k])
                node = w.make_carrying(
                    CALL_MODULE, call_target(path, mapping[k]), node.args, node.kwargs,
                    meta=node.meta, name=node.name, val=kn.KEEP if val is None else val,
                )
        w.add(node)
    return w.finish()[0]
