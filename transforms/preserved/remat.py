"""Rematerialization: values that cross a preserved call boundary outside its signature.

A preserved call (``preserve_module_call_signature``) may take nothing but its eager
``(args, kwargs)`` and state, and hand back nothing but its eager outputs. Export does not keep
to that: it shares computations between modules (a dtype cast that a block and its parent both
make, a ``permute``, a ``getitem`` of one tuple, symbolic-size arithmetic), so the flat graph
has reads that cross a preserved boundary without being in the signature:

- *outside -> inside*: a preserved call reads a value computed before it starts;
- *inside -> outside*: a caller (or a later call) reads a value computed inside the call;
- *call -> call*: one preserved call reads what another computed (both of the above), inside
  its body or as an argument its caller passes (the signature names a value made inside the
  other call, which the caller never sees).

``rematerialize`` rewrites each such read on the flat root graph, before outlining. A value the
reader's call (or a call around it) takes as an argument is resolved where the caller passes
it: just before that call starts, in the caller's module call, and the call's signature is
renamed to the value the caller now passes. A value a call returns that it cannot read itself
(made inside a preserved call it makes) is resolved inside it just before it ends, and its
signature renamed to what it now returns. Any other value is resolved just before the reader,
in the reader's own call. There:

1. **alias**: when the value *is* a value the reader may read, up to a no-op (``getitem`` of the
   same tuple at the same index, ``clone``/``alias``, a ``to``/``view``/``reshape``/``expand``
   that keeps shape, dtype and device), the reader reads that value; a call's output is
   preferred, so that after a user swaps the preserved module every reader sees the new
   module's result, as in eager;
2. **recompute**: else, when the value's producing slice is pure and deterministic (no random
   op, no mutation, no effect, no higher-order op) and every leaf of the slice is readable
   where it is resolved (the inputs and outputs of preserved calls as that side sees them,
   state, constants, symbolic sizes of readable tensors), the slice is copied there;
3. otherwise, when the reader computes nothing that is read (a metadata check,
   ``_assert_tensor_metadata``, that export puts before a ``.to``; a pure node no node reads),
   the reader is dropped;
4. otherwise a ``PassError`` names the value, the preserved call, the reading module, why, and
   what to do.

State values (results of in-place ops, values a ``copy_`` writes back, intermediate values of a
buffer's update chain) are left to ``outline``, which reads them from the state
(``transforms.preserved.state_traffic``).
"""

from __future__ import annotations

import functools
import logging
from bisect import bisect_right
from collections.abc import Iterable
from typing import Any

import attrs
import torch

from ir import ops
from ir.args import Ref, map_refs, ref
from ir.effects import aliased_args
from ir.errors import PassError
from ir.graph import Graph
from ir.node import CALL_FUNCTION, OUTPUT, PLACEHOLDER, Node
from ir.program import Program
from ir.signature import STATE_INPUT_KINDS
from transforms import kernel as kn
from transforms.machinery.call_walk import node_positions
from transforms.machinery.each_graph import with_root_graph
from transforms.machinery.frames import FrameOf, node_frames
from transforms.machinery.pass_checks import require_flat
from transforms.preserved.nesting import common_prefix, preserved_chains
from transforms.preserved.state_traffic import state_traffic

log = logging.getLogger("purefx")

#: The most nodes one rematerialized value may copy; a longer slice is a ``PassError``.
MAX_SLICE = 256

_SYM_SIZE = ops.SYM_SIZE


def rematerialize(program: Program, frames_of: FrameOf = node_frames) -> Program:
    """Rewrite the flat root graph so that no value crosses a preserved call boundary unless
    its signature (or state) carries it.

    Parameters:
        program: a flat program (as ``import_ep`` makes it; ``PassError`` for an outlined one:
            run this before ``outline``).
        frames_of: the module calls a node runs in (``transforms.stacks.node_frames``).

    Returns:
        ``program`` itself when no read crosses a boundary; else a program whose root graph reads
        an alias that is readable (a call's output first), or a copy of the value's slice made
        just before the reader and carrying the reader's module stack. An argument a preserved
        call is passed that its caller cannot read is resolved the same way in the caller, just
        before the call starts, and the call's signature names what is passed instead.

    Raises:
        PassError: naming the value, the preserved call, the reading module and the reason, for
        a value whose slice is not pure, reads something the reader cannot see (a user input
        outside the signature, a buffer updated in between), or is longer than ``MAX_SLICE``;
        or naming the call and the value, for a signature that takes or returns a value
        computed only after the call ends (a name ``run_decompositions`` left stale that
        ``repair_call_signatures`` could not replace).

    **Laws:** semantics-preserving (the copies compute the same values at the reader); idempotent
    (``rematerialize(rematerialize(p)) == rematerialize(p)``); deterministic (names and order
    follow the graph); a program without preserved calls is returned as it is (``is``).

    Complexity: O(n · d + c) for n nodes nested d preserved calls deep and c copied nodes; each
    slice is found once per reading call (memoized), is at most ``MAX_SLICE`` nodes, and its
    size is logged (logger ``purefx``, level DEBUG). Two passes: an analysis (``_Reach``, which
    also answers whether any read crosses: the program is returned as it is when none does),
    then the rewrite (``_rewrite``), which reads it.
    """
    require_flat(program, "rematerialize")
    if not any(program.call_signatures):  # only the root's ('')
        return program
    reach = _Reach.of(program, frames_of)
    _check_signature_order(reach)
    if not reach.crosses:
        return program
    plan = _rewrite(reach)
    return program if plan is None else _applied(program, plan)


def _check_signature_order(reach: _Reach) -> None:
    """``PassError`` for a preserved call whose signature names a value computed only after
    the call ends: no argument or result of a call can be (an undefined name, or one made
    before or inside the call, is left to the rewrite and ``outline``). O(n · d)."""
    last: dict[str, int] = {}
    for i, node in enumerate(reach.nodes):
        for call in reach.chain.get(node.name, ()):
            last[call] = i
    position = reach.position
    for call, end in last.items():
        for kind, names in (("takes", reach.inputs_of), ("returns", reach.outputs_of)):
            for name in names.get(call, ()):
                if position.get(name, -1) > end:
                    where = _where(reach, reach.by_name[name])
                    raise PassError(
                        f"the signature of the preserved call {call!r} {kind} %{name}, which is "
                        f"computed only after the call ends (in {where}): a stale name "
                        "(torch's run_decompositions maps signature names by node provenance) "
                        "that repair_call_signatures could not replace by a unique value "
                        "crossing the call's boundary. Preserve the module without "
                        "run_decompositions, or preserve its parent instead"
                    )


# --- pass 1: the analysis -----------------------------------------------------------------------


@attrs.frozen
class _Reach:
    """Who may read what on the flat root graph, before any rewrite (read-only tables; the
    state traffic and alias classes are computed on first use)."""

    program: Program
    nodes: tuple[Node, ...]
    by_name: dict[str, Node]
    position: dict[str, int]
    chain: dict[str, tuple[str, ...]]  # value -> the preserved calls it is made in
    frames_at: dict[str, Any]
    root_stack: Any
    stack_of: Any
    state: frozenset[str]  # root inputs that are state
    user_inputs: tuple[str, ...]
    # call -> the values its signature takes / returns, in signature order (dict: a set that
    # keeps its order)
    inputs_of: dict[str, dict[str, None]]
    outputs_of: dict[str, dict[str, None]]

    @classmethod
    def of(cls, program: Program, frames_of: FrameOf) -> _Reach:
        graph = program.root_module.graph
        nodes = graph.nodes
        sigs = program.call_signatures
        specs = program.signature.inputs
        chain, frames_at, root_stack, stack_of = preserved_chains(
            graph, frames_of, frozenset(sigs)
        )
        return cls(
            program, nodes, graph.by_name(), node_positions(graph),
            chain, frames_at, root_stack, stack_of,
            frozenset(s.name for s in specs if s.kind in STATE_INPUT_KINDS),
            tuple(s.name for s in specs if s.kind not in STATE_INPUT_KINDS),
            {c: dict.fromkeys(a.name for a in s.inputs if a.name) for c, s in sigs.items()},
            {c: dict.fromkeys(a.name for a in s.outputs if a.name) for c, s in sigs.items()},
        )

    @functools.cached_property
    def writes(self) -> _StateWrites:
        return _StateWrites.of(self.program, self.position)

    @functools.cached_property
    def aliases(self) -> dict[str, list[str]]:
        """Each value -> the values equal to it up to no-op aliasing (classes of size > 1)."""
        return _alias_classes(self.nodes)

    @functools.cached_property
    def crosses(self) -> bool:
        """Whether any read crosses a boundary outside the signatures: a node reads a value it
        may not, or a call's signature names a value its caller (argument) or the call itself
        (output) may not read. Exactly when ``_rewrite`` changes something."""
        chain_of, position = self.chain, self.position
        readable = _Readable(self, chain_of, self.inputs_of, self.outputs_of)

        def unreadable(names: dict[str, None], chain: tuple[str, ...], at: int) -> bool:
            for name in names:  # the common case, made in ``chain`` itself, inline
                own = chain_of.get(name)
                if own is None or own == chain or position.get(name, at) >= at:
                    continue
                if not readable(name, chain):
                    return True
            return False

        current: tuple[str, ...] = ()
        for i, node in enumerate(self.nodes):
            if node.op == PLACEHOLDER:
                continue
            chain = chain_of[node.name]
            if chain != current:
                k = common_prefix(current, chain)
                if any(
                    unreadable(self.outputs_of.get(c, {}), current[: d + 1], i)
                    for d, c in enumerate(current) if d >= k
                ) or any(
                    unreadable(self.inputs_of.get(c, {}), chain[:d], i)
                    for d, c in enumerate(chain) if d >= k
                ):
                    return True
                current = chain
            for r in node.inputs():
                own = chain_of.get(r.name)
                if own is not None and own != chain and not readable(r.name, chain):
                    return True
        return False


@attrs.frozen
class _StateWrites:
    """Values ``outline`` reads from the state (in-place results, values a ``copy_`` writes
    back, the intermediate values of a root input's update chain, the mutated inputs), the
    state each such value is, and where each state is written (positions, sorted)."""

    read_from_state: frozenset[str]
    dest: dict[str, str]
    writes: dict[str, list[int]]

    @classmethod
    def of(cls, program: Program, position: dict[str, int]) -> _StateWrites:
        traffic = state_traffic(program)
        aliases, chains = traffic.aliases, traffic.chains
        # a state changes where it is written in place and where a functional update makes
        # its next value (which ``outline`` writes back when a preserved call reads it)
        writes: dict[str, list[int]] = {}
        for name, dest in [*aliases.items(), *chains.items()]:
            writes.setdefault(dest, []).append(position[name])
        for positions in writes.values():
            positions.sort()
        return cls(traffic.read_from_state, dict(aliases), writes)


@attrs.frozen
class _Readable:
    """Whether a node in preserved calls ``chain`` may read ``name`` as it is, given the
    signatures as they are now: the value leaves each preserved call it was made in as an
    output and enters each one the reader is in as an input; state (and state values, which
    ``outline`` reads from the state) crosses freely."""

    reach: _Reach
    chain_of: dict[str, tuple[str, ...]]
    inputs_of: dict[str, dict[str, None]]  # the signatures now (the rewrite renames them)
    outputs_of: dict[str, dict[str, None]]

    def __call__(self, name: str, chain: tuple[str, ...]) -> bool:
        own = self.chain_of.get(name)
        if own is None:
            return True  # an undefined value: ``outline`` reports it
        if own == chain:
            return True
        if name in self.reach.state:
            return True
        k = common_prefix(own, chain)
        if all(name in self.outputs_of[c] for c in own[k:]) and all(
            name in self.inputs_of[c] for c in chain[k:]
        ):
            return True
        return name in self.reach.writes.read_from_state


# --- pass 2: the rewrite ------------------------------------------------------------------------


@attrs.frozen
class _Plan:
    """What the rewrite made: the new root graph, the call signatures it renamed, and the
    root outputs that now read another value."""

    graph: Graph
    signatures: dict[str, Any]
    output_renames: dict[str, str]


def _applied(program: Program, plan: _Plan) -> Program:
    """``program`` with the plan's root graph, signatures and output names (the root now
    returns the alias or copy: the export signature names it, ``kernel.renamed_outputs``)."""
    program = with_root_graph(program, plan.graph)
    if plan.signatures:
        program = program.replace(
            call_signatures=program.call_signatures.update(plan.signatures)
        )
    signature = kn.renamed_outputs(program.signature, plan.output_renames)
    return program if signature is program.signature else program.replace(signature=signature)


def _rewrite(reach: _Reach) -> _Plan | None:
    """One walk over the root graph in order: at each preserved call's start and end its
    signature's crossing values are resolved, and each node's crossing reads; copies are
    inserted before the node they were made for (``None`` when nothing changed)."""
    rw = _Resolver(reach)
    kept: list[Node] = []
    current: tuple[str, ...] = ()
    last = None  # the last node of the current calls
    read = {r.name for node in reach.nodes for r in node.inputs()}
    dropped = False
    for i, node in enumerate(reach.nodes):
        if node.op == PLACEHOLDER:
            kept.append(node)
            continue
        chain = reach.chain[node.name]
        if chain != current:
            k = common_prefix(current, chain)
            for depth in reversed(range(k, len(current))):
                rw.leave(current[depth], current[: depth + 1], last, i)
            for depth in range(k, len(chain)):
                rw.enter(chain[depth], chain[:depth], node, i)
            current = chain
        last = node
        try:
            kept.append(rw.reader(node, i, chain))
        except PassError:
            if not _droppable(node, read):
                raise
            dropped = True  # it reads a value it cannot have, and computes nothing anyone reads
            log.debug("remat: %%%s dropped: it reads a value it cannot read and computes "
                      "nothing that is read", node.name)
    if not rw.memo and not dropped:
        return None
    w = rw.w
    for node in _with_copies(kept, rw.inserts):
        w.add(node)
    return _Plan(w.finish()[0], rw.renamed_signatures(), rw.output_renames)


def _droppable(node: Node, read: set[str]) -> bool:
    """Whether ``node`` may be dropped where one of its reads cannot be resolved: a metadata
    check (``ir.ops.is_metadata_check``, the ``_assert_tensor_metadata`` export puts before a
    ``.to``: it checks what the value's ``meta['val']`` already says), or a node whose result no
    node reads and that computes nothing else (pure, deterministic, without effect)."""
    if node.op != CALL_FUNCTION:
        return False
    if ops.is_metadata_check(node.target):
        return True
    return node.name not in read and ops.is_recomputable(node.target)


def _with_copies(
    kept: list[Node], inserts: dict[int, list[tuple[tuple[int, int], Node]]]
) -> list[Node]:
    """``kept`` with the copies made before each node inserted there, in their order."""
    out: list[Node] = []
    for i, node in enumerate(kept):
        copies = inserts.get(i)
        if copies:
            copies.sort(key=lambda c: c[0])
            out.extend(c for _, c in copies)
        out.append(node)
    return out


class _Resolver:
    """The rewrite's state: what each crossing value is now read as, per reading calls, and
    the copies made so far (the tables it reads are the analysis, ``reach``)."""

    def __init__(self, reach: _Reach) -> None:
        self.reach = reach
        # the signatures and chains as the rewrite changes them (copies join their reader's)
        self.readable = _Readable(
            reach, dict(reach.chain),
            {c: dict(v) for c, v in reach.inputs_of.items()},
            {c: dict(v) for c, v in reach.outputs_of.items()},
        )
        self.memo: dict[tuple[str, tuple[str, ...]], str] = {}
        self.passed: dict[str, dict[str, str]] = {}  # call -> its argument -> what is passed
        self.returned: dict[str, dict[str, str]] = {}  # call -> its output -> what it returns
        # before node i: (order, copy); a call's closing copies first (innermost first), then
        # the caller's, then those of calls that start there (outermost first)
        self.inserts: dict[int, list[tuple[tuple[int, int], Node]]] = {}
        # the root graph streamed anew: it names and makes the copies (``copy``)
        self.w = kn.WorkingGraph(reach.program.root_module.graph, indexed=False)
        self.output_renames: dict[str, str] = {}
        self.symbols: dict[tuple[str, ...], dict[Any, tuple[int, str, int]]] = {}

    def reader(self, node: Node, i: int, chain: tuple[str, ...]) -> Node:
        """``node`` (at ``i``, in preserved calls ``chain``) reading a resolved value in
        place of each value it may not read."""
        chain_of, readable = self.reach.chain, self.readable
        for r in node.inputs():  # the common case, read in the reader's own calls, inline
            own = chain_of.get(r.name)
            if own is not None and own != chain and not readable(r.name, chain):
                break
        else:
            return node  # nothing crosses
        site = _Site(i, chain, self.reach.stack_of(node), f"read by %{node.name}",
                     _where(self.reach, node))

        def read(r: Ref) -> Ref:
            if readable(r.name, chain):
                return r
            found = self.resolve(r.name, site)
            if node.op == OUTPUT:
                self.output_renames[r.name] = found
            return ref(found)

        args = map_refs(node.args, read)
        kwargs = map_refs(node.kwargs, read)
        if args is not node.args or kwargs is not node.kwargs:
            node = node.replace(args=args, kwargs=kwargs)
        return node

    def enter(self, call: str, caller: tuple[str, ...], first: Node, at: int) -> None:
        """Preserved ``call`` starts at node ``at``: each argument its signature names that its
        caller cannot read is resolved in the caller, and the signature names what is passed."""
        inputs = self.readable.inputs_of.get(call, {})
        for name in self.unreadable(self.reach.inputs_of.get(call, ()), caller, at):
            site = _Site(
                at, caller,
                caller_stack(call, self.reach.stack_of(first)) or dict(self.reach.root_stack),
                f"passed as an argument to the preserved call {call!r}",
                _caller_path(self.reach, first, call),
            )
            found = self.resolve(name, site)
            self.passed.setdefault(call, {})[name] = found
            inputs.pop(name, None)
            inputs[found] = None

    def leave(self, call: str, inside: tuple[str, ...], last: Node | None, at: int) -> None:
        """Preserved ``call`` (the innermost of ``inside``) ends before node ``at``: each output
        its signature names that the call cannot read itself (made inside a preserved call it
        makes, and not returned by that) is resolved inside the call, and the signature names
        what is returned."""
        if last is None:
            return
        outputs = self.readable.outputs_of.get(call, {})
        for name in self.unreadable(self.reach.outputs_of.get(call, ()), inside, at):
            site = _Site(
                at, inside, caller_stack(call, self.reach.stack_of(last), inside=True),
                f"returned by the preserved call {call!r}", repr(call.partition("@")[0]),
            )
            found = self.resolve(name, site, closing=True)
            self.returned.setdefault(call, {})[name] = found
            outputs.pop(name, None)
            outputs[found] = None

    def unreadable(self, names: Iterable[str], chain: tuple[str, ...], at: int) -> list[str]:
        """Of the values a signature names (a call's arguments, which its caller ``chain``
        passes where the call starts at node ``at``; or its outputs, which the call ``chain``
        ends in returns before node ``at``), those made before ``at`` that ``chain`` cannot
        read (values undefined or made inside the call are left to ``outline``, which reports
        them)."""
        position, readable = self.reach.position, self.readable
        return [n for n in names if n in position and position[n] < at and not readable(n, chain)]

    def renamed_signatures(self) -> dict[str, Any]:
        """The call signatures whose arguments (``passed``) or outputs (``returned``) are now
        other values."""
        sigs = self.reach.program.call_signatures
        return {
            call: sigs[call].renamed(self.passed.get(call), self.returned.get(call))
            for call in sorted(set(self.passed) | set(self.returned))
        }

    # --- one crossing read ------------------------------------------------------------------

    def resolve(self, name: str, site: _Site, closing: bool = False) -> str:
        """The name read at ``site`` instead of ``name``: what the caller passed or the callee
        returned, an alias, or a copy (inserted before ``site.at``; ``closing``: at the end of
        the call ``site.chain`` ends in)."""
        chain = site.chain
        passed = self.passed_in(name, chain)
        if passed is None:
            passed = self.returned_out(name, chain)
        if passed is not None:
            return passed
        found = self.memo.get((name, chain))
        if found is not None:
            return found
        alias = self.readable_alias(name, chain, site.at)
        if alias is not None:
            self.memo[(name, chain)] = alias
            log.debug("remat: %%%s read as %%%s (%s in %s)", name, alias, site.reader, site.where)
            return alias
        try:
            plan = self.slice(name, chain, site.at)
        except _NotRecomputable as why:
            raise PassError(_message(self.reach, name, site, str(why))) from None
        copies = self.inserts.setdefault(site.at, [])
        order = (0, -len(chain)) if closing else (1, len(chain))
        for node in plan:
            copies.append((order, self.copy(node, site)))
        log.debug(
            "remat: %%%s recomputed (%s in %s): %d node(s) copied",
            name, site.reader, site.where, len(plan),
        )
        return self.memo[(name, chain)]

    def passed_in(self, name: str, chain: tuple[str, ...]) -> str | None:
        """What a call of ``chain`` that takes ``name`` as an argument is now passed instead,
        as seen inside ``chain`` (``None`` when no call around the reader was)."""
        if not self.passed:
            return None
        k = common_prefix(self.readable.chain_of.get(name, ()), chain)
        for call in chain[k:]:
            found = self.passed.get(call, {}).get(name)
            if found is not None:
                return found
        return None

    def returned_out(self, name: str, chain: tuple[str, ...]) -> str | None:
        """What a call that ``name`` was made in now returns instead of it, when that is
        readable in ``chain`` (``None`` when no such call was renamed)."""
        if not self.returned:
            return None
        own = self.readable.chain_of.get(name, ())
        k = common_prefix(own, chain)
        for call in own[k:]:
            found = self.returned.get(call, {}).get(name)
            if found is not None and self.readable(found, chain):
                return found
        return None

    def readable_alias(self, name: str, chain: tuple[str, ...], limit: int) -> str | None:
        """A value readable in ``chain`` that equals ``name`` up to no-op aliasing, made before
        node ``limit``: a preserved call's output first, then any other."""
        members = self.reach.aliases.get(name)
        if not members:
            return None
        position, readable = self.reach.position, self.readable
        fallback = None
        for member in members:
            if member == name or position[member] >= limit:
                continue
            if not readable(member, chain):
                continue
            own = readable.chain_of.get(member, ())
            if own and member in readable.outputs_of[own[-1]]:
                return member
            fallback = fallback or member
        return fallback

    def slice(self, name: str, chain: tuple[str, ...], at: int) -> list[Node]:
        """The nodes to copy (in graph order) so that ``name`` is computed in ``chain`` just
        before node ``at``."""
        by_name, readable = self.reach.by_name, self.readable
        plan: dict[str, Node] = {}

        def visit(value: str) -> None:
            if value in plan or (value, chain) in self.memo:
                return
            node = by_name[value]
            symbol = self.symbol_source(node, chain, at)
            if symbol is not None:
                plan[value] = symbol
                return
            why = _not_pure(node)
            if why:
                raise _NotRecomputable(f"%{value} {why}")
            for r in node.inputs():
                leaf = r.name
                if (leaf, chain) in self.memo or self.passed_in(leaf, chain) is not None:
                    continue
                if self.returned_out(leaf, chain) is not None:
                    # a call now returns a copy of it: read that, not the call's insides
                    continue
                if readable(leaf, chain):
                    _check_unchanged(self.reach, leaf, value, at)
                    continue
                if self.readable_alias(leaf, chain, at) is not None:
                    continue
                if by_name[leaf].op == PLACEHOLDER:
                    raise _NotRecomputable(
                        f"its slice reads the input %{leaf}, which is not passed to the call"
                    )
                visit(leaf)
            plan[value] = node
            if len(plan) > MAX_SLICE:
                raise _NotRecomputable(f"its slice is longer than {MAX_SLICE} nodes")

        visit(name)
        return sorted(plan.values(), key=lambda n: self.reach.position.get(n.name, -1))

    def symbol_source(self, node: Node, chain: tuple[str, ...], at: int) -> Node | None:
        """A ``sym_size`` of a tensor readable in ``chain`` before node ``at`` whose size is the
        symbolic integer ``node`` computes (a size is known wherever a tensor of that size is),
        or ``None``."""
        val = node.meta.get("val")
        if not isinstance(val, torch.SymInt) or node.op != CALL_FUNCTION:
            return None
        found = self.symbols_of(chain).get(val.node.expr)
        if found is None or found[0] >= at:
            return None
        _, tensor, dim = found
        if node.target is _SYM_SIZE and node.args == (ref(tensor), dim):
            return None  # it is this node: copy it as it is
        return self.w.make_carrying(CALL_FUNCTION, _SYM_SIZE, (ref(tensor), dim), meta=node.meta,
                                    name=node.name)

    def symbols_of(self, chain: tuple[str, ...]) -> dict[Any, tuple[int, str, int]]:
        """Size expression -> (position, tensor, dim) of the first tensor readable in ``chain``
        with that size: the tensors the innermost call of ``chain`` takes (the root's user
        inputs for the root), then the outputs of preserved calls as ``chain`` sees them (as
        the signatures are when ``chain`` first asks: memoized per chain)."""
        found = self.symbols.get(chain)
        if found is None:
            found = _symbols(self.reach, self.readable, chain)
            self.symbols[chain] = found
        return found

    def copy(self, node: Node, site: _Site) -> Node:
        """A copy of ``node`` at ``site``, reading the copies made before it: named after it,
        with its meta and the site's module stack (``kernel.WorkingGraph.make_carrying``)."""
        chain = site.chain
        name = self.w.fresh(node.name)

        def read(r: Ref) -> Ref:
            found = (
                self.memo.get((r.name, chain))
                or self.passed_in(r.name, chain)
                or self.returned_out(r.name, chain)
            )
            if found is not None:
                return ref(found)
            if self.readable(r.name, chain):
                return r
            return ref(self.readable_alias(r.name, chain, site.at))

        args = map_refs(node.args, read)
        kwargs = map_refs(node.kwargs, read)
        self.memo[(node.name, chain)] = name
        self.readable.chain_of[name] = chain
        return self.w.make_carrying(CALL_FUNCTION, node.target, args, kwargs, meta=node.meta,
                                    stack=site.stack, name=name)


def _symbols(
    reach: _Reach, readable: _Readable, chain: tuple[str, ...]
) -> dict[Any, tuple[int, str, int]]:
    """The table of ``_Resolver.symbols_of`` for ``chain``, built from the signatures now."""
    names = (
        [a.name for a in reach.program.call_signatures[chain[-1]].inputs if a.name]
        if chain
        else list(reach.user_inputs)
    )
    names += sorted(
        (n for outs in readable.outputs_of.values() for n in outs
         if n in reach.position and readable(n, chain)),
        key=reach.position.__getitem__,
    )
    found: dict[Any, tuple[int, str, int]] = {}
    for name in names:
        node = reach.by_name.get(name)
        val = node.meta.get("val") if node is not None else None
        at = reach.position.get(name, -1)
        for dim, size in enumerate(getattr(val, "shape", ())):
            if isinstance(size, torch.SymInt):
                key = size.node.expr
                if key not in found or found[key][0] > at:
                    found[key] = (at, name, dim)
    return found


def _check_unchanged(reach: _Reach, leaf: str, user: str, at: int) -> None:
    """A leaf that is (a value of) a mutated root input must still be the input's current
    value where the copy runs (before node ``at``): no write between the leaf and there."""
    state = reach.writes
    writes = state.writes.get(state.dest.get(leaf, leaf))
    if not writes:
        return
    start = reach.position[leaf]  # the value the slice reads is current from here on
    if bisect_right(writes, at - 1) > bisect_right(writes, start):
        raise _NotRecomputable(
            f"its slice (%{user}) reads %{leaf}, which is updated before the reader runs"
        )


class _NotRecomputable(Exception):
    """Why a slice cannot be copied to the reader (internal: becomes a ``PassError``)."""


class _Site:
    """Where a crossing read is resolved: before original node ``at``, in preserved calls
    ``chain``, with module stack ``stack``; ``reader`` says who reads (for messages)."""

    __slots__ = ("at", "chain", "reader", "stack", "where")

    def __init__(self, at: int, chain: tuple[str, ...], stack: Any, reader: str, where: str):
        self.at, self.chain, self.stack, self.reader, self.where = at, chain, stack, reader, where


# --- errors ---------------------------------------------------------------------------------------


def _where(reach: _Reach, reader: Node) -> str:
    frames = reach.frames_at.get(reader.name, ())
    return repr(frames[-1].path) if frames else "'<root>'"


def _caller_path(reach: _Reach, first: Node, call: str) -> str:
    """The module path that calls preserved ``call`` (whose first node is ``first``)."""
    path = ""
    for frame in reach.frames_at.get(first.name, ()):
        if frame.call_name == call:
            break
        path = frame.path
    return repr(path) if path else "'<root>'"


def _message(reach: _Reach, name: str, site: _Site, why: str) -> str:
    chain = site.chain
    own = reach.chain.get(name, ())
    k = common_prefix(own, chain)
    if len(own) > k:
        crossing = f"is produced inside a preserved call {own[-1]!r}"
        parent = own[k]
        fix = f"return it from {own[-1]!r}, or preserve the module that calls it instead of it"
    else:
        crossing = f"is computed outside the preserved call {chain[-1]!r}"
        parent = chain[k]
        fix = f"pass it to {chain[-1]!r} as an argument, or preserve its parent instead"
    return (
        f"value %{name} {crossing} and {site.reader} in {site.where} without crossing the "
        f"call's signature; it cannot be recomputed there: {why}. "
        f"{fix[0].upper()}{fix[1:]} (e.g. not {parent!r})"
    )


def caller_stack(call: str, stack: Any, inside: bool = False) -> dict[str, Any]:
    """A module stack inside preserved ``call`` cut just before its entry (the stack of the
    module call that calls it), or just after it (``inside``: the call's own stack); the whole
    stack when ``call`` is not on it. O(len(stack))."""
    items = list((stack or {}).items())
    for i, (key, (path, _)) in enumerate(items):
        number = key.partition("@")[2]
        name = f"{path}@{number}" if number.isdigit() and int(number) else path
        if path and name == call:
            return dict(items[: i + 1 if inside else i])
    return dict(items)


# --- tables over the flat graph ---------------------------------------------------------------


def _not_pure(node: Node) -> str:
    """Why ``node`` cannot be computed a second time ('' when it can)."""
    if node.op != CALL_FUNCTION:
        return f"is a {node.op} node"
    return ops.impurity(node.target)


def _same_value(node: Node, source: Node) -> bool:
    a, b = node.meta.get("val"), source.meta.get("val")
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    return a.dtype == b.dtype and a.device == b.device and a.shape == b.shape


def _alias_classes(nodes: tuple[Node, ...]) -> dict[str, list[str]]:
    """The classes of values equal up to no-op edges: ``getitem(t, i)`` nodes with the same
    ``(t, i)``, and the ops that ``ir.ops`` calls alias-like whose result keeps the input's
    shape, dtype and device and is the input's memory (``ir.effects.aliased_args``, the verified
    row's answer: ``reshape``, ``to``, ``_unsafe_view``; not a ``clone`` or ``_to_copy``, whose
    result is fresh: read as its source, two outputs would become one tensor). A no-op edge runs from an
    earlier value to a new one, so each
    value's class is named by its first member, looked up once. Each member of a class of two
    or more maps to the class's members in graph order. O(n)."""
    first_of: dict[str, str] = {}
    by_name = {n.name: n for n in nodes}
    items: dict[tuple[str, Any], str] = {}
    for node in nodes:
        if node.op != CALL_FUNCTION or not node.args or type(node.args[0]) is not Ref:
            continue
        first = node.args[0].name
        if ops.is_getitem(node.target) and len(node.args) == 2:
            try:
                seen = items.setdefault((first, node.args[1]), node.name)
            except TypeError:
                continue
            if seen != node.name:
                first_of[node.name] = first_of.setdefault(seen, seen)
        elif (ops.is_alias_like(node.target) and first in aliased_args(node)
              and first in by_name
              and _same_value(node, by_name[first])):  # (a name defined nowhere: no class)
            first_of[node.name] = first_of.setdefault(first, first)
    classes: dict[str, list[str]] = {}
    for node in nodes:
        if node.name in first_of:
            classes.setdefault(first_of[node.name], []).append(node.name)
    return {m: members for members in classes.values() if len(members) > 1 for m in members}
