"""Intermediate state values ("ivals") that cross a preserved call boundary.

After ``run_decompositions`` a buffer updated in place by several calls is a chain of functional
values, ``b -> v1 -> v2 -> ... -> vn``, and ``functional_to_inplace`` writes only ``vn`` back
(``copy_(b, vn)``). A preserved call can take nothing but its eager signature and state, so when a
call reads ``vk`` that another call computed (``k < n``), that read must be a read of ``b``: the
call that computes ``vk`` writes it into ``b`` (a new ``copy_(b, vk)`` right after ``vk``) and the
call that reads it reads ``b``. The same holds for a mutated user input. This module finds the
chains (``update_chains``) and inserts the writes into the flat root graph after checking that
every read through ``b`` sees the value it stands for (``insert_ival_copies``); ``outline``
decides which values need one.
"""

from __future__ import annotations

import operator
from bisect import bisect_left
from collections.abc import Mapping, Sequence

import torch  # only for the ``aten.copy_`` operator the rewritten graph calls

from ir.args import EMPTY_DICT, Ref, ref
from ir.errors import PassError
from ir.graph import Graph
from ir.names import Names, fresh_name
from ir.node import CALL_FUNCTION, PLACEHOLDER, Node
from ir.program import Program
from ir.signature import MUTATION_KINDS, ExportSignature
from ir.torch_seam import op_schema

COPY = torch.ops.aten.copy_.default


def update_chains(
    graph: Graph, aliases: Mapping[str, str], written_back: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``{value: root input}`` for each value on a functional update chain of a root input.

    ``aliases`` maps every node that writes a root input in place (``copy_`` included) to the
    input's placeholder name; ``written_back`` maps the values that the export signature writes
    back after the call (a functional program: ``written_back_values``) to the input's
    placeholder name. A chain runs from the value ``v`` that a ``copy_(dest, v)`` writes (or
    that is written back),
    through the first argument of each functional ``call_function`` (the argument that the
    functionalized in-place op wrote), back to ``dest`` itself or to a node that writes ``dest``
    in place. Every value on it, ``v`` included, is a state of ``dest`` between its writes.
    Ops that return new values of other inputs (train-mode batch norm's running statistics) step
    back through the table ``_STATE_OUTPUTS`` instead of the first argument.
    A walk that ends anywhere else (another input, a literal, a mutable op, another input's
    write) marks nothing: its values are nobody's state, and reading them across a preserved call
    stays an error. The first-argument rule is the one functionalization follows; a value it
    cannot place is an error, never a guess.

    Complexity: O(n): each node is walked at most twice.
    """
    nodes = graph.by_name()
    ends: dict[str, str | None] = {}  # walked value -> the input its walk ends at, or None
    chains: dict[str, str] = {}

    def end_of(name: str) -> str | None:
        path: list[str] = []
        while True:
            if name in ends:
                end = ends[name]
                break
            if name in aliases:
                end = aliases[name]
                break
            step = nodes.get(name)
            previous = _previous_value(step, nodes) if step is not None else None
            if previous is None:
                end = name if step is not None and step.op == PLACEHOLDER else None
                break
            path.append(name)
            name = previous
        for name in path:
            ends[name] = end
        return end

    starts = [
        (node.args[1], aliases[node.name])
        for node in graph.nodes
        if node.target is COPY and node.name in aliases and len(node.args) >= 2
    ]
    starts += [(ref(value), dest) for value, dest in (written_back or {}).items()]
    for source, dest in starts:
        if type(source) is not Ref or source.name not in nodes or end_of(source.name) != dest:
            continue
        name = source.name
        while name in ends and name not in chains:  # stops at dest, its writes, or a known chain
            chains[name] = dest
            name = _previous_value(nodes[name], nodes)
    return chains


# Functional ops that return new values of some of their inputs: op -> {output index: the input
# it is the new value of}. ``getitem(op(...), i)`` steps back to that input, not to the first
# argument.
_STATE_OUTPUTS: dict[object, dict[int, int]] = {
    # (out, save_mean, save_rstd, running_mean, running_var) of train-mode batch norm
    torch.ops.aten._native_batch_norm_legit_functional.default: {3: 3, 4: 4},
}


def _previous_value(node: Node, nodes: Mapping[str, Node]) -> str | None:
    """The value ``node`` is the next state of, along a functional update chain, or ``None``:
    the input named by ``_STATE_OUTPUTS`` for a ``getitem`` of such an op, else the first
    argument of a functional op."""
    if node.target is operator.getitem and node.args and type(node.args[0]) is Ref:
        producer = nodes.get(node.args[0].name)
        rule = _STATE_OUTPUTS.get(producer.target) if producer is not None else None
        if rule is not None:
            index = rule.get(node.args[1]) if len(node.args) > 1 else None
            arg = producer.args[index] if index is not None and index < len(producer.args) else None
            return arg.name if type(arg) is Ref else None
    if node.target in _STATE_OUTPUTS:
        return None  # the op's tuple itself is no state
    return node.args[0].name if _functional_step(node) else None


def written_back_values(signature: ExportSignature) -> dict[str, str]:
    """``{value: root input}`` for each mutation the export signature writes back after the call
    (buffer, parameter and user input mutations a functional program returns). O(inputs +
    outputs)."""
    placeholder = {}
    for spec in signature.inputs:
        placeholder.setdefault(spec.target or spec.name, spec.name)
        placeholder.setdefault(spec.name, spec.name)
    found = {}
    for spec in signature.outputs:
        if spec.kind in MUTATION_KINDS and spec.name and spec.target in placeholder:
            found[spec.name] = placeholder[spec.target]
    return found


def _functional_step(node: Node) -> bool:
    if node.op != CALL_FUNCTION or not node.args or type(node.args[0]) is not Ref:
        return False
    schema = op_schema(node.target)
    return schema is None or not schema.is_mutable


def insert_ival_copies(
    graph: Graph,
    signature: ExportSignature,
    ivals: Mapping[str, str],
    reads: Sequence[tuple[str, int]],
    aliases: Mapping[str, str],
) -> Graph:
    """``graph`` with ``copy_(dest, v)`` right after each ``v`` of ``ivals`` (``{v: dest}``).

    Each copy carries ``v``'s ``meta``, so outlining puts it in the call that computes ``v``.
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
    taken = Names(position)
    out: list[Node] = []
    for node in nodes:
        out.append(node)
        dest = ivals.get(node.name)
        if dest is not None:
            name = fresh_name("copy_", taken)
            args = (ref(dest), node.ref)
            out.append(Node(CALL_FUNCTION, name, COPY, args, EMPTY_DICT, node.meta))
    return Graph.of(out)


def mutation_sources(graph: Graph, program: Program) -> tuple[dict[str, str], dict[str, str]]:
    """Which values stand for a mutated root input (state or user input).

    Complexity: O(n).

    Returns ``(aliases, sources)``: ``aliases`` maps the result of an in-place op (which *is* its
    mutated first argument) to the root placeholder it mutated; ``sources`` also maps the value
    that a ``copy_(dest, value)`` wrote, which equals ``dest`` until ``dest`` changes again.
    """
    roots = {s.name for s in program.signature.inputs}
    aliases: dict[str, str] = {}
    sources: dict[str, str] = {}
    for node in graph.nodes:
        if node.op != CALL_FUNCTION or not node.args or not isinstance(node.args[0], Ref):
            continue
        schema = op_schema(node.target)
        if schema is None or not schema.is_mutable:
            continue
        first = node.args[0].name
        dest = first if first in roots else aliases.get(first)
        if dest is None:
            continue
        aliases[node.name] = dest
        sources[node.name] = dest
        if node.target is torch.ops.aten.copy_.default and isinstance(node.args[1], Ref):
            sources.setdefault(node.args[1].name, dest)
    return aliases, sources
