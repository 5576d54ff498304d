"""Ival insertion: write back the state values that a preserved call boundary separates.

Runs on the flat root graph before outlining (DESIGN step 4). A value on a root input's
functional update chain (``transforms.ivals.update_chains``) that is read across a preserved
call boundary the call's signature does not carry it across is an *ival*: a ``copy_(input,
value)`` right after it (in the call that computes it) writes it back, and outlining then reads
the input instead, as for any value a ``copy_`` writes. ``insert_ival_copies`` checks that every
such read sees the value it stands for.
"""

from __future__ import annotations

from ir.graph import Graph
from ir.node import CALL_MODULE, PLACEHOLDER
from ir.program import Program
from transforms.ivals import (
    insert_ival_copies,
    mutation_sources,
    update_chains,
    written_back_values,
)
from transforms.remat import FrameOf, _chains, _common_prefix
from transforms.stacks import node_frames


def insert_ivals(program: Program, frames_of: FrameOf = node_frames) -> Program:
    """Insert ``copy_(input, v)`` after each ival ``v`` of the flat root graph.

    Parameters:
        program: a flat program (an outlined one is returned as it is).
        frames_of: the module calls a node runs in.

    Returns:
        ``program`` itself when no update-chain value crosses a preserved boundary unsigned;
        else the program whose root graph writes each such value back where it is computed.

    Raises:
        PassError: from ``insert_ival_copies``, naming the node, when a read through the input
        would see another value than the one it reads.

    **Laws:** idempotent (a written-back value is no ival any more); ``outline`` of the result
    equals ``outline`` of the input. Complexity: O(n + r log r) for n nodes and r reads.
    """
    sigs = program.call_signatures
    graph = program.root_module.graph
    if not any(sigs) or any(n.op == CALL_MODULE for n in graph.nodes):
        return program
    aliases, sources = mutation_sources(graph, program)
    chains = update_chains(graph, aliases, written_back_values(program.signature))
    chains = {v: dest for v, dest in chains.items() if v not in sources}
    if not chains:
        return program
    nodes = graph.nodes
    chain_of = _chains(nodes, frames_of, frozenset(sigs))[0]
    inputs_of = {c: {a.name for a in s.inputs if a.name} for c, s in sigs.items()}
    outputs_of = {c: {a.name for a in s.outputs if a.name} for c, s in sigs.items()}

    def crosses(value: str, reader: tuple[str, ...]) -> bool:
        own = chain_of.get(value, ())
        if own == reader:
            return False
        k = _common_prefix(own, reader)
        return not (
            all(value in outputs_of[c] for c in own[k:])
            and all(value in inputs_of[c] for c in reader[k:])
        )

    ivals: dict[str, str] = {}
    reads: list[tuple[str, int]] = []
    starts: dict[str, int] = {}
    for i, node in enumerate(nodes):
        if node.op == PLACEHOLDER:
            continue
        reader = chain_of[node.name]
        for c in reader:
            starts.setdefault(c, i)
        for r in node.inputs():
            if r.name in chains and crosses(r.name, reader):
                ivals[r.name] = chains[r.name]
                reads.append((r.name, i))
    if not ivals:
        return program
    # an ival passed to a preserved call is passed as its state: each later read of it reads
    # the state at that point
    position = {n.name: i for i, n in enumerate(nodes)}
    users = graph.users()
    for call, start in starts.items():
        for name in inputs_of.get(call, ()):
            if name in ivals:
                reads.extend((name, position[u]) for u in users[name] if position[u] >= start)
    new_graph: Graph = insert_ival_copies(graph, program.signature, ivals, reads, aliases)
    root = program.root_module.replace(graphs=(new_graph,) + program.root_module.graphs[1:])
    return program.replace(modules=program.modules.set(program.root, root))
