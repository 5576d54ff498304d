"""Foreign state in a preserved call: read through a peer, never passed as an extra argument.

A preserved call's module must take exactly its preserved signature's arguments, so that a user
can replace it by any module with the eager ``forward`` (``setattr(parent, name, module)``).
State that the call's subtree reads but that lives outside that subtree (``a.leaf`` runs
``norm``, a sibling of its ancestor ``a``; a block reads a parameter of another block) cannot be
sunk into a ``get_attr`` below the module (``sink_state``), and ``outline`` passes it as an
extra argument after the signature's, which a swapped-in module does not accept.

``hold_foreign_state`` gives the preserved module a *peer*: a reference to the module that owns
the state, held outside its children (as the eager module holds it, in a plain attribute), and
reads the state as ``get_attr`` ``peer.attr``. The callers stop passing it. A swapped-in eager
module reads its own reference, as in eager; the lowered one reads the owner's current tensor.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ir.args import EMPTY_DICT, IDict, Ref
from ir.graph import Graph
from ir.module import ModuleId, split_call_target
from ir.names import Names
from ir.node import CALL_MODULE, GET_ATTR
from ir.program import Program
from ir.signature import STATE_INPUT_KINDS
from ir.tree_calls import flattened_arguments
from transforms import kernel as kn
from transforms.machinery.pass_checks import require_program

log = logging.getLogger("purefx")

Variant = tuple[ModuleId, int]


def hold_foreign_state(program: Program) -> Program:
    """Make every preserved call take only its signature's arguments where its extra arguments
    carry state: each such placeholder becomes ``get_attr`` ``peer.attr`` through a peer that
    the module holds (``Module.peers``), and its callers stop passing it.

    A listed pass (``purefx --passes hold_foreign_state``), and the last step of ``sink_state``
    and of ``outline_and_sink``, so the default pipeline runs it already; run it alone on an
    outlined program that was not sunk by ``sink_state`` (state owned below a module should be
    a ``get_attr`` there first). A placeholder carries state fqn ``f`` when every call of its
    graph passes a value that is the root's input of ``f``, a ``get_attr`` of ``f`` or a
    placeholder carrying ``f``. A preserved graph is one whose first computation flattens a
    prefix of its placeholders with the call's ``in_spec`` (what ``outline`` builds); the
    placeholders after that prefix are its extras. Extras that carry no state (or different
    state at different call sites) are left as they are.

    Parameters:
        program: a Program, usually outlined and sunk; a flat one has no preserved graph and is
            returned as it is.

    Returns:
        The rewritten Program, or ``program`` itself (``is``) when no preserved call takes
        state as an extra argument.

    Raises:
        ``NotAProgramError`` (a ``PassError``) when ``program`` is not a Program.

    **Laws:** the lowered module computes the same; idempotent (``hold_foreign_state(q) is q``
    for a result ``q``); ``sink_state(p) == hold_foreign_state(sink_state(p))``; never changes
    the number of compute nodes (a dropped state read is a ``get_attr``); a program without
    preserved calls is returned as it is.

    A driver on the rewriting kernel (``transforms.kernel``): each graph it changes is streamed
    through a ``WorkingGraph`` (a peer read is ``derive`` d from the placeholder it replaces);
    peer names come from ``kernel.fresh_id``.

    **Complexity:** O(n + m) for n nodes and m modules.
    """
    require_program(program, "hold_foreign_state")
    if not any(name for name in program.call_signatures):  # only the root's, if any
        return program
    if not _any_extra_arguments(program):
        return program  # no preserved graph takes more than its signature: nothing to move
    _, carried, callers = carried_state(program)
    moves: dict[Variant, dict[int, str]] = {}
    for key, fqns in carried.items():
        mid, variant = key
        graph = program.module_table()[mid].graphs[variant]
        arity = signature_arity(graph)
        if arity is None:
            continue
        foreign = {
            i: f
            for i, f in enumerate(fqns)
            if i >= arity and f is not None and program.resolve(f.rpartition(".")[0]) is not None
        }
        if foreign:
            moves[key] = foreign
    if not moves:
        return program
    return _rewrite(program, moves, carried, callers)


def signature_arity(graph: Graph) -> int | None:
    """How many leading placeholders are a preserved call's own arguments, or ``None`` when
    ``graph`` is not a preserved call's: its first computation (after placeholders and
    ``get_attr``) is ``flatten_by_spec(((p0, ...), {"k": k, ...}), in_spec)`` over exactly
    its first placeholders, in order (``flattened_arguments``). O(placeholders)."""
    tree = flattened_arguments(graph)
    if tree is None:
        return None
    positional, keywords = tree
    names = tuple(r.name for r in (*positional, *keywords.values()))
    return len(names) if names == tuple(n.name for n in graph.placeholders[: len(names)]) else None


def _any_extra_arguments(program: Program) -> bool:
    """Whether some preserved graph has placeholders after its signature's. O(modules + the
    placeholders of each graph)."""
    for module in program.module_table().values():
        for graph in module.graphs:
            arity = signature_arity(graph)
            if arity is not None and len(graph.placeholders) > arity:
                return True
    return False


def carried_state(program: Program, *, through_attrs: bool = True) -> tuple[
    list[Variant], dict[Variant, list[str | None]], dict[Variant, list[tuple[Variant, str]]]
]:
    """Every (module, variant) that calls from the root reach, callers first (breadth first);
    per one, the state fqn each placeholder carries (``None``: not state, or not the same state
    at every call site); and its call sites as (caller, node name).

    With ``through_attrs`` (``hold_foreign_state``), a ``get_attr`` of state carries its fqn
    and a keyword argument binds the callee's placeholder of its name; without
    (``sink_state``, which leaves out positional arguments only), a placeholder fed by either
    carries ``None``. O(n) for n nodes."""
    table = program.module_table()
    state = program.state_table()
    root_inputs = {
        s.name: s.target for s in program.signature.inputs if s.kind in STATE_INPUT_KINDS
    }
    root_key = (program.root, 0)
    carried: dict[Variant, list[str | None]] = {
        root_key: [root_inputs.get(n.name) for n in program.root_module.graph.placeholders]
    }
    callers: dict[Variant, list[tuple[Variant, str]]] = {}
    order = [root_key]
    paths = {root_key: ""}
    i = 0
    while i < len(order):
        key = order[i]
        i += 1
        mid, variant = key
        path = paths[key]
        graph = table[mid].graphs[variant]
        local = dict(zip((n.name for n in graph.placeholders), carried[key]))
        for node in graph.nodes:
            if through_attrs and node.op == GET_ATTR and program.resolve(node.target, mid) is None:
                fqn = program.attr_fqn(mid, path, node.target)
                local[node.name] = fqn if fqn in state else None
            if node.op != CALL_MODULE:
                continue
            target, k = split_call_target(node.target)
            child = program.resolve(target, mid)
            if child is None or not table[child].graphs:
                continue
            holders = table[child].graphs[k].placeholders
            by_key = dict(node.kwargs.items) if through_attrs else {}
            passed = []
            for j, h in enumerate(holders):
                arg = node.args[j] if j < len(node.args) else by_key.get(h.name)
                passed.append(local.get(arg.name) if isinstance(arg, Ref) else None)
            callee = (child, k)
            callers.setdefault(callee, []).append((key, node.name))
            if callee in carried:
                carried[callee] = [a if a == b else None for a, b in zip(carried[callee], passed)]
            else:
                carried[callee] = passed
                paths[callee] = f"{path}.{target}" if path else target
                order.append(callee)
    return order, carried, callers


def _rewrite(
    program: Program,
    moves: dict[Variant, dict[int, str]],
    carried: dict[Variant, list[str | None]],
    callers: dict[Variant, list[tuple[Variant, str]]],
) -> Program:
    """Apply ``moves`` (preserved graph -> placeholder index -> state fqn), then leave the moved
    arguments out at every call site. A plain (not preserved, not root) caller whose placeholder
    carried that state and is read no more loses it too, and so on up the calls: one round per
    level of calls, each graph rewritten at most once a round."""
    table = program.module_table()
    graphs: dict[Variant, Graph] = {}
    peers: dict[ModuleId, list[tuple[str, ModuleId]]] = {}

    def graph_of(key: Variant) -> Graph:
        return graphs.get(key) or table[key[0]].graphs[key[1]]

    state_names: dict[str, list[str]] = {}  # module path -> names of the state it registers
    for fqn in program.state_order:
        owner, _, name = fqn.rpartition(".")
        state_names.setdefault(owner, []).append(name)
    # callee -> (its graph before the round, the placeholder names it no longer takes)
    dropped: dict[Variant, tuple[Graph, frozenset[str]]] = {}
    for key, foreign in sorted(moves.items()):
        mid, _ = key
        held = peers.setdefault(mid, list(table[mid].peers))
        before = graph_of(key)
        own = state_names.get(program.first_path(mid) or "", ())
        reads = {i: _peer_read(program, mid, held, fqn, own) for i, fqn in foreign.items()}
        graphs[key] = _read_through_peers(before, reads)
        dropped[key] = (before, frozenset(before.placeholders[i].name for i in reads))
        log.debug(
            "hold_foreign_state: preserved module %r reads %s through peers",
            program.first_path(mid), sorted(reads.values()),
        )
    root_key = (program.root, 0)
    while dropped:
        at_caller: dict[Variant, dict[str, tuple[Graph, frozenset[str]]]] = {}
        for callee, change in dropped.items():
            for caller, node_name in callers.get(callee, ()):
                at_caller.setdefault(caller, {})[node_name] = change
        dropped = {}
        for caller, calls in sorted(at_caller.items()):
            after = _drop_arguments(graph_of(caller), calls)
            graphs[caller] = after
            if caller == root_key or signature_arity(after) is not None:
                continue  # the root's and a preserved call's own inputs stay
            graph = table[caller[0]].graphs[caller[1]]
            unused = _unused_state_inputs(after, graph, carried[caller])
            if unused:
                w = kn.WorkingGraph(after, indexed=False)
                w.leave_out(unused)
                graphs[caller] = w.finish()[0]
                dropped[caller] = (after, unused)
    modules = program.modules
    for mid in sorted({key[0] for key in graphs}):
        mod = table[mid]
        variants = tuple(graphs.get((mid, k), g) for k, g in enumerate(mod.graphs))
        held = tuple(peers.get(mid, mod.peers))
        modules = modules.set(mid, mod.replace(graphs=variants, peers=held))
    return program.replace(modules=modules)


def _unused_state_inputs(
    graph: Graph, original: Graph, carried: list[str | None]
) -> frozenset[str]:
    """The placeholders of ``graph`` that carry state (by ``original``'s placeholder order) and
    that no node reads."""
    fqn_of = dict(zip((h.name for h in original.placeholders), carried))
    used = {r.name for n in graph.nodes for r in n.inputs()}
    return frozenset(
        h.name for h in graph.placeholders if fqn_of.get(h.name) is not None and h.name not in used
    )


def _peer_read(
    program: Program,
    mid: ModuleId,
    peers: list[tuple[str, ModuleId]],
    fqn: str,
    own_state: Iterable[str],
) -> str:
    """The ``get_attr`` target that reads ``fqn`` in module ``mid`` through a peer holding its
    owner (added to ``peers`` when new, named unlike ``mid``'s children, peers and
    ``own_state``, the names of the state it registers)."""
    owner_path, _, attr = fqn.rpartition(".")  # the module that registers it ("": the root)
    owner = program.resolve(owner_path)
    for name, held in peers:
        if held == owner:
            return f"{name}.{attr}"
    mod = program.module_table()[mid]
    taken = Names([n for n, _ in mod.children] + [n for n, _ in peers] + list(own_state))
    base = "_peer_" + (owner_path.replace(".", "_") or "root")
    name = kn.fresh_id(base, taken)
    peers.append((name, owner))
    return f"{name}.{attr}"


def _read_through_peers(graph: Graph, reads: dict[int, str]) -> Graph:
    """``graph`` with placeholder ``i`` of ``reads`` replaced by ``get_attr`` ``reads[i]`` (same
    name and meta, derived by a ``kernel.WorkingGraph``), placed after the placeholders that
    stay. O(nodes)."""
    placeholders = graph.placeholders
    w = kn.WorkingGraph(graph, indexed=False)
    for i, n in enumerate(placeholders):
        if i not in reads:
            w.keep(n)
    for i, target in sorted(reads.items()):
        ph = placeholders[i]
        w.add(w.derive(ph, name=ph.name, op=GET_ATTR, target=target, args=(), kwargs=EMPTY_DICT))
    for n in graph.nodes[len(placeholders) :]:
        w.keep(n)
    return w.finish()[0]


def _drop_arguments(graph: Graph, calls: dict[str, tuple[Graph, frozenset[str]]]) -> Graph:
    """``graph`` with, for each call node named in ``calls``, the arguments it binds to the
    callee's placeholders that are dropped left out (positionally, or by keyword past the
    positional ones; the callee's graph before the drop says which); a ``get_attr`` that only
    those arguments read is dropped too. Streamed through a ``kernel.WorkingGraph``. O(nodes)."""
    nodes = []
    released: set[str] = set()
    for node in graph.nodes:
        change = calls.get(node.name)
        if change is None:
            nodes.append(node)
            continue
        callee, names = change
        holders = callee.placeholders
        gone = {j for j, h in enumerate(holders) if h.name in names}
        by_name = {holders[j].name for j in gone if j >= len(node.args)}
        for j, a in enumerate(node.args):
            if j in gone and isinstance(a, Ref):
                released.add(a.name)
        for k, v in node.kwargs.items:
            if k in by_name and isinstance(v, Ref):
                released.add(v.name)
        args = tuple(a for j, a in enumerate(node.args) if j not in gone)
        kwargs = IDict(tuple((k, v) for k, v in node.kwargs.items if k not in by_name))
        nodes.append(node.replace(args=args, kwargs=kwargs))
    used = {r.name for n in nodes for r in n.inputs()}
    stale = {n.name for n in nodes if n.op == GET_ATTR and n.name in released - used}
    w = kn.WorkingGraph(graph, indexed=False)
    for n in nodes:
        if n.name in stale:
            w.drop(n.name)
        else:
            w.keep(n)
    return w.finish()[0]
