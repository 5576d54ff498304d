"""The program a search chose: extraction per graph (``plan``) and the program built from it.

``plan`` costs each e-node of one graph's saturated e-graph with the cost model, chooses with
``extract.greedy`` (and ``extract.exact`` where scipy is installed and it is cheaper), checks
the choice (``extract.complete``) and says whether it changes the graph. ``Builder`` is the
``visit`` of ``transforms.edit.rewrite_nodes`` that builds the choice: the one place that
edits the program, through ``rewrite_nodes``, a driver on the shared rewriting kernel
(``transforms.kernel``). A rewrite of several results is tried as one (``extract.together``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import attrs

from ir import ops
from ir.args import IDict, IList, Ref, thaw
from ir.effects import binds_symbols, graph_effects, shares_first
from ir.errors import PassError
from ir.graph import Graph
from ir.module import ModuleId
from ir.node import CALL_FUNCTION, OUTPUT, PLACEHOLDER, Node
from ir.program import Program
from transforms import kernel as kn
from transforms.rewrite import egraph, extract
from transforms.rewrite.cost import Cost, node_cost
from transforms.rewrite.egraph import LEAF, EGraph, ENode, GraphEGraph, escapes, passes_on

__all__ = ["EXACT_MAX", "TOGETHER_SECONDS", "Builder", "Plan", "drop_dead", "output_alias",
           "plan", "shared_escape"]

EXACT_MAX = 5_000  #: e-nodes past which the exact (ILP) extraction is not tried
TOGETHER_SECONDS = 2.0
"""Seconds ``together`` may take past the deadline (a search that used its seconds still
tries its first groups of several results: about 30 at 16k classes)."""


@attrs.define
class Plan:
    """What to build for one graph: ``geg`` and ``choice`` (class -> e-node); ``changes``:
    whether the choice differs from the graph; ``rules_used``: the rule of each chosen e-node
    that a rule made; ``extractor``: ``"greedy"`` or ``"ilp"``; ``cut``: the deadline had passed
    when the groups of several results were tried together (``extract.together``): some may
    not have been."""

    geg: GraphEGraph
    choice: dict[int, ENode]
    changes: bool
    rules_used: list[str]
    extractor: str
    cut: bool = False


def plan(geg: GraphEGraph, graph: Graph, cost: Cost, deadline: float, *,
         frozen: bool = True) -> Plan:
    """The extraction of ``geg`` (of ``graph``) under ``cost``: greedy, the groups of several
    results tried together, then exact where scipy is installed, time is left (``deadline``, a
    ``time.monotonic`` value) and some class has a choice; the exact choice kept where its DAG
    cost over what the built program computes (``_needed``: not what only a dropped leaf
    reads) is strictly lower and it passes the escape and alias guards (else the choice so far
    stands: where costs tie, the ILP changes nothing). Complexity: O(e-nodes log
    e-nodes) greedy (``extract.greedy``), one cost-model call per e-node; the exact solve only
    up to ``EXACT_MAX`` e-nodes and within ``deadline``; ``together`` O(``extract.GROUPS_MAX``
    x classes reached), its groups tried until ``deadline`` or for ``TOGETHER_SECONDS``,
    whichever is later (``Plan.cut`` where that passed).
    Greedy is never cut: bounded by ``limits.node_limit``, about a second at 20k e-nodes.

    What costs nothing: an e-node whose children are all ``ClassData.invariant`` (computed from
    unwritten state alone), where ``frozen`` (the caller folds every such value); with
    ``frozen=False`` only such an e-node of a ``fold_state`` rule (``ENode.folds``: the caller
    folds what those rules made, as ``rewrite`` does). Classes are marked invariant only where
    ``from_graph`` was asked to (``frozen_state``)."""
    eg = geg.eg
    memo: dict[tuple, float] = {}

    def of(n: ENode) -> float:
        if n.op == LEAF:
            return 0.0
        n = eg.canonical(n)
        if (n.children and (frozen or n.folds)
                and all(eg.data[ch].invariant for ch in n.children)):
            return 0.0  # the same at every call: computed once (cost.invariant_values)
        found = memo.get(n.key)
        if found is None:
            c = eg.lookup(n)
            vals = {f"#{i}": eg.data[eg.find(ch)].val for i, ch in enumerate(n.children)}
            out = eg.data[c].val if c is not None else None
            found = memo[n.key] = node_cost(cost, n.op, n.args, n.kwargs, vals.get, out)
        return found

    prefer: dict[int, ENode] = {}
    for name, e in geg.own.items():
        prefer.setdefault(eg.find(geg.class_of[name]), e)
    choice = extract.greedy(eg, geg.roots, of, prefer)
    extractor = "greedy"
    cut = False
    held: dict[int, tuple] = {}
    if eg.groups:
        alone = choice
        until = max(deadline, time.monotonic() + TOGETHER_SECONDS)
        choice = extract.together(eg, geg.roots, choice, of, eg.groups, until)
        cut = time.monotonic() >= until
        held = _held_projections(geg)
        if shared_escape(eg, geg.roots, choice, held):
            choice = alone
            if shared_escape(eg, geg.roots, choice, held):
                return Plan(geg, choice, False, [], extractor, cut)  # keep the graph as it is
    remaining = deadline - time.monotonic()
    if (remaining > 0 and eg.size <= EXACT_MAX
            and any(len(eg.classes[c]) > 1 for c in choice)):
        needed, reads = _needed(geg, graph)
        better = extract.exact(eg, needed, of, seconds=remaining, reads=reads)
        if better is not None and (extract.dag_cost(eg, needed, better, of, reads)
                                   < extract.dag_cost(eg, needed, choice, of, reads)
                                   * (1 - 1e-9)):
            # the classes only a dropped leaf reads keep their e-node: acyclic, as no class
            # of the exact choice reads one outside it. Kept only where it passes the guards
            # the choice so far passes (else that choice stands)
            trial = {**choice, **better}
            if (extract.complete(eg, geg.roots, trial)
                    and not (eg.groups and shared_escape(eg, geg.roots, trial, held))
                    and not output_alias(geg, graph, trial)):
                choice, extractor = trial, "ilp"
    if not extract.complete(eg, geg.roots, choice):
        return Plan(geg, choice, False, [], extractor, cut)  # never expected: keep the graph
    if output_alias(geg, graph, choice):
        return Plan(geg, choice, False, [], extractor, cut)  # an output would alias: keep it
    changes = any((c := eg.find(geg.class_of[name])) in choice
                  and eg.canonical(choice[c]).key != eg.canonical(e).key
                  for name, e in geg.own.items())
    reached = egraph.walk_classes(eg, geg.roots, lambda c: choice[c].children)
    used = [choice[c].rule for c in reached if choice[c].rule is not None]
    return Plan(geg, choice, changes, used, extractor, cut)


def _needed(geg: GraphEGraph, graph: Graph) -> tuple[list[int], dict[int, list[int]]]:
    """The classes the built program must compute, as ``extract.exact`` and ``dag_cost``
    take them: those the output and the kept leaves read; and, for each leaf that
    ``drop_dead`` drops where nothing reads it (a metadata check goes with its value; a node
    that computes nothing, ``passes_on``), its class -> the classes it reads. ``geg.roots``
    counts the latter as read always, so a fused attention paid for the eager softmax that
    its ``.to`` check reads. O(n)."""
    eg = geg.eg
    vals = {n.name: n.meta.get("val") for n in graph.nodes}
    needed: list[int] = []
    reads: dict[int, list[int]] = {}
    for n in graph.nodes:
        if n.op != OUTPUT and n.name not in geg.leaves:
            continue
        stale = geg.versions.rebind.get(n.name, {})
        ins = [eg.find(geg.class_of[stale.get(r.name, r.name)]) for r in n.inputs()
               if stale.get(r.name, r.name) in geg.class_of]
        if (n.op == CALL_FUNCTION and n.name in geg.class_of
                and (ops.is_metadata_check(n.target) or passes_on(n, vals) is not None)):
            reads.setdefault(eg.find(geg.class_of[n.name]), []).extend(ins)
        else:
            needed.extend(ins)
    return list(dict.fromkeys(needed)), reads


def _held_projections(geg: GraphEGraph) -> dict[int, tuple]:
    """For each class holding exactly one value of the program where that value is a
    ``getitem`` (a projection of a list the program holds, ``egraph.value_roles``): the key
    of its own e-node. Choosing it builds the program's own view: no new aliasing. O(n)."""
    eg = geg.eg
    count: dict[int, int] = {}
    for name in geg.own:
        c = eg.find(geg.class_of[name])
        count[c] = count.get(c, 0) + 1
    held: dict[int, tuple] = {}
    for name, e in geg.own.items():
        c = eg.find(geg.class_of[name])
        if count[c] == 1 and getattr(e.op, "__name__", "") == "getitem":
            held[c] = eg.canonical(e).key
    return held


def shared_escape(eg: EGraph, roots: Any, choice: Mapping[int, ENode],
                  held: Mapping[int, tuple] | None = None) -> bool:
    """Whether ``choice`` would build two escaping values (``egraph.escapes``: returned or
    read by a leaf, themselves or through views) as ``getitem`` s of one value that is no
    leaf of the program (a ``split`` of a rewrite of several results, or one the program
    holds): they would alias each other where the program's values did not. ``held``: class
    -> the key of the program's own ``getitem`` that the class alone holds
    (``_held_projections``); choosing it keeps an aliasing the program has, and is not
    counted. ``saturate`` declines such a rewrite when it is applied; this checks the choice
    again, since a later merge may make a result escape. O(classes reached x views
    followed)."""
    held = held or {}
    pinned = {eg.find(r) for r in roots}
    by_base: dict[int, int] = {}
    for c in egraph.walk_classes(eg, roots, lambda c: choice[c].children if c in choice else ()):
        n = choice.get(c)
        if n is None:
            continue  # an incomplete choice: ``complete`` refuses it
        if getattr(n.op, "__name__", "") != "getitem" or not n.children:
            continue
        base = eg.find(n.children[0])
        if (eg.data[base].leaf or held.get(c) == eg.canonical(n).key
                or not escapes(eg, c, pinned)):
            continue
        by_base[base] = by_base.get(base, 0) + 1
        if by_base[base] > 1:
            return True
    return False


def output_alias(geg: GraphEGraph, graph: Graph, choice: Mapping[int, ENode]) -> bool:
    """Whether building ``choice`` may give an output of ``graph`` the memory of a leaf (an
    input, state, a constant, an effect's result) or of another output, where the graph's
    own outputs did not share it: a class that a rule merged with its input (``x * 1 ->
    x``, ``guards.alias_guard``) holds that input as a leaf e-node of cost 0, which
    extraction picks, and a later merge may make such a class returned.

    Memory is followed down views, alias-like operators and ``getitem`` s (their first
    argument) and, in the graph, nodes that compute nothing (``egraph.passes_on``, as the
    e-graph does): in the graph to the node a returned value is the memory of; in the choice
    to a chosen leaf (then that node, followed in the graph) or to a class. Each returned
    value may be built two ways (``Builder``): the first of its class to be reached takes
    the class's chosen value unless the class was made before it, every other keeps its own
    node (over its children's values): both are counted. ``saturate`` declines such merges
    where it makes them; this checks the choice again, as ``shared_escape`` does for
    rewrites of several results. O(outputs x views followed)."""
    eg = geg.eg
    table = graph.by_name()
    vals = {n.name: n.meta.get("val") for n in graph.nodes}

    def memory_of(name: str) -> str:
        seen: set[str] = set()
        while name not in seen:
            seen.add(name)
            n = table.get(name)
            if n is None or n.op != CALL_FUNCTION:
                return name
            source = passes_on(n, vals)
            first = n.args[0] if n.args else None
            if source is None and type(first) is Ref and shares_first(n.target):
                source = first.name
            if source is None:
                return name
            name = source
        return name

    def built(c: int) -> tuple:
        seen: set[int] = set()
        c = eg.find(c)
        while c not in seen:
            seen.add(c)
            n = choice.get(c)
            if n is None:
                return ("class", c)
            if n.op == LEAF:
                return ("name", memory_of(n.canon[0]))
            if not (n.children and shares_first(n.op)):
                return ("class", c)
            c = eg.find(n.children[0])
        return ("class", c)

    def kept(name: str) -> tuple:
        own = geg.own.get(name)
        if own is None:
            return ("name", memory_of(name))
        if own.children and shares_first(own.op):
            return built(own.children[0])
        return ("own", name)

    returned: dict[str, None] = {}
    for n in graph.nodes:
        if n.op == OUTPUT:
            returned.update((r.name, None) for r in n.inputs())
    firsts: set[int] = set()
    holders: dict[tuple, set[str]] = {}
    for name in returned:
        if name not in geg.class_of:
            continue
        c = eg.find(geg.class_of[name])
        ways = {kept(name)}
        if c not in firsts:
            firsts.add(c)
            ways.add(built(c))
        was = memory_of(name)
        for way in ways:
            if way[0] == "name" and way[1] != was:
                return True
            holders.setdefault(way, set()).add(was)
    return any(len(v) > 1 for v in holders.values())


class Builder:
    """The ``visit`` of ``rewrite_nodes`` that builds the chosen program: a pure node whose
    class's chosen e-node is its own is kept; else its class's value is emitted (its chosen
    e-node, children first) and takes its place; a class already emitted is reused. A choice
    that would read a leaf defined later keeps the node as it is.

    A write seen functionally (``GraphEGraph.versions``) is always replaced: by its class's
    value where one was made or chosen, else by its functional twin on the same arguments; the
    in-place node is then unread and ``drop_dead`` drops it (``writes``: per graph, by
    ``id``, the writes replaced). A node that reads a written value by an older name after the
    write (``Versions.rebind``) is given the version's value instead. So no value of the built
    program is written where the e-graph saw a write functionally, and sharing one value
    between equal classes stays sound."""

    def __init__(self, plans: Mapping[int, Plan]) -> None:
        self.plans = plans
        self.made: dict[int, dict[int, Ref]] = {}
        self.returned: dict[int, frozenset[str]] = {}
        self.writes: dict[int, set[str]] = {}
        self.folds: set[str] = set()  # nodes emitted for e-nodes of fold_state rules

    def __call__(self, node: Node, e: Any) -> Ref | None:
        plan = self.plans.get(id(e.graph))
        if plan is None or not plan.changes:
            return None
        geg, eg = plan.geg, plan.geg.eg
        made = self.made.setdefault(id(e.graph), {})
        twin = geg.versions.functional.get(node.name)
        args, kwargs = e.args, e._kwargs
        stale = geg.versions.rebind.get(node.name)
        if stale:
            swap = {old: made[eg.find(geg.class_of[now])] for old, now in stale.items()}
            args = _reread(node.args, args, swap)
            kwargs = _reread(node.kwargs, kwargs, swap)
            if twin is None:
                e.args, e.kwargs = args, dict(kwargs.items)
        if twin is not None:
            return self._functional(plan, node, e, made, twin, args, dict(kwargs.items))
        if node.name not in geg.own:
            return None
        c = eg.find(geg.class_of[node.name])
        if c in made:
            if made[c].name == node.name or node.name in self._returned(e.graph):
                # a returned value keeps its own tensor: sharing another's would make two
                # outputs (or an output and a later write) alias where they did not
                return None
            return made[c]
        chosen = plan.choice.get(c)
        if chosen is None or eg.canonical(chosen).key == eg.canonical(geg.own[node.name]).key:
            made[c] = node.ref
            return None
        here = geg.position[node.name]
        if not self._feasible(plan, c, here, made):
            made[c] = node.ref
            return None
        return self._emit(plan, c, e, made)

    def _functional(self, plan: Plan, node: Node, e: Any, made: dict[int, Ref], twin: Any,
                    args: tuple, kwargs: dict) -> Ref:
        """The value replacing the write ``node``: its class's value where one was made (not
        for a returned write, which keeps a tensor of its own), the chosen e-node where it
        is not the write's own and can be built here, else ``twin(*args, **kwargs)``."""
        geg, eg = plan.geg, plan.geg.eg
        c = eg.find(geg.class_of[node.name])
        self.writes.setdefault(id(e.graph), set()).add(node.name)
        if c in made and node.name not in self._returned(e.graph):
            return made[c]
        chosen = plan.choice.get(c)
        if (c not in made and chosen is not None
                and eg.canonical(chosen).key != eg.canonical(geg.own[node.name]).key
                and self._feasible(plan, c, geg.position[node.name], made)):
            return self._emit(plan, c, e, made)
        ref = e.call(twin, *args, **kwargs)
        made.setdefault(c, ref)
        return ref

    def _returned(self, graph: Graph) -> frozenset[str]:
        found = self.returned.get(id(graph))
        if found is None:
            found = self.returned[id(graph)] = frozenset(
                r.name for n in graph.nodes if n.op == OUTPUT for r in n.inputs()
            )
        return found

    def _feasible(self, plan: Plan, c: int, here: int, made: Mapping[int, Ref]) -> bool:
        geg, choice = plan.geg, plan.choice

        def step(x: int) -> tuple[int, ...]:
            return () if x in made or choice[x].op == LEAF else choice[x].children

        for x in egraph.walk_classes(geg.eg, (c,), step):
            n = choice.get(x)
            if x not in made and (n is None or (n.op == LEAF and geg.position[n.canon[0]] >= here)):
                return False
        return True

    def _emit(self, plan: Plan, c: int, e: Any, made: dict[int, Ref]) -> Ref:
        eg = plan.geg.eg
        stack = [(eg.find(c), False)]
        while stack:
            x, ready = stack.pop()
            if x in made:
                continue
            n = plan.choice[x]
            if n.op == LEAF:
                made[x] = Ref(n.canon[0])
                continue
            kids = [eg.find(k) for k in n.children]
            if not ready:
                stack.append((x, True))
                stack.extend((k, False) for k in kids if k not in made)
                continue
            env = {f"#{i}": made[k] for i, k in enumerate(kids)}
            args = thaw(n.args, lambda r, env=env: env[r.name])
            kwargs = thaw(n.kwargs, lambda r, env=env: env[r.name])
            made[x] = e.call(n.op, *args, **kwargs)
            if n.folds:
                self.folds.add(made[x].name)
        return made[eg.find(c)]


def _reread(orig: Any, now: Any, swap: Mapping[str, Ref]) -> Any:
    """``now`` (arguments with the edit's replacements) with each ``Ref`` that is, in
    ``orig`` (the same arguments as the program has them), a name in ``swap`` replaced by
    its value there. ``orig`` and ``now`` have one shape. O(size)."""
    if type(orig) is Ref:
        return swap.get(orig.name, now)
    if type(orig) is tuple:
        return tuple(_reread(a, b, swap) for a, b in zip(orig, now))
    if type(orig) is IList:
        return IList(tuple(_reread(a, b, swap) for a, b in zip(orig.items, now.items)))
    if type(orig) is IDict:
        return IDict(tuple((k, _reread(a, b, swap))
                           for (k, a), (_, b) in zip(orig.items, now.items)))
    return now


def drop_dead(before: Program, after: Program,
              writes: Mapping[int, Any] | None = None) -> Program:
    """``after`` (the built program) without what the extracted choice left unread in the graphs
    it changed (those that are not ``before``'s own objects): nodes that nothing kept reads
    and that have no effect, where a node that computes nothing (``egraph.passes_on``: an
    eval-mode dropout, which draws no random numbers; a ``.to`` that keeps the dtype) counts
    as effect-free, and a metadata check (``_assert_tensor_metadata``) goes with the value it
    checks. ``rewrite_nodes`` keeps both (a dropout is impure by its operator's facts; a check
    it did not emit reads its value): the greedy engine drops them with a match, and so must
    the search, or a fused attention keeps its eager softmax alive. ``writes`` (id of a graph
    of ``before`` -> names, ``Builder.writes``): the in-place writes the builder replaced by
    their functional values; each is unread and dropped, its write with it (every later
    reader of the memory it wrote reads the functional value instead).

    Raises:
        PassError: a replaced write is still read (never expected: the builder's invariant).

    **Laws:** ``drop_dead(p, p) is p``; the outputs, state and effects of ``after`` unchanged
    (but the replaced writes, which nothing observes). O(n) in the changed graphs' nodes."""
    if after is before:
        return after
    from transforms.machinery.each_graph import map_graphs, signature_names

    old = {id(g) for mod in before.module_table().values() for g in mod.graphs}
    named = signature_names(after)
    writes = writes or {}

    def replaced(mid: ModuleId, graph: Graph) -> frozenset[str]:
        """The replaced writes of ``graph``: those of the graph of ``before`` in its place."""
        now = after.module_table()[mid].graphs
        was = before.module_table()[mid].graphs if mid in before.module_table() else ()
        for i, g in enumerate(now):
            if g is graph and i < len(was):
                return frozenset(writes.get(id(was[i]), ()))
        return frozenset()

    def clean(mid: ModuleId, graph: Graph) -> Graph:
        if id(graph) in old:
            return graph
        dead = replaced(mid, graph) if writes else frozenset()
        effects = graph_effects(after, mid, graph)
        vals = {n.name: n.meta.get("val") for n in graph.nodes}
        live: set[str] = set()
        keep: set[str] = set()
        checks: list[Node] = []
        for n in reversed(graph.nodes):
            if n.op not in (PLACEHOLDER, OUTPUT) and ops.is_metadata_check(n.target):
                checks.append(n)
                continue
            if (
                n.op in (PLACEHOLDER, OUTPUT)
                or n.name in live
                or n.name in named
                or binds_symbols(n)
                or (effects.has_effect(n.name) and passes_on(n, vals) is None
                    and n.name not in dead)
            ):
                if n.name in dead:
                    raise PassError(
                        f"saturate: the write %{n.name}, replaced by its functional value, is "
                        "still read: please report this program")
                keep.add(n.name)
                live.update(r.name for r in n.inputs())
        keep.update(c.name for c in checks if all(r.name in live for r in c.inputs()))
        if len(keep) == len(graph.nodes):
            return graph
        return kn.built(n for n in graph.nodes if n.name in keep)

    return map_graphs(after, clean)
