"""Running a per-graph rewrite over every graph of a program, flat or outlined."""

from __future__ import annotations

from collections.abc import Callable

from ir.graph import Graph
from ir.module import ModuleId
from ir.program import Program
from transforms.kernel import protected_names

__all__ = ["map_graphs", "signature_names", "walked_graphs", "with_root_graph"]

GraphFn = Callable[[ModuleId, Graph], Graph]


def map_graphs(p: Program, fn: GraphFn) -> Program:
    """``p`` with every graph ``g`` of every module ``mid`` replaced by ``fn(mid, g)``.

    Each graph of the module table is visited once, however many calls (paths, ``@k``
    variants sharing it) run it; a graph object that several variants of one module share is
    rewritten once. ``fn`` returns ``g`` itself for "no change"; when it does for every graph,
    ``p`` itself is returned.

    **Laws:** ``map_graphs(p, lambda mid, g: g) is p``. Complexity: O(modules + graphs) plus
    the calls of ``fn``.
    """
    changed = {}
    for mid, mod in p.module_table().items():
        done: dict[int, Graph] = {}
        graphs = []
        for g in mod.graphs:
            if id(g) not in done:
                done[id(g)] = fn(mid, g)
            graphs.append(done[id(g)])
        if any(a is not b for a, b in zip(graphs, mod.graphs)):
            changed[mid] = mod.replace(graphs=tuple(graphs))
    if not changed:
        return p
    return p.replace(modules=p.modules.update(changed))


def with_root_graph(p: Program, graph: Graph) -> Program:
    """``p`` with ``graph`` as its root's first graph (``p`` itself when it is that graph
    already): how a pass over the flat root graph puts its result back. O(1)."""
    root = p.root_module
    if graph is root.graph:
        return p
    return p.replace(modules=p.modules.set(p.root, root.replace(graphs=(graph, *root.graphs[1:]))))


def walked_graphs(p: Program) -> list[tuple[ModuleId, Graph]]:
    """``(module id, graph)`` for every graph of every module ``p.walk()`` reaches, modules in
    the order it first reaches them (a module called from several paths once), each module's
    graphs in order. The order the rewrite drivers (``rewrite``, ``saturate``, ``matches``)
    visit graphs in and read a program's level from. O(modules + graphs)."""
    table = p.module_table()
    order = dict.fromkeys(mid for _, mid in p.walk())
    return [(mid, g) for mid in order for g in table[mid].graphs]


def signature_names(p: Program) -> frozenset[str]:
    """The node names that preserved call signatures name (their inputs and outputs): a pass
    that drops or merges nodes keeps these, so the signatures stay true. O(signatures).
    (``transforms.kernel.protected_names`` gives them by module path.)"""
    return frozenset().union(*protected_names(p).values())
