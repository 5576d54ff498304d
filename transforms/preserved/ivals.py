"""Ival insertion: write back the state values that a preserved call boundary separates.

Runs on the flat root graph before outlining (DESIGN step 4). A value on a root input's
functional update chain (``transforms.preserved.state_traffic.update_chains``) that is read
across a preserved call boundary the call's signature does not carry it across is an *ival*:
a ``copy_(input, value)`` right after it (in the call that computes it) writes it back, and
outlining then reads the input instead, as for any value a ``copy_`` writes. So is a value a
``copy_`` in another preserved call writes (a caller writing back, after the call, a value the
call made and did not return): outlining reads it from the input outside its call, that
``copy_`` included, so it too is written back where it is computed.
``insert_ival_copies`` checks that every such read sees the value it stands for.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence

from ir.args import Ref, map_refs, ref
from ir.errors import PassError
from ir.graph import Graph
from ir.node import CALL_FUNCTION, PLACEHOLDER, Node
from ir.ops import CLONE, COPY
from ir.program import Program
from ir.signature import ExportSignature
from transforms import kernel as kn
from transforms.machinery.each_graph import with_root_graph
from transforms.machinery.frames import FrameOf, node_frames
from transforms.machinery.pass_checks import require_flat
from transforms.preserved.nesting import common_prefix, preserved_chains
from transforms.preserved.state_traffic import state_traffic

__all__ = ["insert_ival_copies", "insert_ivals"]


def insert_ivals(program: Program, frames_of: FrameOf = node_frames) -> Program:
    """Insert ``copy_(input, v)`` after each ival ``v`` of the flat root graph.

    Parameters:
        program: a flat program (``PassError`` for an outlined one: run this before
            ``outline``).
        frames_of: the module calls a node runs in.

    Returns:
        ``program`` itself when no update-chain value crosses a preserved boundary unsigned
        (a value a ``copy_`` in another preserved call writes is such a value); else the
        program whose root graph writes each such value back where it is computed.

    Raises:
        PassError: for an outlined program (run this before ``outline``); from
        ``insert_ival_copies``, naming the node, when a read through the input
        would see another value than the one it reads.

    **Laws:** idempotent (a written-back value is no ival any more); ``outline`` of the result
    equals ``outline`` of the input. Complexity: O(n + r log r) for n nodes and r reads.
    """
    require_flat(program, "insert_ivals")
    sigs = program.call_signatures
    graph = program.root_module.graph
    if not any(sigs) or graph is None:
        return program
    traffic = state_traffic(program)
    aliases, sources = traffic.aliases, traffic.sources
    nodes = graph.nodes
    chain_of = preserved_chains(graph, frames_of, frozenset(sigs))[0]
    chains = {v: dest for v, dest in traffic.chains.items() if v not in sources}
    chains.update(_copied_from_another_call(nodes, aliases, chain_of))
    if not chains:
        return program
    inputs_of = {c: {a.name for a in s.inputs if a.name} for c, s in sigs.items()}
    outputs_of = {c: {a.name for a in s.outputs if a.name} for c, s in sigs.items()}

    def crosses(value: str, reader: tuple[str, ...]) -> bool:
        own = chain_of.get(value, ())
        if own == reader:
            return False
        k = common_prefix(own, reader)
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
    new_graph: Graph = insert_ival_copies(graph, program.signature, ivals, reads, aliases,
                                          chain_of)
    return with_root_graph(program, new_graph)


def _overwritten_reads(
    reads: Sequence[tuple[str, int]],
    ivals: Mapping[str, str],
    writes: Mapping[str, list[int]],
    aliases: Mapping[str, str],
    nodes: Sequence[Node],
) -> dict[int, list[str]]:
    """Per reader position, the ivals it reads through a state that is written again at or
    after the reader (times as in ``insert_ival_copies``: node ``i`` runs at ``4i``); a reader
    that writes that state itself (the ``copy_`` writing ``v`` back) reads no snapshot. O(r)."""
    found: dict[int, list[str]] = {}
    for value, at in reads:
        dest = ivals[value]
        if aliases.get(nodes[at].name) == dest or writes[dest][-1] < 4 * at:
            continue
        values = found.setdefault(at, [])
        if value not in values:
            values.append(value)
    return found


def _reading_snapshots(
    w: kn.WorkingGraph,
    node: Node,
    values: Sequence[str],
    by_name: Mapping[str, Node],
    snapshots: dict[tuple[str, tuple[str, ...] | None], Ref],
    call: tuple[str, ...] | None,
) -> Node:
    """``node`` reading a snapshot of each of ``values``: the one its call already made, or a
    new ``clone`` placed now (before ``node``), named after the value and carrying ``node``'s
    meta with the value's ``val``."""
    swap: dict[str, Ref] = {}
    for value in values:
        key = (value, call if call is not None else (node.name,))
        snapshot = snapshots.get(key)
        if snapshot is None:
            made = w.make_carrying(CALL_FUNCTION, CLONE, (ref(value),), meta=node.meta,
                                   val=by_name[value].meta.get("val"), base=f"{value}_read")
            w.add(made)
            snapshot = snapshots[key] = made.ref
        swap[value] = snapshot
    args = map_refs(node.args, lambda r: swap.get(r.name, r))
    kwargs = map_refs(node.kwargs, lambda r: swap.get(r.name, r))
    return node.replace(args=args, kwargs=kwargs)


def _copied_from_another_call(
    nodes: Sequence[Node], aliases: Mapping[str, str], chain_of: Mapping[str, tuple[str, ...]]
) -> dict[str, str]:
    """``{v: dest}`` for each value ``v`` a ``copy_(dest, v)`` writes from another preserved
    call than the one computing ``v`` (a caller writing back, after the call, a value the call
    made without returning it). Outlining reads such a ``v`` from ``dest`` outside its call, the
    ``copy_`` included, so it must be written back where it is computed: an ival, unless a
    ``copy_`` in its own call already writes it back (as this pass's own result does: it is
    idempotent). A graph input (a placeholder) is no ival: a call reads it as an input.
    O(n)."""
    found: dict[str, str] = {}
    at_home: set[str] = set()  # values a copy_ in their own call already writes back
    computed: set[str] = set()
    for node in nodes:
        if node.op == CALL_FUNCTION:
            computed.add(node.name)
        dest = aliases.get(node.name)
        if dest is None or node.target is not COPY or not isinstance(node.args[1], Ref):
            continue
        value = node.args[1].name
        if value not in computed or value in aliases:
            continue
        if chain_of[value] == chain_of[node.name]:
            at_home.add(value)
        else:
            found.setdefault(value, dest)
    return {value: dest for value, dest in found.items() if value not in at_home}


def insert_ival_copies(
    graph: Graph,
    signature: ExportSignature,
    ivals: Mapping[str, str],
    reads: Sequence[tuple[str, int]],
    aliases: Mapping[str, str],
    calls: Mapping[str, tuple[str, ...]] | None = None,
) -> Graph:
    """``graph`` with ``copy_(dest, v)`` right after each ``v`` of ``ivals`` (``{v: dest}``),
    and each read of ``v`` through ``dest`` that ``dest`` is written again after reading a
    snapshot of it: ``clone(v)`` right before the first such reader in each preserved call
    (``calls``: node -> the preserved calls it runs in; ``None``: one snapshot per reader
    node), carrying that reader's ``meta`` so that it lands in the reader's call. An operator
    that saves ``v`` for the backward then holds the snapshot, which the later write leaves
    alone (read through ``dest`` itself, ``backward()`` would raise torch's "modified by an
    inplace operation" where eager's runs: eager's ``v`` is a tensor of its own).

    Each copy carries ``v``'s ``meta`` (``kernel.WorkingGraph.make_carrying``, named after
    ``copy_`` among the graph's names), so outlining puts it in the call that computes ``v``.
    ``reads`` lists ``(v, i)`` for each read of ``v`` that goes through ``dest`` instead (before
    node ``i`` runs); ``aliases`` maps the nodes that already write a root input in place to it.

    Raises:
        PassError: naming the node, when a read through ``dest`` would see another value than
        the one it reads: ``dest`` is written again between ``v``'s copy and the read, or a node
        reads ``dest``'s value from before the call after a new value of it has been written back.

    Complexity: O(n + r log r) for n nodes and r reads.
    """
    nodes = graph.nodes
    position = {n.name: i for i, n in enumerate(nodes)}
    # times: node i runs at 4i, a copy after it at 4i + 2, a read before it at 4i - 1
    writes: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        if node.name in aliases:
            writes.setdefault(aliases[node.name], []).append(4 * i)
        if node.name in ivals:
            writes.setdefault(ivals[node.name], []).append(4 * i + 2)
    names = {s.name: s.target or s.name for s in signature.inputs}
    for value, at in reads:
        dest = ivals[value]
        times = writes[dest]
        k = bisect_left(times, 4 * at - 1)
        last = times[k - 1] if k else -1
        if last != 4 * position[value] + 2:
            writer = nodes[last // 4].name
            how = f"%{writer} wrote it" if last % 4 == 0 else f"%{writer} was written back to it"
            raise PassError(
                f"%{value}, a value of {names[dest]!r} computed in one call, is read across a "
                f"preserved call boundary before node %{nodes[at].name}, after {how}: purefx "
                "can carry a value of state across a preserved call only while it is the "
                "state's current value; re-export so that the old value is cloned"
            )
    first = {}
    for value, dest in ivals.items():
        first[dest] = min(first.get(dest, len(nodes)), position[value])
    users = graph.users()
    for dest, at in first.items():
        for user in users[dest]:
            if position[user] > at and aliases.get(user) != dest:
                raise PassError(
                    f"node %{user} reads the value {names[dest]!r} had before the call, after "
                    f"%{nodes[at].name}, a later value of it, must be written back to it for a "
                    "preserved call that reads it; re-export so that the old value is cloned "
                    "before the update"
                )
    overwritten = _overwritten_reads(reads, ivals, writes, aliases, nodes)
    by_name = graph.by_name()
    w = kn.WorkingGraph(graph, indexed=False)
    snapshots: dict[tuple[str, tuple[str, ...] | None], Ref] = {}
    for i, node in enumerate(nodes):
        values = overwritten.get(i)
        if values:
            call = calls.get(node.name) if calls is not None else None
            node = _reading_snapshots(w, node, values, by_name, snapshots, call)
        w.add(node)
        dest = ivals.get(node.name)
        if dest is not None:
            w.add(w.make_carrying(CALL_FUNCTION, COPY, (ref(dest), node.ref), meta=node.meta,
                                  base="copy_"))
    return w.finish()[0]
