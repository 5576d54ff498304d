"""``saturate``: rules applied by equality saturation, then the cheapest program extracted.

Where ``rewrite`` applies rules greedily (each match taken, the first rule by benefit), here
every match *adds* its replacement to an e-graph (``egraph``) beside what it matched, as an
equal value, until nothing new is found or a limit is reached; then ``extract`` chooses, per
value, the cheapest way to compute it under a cost model (``cost``). A rule and its reverse
never cycle: the second only finds the first's result already in the class. The program is
rebuilt through ``transforms.edit.rewrite_nodes`` (names, module stacks, fake values,
signatures), and kept only if it is cheaper than the program and than greedy ``rewrite``'s.
Design, walk-through and limits: ``docs/search.md``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from itertools import pairwise
from types import MappingProxyType
from typing import Any

import attrs
import torch

from ir import ops
from ir.args import IDict, IList, Ref, thaw
from ir.effects import shares_first, view_base
from ir.errors import PassError
from ir.gcpause import gc_paused
from ir.graph import Graph
from ir.node import CALL_FUNCTION, OUTPUT, PLACEHOLDER, Node
from ir.program import Program, require_program
from transforms import kernel as kn
from transforms.edit import rewrite_nodes
from transforms.machinery.each_graph import walked_graphs
from transforms.rewrite.cost import Cost, invariant_values, program_cost, roofline
from transforms.rewrite.egraph import (
    ESCAPE_CAP,
    LEAF,
    ClassData,
    EGraph,
    ENode,
    GraphEGraph,
    covered,
    enode_of,
    escapes,
    from_graph,
    spell,
)
from transforms.rewrite.ematch import EMatch, ematch_counted, ematch_value, exact, result_nodes
from transforms.rewrite.engine import apply_rules
from transforms.rewrite.guards import shares_storage, where_holds
from transforms.rewrite.result_sharing import output_bases
from transforms.rewrite.rule import (
    Rule,
    replacement_for,
)
from transforms.rewrite.ruleset import Directed, directions, prepare
from transforms.rewrite.search_result import Builder, Plan, drop_dead, plan
from transforms.rewrite.state_fold import fold_into_state

__all__ = ["SaturationLimits", "SaturationReport", "saturate", "saturate_report"]

GREEDY_SHARE = 0.5
"""Of ``limits.seconds``, counted from the call's start (the rules checked), what the greedy ``rewrite`` compared
against may take (it runs first; a cut one is compared as far as it got)."""

SEARCH_SHARE = 0.75
"""Of ``limits.seconds``, counted from the call's start (the rules checked), where saturation stops and
extraction's optional work (the exact ILP, ``extract.together``) with it: the greedy
``rewrite``'s time is taken from it, and the last quarter is left for extraction's greedy pass
and building the program, which are not cut."""


@attrs.frozen
class SaturationLimits:
    """When saturation stops: ``nodes`` (e-nodes held per graph; by default, ``None``, the
    larger of ``NODES`` and ``growth`` times the graph's e-nodes as built: ``node_limit``,
    so that a program of many blocks may grow each block as far as one block alone may; a
    number is that many whatever the program), ``iterations`` (rounds of
    matching per graph), ``seconds`` (wall time for the whole ``saturate`` call, split in
    ``saturate_report``: the greedy ``rewrite`` compared against stops at ``GREEDY_SHARE`` of
    it, the search (saturation and extraction's optional work) at ``SEARCH_SHARE``, the rest
    left for extraction's greedy pass and the build), and the backoff
    scheduler's ``match_limit`` (matches a rule may make in one round before it is banned;
    default the larger of 1000 and the graph's node count) and ``ban_length`` (rounds it is banned for; both doubled each time it is banned again)."""

    nodes: int | None = None
    iterations: int = 30
    seconds: float = 20.0
    match_limit: int | None = None
    ban_length: int = 2
    growth: float = 16.0

    def node_limit(self, built: int) -> int:
        """The e-nodes a graph whose e-graph held ``built`` as built may grow to: ``nodes``
        where given, else the larger of ``NODES`` and ``growth`` x ``built``. O(1)."""
        if self.nodes is not None:
            return self.nodes
        return max(NODES, int(self.growth * built))


NODES = 20_000
"""The least e-node limit per graph where ``SaturationLimits.nodes`` is not given (a small
program's e-graph may grow to it, as it did before the limit scaled with the program)."""


@attrs.frozen
class SaturationReport:
    """What ``saturate_report`` did.

    - ``sizes``: per graph (in module-walk order), the e-graph's e-nodes after building and
      after each round; ``(0,)`` for a graph not searched, its search's share of
      ``limits.seconds`` (``SEARCH_SHARE``) spent before it began (the graph is kept as it is);
    - ``stopped``: per graph, why saturation stopped: ``"saturated"`` (nothing new),
      ``"nodes"``, ``"iterations"`` or ``"seconds"`` (the limit reached; for ``seconds``,
      the search's share of it, ``SEARCH_SHARE``), followed by
      ``"; extraction cut by seconds"`` where ``limits.seconds`` passed before extraction had
      tried every rewrite of several results together (``extract.together``);
    - ``cost_before``, ``cost_after``: the cost model summed over the program and the result;
    - ``chosen``: which program was kept: ``"saturate"`` (the extracted one), ``"greedy"``
      (``rewrite``'s was cheaper) or ``"original"`` (nothing cheaper: ``p`` itself);
    - ``extractor``: ``"greedy"`` (tree-cost choice) or ``"ilp"`` (the exact integer program,
      where ``scipy`` is installed and it found a cheaper DAG);
    - ``greedy_cost``: the cost of greedy ``rewrite``'s program on the same rules (``None``
      when it raised, e.g. a rule and its reverse cycling there);
    - ``greedy_cut``: ``None`` where that ``rewrite`` reached its fixpoint; else where its
      share of ``limits.seconds`` (``GREEDY_SHARE``) ran out (``RewriteReport.cut``): its
      cost, and its program where ``chosen`` is ``"greedy"``, are of the rewrites taken by
      then, a right program less rewritten;
    - ``rewrites``: ``{rule name: values of the kept program computed by that rule's
      replacement}`` (the replacement's result e-node, chosen by extraction; empty
      unless ``chosen`` is ``"saturate"``);
    - ``skipped_rules``: ``{rule name: why saturate does not apply it}`` (a result that is an
      input, a literal or another result again; assumptions not granted; a reverse that
      computes nothing);
    - ``seconds``: wall time of each phase (``check`` the rules, ``saturate``, ``extract``,
      ``build``, ``greedy`` rewrite and costing): a measurement, the one field that is not
      a function of the arguments;
    - ``classes``: per graph, the e-graph's e-classes after building and after each round
      (``sizes``' twin: their gap is what the rounds proved equal);
    - ``state``: how values computed from state alone were costed: ``"charged: ..."`` (the
      default: at every call, as the result runs them) or ``"frozen: N values ... folded into
      constants"`` (``frozen_state=True``: free, and folded in the result). Either way
      ``cost_before`` and ``cost_after`` are what one call of ``p`` and of the result run.
    """

    sizes: tuple[tuple[int, ...], ...]
    stopped: tuple[str, ...]
    cost_before: float
    cost_after: float
    chosen: str
    extractor: str
    greedy_cost: float | None
    rewrites: Mapping[str, int]
    skipped_rules: Mapping[str, str]
    seconds: Mapping[str, float] = MappingProxyType({})
    classes: tuple[tuple[int, ...], ...] = ()
    greedy_cut: str | None = None
    state: str = "charged"

    def __str__(self) -> str:
        cut = "" if self.greedy_cut is None else f", cut by seconds in {self.greedy_cut}"
        lines = [
            (f"cost: {self.cost_before:.1f} -> {self.cost_after:.1f} ({self.chosen}; "
             f"extraction {self.extractor}; greedy rewrite "
             f"{'raised' if self.greedy_cost is None else f'{self.greedy_cost:.1f}'}{cut})"),
            "rewrites: " + (", ".join(f"{k} {v}" for k, v in self.rewrites.items()) or "none"),
            f"state: {self.state}",
        ]
        for i, (sizes, why) in enumerate(zip(self.sizes, self.stopped)):
            counted = self.classes[i] if i < len(self.classes) else ()
            tail = f"; e-classes {' '.join(map(str, counted))}" if counted else ""
            lines.append(f"graph {i}: e-nodes {' '.join(map(str, sizes))}{tail}; stopped: {why}")
        for name, why in self.skipped_rules.items():
            lines.append(f"not applied: {name!r}: {why}")
        return "\n".join(lines)


def saturate(
    p: Program, rules: Iterable[Rule], *, cost: Cost | None = None,
    limits: SaturationLimits | None = None, assume: Any = frozenset(),
    frozen_state: bool = False, verdicts: Any = None,
) -> Program:
    """The cheapest program equal to ``p`` that ``rules`` reach, found by equality saturation.

    Parameters:
        p: a Program, flat (``import_ep``) or outlined (``transform``); each distinct graph is
            searched once (a graph shared by several calls once).
        rules: ``Rule`` values, checked once (``check_rule``, unless ``trusted``) as
            ``rewrite`` checks them; a rule with ``both_ways=True`` is applied in both
            directions, and so is any rule passed together with its reverse, without cycling.
            A rule of several results (``x @ w1, x @ w2 -> split(x @ cat(w1, w2))``) is
            matched result by result and its results merged together; not where two results
            sharing one buffer would both be returned (``docs/search.md``). A replacement
            that returns its input (``x * 1.0 -> x``) or a view of one is merged where the
            result and the input do not both escape (returned, or read by a leaf; an input
            or state value always does), and the extracted program is checked so that no
            output aliases an input or another output where ``p``'s did not.
        cost: ``(target, args, kwargs, val) -> float`` (tensors replaced by their fake values;
            ``val`` the result's), default ``transforms.rewrite.cost.roofline``;
            ``transforms.rewrite.cost.measured_cost()`` times operators instead.
        limits: a ``SaturationLimits`` (default one).
        assume: the assumptions granted, as in ``rewrite(..., assume=)``: a rule whose
            ``assumes`` are not all granted is neither checked nor applied.
        frozen_state: ``False`` (the default): every value is charged at every call, those
            computed from state alone (parameters, buffers, constants) included, since the
            result recomputes them at each call. ``True``: the caller will neither train the
            result nor load other state into it, so such values (``cost.invariant_values``)
            are free to the search and are folded into new constants
            (``fold.fold_into_state``: ``<module>._folded_<node>``, outside the state dict)
            in the returned program, greedy ``rewrite``'s included, so that its per-call cost
            is what it runs (``report.state``).
        verdicts: where ``check_rule``'s verdicts are kept between processes, as in
            ``rewrite(..., verdicts=)``: ``None`` for the default store, a directory, or
            ``False`` for none.

    Returns:
        ``p`` itself (``is p``) when nothing cheaper was found; else the cheaper of the
        extracted program and greedy ``rewrite``'s on the same rules (ties: the extracted).

    Raises:
        ValueError: ``assume`` holds an unknown flag. PassError: naming the rule, when a rule
        is malformed or ``check_rule`` finds it wrong; ``limits`` not a ``SaturationLimits``.

    **Laws:**

    - semantics: the result computes what ``p`` computes, up to each rule's tolerance, on the
      inputs the granted assumptions admit (``rewrite``'s in-context law);
    - purity: ``p`` is never written; ``saturate(p, []) is p``;
    - never worse: ``cost(result) <= cost(p)`` and ``<= cost(rewrite(p, rules))`` (where
      greedy ``rewrite`` is cut by its share of ``limits.seconds``, ``report.greedy_cut``:
      ``<=`` the cost of what it reached).

    Complexity: O(e-nodes x rules x pattern size) per round, at most ``limits.iterations``
    rounds and ``limits.node_limit(n)`` e-nodes per graph of ``n`` e-nodes as built; extraction O(e-nodes log e-nodes)
    (``extract.greedy``); one greedy ``rewrite`` to compare against. Time: the call takes
    ``limits.seconds`` or less, up to a slack: the greedy ``rewrite`` stops at
    ``GREEDY_SHARE`` of it, saturation and extraction's optional work at ``SEARCH_SHARE``
    (``extract.together`` may take ``extracted.TOGETHER_SECONDS`` past that); what is not
    cut is checking the rules (before the clock starts; once per rule), one rule application or 256 match candidates past each
    deadline, extraction's greedy pass, building the program and costing it: the call
    overruns by what of those does not fit in the last quarter (``docs/search.md``,
    *Limits, measured*).
    """
    return saturate_report(p, rules, cost=cost, limits=limits, assume=assume,
                           frozen_state=frozen_state, verdicts=verdicts)[0]


@gc_paused
def saturate_report(
    p: Program, rules: Iterable[Rule], *, cost: Cost | None = None,
    limits: SaturationLimits | None = None, assume: Any = frozenset(),
    frozen_state: bool = False, verdicts: Any = None,
) -> tuple[Program, SaturationReport]:
    """``saturate(p, rules, ...)`` and its ``SaturationReport``. Same contract, laws and
    complexity as ``saturate``."""
    started = time.monotonic()
    require_program(p, "saturate")
    limits = SaturationLimits() if limits is None else limits
    if not isinstance(limits, SaturationLimits):
        raise PassError(f"saturate: limits must be a SaturationLimits, got {limits!r}")
    cost = roofline if cost is None else cost
    rs = prepare(p, rules, assume, who="saturate", verdicts=verdicts)
    skipped = {name: f"assumes {sorted(flags)}, not granted" for name, flags in rs.missing.items()}
    applied = list(rs.applied)
    graphs = walked_graphs(p)
    compiled = directions(applied, rs.level, skipped)
    clock = time.monotonic()
    seconds = {"check": 0.0, "saturate": 0.0, "extract": 0.0, "build": 0.0, "greedy": 0.0}
    seconds["check"] = clock - started

    def lap(phase: str) -> None:
        nonlocal clock
        now = time.monotonic()
        seconds[phase] += now - clock
        clock = now

    # the clock starts once the rules are checked (once per rule: ``ensure_checked``).
    # Greedy first, so that its time is known and taken from the search's share
    begun = clock
    greedy_q, greedy_cost, greedy_cut, greedy_folded = _greedy(
        p, applied, cost, begun + GREEDY_SHARE * limits.seconds, frozen_state)
    lap("greedy")
    deadline = begun + SEARCH_SHARE * limits.seconds
    sizes: list[tuple[int, ...]] = []
    classes: list[tuple[int, ...]] = []
    stopped: list[str] = []
    plans: dict[int, Plan] = {}
    for mid, graph in graphs:
        if time.monotonic() > deadline:
            # not searched: building its e-graph and extracting would only add to the overrun
            sizes.append((0,))
            classes.append((0,))
            stopped.append("seconds")
            continue
        geg = from_graph(p, mid, graph, frozen_state=frozen_state)
        grown, counted, why = _saturate(geg.eg, compiled, limits, deadline, geg.roots,
                                        _read_by_leaves(geg, graph))
        sizes.append(grown)
        classes.append(counted)
        stopped.append(why)
        lap("saturate")
        plans[id(graph)] = plan(geg, graph, cost, deadline)
        if plans[id(graph)].cut:
            stopped[-1] += "; extraction cut by seconds"
        lap("extract")
    before = program_cost(p, cost)
    q = p
    if any(pl.changes for pl in plans.values()):
        builder = Builder(plans)
        q = drop_dead(p, rewrite_nodes(p, builder), builder.writes)
    folded = 0
    if frozen_state:
        q, folded = _frozen(q)
    after = before if q is p else program_cost(q, cost)  # 1-2 s at 15k nodes: not twice
    lap("build")
    chosen = "saturate"
    if greedy_q is not None and greedy_cost < after * (1 - 1e-9):
        q, after, chosen, folded = greedy_q, greedy_cost, "greedy", greedy_folded
    if q is not p and not after < before * (1 - 1e-9):
        q, after = p, before
    if q is p:
        chosen, after = "original", before
    rewrites: dict[str, int] = {}
    if chosen == "saturate":
        for pl in plans.values():
            for name in pl.rules_used:
                rewrites[name] = rewrites.get(name, 0) + 1
    extractor = "ilp" if any(pl.extractor == "ilp" for pl in plans.values()) else "greedy"
    report = SaturationReport(
        tuple(sizes), tuple(stopped), before, after, chosen, extractor, greedy_cost,
        MappingProxyType(rewrites), MappingProxyType(skipped), MappingProxyType(seconds),
        tuple(classes), greedy_cut,
        (f"frozen: {folded} values computed from state alone folded into constants"
         if frozen_state and chosen != "original" else
         "frozen: nothing folded" if frozen_state else
         "charged: values computed from state alone are recomputed and counted at every call"),
    )
    return q, report


def _frozen(q: Program) -> tuple[Program, int]:
    """``q`` with the values its root graph computes from unwritten state alone
    (``cost.invariant_values``) folded into new constants (``fold.fold_into_state``), and how
    many nodes went. O(n) plus the folded arithmetic."""
    graph = q.root_module.graph
    if graph is None:
        return q, 0
    once = invariant_values(q, q.root, graph)
    made = [n.name for n in graph.nodes if n.op == CALL_FUNCTION and n.name in once]
    out = fold_into_state(q, made) if made else q
    if out is q:
        return q, 0
    left = {n.name for n in out.root_module.graph.nodes}
    return out, sum(1 for name in made if name not in left)


# --- saturation ------------------------------------------------------------------------------------


def _saturate(eg: EGraph, rules: list[Directed], limits: SaturationLimits,
              deadline: float, roots: Iterable[int] = (),
              read_by_leaves: Iterable[int] | None = None,
              ) -> tuple[tuple[int, ...], tuple[int, ...], str]:
    """Rounds of matching and adding, with egg's backoff scheduler: a rule that matches more
    than its limit in a round is banned (its matches dropped) for a number of rounds; both
    double at each ban. Returns the e-node and e-class counts per round and why it stopped."""
    sizes = [eg.size]
    classes = [len(eg.classes)]
    cap_nodes = limits.node_limit(eg.size)
    base_limit = limits.match_limit or max(1000, eg.size)
    applied: set[tuple] = set()  # matches applied (as their classes were then)
    memo: dict = {}  # fake runs by operator and argument metadata
    roots = frozenset(roots)
    layouts = _Layouts(eg, roots, roots if read_by_leaves is None else frozenset(read_by_leaves))
    banned_until = [0] * len(rules)
    times_banned = [0] * len(rules)
    for it in range(limits.iterations):
        if time.monotonic() > deadline:
            return tuple(sizes), tuple(classes), "seconds"
        by_op: dict[Any, list[tuple[ENode, int]]] = {}
        for c, nodes in eg.classes.items():
            for n in nodes:
                if n.op != LEAF:
                    by_op.setdefault(n.op, []).append((n, c))
        todo: list[tuple[Directed, EMatch]] = []
        banned_now = False
        for i, d in enumerate(rules):
            if time.monotonic() > deadline:
                break
            if banned_until[i] > it:
                banned_now = True
                continue
            cap = base_limit << times_banned[i]
            found, counted = ematch_counted(eg, d.compiled.pattern, by_op, cap, deadline)
            if counted > cap:
                banned_until[i] = it + (limits.ban_length << times_banned[i])
                times_banned[i] += 1
                banned_now = True
                continue
            todo.extend((d, m) for m in found)
        changed = False
        for d, m in todo:
            key = (id(d), eg.find(m.root), tuple(sorted(
                (k, eg.find(v)) for k, v in m.inputs.items())), spell(tuple(sorted(
                    m.scalars.items()))), tuple(eg.find(r) for r in m.results))
            if key in applied:
                continue
            applied.add(key)
            changed |= _apply(eg, d, m, memo, layouts)
            if eg.size > cap_nodes or (len(applied) % 256 == 0
                                          and time.monotonic() > deadline):
                break
        eg.rebuild()
        sizes.append(eg.size)
        classes.append(len(eg.classes))
        if eg.size > cap_nodes:
            return tuple(sizes), tuple(classes), "nodes"
        if time.monotonic() > deadline:
            return tuple(sizes), tuple(classes), "seconds"
        if not changed:
            if not banned_now:
                return tuple(sizes), tuple(classes), "saturated"
            banned_until = [0] * len(rules)  # nothing else to do: the banned rules run again
    return tuple(sizes), tuple(classes), "iterations"


def _apply(eg: EGraph, d: Directed, m: EMatch, memo: dict,
           layouts: _Layouts | None = None) -> bool:
    """Add the replacement for match ``m`` to the e-graph and merge it with the matched value;
    ``False`` when the match is declined (``where`` false, the replacement not traceable or
    not runnable there, another shape, dtype or device, other strides that a reader of the
    matched value would see (``_Layouts``), a result that is an input or a view of one where
    both would escape (``_may_alias``)) or adds nothing new."""
    layouts = _Layouts(eg, frozenset()) if layouts is None else layouts
    rule, c, pattern = d.rule, d.compiled, d.compiled.pattern
    if m.results and not _disjoint_values(eg, m.results):
        return False
    vals: dict[int, Any] = {}
    for name, pos in zip(pattern.input_order, pattern.tensor_args):
        cls = m.inputs.get(name)
        vals[pos] = eg.data[eg.find(cls)].val if cls is not None else None
    if not exact(eg, rule, c, m):
        return False  # a hole bound another value: the pattern traced there does not match
    if rule.where is not None and not where_holds(rule, ematch_value(rule, m, vals),
                                                  f"e-class {m.root}"):
        return False
    try:
        rep = replacement_for(rule, c, m.scalars, vals)
    except PassError:
        return False
    if rep is None:
        return False
    rep_ph = [n.name for n in rep.graph.nodes if n.op == PLACEHOLDER]
    child_of: dict[str, int] = {}
    val_of: dict[str, Any] = {}
    for pp, rp in zip(pattern.input_order, rep_ph):
        if pp in m.inputs:
            child_of[rp] = eg.find(m.inputs[pp])
            val_of[rp] = eg.data[child_of[rp]].val
    roots = m.results or (m.root,)
    outs = tuple(rep.outputs)
    if len(outs) != len(roots) or any(type(o) is not Ref for o in outs):
        return False  # a literal result: never merged
    if len(roots) > 1:
        # several results: every check first, so that a declined match adds nothing (each
        # would otherwise leave its nodes behind for the rules to match again)
        if not _may_share(eg, roots, rep, layouts) or not _may_unshare(
                eg, roots, c.traced, rep, layouts):
            return False
        dry = _instantiate(eg, d, m, rep, dict(child_of), dict(val_of), memo, layouts, None)
        if dry is None or _results(eg, roots, outs, rep, rep_ph, *dry, memo, layouts) is None:
            return False
    made: dict[str, ENode] = {}
    done = _instantiate(eg, d, m, rep, child_of, val_of, memo, layouts, made)
    if done is None:
        return False
    news = _results(eg, roots, outs, rep, rep_ph, *done, memo, layouts)
    if news is None:
        return False
    if len(roots) > 1:
        _record_covers(eg, roots, news, [done[0][name] for name in made])
    changed = False
    for root, new in zip(roots, news):
        changed |= eg.union(root, new)
    if changed and len(roots) > 1:
        # a result that is an input (``_may_alias``) has no e-node of its own to try
        group = tuple((r, made[o.name]) for r, o in zip(roots, outs) if o.name in made)
        if len(group) > 1:
            eg.groups.append(group)
        matched = _projections(eg, pattern, m)
        if matched is not None:
            eg.groups.append(tuple(zip(roots, matched)))
    return changed


def _projections(eg: EGraph, pattern: Any, m: EMatch) -> tuple[ENode, ...] | None:
    """The matched e-nodes of a match of several results where they are ``getitem`` s of one
    list (the reverse of ``SHARED_INPUT_MM`` matched on ``split(x @ cat(w1, w2))`` of the
    program), else ``None``. Such a group is recorded beside the replacement's: the tree cost
    of ``extract.greedy`` counts the shared list once per projection, so only choosing them
    together (``extract.together``) keeps the fused form where it is the cheaper.
    O(results)."""
    names = result_nodes(pattern)
    if names is None:
        return None
    nodes = tuple(m.nodes.get(n) for n in names)
    if any(n is None or getattr(n.op, "__name__", "") != "getitem" or not n.children
           for n in nodes):
        return None
    if len({eg.find(n.children[0]) for n in nodes}) != 1:
        return None
    return nodes


def _disjoint_values(eg: EGraph, results: tuple[int, ...]) -> bool:
    """Whether the result classes of a match of several results compute disjoint, non-empty
    sets of program values (``egraph.covered``): a value of the program covers itself; the
    fused ``x @ cat(w1, w2)`` that a rule of several results made covers ``x @ w1`` and
    ``x @ w2`` (``ClassData.covers``). So the fused value may be fused again with a third,
    ``x @ w3`` (three projections of one input become one matmul in two rewrites), but never
    with ``x @ w1``, which it computes already: that would grow without end. A class a rule
    made otherwise covers nothing and is not a result.

    Where a result is such a fused value, one order of fusing is kept: only the first result
    may cover several values, and every value it covers precedes (by name: any fixed order
    would do) the values of the results after it. So each set of ``n`` readers of ``x`` is
    fused in one way, left to right (``((a, b), c)``), not in every order and bracketing:
    ``2^n - n - 1`` fused values, where without the order six projections grew to 3181
    e-nodes and stopped at ``seconds``. Results that are all values of the program are
    matched in any order, as before. O(results x covered values)."""
    sets = [covered(eg.data[eg.find(r)]) for r in results]
    if not all(sets):
        return False
    seen: set[str] = set()
    for got in sets:
        if not seen.isdisjoint(got):
            return False
        seen |= got
    # the order is kept among fused values a rule made: a value of the program (its class's
    # ``origin``) is ordered as itself, though it covers its own projections where the
    # program splits it (``egraph.from_graph``)
    order = [frozenset((eg.data[eg.find(r)].origin,)) if eg.data[eg.find(r)].origin is not None
             else got for r, got in zip(results, sets)]
    if all(len(got) == 1 for got in order):
        return True
    if any(len(got) > 1 for got in order[1:]):
        return False
    return all(max(a) < min(b) for a, b in pairwise(order))


def _record_covers(eg: EGraph, roots: tuple[int, ...], news: list[int],
                   made: list[int]) -> None:
    """Mark the classes a rewrite of several results made, but for its results' own (the
    ``getitem`` projections merged with ``roots``) and classes of the program it met again
    (hash-consed: those stay the values they are), as covering the program values of
    ``roots`` (``ClassData.covers``): the fused matmul and its ``split`` compute them together.
    O(classes made x covered values)."""
    cov = frozenset().union(*(covered(eg.data[eg.find(r)]) for r in roots))
    own = {eg.find(n) for n in news}
    for cls in map(eg.find, made):
        if cls not in own and eg.data[cls].origin is None:
            eg.data[cls].covers = eg.data[cls].covers | cov


def _instantiate(eg: EGraph, d: Directed, m: EMatch, rep: Any, child_of: dict[str, int],
                 val_of: dict[str, Any], memo: dict, layouts: _Layouts,
                 made: dict[str, ENode] | None) -> tuple[dict, dict] | None:
    """Run the replacement ``rep``'s nodes on fake values and, where ``made`` is a dict, add
    each as an e-node (``made``: node name -> e-node); ``None`` where a node cannot be run
    there or may not read a class of mixed strides (``_Layouts.may_read``). With ``made``
    ``None`` nothing is added (a dry run: new values get class ``-1``). Returns ``(child_of,
    val_of)`` extended by the replacement's nodes."""
    sentinels = {(type(v), v): pos for pos, v in rep.sentinels}
    results = {o.name for o in rep.outputs if type(o) is Ref}
    for rn in rep.graph.nodes:
        if rn.op in (PLACEHOLDER, OUTPUT):
            continue
        if rn.op != CALL_FUNCTION:
            return None
        args = _bind(rn.args, sentinels, m.scalars)
        kwargs = _bind(rn.kwargs, sentinels, m.scalars)
        if any(r.name not in child_of for r in _refs((args, kwargs))):
            if _is_check(rn):
                continue  # a metadata check on a value the e-graph does not hold
            return None
        try:
            val = _fake_run(rn.target, args, kwargs, val_of, memo)
        except kn.FakeRunFailed:
            return None
        if val is None and ops.facts(rn.target).results != 0:
            return None  # an argument without a fake value, or no fake mode
        if _is_check(rn):
            continue
        if made is None:
            child_of[rn.name] = -1
            val_of[rn.name] = val
            continue
        e = enode_of(rn.target, args, kwargs, child_of, val_of, val)
        if not layouts.may_read(e):
            return None
        if rn.name in results:
            e = attrs.evolve(e, rule=d.name)  # the rewrite's result: what the report counts
        once = bool(e.children) and all(eg.data[eg.find(ch)].invariant for ch in e.children)
        cls = eg.add(e, ClassData(val, False, None, once))
        layouts.inherit(e, cls)
        made[rn.name] = e
        child_of[rn.name] = cls
        val_of[rn.name] = eg.data[cls].val if eg.data[cls].val is not None else val
    return child_of, val_of


def _results(eg: EGraph, roots: tuple[int, ...], outs: tuple, rep: Any, rep_ph: list[str],
             child_of: dict[str, int], val_of: dict[str, Any], memo: dict,
             layouts: _Layouts) -> list[int] | None:
    """The class of each result of the replacement, to be merged with ``roots`` in order;
    ``None`` where one is an input or a view of one that may not alias it there
    (``_may_alias``), or has another shape, dtype or device, or other strides that a reader
    of the matched value would see (``_Layouts``)."""
    news = []
    for root, out in zip(roots, outs):
        if out.name not in child_of:
            return None
        source = _input_aliased(rep, out.name)
        if source is not None and (source not in child_of
                                   or not _may_alias(eg, root, child_of[source], layouts)):
            return None
        old_val, new_val = eg.data[eg.find(root)].val, val_of.get(out.name)
        if not _compatible(old_val, new_val) and not (_same_metadata(old_val, new_val)
                and layouts.restride(root, new_val, memo)):
            return None
        news.append(child_of[out.name])
    return news


def _may_share(eg: EGraph, roots: tuple[int, ...], rep: Any, layouts: _Layouts) -> bool:
    """Whether the results of a match (classes ``roots``) may become the replacement ``rep``'s
    results where two of these are views of one value it computes (``split(x @ cat(w1,
    w2))``): at most one of those sharing a value *escapes*, is returned or read by a leaf,
    itself or through views of it (``egraph.escapes``): two outputs would alias each other where
    the program's did not, and a caller writing one would change the other. (A value written
    in place is a leaf, ``egraph.value_roles``, and no pattern matches a leaf; a write seen
    functionally, ``versions``, is built as its functional twin: nothing here is written.) Results that share nothing are not constrained here. ``extracted.shared_escape``
    checks the extracted choice again (a later merge may make a result escape). O(views
    followed), at most ``egraph.ESCAPE_CAP`` each."""
    bases = output_bases(rep)
    return all(len(shared) < 2 for shared in _escaping_by_base(eg, roots, bases, layouts))


def _may_unshare(eg: EGraph, roots: tuple[int, ...], pattern: Any, rep: Any,
                 layouts: _Layouts) -> bool:
    """The mirror of ``_may_share``: whether the results of a match (classes ``roots``) may
    become ``rep``'s where the pattern's results are views of one value (the halves of a
    ``split`` the reverse of ``SHARED_INPUT_MM`` unfuses) and the replacement's are not:
    at most one of those sharing a value escapes (``egraph.escapes``). Two returned halves
    of one buffer are the caller's aliasing; fresh values in their place would lose it (the
    in-context law: "fresh, the original's result is an alias of output 0"). O(views
    followed), at most ``egraph.ESCAPE_CAP`` each."""
    old_bases, new_bases = output_bases(pattern), output_bases(rep)
    for shared in _escaping_by_base(eg, roots, old_bases, layouts):
        if len(shared) > 1 and (None in {new_bases[i] for i in shared}
                                or len({new_bases[i] for i in shared}) > 1):
            return False
    return True


def _escaping_by_base(eg: EGraph, roots: tuple[int, ...], bases: tuple[str | None, ...],
                      layouts: _Layouts) -> list[list[int]]:
    """The positions of ``roots`` that escape (``egraph.escapes``), grouped by their entry of
    ``bases`` (the value each result is a view of; ``None``: in no group). What
    ``_may_share`` and ``_may_unshare`` both ask. O(views followed)."""
    pinned = {eg.find(x) for x in layouts.pinned}
    by_base: dict[str, list[int]] = {}
    for i, (root, base) in enumerate(zip(roots, bases)):
        if base is not None and escapes(eg, root, pinned):
            by_base.setdefault(base, []).append(i)
    return list(by_base.values())


def _is_check(n: Node) -> bool:
    return ops.is_metadata_check(n.target)


def _input_aliased(rep: Any, name: str) -> str | None:
    """The input (placeholder name) that the replacement's result ``name`` is, or is a view
    of through a chain of views (``ir.effects.view_base``); ``None`` for a fresh result."""
    table = {n.name: n for n in rep.graph.nodes}
    base = view_base(name, table.get)
    n = table.get(base)
    return base if n is not None and n.op == PLACEHOLDER else None


def _may_alias(eg: EGraph, root: int, source: int, layouts: _Layouts) -> bool:
    """Whether the matched class ``root`` may be merged with a value that is the class
    ``source`` (an input of the match) or a view of it: the replacement returns its input
    (``x * 1 -> x``), so after the merge the program may read one tensor where it read two.

    ``rewrite``'s ``alias_guard`` on the e-graph: writes first. A value written in place that
    the e-graph does not see functionally is a leaf, and so is every node that reads it
    (``egraph.value_roles``); no pattern matches a leaf, so neither ``root`` nor the
    matched inputs are written by anything in the program; a write seen functionally
    (``versions``) is built as its functional twin, so the built program writes neither.
    What is left is the caller: refused where ``root`` *escapes* (``egraph.escapes``: it or
    a view of it is returned or read by a leaf, or it is a leaf) while ``source``, or a
    value it is a view of (down its view e-nodes, ``_alias_sources``), escapes too (an input
    or state value is a leaf: returning it would make an output alias an input; returned
    too: two outputs would alias each other). ``extracted.output_alias`` checks the
    extracted choice again, since a later merge may make a class escape. O(views followed),
    at most ``egraph.ESCAPE_CAP`` each."""
    pinned = {eg.find(x) for x in layouts.pinned}
    if not escapes(eg, root, pinned):
        return True
    sources = _alias_sources(eg, source)
    return sources is not None and not any(escapes(eg, c, pinned) for c in sources)


def _alias_sources(eg: EGraph, c: int) -> set[int] | None:
    """Class ``c`` and the classes whose memory it may be, down its e-nodes that may give
    their first argument's memory (``ir.effects.shares_first``): their first child,
    transitively; ``None`` past ``egraph.ESCAPE_CAP`` classes. O(classes reached)."""
    seen: set[int] = set()
    todo = [eg.find(c)]
    while todo:
        x = todo.pop()
        if x in seen:
            continue
        if len(seen) >= ESCAPE_CAP:
            return None
        seen.add(x)
        for n in eg.classes.get(x, ()):
            if n.children and shares_first(n.op):
                todo.append(eg.find(n.children[0]))
    return seen


def _compatible(old: Any, new: Any) -> bool:
    """The values may be one class: the same shape, dtype, device and strides."""
    return _same_metadata(old, new) and (old.numel() <= 1 or old.stride() == new.stride())


def _same_metadata(old: Any, new: Any) -> bool:
    """Both tensors, of one shape, dtype and device (strides aside)."""
    if not isinstance(old, torch.Tensor) or not isinstance(new, torch.Tensor):
        return False
    return old.shape == new.shape and old.dtype == new.dtype and old.device == new.device


_LAYOUT_CAP = 64  #: readers followed from one value with other strides, at most


class _Layouts:
    """The classes whose members may differ in strides (*mixed*), and the check that lets a
    value of other strides join a class (a fused kernel's result laid out otherwise: an
    attention's ``(B, L, H, E)`` memory order for a ``(B, H, L, E)`` result).

    As ``rewrite``'s layout guard does, the new layout is followed up the class's readers
    (its parent e-nodes): each is run again on the fake values with the new strides in;
    where its result has its old strides the difference stops there; where not, its readers
    are followed. Refused where a reader raises at the new strides (a ``view`` they admit
    not), reads strides (``ir.ops.reads_strides``), where a class followed is a leaf or is
    read by one (``fixed``: the program's own effects, module calls and writes see it), or
    past ``_LAYOUT_CAP`` readers. A class the graph returns may take other strides, as
    ``rewrite``'s layout guard lets a returned value (the caller gets the same values; the
    in-context law compares values, dtypes, shapes and aliasing, not strides): so
    ``return x @ w1, relu(x @ w2)`` fuses by columns, its first output a strided half. Where
    a reader shares memory with what it reads at one layout and not at the other
    (``reshape``, ``_same_sharing``), refused where two of the classes followed and such
    readers escape (returned or read by a leaf): outputs that shared memory would not.
    The classes whose strides may now differ are marked mixed; an e-node added later that
    reads a mixed class is refused where it is a view or reads strides (it was run on one
    layout only), and its own class is marked mixed. Sound, not complete.

    ``pinned``: the classes returned or read by a leaf (``GraphEGraph.roots``: what escapes,
    for ``_may_share`` and ``_may_alias``); ``fixed``: those read by a leaf
    (``_read_by_leaves``; default ``pinned``).
    """

    def __init__(self, eg: EGraph, pinned: frozenset[int],
                 fixed: frozenset[int] | None = None) -> None:
        self.eg = eg
        self.pinned = pinned
        self.fixed = pinned if fixed is None else fixed
        self.mixed: set[int] = set()

    def is_mixed(self, c: int) -> bool:
        c = self.eg.find(c)
        return any(self.eg.find(x) == c for x in self.mixed)

    def may_read(self, e: ENode) -> bool:
        """Whether the new e-node ``e`` may read its children as they are: no view or stride
        reader of a mixed class."""
        if not self.mixed or not any(self.is_mixed(c) for c in e.children):
            return True
        return not (ops.is_view(e.op) or ops.reads_strides(e.op))

    def inherit(self, e: ENode, c: int) -> None:
        """Mark ``c`` (the class of the new e-node ``e``) mixed where ``e`` reads one."""
        if self.mixed and any(self.is_mixed(x) for x in e.children):
            self.mixed.add(self.eg.find(c))

    def restride(self, c: int, new: Any, memo: dict) -> bool:
        """Whether a value of strides ``new`` may join class ``c`` (see the class); marks the
        classes whose strides may then differ."""
        eg = self.eg
        pinned = {eg.find(x) for x in self.fixed}
        escaping = {eg.find(x) for x in self.pinned}
        vals = {eg.find(c): new}
        todo = [eg.find(c)]
        followed = 0
        flipped: set[int] = set()
        while todo:
            x = todo.pop()
            if x in pinned or eg.data[x].leaf:
                return False
            for enode, owner in list(eg.parents.get(x, ())):
                owner = eg.find(owner)
                if ops.reads_strides(enode.op) or eg.data[owner].leaf:
                    return False
                followed += 1
                if followed > _LAYOUT_CAP:
                    return False
                env = {}
                for i, ch in enumerate(enode.children):
                    ch = eg.find(ch)
                    env[f"#{i}"] = vals.get(ch, eg.data[ch].val)
                try:
                    after = _fake_run(enode.op, enode.args, enode.kwargs, env, memo)
                except kn.FakeRunFailed:
                    return False
                before = eg.data[owner].val
                same = _same_layout(before, after)
                if same is None:
                    return False
                if not _same_sharing(before, eg.data[x].val, after, vals[x]):
                    flipped.add(owner)
                if same or owner in vals:
                    continue
                vals[owner] = after
                todo.append(owner)
        if flipped and len(escaping & (set(vals) | flipped)) > 1:
            return False  # returned values that shared memory no longer do (or the reverse)
        self.mixed.update(vals)
        return True


def _same_sharing(before: Any, before_in: Any, after: Any, after_in: Any) -> bool:
    """Whether a reader's value shares memory with the class it reads at the new strides as
    it did at the old (``guards.shares_storage`` on the fake values): a ``reshape`` is a view
    of a contiguous value and a copy of a strided one. Unknown (not tensors): ``False``."""
    was, now = shares_storage(before, before_in), shares_storage(after, after_in)
    return was is not None and was == now


def _read_by_leaves(geg: GraphEGraph, graph: Graph) -> frozenset[int]:
    """The classes (as built) that a leaf node of ``graph`` reads: the part of
    ``geg.roots`` that is not there only because the output returns it. O(n)."""
    out: set[int] = set()
    for n in graph.nodes:
        if n.op == OUTPUT or n.name not in geg.leaves:
            continue
        stale = geg.versions.rebind.get(n.name) or {}
        for r in n.inputs():
            name = stale.get(r.name, r.name)
            if name in geg.class_of:
                out.add(geg.class_of[name])
    return frozenset(out)


def _same_layout(before: Any, after: Any) -> bool | None:
    """Whether ``after`` (a reader's value run again on other strides) keeps ``before``'s
    strides: ``None`` where they differ in anything else (or are not tensors), so the new
    layout may not join. A list or tuple of tensors (``split``'s value, read by ``getitem``)
    is compared item by item: a fused value that was itself split (``x @ cat(w1, w2)``, fused
    again with ``x @ w3``) passes its new strides on to its halves through it. O(items)."""
    if isinstance(before, (list, tuple)):
        if not isinstance(after, (list, tuple)) or len(before) != len(after):
            return None
        got = [_same_layout(b, a) for b, a in zip(before, after)]
        return None if None in got else all(got)
    if not isinstance(before, torch.Tensor) or not _same_metadata(before, after):
        return None
    return before.numel() <= 1 or before.stride() == after.stride()


def _bind(tree: Any, sentinels: Mapping, scalars: Mapping) -> Any:
    kind = type(tree)
    if kind is tuple:
        return tuple(_bind(x, sentinels, scalars) for x in tree)
    if kind is IList:
        return IList(tuple(_bind(x, sentinels, scalars) for x in tree.items))
    if kind is IDict:
        return IDict(tuple((k, _bind(v, sentinels, scalars)) for k, v in tree.items))
    if kind in (int, float):
        pos = sentinels.get((kind, tree))
        if pos is not None and pos in scalars:
            return scalars[pos]
    return tree


def _refs(tree: Any) -> list[Ref]:
    found: list[Ref] = []
    thaw(tree, found.append)
    return found


def _fake_key(target: Any, args: Any, kwargs: Any, val_of: Mapping[str, Any]) -> tuple | None:
    """What a fake run depends on: the operator, the literals, and each tensor argument's
    shape, dtype, strides and device (``None`` when one is not a plain tensor)."""
    parts: list[Any] = []

    def on_ref(r: Ref) -> Any:
        v = val_of.get(r.name)
        if not isinstance(v, torch.Tensor):
            parts.append(None)
            return None
        parts.append((tuple(v.shape), v.dtype, v.stride(), v.device))
        return None

    thaw((args, kwargs), on_ref)
    if any(x is None for x in parts):
        return None
    return (target, spell((args, kwargs)), tuple(parts))


def _fake_run(target: Any, args: Any, kwargs: Any, val_of: Mapping[str, Any],
              memo: dict | None = None) -> Any:
    """``target`` run on the fake values of its arguments (``kernel.fake_value``, fake modes
    only, no ``meta`` runs; its contract: ``None`` where an argument has no fake value or no
    fake mode is found, ``FakeRunFailed`` where the operator raises). ``memo``: results, and
    failures, kept by ``_fake_key`` (one per search: the same operator at the same shapes
    runs once)."""
    key = _fake_key(target, args, kwargs, val_of) if memo is not None else None
    if key is not None and key in memo:
        out = memo[key]
        if isinstance(out, kn.FakeRunFailed):
            raise out
        return out
    try:
        out = kn.fake_value(target, args, kwargs, lambda r: val_of.get(r.name), meta=False)
    except kn.FakeRunFailed as exc:
        if key is not None:
            memo[key] = exc.with_traceback(None)
        raise
    if key is not None:
        memo[key] = out
    return out


def _greedy(p: Program, rules: list[Rule], cost: Cost, deadline: float,
            frozen_state: bool = False,
            ) -> tuple[Program | None, float | None, str | None, int]:
    """Greedy ``rewrite``'s program on the same rules (taken as checked; with what it computes
    from state alone folded where ``frozen_state``), its cost, where ``deadline`` (a
    ``time.monotonic`` value) cut it (``RewriteReport.cut``; ``None``: at its fixpoint) and
    how many nodes were folded; ``(None, None, None, 0)`` where it raises (a rule and its
    reverse cycle there)."""
    if not rules:
        return None, None, None, 0
    try:
        q, report = apply_rules(p, rules, deadline=deadline)
    except PassError:
        return None, None, None, 0
    folded = 0
    if frozen_state:
        q, folded = _frozen(q)
    return q, program_cost(q, cost), report.cut, folded
