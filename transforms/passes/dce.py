"""``eliminate_dead_code``: drop the nodes whose results nothing reads and that do nothing else."""

from __future__ import annotations

from collections.abc import Callable

from ir import ops
from ir.effects import binds_symbols, graph_effects
from ir.gcpause import gc_paused
from ir.graph import Graph
from ir.module import ModuleId
from ir.node import CALL_FUNCTION, OUTPUT, PLACEHOLDER
from ir.program import Program
from transforms import kernel as kn
from transforms.machinery.each_graph import map_graphs, signature_names
from transforms.machinery.pass_checks import require_program

__all__ = ["eliminate_dead_code"]


@gc_paused
def eliminate_dead_code(
    p: Program, *, metadata_checks: bool = True, listener: kn.Listener | None = None
) -> Program:
    """Remove every node whose result is unused and that has no effect, in every graph.

    A driver on the rewriting kernel (``transforms.kernel``): the live nodes are found in one
    backward sweep, and a graph with dead nodes is streamed through a ``WorkingGraph`` that
    keeps the live ones and ``drop`` s the dead.

    Parameters:
        p: a Program, flat or outlined (each graph of the module table is cleaned once,
            however many calls run it).
        metadata_checks: keep the metadata checks (``ir.ops.is_metadata_check``:
            ``_assert_tensor_metadata``, which ``torch.export`` traces before a dtype cast).
            They are effects (each raises when its input's metadata differs), so by default
            they are kept, and so is what they read. With ``False`` every one of them is
            dropped first, in every graph, and then the dead code: what is left computes what
            ``p`` computes on every input where no check fails. ``check_laws`` judges vacuity
            on programs cleaned so (a value a pass made and never used, its checks included,
            is no change).
        listener: a ``kernel.Listener`` told of each node removed (``erased``), metadata
            checks included; ``None``: nobody.

    Returns:
        ``p`` itself when no node is dead; else a Program without the dead nodes. A node is
        dead when no kept node, output, output spec or preserved call signature reads or names
        it, and it has no effect (``ir.effects.Effects.has_effect``): placeholders (the
        graph's signature) and the output node are always kept, and so are operators that
        mutate, draw random numbers, have a side effect or are higher-order ops, and
        ``call_module`` nodes whose callee has such a node. Random operators are kept even
        when their result is unused: dropping one would change the random numbers that later
        random operators draw from the same generator; so are nodes that define unbacked
        symbols (``binds_symbols``). ``get_attr`` reads and pure operators
        (views included) that nothing reads are dropped. Names, meta and the order of the
        kept nodes are as they were; state is kept (an unused state value stays state).

    Raises:
        NotAProgramError: ``p`` is not a Program.

    **Laws:**

    - identity: a program without dead nodes (and, under ``metadata_checks=False``, without
      metadata checks) is returned as is; hence idempotent: ``f(f(p)) is f(p)``;
    - semantics: ``lower(f(p))`` returns the same outputs, leaves the same state and runs the
      same side effects (in the same order) as ``lower(p)``;
    - monotone: ``f(p).node_count() <= p.node_count()``; signatures unchanged;
    - ``verify`` holds of the result whenever it holds of ``p``.

    Complexity: O(n) in the nodes of all graphs (each callee graph's effects found once).
    """
    require_program(p, "eliminate_dead_code")
    if not metadata_checks:
        p = map_graphs(p, _leaving(_metadata_checks, listener))
    named = signature_names(p)

    def dead(mid: ModuleId, graph: Graph) -> set[str]:
        effects = graph_effects(p, mid, graph)
        live: set[str] = set()
        out: set[str] = set()
        for n in reversed(graph.nodes):
            if (
                n.op in (PLACEHOLDER, OUTPUT)
                or n.name in live
                or n.name in named
                or binds_symbols(n)
                or effects.has_effect(n.name)
            ):
                live.update(r.name for r in n.inputs())
            else:
                out.add(n.name)
        return out

    return map_graphs(p, _leaving(dead, listener))


def _metadata_checks(mid: ModuleId, graph: Graph) -> set[str]:
    """The names of ``graph``'s metadata checks. O(nodes)."""
    return {n.name for n in graph.nodes
            if n.op == CALL_FUNCTION and ops.is_metadata_check(n.target)}


def _leaving(
    gone: Callable[[ModuleId, Graph], set[str]], listener: kn.Listener | None
) -> Callable[[ModuleId, Graph], Graph]:
    """A ``map_graphs`` function: each graph without the nodes ``gone`` names in it, streamed
    through a ``kernel.WorkingGraph`` (the graph itself when ``gone`` names none). O(nodes)."""

    def one(mid: ModuleId, graph: Graph) -> Graph:
        names = gone(mid, graph)
        if not names:
            return graph
        w = kn.WorkingGraph(graph, indexed=False, listener=listener)
        w.leave_out(names)
        return w.finish()[0]

    return one
