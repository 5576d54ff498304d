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
from ir.args import Ref, iter_refs
from ir.errors import PassError
from ir.fake_memo import FakeMemo
from ir.gcpause import gc_paused
from ir.node import CALL_FUNCTION, OUTPUT, PLACEHOLDER
from ir.program import Program, require_program
from transforms import kernel as kn
from transforms.edit import rewrite_nodes
from transforms.machinery.each_graph import walked_graphs
from transforms.rewrite.cost import Cost, invariant_values, program_cost, roofline
from transforms.rewrite.eclass_view import EClassView, read_by_leaves
from transforms.rewrite.egraph import (
    LEAF,
    ClassData,
    EGraph,
    ENode,
    covered,
    enode_of,
    from_graph,
    spell,
)
from transforms.rewrite.ematch import EMatch, ematch_counted, ematch_value, exact, result_nodes
from transforms.rewrite.engine import apply_rules
from transforms.rewrite.guards import (
    alias_guard,
    fake_run,
    same_strides,
    sharing_guard,
    where_holds,
)
from transforms.rewrite.result_sharing import base_pairs, output_bases
from transforms.rewrite.rule import Rule, bind_scalars, replacement_for
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
    folding = any(r.fold_state for r in applied)
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
        # a fold_state rule's values from state alone are free (``ENode.folds``): the classes
        # of state are marked so, and only those e-nodes (or, frozen, every one) cost nothing
        geg = from_graph(p, mid, graph, frozen_state=frozen_state or folding)
        grown, counted, why = _saturate(geg.eg, compiled, limits, deadline, geg.roots,
                                        read_by_leaves(geg, graph))
        sizes.append(grown)
        classes.append(counted)
        stopped.append(why)
        lap("saturate")
        plans[id(graph)] = plan(geg, graph, cost, deadline, frozen=frozen_state)
        if plans[id(graph)].cut:
            stopped[-1] += "; extraction cut by seconds"
        lap("extract")
    before = program_cost(p, cost)
    q = p
    folds: set[str] = set()
    if any(pl.changes for pl in plans.values()):
        builder = Builder(plans)
        q = drop_dead(p, rewrite_nodes(p, builder), builder.writes)
        folds = builder.folds
    folded = 0
    if frozen_state:
        q, folded = _frozen(q)
    elif folds:
        q, folded = _folded(q, folds)
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
         "charged: values computed from state alone are recomputed and counted at every call"
         + (f", but for {folded} that fold_state rules made, folded into constants"
            if folded and chosen != "original" else "")),
    )
    return q, report


def _folded(q: Program, made: set[str]) -> tuple[Program, int]:
    """``q`` with the values of ``made`` (nodes the build emitted for e-nodes of
    ``fold_state`` rules) that read unwritten state alone folded into new constants
    (``fold_into_state``, as ``rewrite`` folds what those rules create), and how many nodes
    went. O(n) plus the folded arithmetic."""
    out = fold_into_state(q, made)
    if out is q:
        return q, 0
    left = {n.name for n in out.root_module.graph.nodes}
    return out, sum(1 for name in made if name not in left)


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
              fixed: Iterable[int] | None = None,
              ) -> tuple[tuple[int, ...], tuple[int, ...], str]:
    """Rounds of matching and adding, with egg's backoff scheduler: a rule that matches more
    than its limit in a round is banned (its matches dropped) for a number of rounds; both
    double at each ban. ``roots`` / ``fixed``: the classes that escape / are read by a leaf
    (``EClassView``'s ``pinned`` / ``fixed``). Returns the e-node and e-class counts per
    round and why it stopped."""
    sizes = [eg.size]
    classes = [len(eg.classes)]
    cap_nodes = limits.node_limit(eg.size)
    base_limit = limits.match_limit or max(1000, eg.size)
    applied: set[tuple] = set()  # matches applied (as their classes were then)
    memo = FakeMemo()  # the search's fake runs: one per operator and argument metadata
    roots = frozenset(roots)
    view = EClassView(eg, roots, roots if fixed is None else frozenset(fixed))
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
            changed |= _apply(eg, d, m, memo, view)
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


def _apply(eg: EGraph, d: Directed, m: EMatch, memo: FakeMemo,
           view: EClassView | None = None) -> bool:
    """Add the replacement for match ``m`` to the e-graph and merge it with the matched value;
    ``False`` when the match is declined (``where`` false, the replacement not traceable or
    not runnable there, another shape, dtype or device, other strides that a reader of the
    matched value would see (``EClassView.restride``), a result that is an input or a view of
    one where both would escape (``guards.alias_guard``), results that are views of one value
    in the pattern or the replacement where two escape (``guards.sharing_guard``)) or adds
    nothing new."""
    view = EClassView(eg, frozenset()) if view is None else view
    rule, c, pattern = d.rule, d.compiled, d.compiled.pattern
    if m.results and not _disjoint_values(eg, m.results):
        return False
    vals = {pos: eg.data[eg.find(m.inputs[name])].val if name in m.inputs else None
            for name, pos in zip(pattern.input_order, pattern.tensor_args)}
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
        pairs = sorted(base_pairs(rep) | base_pairs(c.traced))
        if not sharing_guard(view, [(roots[i], roots[j]) for i, j in pairs if j < len(roots)]):
            return False
        dry = _instantiate(eg, d, m, rep, dict(child_of), dict(val_of), memo, view, None)
        if dry is None or _results(eg, roots, outs, rep, rep_ph, *dry, memo, view) is None:
            return False
    made: dict[str, ENode] = {}
    done = _instantiate(eg, d, m, rep, child_of, val_of, memo, view, made)
    if done is None:
        return False
    news = _results(eg, roots, outs, rep, rep_ph, *done, memo, view)
    if news is None:
        return False
    if len(roots) > 1:
        _record_covers(eg, roots, news, [done[0][name] for name in made])
    changed = False
    for root, new in zip(roots, news):
        changed |= eg.union(root, new)
    if changed and len(roots) > 1:
        # a result that is an input (``guards.alias_guard``) has no e-node of its own to try
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
                 val_of: dict[str, Any], memo: FakeMemo, view: EClassView,
                 made: dict[str, ENode] | None) -> tuple[dict, dict] | None:
    """Run the replacement ``rep``'s nodes on fake values and, where ``made`` is a dict, add
    each as an e-node (``made``: node name -> e-node); ``None`` where a node cannot be run
    there or may not read a class of mixed strides (``EClassView.may_read``). With ``made``
    ``None`` nothing is added (a dry run: new values get class ``-1``). Returns ``(child_of,
    val_of)`` extended by the replacement's nodes."""
    sentinels = {(type(v), v): pos for pos, v in rep.sentinels}
    results = {o.name for o in rep.outputs if type(o) is Ref}
    rule_folds = d.rule.fold_state
    for rn in rep.graph.nodes:
        if rn.op in (PLACEHOLDER, OUTPUT):
            continue
        if rn.op != CALL_FUNCTION:
            return None
        args = bind_scalars(rn.args, sentinels, m.scalars)
        kwargs = bind_scalars(rn.kwargs, sentinels, m.scalars)
        check = ops.is_metadata_check(rn.target)
        if any(r.name not in child_of for r in iter_refs((args, kwargs))):
            if check:
                continue  # a metadata check on a value the e-graph does not hold
            return None
        try:
            val = fake_run(rn.target, args, kwargs, val_of, memo)
        except kn.FakeRunFailed:
            return None
        if val is None and ops.facts(rn.target).results != 0:
            return None  # an argument without a fake value, or no fake mode
        if check:
            continue
        if made is None:
            child_of[rn.name] = -1
            val_of[rn.name] = val
            continue
        e = enode_of(rn.target, args, kwargs, child_of, val_of, val)
        if not view.may_read(e):
            return None
        if rn.name in results:
            e = attrs.evolve(e, rule=d.name)  # the rewrite's result: what the report counts
        if rule_folds:
            e = attrs.evolve(e, folds=True)  # folded where it reads state alone
        once = bool(e.children) and all(eg.data[eg.find(ch)].invariant for ch in e.children)
        cls = eg.add(e, ClassData(val, False, None, once))
        view.inherit(e, cls)
        made[rn.name] = e
        child_of[rn.name] = cls
        val_of[rn.name] = eg.data[cls].val if eg.data[cls].val is not None else val
    return child_of, val_of


def _results(eg: EGraph, roots: tuple[int, ...], outs: tuple, rep: Any, rep_ph: list[str],
             child_of: dict[str, int], val_of: dict[str, Any], memo: FakeMemo,
             view: EClassView) -> list[int] | None:
    """The class of each result of the replacement, to be merged with ``roots`` in order;
    ``None`` where one is an input or a view of one (``result_sharing.output_bases``) that
    may not alias it there (``guards.alias_guard`` on the e-graph: both would escape), or has
    another shape, dtype or device, or other strides that a reader of the matched value
    would see (``guards.same_strides``, then ``EClassView.restride``)."""
    news = []
    inputs = set(rep_ph)
    for root, out, base in zip(roots, outs, output_bases(rep)):
        if out.name not in child_of:
            return None
        if base in inputs and (base not in child_of
                               or not alias_guard(view, {root: child_of[base]})):
            return None
        old_val, new_val = eg.data[eg.find(root)].val, val_of.get(out.name)
        alike = (same_strides(old_val, new_val, single=True)
                 if isinstance(old_val, torch.Tensor) else None)
        if not alike and (alike is None or not view.restride(root, new_val, memo)):
            return None
        news.append(child_of[out.name])
    return news


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
