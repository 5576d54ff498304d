"""State traffic: which values of the flat root graph stand for state, computed once per Program.

After ``run_decompositions`` a buffer updated in place by several calls is a chain of functional
values, ``b -> v1 -> v2 -> ... -> vn``, and ``functional_to_inplace`` writes only ``vn`` back
(``copy_(b, vn)``). A preserved call can take nothing but its eager signature and state, so a
value on such a chain, an in-place result or a value a ``copy_`` writes is read across a
preserved boundary as a read of the state (``transforms.preserved.ivals``).

``state_traffic(program)`` is the one analysis every preserved-call stage and the outlining walk
read: the in-place results, the values written back, the update chains (``update_chains``). It
is a memo on the Program it describes (``ir.memo.WeakMemo``), so the stages that see one
Program compute it once.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from ir import ops
from ir.args import Ref, ref
from ir.effects import same_tensor
from ir.graph import Graph
from ir.memo import WeakMemo, memoized
from ir.node import CALL_FUNCTION, PLACEHOLDER, Node
from ir.ops import COPY
from ir.program import Program
from ir.signature import MUTATION_KINDS, ExportSignature
from transforms.machinery.call_targets import call_targets


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
    back through the argument each result is the new value of (``ir.ops``'s ``state_outputs``)
    instead of the first argument.
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


def _previous_value(node: Node, nodes: Mapping[str, Node]) -> str | None:
    """The value ``node`` is the next state of, along a functional update chain, or ``None``:
    for a ``getitem`` of a functional op that returns new values of some of its inputs (train-mode
    batch norm's running statistics: ``ir.ops``'s ``state_outputs``), the input that result is the
    new value of; else the first argument of a functional op."""
    if ops.is_getitem(node.target) and node.args and type(node.args[0]) is Ref:
        producer = nodes.get(node.args[0].name)
        rule = _state_outputs(producer) if producer is not None else None
        if rule:
            index = rule.get(node.args[1]) if len(node.args) > 1 else None
            arg = producer.args[index] if index is not None and index < len(producer.args) else None
            return arg.name if type(arg) is Ref else None
    if _state_outputs(node):
        return None  # the op's tuple itself is no state
    if node.op != CALL_FUNCTION or not node.args or type(node.args[0]) is not Ref:
        return None
    return None if ops.is_mutating(node.target) else node.args[0].name


def _state_outputs(node: Node) -> Mapping[int, int]:
    return ops.facts(node.target).state_outputs if node.op == CALL_FUNCTION else {}


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
    # the in-place operators the graph calls, by identity: one question per operator
    inplace = {id(t) for t in call_targets(graph) if ops.is_inplace(t)}
    if not inplace:
        return aliases, sources
    for node in graph.nodes:
        if id(node.target) not in inplace or node.op != CALL_FUNCTION:
            continue
        first = same_tensor(node)  # the input (or in-place result of one) it is
        if first is None:
            continue
        dest = first if first in roots else aliases.get(first)
        if dest is None:
            continue
        aliases[node.name] = dest
        sources[node.name] = dest
        if node.target is COPY and isinstance(node.args[1], Ref) and node.args[1].name != dest:
            # (``copy_(dest, dest)`` writes nothing: ``dest`` is the input, not a value of it)
            sources.setdefault(node.args[1].name, dest)
    return aliases, sources


@attrs.frozen
class StateTraffic:
    """The state traffic of a Program's flat root graph (``state_traffic``).

    - ``aliases``: in-place result -> the root input it mutated (it *is* that input);
    - ``sources``: ``aliases`` and each value a ``copy_(dest, value)`` writes -> ``dest``;
    - ``written_back``: value the export signature writes back after the call -> root input;
    - ``chains``: each value on a root input's functional update chain -> that input.
    """

    aliases: Mapping[str, str]
    sources: Mapping[str, str]
    written_back: Mapping[str, str]
    chains: Mapping[str, str]

    @memoized
    def writes(self) -> frozenset[str]:
        """Every value that writes state or is a state between writes (the keys of all four
        tables): traffic a preserved call signature does not carry."""
        return frozenset(
            {**self.aliases, **self.sources, **self.written_back, **self.chains}
        )

    @memoized
    def read_from_state(self) -> frozenset[str]:
        """Values outlining reads from the state: in-place results, values a ``copy_`` writes,
        update-chain values, and the mutated inputs themselves (a call that mutates one is
        handed it)."""
        dests = {*self.aliases.values(), *self.chains.values(), *self.written_back.values()}
        return frozenset({*self.sources, *self.chains, *dests})


def _traffic(program: Program) -> StateTraffic:
    graph = program.root_module.graph
    aliases, sources = mutation_sources(graph, program)
    written_back = written_back_values(program.signature)
    chains = update_chains(graph, aliases, written_back)
    return StateTraffic(aliases, sources, written_back, chains)


_TRAFFIC: WeakMemo[Program, StateTraffic] = WeakMemo(_traffic)


def state_traffic(program: Program) -> StateTraffic:
    """The state traffic of ``program``'s flat root graph, computed once per Program object.

    Parameters:
        program: a program whose root has a graph (flat: the stages before ``outline`` and the
            outlining walk read it).

    Returns:
        A ``StateTraffic`` of plain name tables; callers read it and never change it.

    **Laws:** a pure function of ``program`` (equal programs give equal traffic); the memo is
    held weakly by identity (``ir.memo.WeakMemo``) and never changes the Program.
    Complexity: O(n) in the root graph's nodes on the first call for a Program, O(1) after.
    """
    return _TRAFFIC(program)
