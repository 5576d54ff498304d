"""Repairing preserved call signatures whose value names went stale in ``run_decompositions``.

torch 2.13's ``run_decompositions`` renames the graph's nodes and maps the names of each
preserved call's signature through node provenance (``meta["from_node"]``), keeping the *last*
new node that came from an old one. When one old node becomes several (a train-mode batch norm:
the output and the running statistics), the signature names the wrong one; when an old name has
no new node, the signature keeps the old name, which may now belong to another node (a top-k
index of another layer). The program then reads a value across the call's boundary that the
signature does not carry, and names one it does not use.

``repair_call_signatures`` finds such a signature by its symptom and fixes it when the fix is
unambiguous: a *suspect* name (an input defined only after the call starts, an input the call
neither reads nor passes on to a preserved call it makes, an output defined outside the call, an
output that is itself state traffic, an output nothing after the call reads or takes; never a
user input or state, whose names decomposition keeps) is replaced by a value that
*crosses* the boundary in the same direction without being in the signature, when exactly one
such value comes from the same old node (same provenance), or failing that has the same shape
and dtype, or is the only one left, of the same kind, for the only suspect left.

Suspects are matched in two rounds. A name that cannot be what the signature says (undefined;
an input defined after the call starts; an output defined outside the call, or one that is state
traffic: written back, copied into state, a step of a state's update chain, where decomposition
puts the name of a train-mode batch norm's output) is *certain*, and is matched first. A name
that is where the signature says but unused (an input the call never reads, an output nothing
after the call reads: a module may ignore an argument, a caller may drop a result, as a Mixtral
MoE block drops its router's logits) is only *doubtful*, and takes only what the certain ones
leave. An output the caller reads is used, whatever the caller computes from it (a value it
writes into state too), and a name another preserved call's signature takes is used where that
call starts (an argument passed on to a nested call, a result handed to a later one): renaming
it would leave that signature naming a value this side no longer carries. An unused output can
neither take a crossing value from, nor make the "only one left" rule ambiguous for, a certain
stale name.

One repair can make another name look stale: an argument a nested call took, until its own
name there was repaired, is now unused; a suspect with two candidates has one left once another
suspect takes the other. The repair runs in rounds until one renames nothing, so a second run
finds nothing to do.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Any

import attrs
import torch

from ir.graph import Graph
from ir.node import PLACEHOLDER, Node
from ir.program import Program
from ir.signature import CallSignature
from transforms.machinery.call_walk import call_spans, node_positions
from transforms.machinery.frames import FrameOf, node_frames
from transforms.machinery.pass_checks import require_flat
from transforms.preserved.state_traffic import state_traffic

__all__ = ["repair_call_signatures"]

log = logging.getLogger("purefx")


def repair_call_signatures(program: Program, frames_of: FrameOf = node_frames) -> Program:
    """Replace stale value names in preserved call signatures (see the module docstring).

    Parameters:
        program: a flat program (``PassError`` for an outlined one: run this before
            ``outline``).
        frames_of: the module calls a node runs in.

    Returns:
        ``program`` itself when every signature is consistent with the graph or no fix is
        unambiguous; else the program with the repaired ``call_signatures`` (the graph is not
        changed). Each repair is logged (logger ``purefx``, level INFO).

    **Laws:** idempotent (it repairs until no name looks stale, so its result is returned as it
    is); never changes a graph; a signature whose names are all used as the signature says is
    never changed. Complexity: O(r · n · d) for n nodes, preserved calls nested d deep and r
    rounds, r at most one more than the slots renamed (one when nothing is, two as a rule).
    """
    require_flat(program, "repair_call_signatures")
    sigs = program.call_signatures
    if not any(sigs):  # only the root's ('')
        return program
    graph = program.root_module.graph
    spans = _spans(graph, frames_of, frozenset(sigs))
    if not spans:
        return program
    position = node_positions(graph)
    by_name = graph.by_name()
    writes = state_traffic(program).writes
    state = {s.name for s in program.signature.inputs if s.target is not None}
    # Repairs feed each other: whether a name is used reads the other signatures (a name
    # another call takes is used where that call starts), and a suspect with two candidates has
    # one once another suspect of its call takes the other. So repair until a round renames
    # nothing, what a second run would see. This ends: a renamed input is read inside its call
    # and a renamed output after it (graph and spans never change), so no renamed slot is
    # suspect again, and each round but the last renames at least one slot.
    current = dict(sigs)
    while True:
        users = _signature_users(graph, current, by_name)
        passed = _passed_at(current, spans)
        renamed = {}
        for call, (start, end) in spans.items():
            sig = current[call]
            inside = _Inside(start, end, position)
            fixed = _repair(call, sig, graph, inside, users, passed, by_name, writes, state)
            if fixed is not sig:
                renamed[call] = fixed
        if not renamed:
            break
        current.update(renamed)
    repaired = {call: sig for call, sig in current.items() if sig is not sigs[call]}
    if not repaired:
        return program
    return program.replace(call_signatures=program.call_signatures.update(repaired))


@attrs.frozen
class _Inside:
    start: int
    end: int
    position: Mapping[str, int]

    def __call__(self, name: str) -> bool:
        at = self.position.get(name)
        return at is not None and self.start <= at <= self.end


def _signature_users(
    graph: Graph, sigs: Mapping[str, CallSignature], by_name: Mapping[str, Node]
) -> dict[str, list[str]]:
    """``graph.users()`` for the values the signatures ``sigs`` name (the names of other
    values are absent): what deciding that no signature is stale reads, without the table of
    every value's readers. O(n + reads)."""
    named = {a.name for sig in sigs.values() for a in (*sig.inputs, *sig.outputs) if a.name}
    found: dict[str, list[str]] = {name: [] for name in named if name in by_name}
    for node in graph.nodes:
        for r in node.inputs():
            readers = found.get(r.name)
            if readers is not None and (not readers or readers[-1] != node.name):
                readers.append(node.name)  # each reader once, in graph order
    return found


def _passed_at(
    sigs: Mapping[str, CallSignature], spans: Mapping[str, tuple[int, int]]
) -> dict[str, list[tuple[str, int]]]:
    """Value -> ``(call, start)`` for each preserved call whose signature takes it, ``start``
    the position of the call's first node: a call passes an argument on to a preserved call
    it makes, and a caller hands a result on to a later one, without a node reading it. O(s)
    for s names in the signatures."""
    found: dict[str, list[tuple[str, int]]] = {}
    for call, (start, _) in spans.items():
        for a in sigs[call].inputs:
            if a.name:
                found.setdefault(a.name, []).append((call, start))
    return found


def _repair(
    call: str,
    sig: CallSignature,
    graph: Graph,
    inside: _Inside,
    users: Mapping[str, Any],
    passed: Mapping[str, list[tuple[str, int]]],
    by_name: Mapping[str, Node],
    writes: frozenset[str],
    state: set[str],
) -> CallSignature:
    """``sig`` with its stale names replaced (``sig`` itself when none is); ``users`` holds the
    readers of at least the values ``sig`` names, ``passed`` the preserved calls that take
    them (``_passed_at``)."""
    names_in = {a.name for a in sig.inputs if a.name}
    names_out = {a.name for a in sig.outputs if a.name}
    position = inside.position

    def read_inside(name: str) -> bool:
        return any(inside(u) for u in users.get(name, ()))

    # a name a preserved call takes is used where that call starts: renaming it here alone
    # would leave the other signature naming a value this side no longer carries
    def used_inside(name: str) -> bool:
        return read_inside(name) or any(
            other != call and inside.start <= at <= inside.end
            for other, at in passed.get(name, ())
        )

    def used_after(name: str) -> bool:
        return read_after(name, ()) or any(at > inside.end for _, at in passed.get(name, ()))

    def read_after(name: str, besides: Collection[str] = writes) -> bool:  # (): writes count
        return any(position[u] > inside.end and u not in besides for u in users.get(name, ()))

    # a user input keeps its name through run_decompositions: naming one is never stale. Each
    # suspect -> whether it is certain (True) or only doubtful (False: unused where it is)
    suspect_in = {
        a.name: a.name not in position or position[a.name] >= inside.start
        for a in sig.inputs
        if a.name
        and a.name not in state
        and (a.name not in by_name or by_name[a.name].op != PLACEHOLDER)
        and (a.name not in position or position[a.name] >= inside.start or not used_inside(a.name))
    }
    # an output that is itself state traffic (written back, copied into state, a step of an
    # update chain) is where decomposition puts a stale name; one the caller reads after the
    # call is used, even where what the caller computes from it goes into state
    # (``self.b.copy_(y.mean(0))``): only a value crossing unsigned could take its name, and a
    # swapped module would then hand the caller another value
    suspect_out = {
        a.name: not inside(a.name) or a.name in writes
        for a in sig.outputs
        if a.name
        and a.name not in names_in
        and (not inside(a.name) or a.name in writes or not used_after(a.name))
    }
    if not suspect_in and not suspect_out:
        return sig
    users = graph.users()  # what crosses: the readers of any value (``read_after`` reads it)
    crossing_in: dict[str, None] = {}
    crossing_out: dict[str, None] = {}
    for node in graph.nodes[inside.start : inside.end + 1]:
        for r in node.inputs():
            source = by_name.get(r.name)
            if (
                source is not None
                and source.op != PLACEHOLDER
                and position[r.name] < inside.start
                and r.name not in names_in
                and r.name not in writes
            ):
                crossing_in[r.name] = None
        private = node.name not in names_out and node.name not in writes
        if private and node.op != PLACEHOLDER and read_after(node.name):
            crossing_out[node.name] = None
    renames = {}
    renames.update(_match_ranked(suspect_in, list(crossing_in), by_name))
    renames.update(_match_ranked(suspect_out, list(crossing_out), by_name))
    if not renames:
        return sig
    for old, new in renames.items():
        log.info(
            "preserved call %r: its signature names %%%s, which the call does not use as such; "
            "%%%s crosses its boundary instead (a name run_decompositions did not update)",
            call, old, new,
        )
    return sig.renamed(inputs=renames, outputs=renames)


def _match_ranked(
    suspects: Mapping[str, bool], crossing: list[str], by_name: Mapping[str, Node]
) -> dict[str, str]:
    """``_match`` of the certain suspects (``suspects[name]`` true), then of the doubtful ones
    with the crossing values the certain ones left (signature order within each round)."""
    found = _match([s for s, certain in suspects.items() if certain], crossing, by_name)
    taken = set(found.values())
    left = [c for c in crossing if c not in taken]
    doubtful = [s for s, certain in suspects.items() if not certain]
    return found | _match(doubtful, left, by_name)


def _match(suspects: list[str], crossing: list[str], by_name: Mapping[str, Node]) -> dict[str, str]:
    """Each suspect name -> the one crossing value from the same old node, or else the one with
    the same shape and dtype, or else, when one suspect and one crossing value of the same kind
    (tensor, symbolic integer, other) are left, that one; suspects without exactly one
    candidate stay."""
    found = {}
    free = dict.fromkeys(crossing)
    left = []
    for name in suspects:
        for same in (_same_origin, _same_type):
            candidates = [c for c in free if same(by_name.get(name), by_name[c])]
            if len(candidates) == 1:
                found[name] = candidates[0]
                del free[candidates[0]]
                break
            if candidates:
                break
        else:
            left.append(name)
    if len(left) == 1 and len(free) == 1:
        last = next(iter(free))
        if _kind(by_name.get(left[0])) == _kind(by_name[last]):
            found[left[0]] = last
    return found


def _kind(node: Node | None) -> type | None:
    """What a value is (tensor, symbolic integer, ...), as far as its meta says."""
    val = node.meta.get("val") if node is not None else None
    if isinstance(val, torch.Tensor):
        return torch.Tensor
    return type(val) if val is not None else None


def _origin(node: Node | None) -> Any:
    sources = node.meta.get("from_node") if node is not None else None
    return getattr(sources[-1], "name", None) if sources else None


def _same_origin(a: Node | None, b: Node) -> bool:
    origin = _origin(a)
    return origin is not None and origin == _origin(b)


def _same_type(a: Node | None, b: Node) -> bool:
    x = a.meta.get("val") if a is not None else None
    y = b.meta.get("val")
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        return False
    return x.dtype == y.dtype and x.shape == y.shape


def _spans(graph: Graph, frames_of: FrameOf, sigs: Any) -> dict[str, tuple[int, int]]:
    """Preserved call name -> (first, last) position of its nodes in the flat graph."""
    first_at, last_at = call_spans(graph, frames_of)
    return {name: (first, last_at[name]) for name, first in first_at.items() if name in sigs}
