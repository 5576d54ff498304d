"""The rewrite engine: ``apply_rules``, the worklist that applies rules to a fixpoint.

Rules are taken as given (right, and their assumptions granted): ``transforms.rewrite.api``'s
``rewrite`` checks them first. For each graph, each node that some rule's pattern ends in is
tried; a match (``transforms.rewrite.match``) is taken only when every guard of
``transforms.rewrite.guards.GUARDS`` holds, stage by stage (the match, its plan, its
replacement, its instance), and the first guard that fails is counted in
``RewriteReport.skipped``. A taken match is replaced in place, its new nodes and their
readers revisited, and a closing sweep per graph proves the fixpoint.

The search hooks live here too, since they are the engine's own steps taken one at a time:
``matches(p, rule)`` lists every place where ``rewrite`` could take ``rule`` (each a ``Match``
naming the module graph, the matched nodes and the bindings), ``apply_match(p, m)`` takes one
(the same guards, instantiation and finalisation). A search enumerates and applies through them.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import attrs

from ir import ops
from ir.args import Ref, ref
from ir.effects import Effects, graph_effects
from ir.errors import PassError, PurefxError
from ir.fake_memo import FakeMemo
from ir.gcpause import gc_paused
from ir.graph import Graph
from ir.module import ModuleId
from ir.module_stack import common_stack
from ir.names import target_name
from ir.node import CALL_FUNCTION, CALL_MODULE, OUTPUT, PLACEHOLDER, Node
from ir.program import Program
from transforms import kernel as kn
from transforms.machinery.each_graph import walked_graphs
from transforms.machinery.law_violation import LawViolation
from transforms.machinery.trace import Traced, level_of
from transforms.rewrite import guards, result_sharing, sizes
from transforms.rewrite.match import match_at
from transforms.rewrite.rule import Compiled, Match, Rule, bind_scalars, replacement_for
from transforms.rewrite.state_fold import fold_into_state


@attrs.frozen
class Rewrite:
    """One rewrite that was applied: the rule, the module path and graph of the rewritten graph,
    the names of the nodes it replaced and of those it created."""

    rule: str
    module: str
    graph: int
    replaced: tuple[str, ...]
    created: tuple[str, ...] = ()


_EMPTY: Mapping[str, Any] = MappingProxyType({})


@attrs.frozen
class RewriteReport:
    """What ``rewrite_report`` did.

    - ``counts``: ``{rule name: rewrites applied}``, every rule listed, in the order given;
    - ``rewrites``: each applied ``Rewrite``, in order;
    - ``skipped``: ``{guard name: matches skipped}``, the first guard of
      ``transforms.rewrite.guards.GUARDS`` that failed at each match tried (a match tried
      again after a nearby rewrite counts again), in the table's order; guards that skipped
      nothing are left out;
    - ``not_granted``: ``{rule name: the assumptions it needs that the caller did not grant}``
      for each rule not applied for that reason (``rewrite(p, rules, assume=...)``);
    - ``cut``: where ``apply_rules(..., deadline=)`` stopped before its fixpoint (``"graph G
      of module M"``), ``None`` where it reached it (always, without a deadline).

    ``str(report)`` is a short text of all of them.
    """

    counts: Mapping[str, int]
    rewrites: tuple[Rewrite, ...]
    skipped: Mapping[str, int] = _EMPTY
    not_granted: Mapping[str, frozenset[str]] = _EMPTY
    cut: str | None = None

    def __str__(self) -> str:
        lines = ["rewrites: " + (", ".join(f"{k} {v}" for k, v in self.counts.items()) or "none")]
        if self.skipped:
            lines.append("skipped: " + ", ".join(f"{k} {v}" for k, v in self.skipped.items()))
        for name, flags in self.not_granted.items():
            lines.append(
                f"not applied: {name!r} assumes {sorted(flags)}, not granted "
                "(rewrite(..., assume=...))"
            )
        if self.cut is not None:
            lines.append(f"cut by the deadline in {self.cut}: not a fixpoint")
        return "\n".join(lines)


# --- the pass -----------------------------------------------------------------------------------


def program_level(p: Program) -> str:
    """The level ``p``'s rules are traced at (``trace.level_of`` over its graphs in walk
    order, ``each_graph.walked_graphs``): what ``rewrite``, ``saturate``, ``matches`` and
    ``apply_rules`` all read. O(nodes)."""
    return level_of([g for _, g in walked_graphs(p)])


@gc_paused
def apply_rules(
    p: Program, rules: Iterable[Rule], *, fixpoint: bool = True,
    deadline: float | None = None,
) -> tuple[Program, RewriteReport]:
    """Apply ``rules`` to every graph of ``p`` until none matches, taking them as right and
    their assumptions as granted: the one path that instantiates replacements, shared by
    ``rewrite`` (which checks the rules and their assumptions first) and the laws that check a
    rule (``check_rule`` rewrites the pattern's own program with it).

    Parameters:
        p: a Program, flat or outlined; every distinct module graph is rewritten once.
        rules: ``Rule`` values (distinct names).
        fixpoint: ``True`` (the default): after each rewrite the nodes downstream of its new
            nodes (within the deepest pattern) are revisited, each graph swept again until a
            sweep applies nothing, and the rules traced again where the program's level
            changed. ``False``: one pass of the worklist (only the direct readers of new nodes
            revisited), which misses matches two or more readers downstream of a rewrite; for
            tests that show the sweep is needed.
        deadline: a ``time.monotonic()`` value, or ``None`` (the default: no deadline, the
            rewrite runs to its fixpoint). Looked at before each node is tried: once it has
            passed, no further match is tried and the rewrites taken so far are finalised as
            usual (each rewrite is whole, so the program is as right as the fixpoint's, just
            less rewritten); ``RewriteReport.cut`` says where. ``saturate`` gives its
            comparison ``rewrite`` one.

    Returns ``(program, RewriteReport)``; ``p`` itself when no rule matched. Same contract,
    laws and complexity as ``transforms.rewrite.api.rewrite``, for rules taken as right.
    """
    counts = {r.name: 0 for r in rule_list(rules)}
    rules = variants(rules)
    done: list[Rewrite] = []
    skipped: dict[str, int] = {}
    cut: list[str] = []
    q = p
    if rules:
        run = _Run(done, skipped, _by_stage(guards.GUARDS), bool(fixpoint), deadline, cut)
        level = program_level(p)
        for _ in range(_LEVEL_ROUNDS):
            nxt = _round(q, rules, level, run)
            if nxt is q or not run.fixpoint or run.cut:
                q = nxt
                break
            q = nxt
            # the replacements may have put operators of another level in: the rules are
            # traced again at the program's new level until it holds (a fixpoint there)
            now = program_level(q)
            if now == level or _same_at_both_levels(rules, level, now):
                break
            level = now
        else:
            raise PassError(
                f"rewrite: rules {sorted({rw.rule for rw in done})} keep moving the program "
                f"between the training and core levels ({_LEVEL_ROUNDS} rounds); narrow one"
            )
    for rw in done:
        counts[rw.rule] += 1
    order = {g.name: i for i, g in enumerate(guards.GUARDS)}
    skips = dict(sorted(skipped.items(), key=lambda kv: order.get(kv[0], len(order))))
    return q, RewriteReport(MappingProxyType(counts), tuple(done), MappingProxyType(skips),
                            cut=cut[0] if cut else None)


def _by_stage(table: Sequence[guards.Guard]) -> dict[int, tuple[guards.Guard, ...]]:
    stages = (guards.MATCH, guards.PLAN, guards.REPLACEMENT, guards.INSTANCE)
    return {st: tuple(g for g in table if g.stage == st) for st in stages}


@attrs.frozen
class _Run:
    """What one ``apply_rules`` call shares across its graphs: the rewrites ``done`` and the
    ``skipped`` counts (appended to), the guard rows by stage, ``fixpoint``, the
    ``deadline`` (``None``: none) and ``cut`` (appended to once it has passed: where)."""

    done: list[Rewrite]
    skipped: dict[str, int]
    table: Mapping[int, tuple[guards.Guard, ...]]
    fixpoint: bool = True
    deadline: float | None = None
    cut: list[str] = attrs.Factory(list)
    fakes: FakeMemo = attrs.field(factory=FakeMemo, eq=False)  # fake runs kept by metadata


def _same_at_both_levels(rules: list[Rule], a: str, b: str) -> bool:
    """Whether every rule's pattern traces to the same graph at levels ``a`` and ``b`` (none
    holds an operator that one level decomposes): a fixpoint at one is one at the other."""
    return all(_pattern_key(r.at_level(a)) == _pattern_key(r.at_level(b)) for r in rules)


def _pattern_key(c: Compiled | None) -> tuple | None:
    if c is None:
        return None  # the variant does not exist at that level
    return tuple((n.op, n.name, n.target, n.args, n.kwargs) for n in c.traced.graph.nodes)


_LEVEL_ROUNDS = 8  #: rounds at a new level after a rewrite changed the program's level, at most


def _round(p: Program, rules: list[Rule], level: str, run: _Run) -> Program:
    """Every graph of ``p`` rewritten to a fixpoint with the rules traced at ``level``;
    appends the rewrites to ``run.done``; ``p`` itself when none applied."""
    done = run.done
    compiled = [(r, c) for r in rules if (c := r.at_level(level)) is not None]
    compiled.sort(key=lambda rc: -rc[1].benefit)  # stable: ties keep the order given
    index: dict[int, list[tuple[Rule, Compiled]]] = {}
    for r, c in compiled:
        index.setdefault(id(c.pattern.anchor.target), []).append((r, c))
    depth = max((c.pattern.size for _, c in compiled), default=0)
    start = len(done)
    new_graphs: dict[ModuleId, list[Graph]] = {}
    renamed_root: dict[str, str] = {}
    for mid, path, gi, graph, per_match, barriers in _graph_sites(p):
        out, renames = graph, {}  # once the deadline has passed: left as it is
        if not run.cut:
            out, renames = _rewrite_graph(graph, index, run, path, gi, per_match, barriers,
                                          depth, effects=graph_effects(p, mid, graph))
        new_graphs.setdefault(mid, []).append(out)
        if mid == p.root and gi == 0:
            renamed_root = renames
    table = p.module_table()
    changed = {mid: table[mid].replace(graphs=tuple(gs)) for mid, gs in new_graphs.items()
               if any(a is not b for a, b in zip(gs, table[mid].graphs))}
    if not changed:
        return p
    q = kn.finalised(p, p.replace(modules=p.modules.update(changed)), {p.root: renamed_root})
    folding = {r.name for r in rules if r.fold_state}
    if folding:
        root_path = p.first_path(p.root) or ""
        created = {
            name for rw in done[start:]
            if rw.rule in folding and rw.module == root_path and rw.graph == 0
            for name in rw.created
        }
        try:
            q = fold_into_state(q, created)
        except PurefxError:
            raise
        except Exception as exc:
            raise PassError(
                f"rewrite: folding the state of rules {sorted(folding)} failed with "
                f"{type(exc).__name__}: {exc}; drop fold_state=True from them"
            ) from exc
    return q


def _called_more_than_once(p: Program, order: list, table: Mapping) -> set:
    """The modules whose graphs run in more than one call: called at two sites, or called by
    such a module. O(nodes + modules · depth)."""
    callers: dict[Any, list] = {}
    for mid in order:
        for g in table[mid].graphs:
            for n in g.nodes:
                if n.op == CALL_MODULE and isinstance(n.target, str):
                    callee = p.resolve(n.target, mid)
                    if callee is not None:
                        callers.setdefault(callee, []).append(mid)
    multi = {callee for callee, sites in callers.items() if len(sites) > 1}
    grown = True
    while grown:
        grown = False
        for callee, sites in callers.items():
            if callee not in multi and any(s in multi for s in sites):
                multi.add(callee)
                grown = True
    return multi


def rule_list(rules: Iterable[Rule]) -> list[Rule]:
    """``rules`` (one ``Rule`` or an iterable of them) as a list; ``PassError`` naming the
    position of a value that is not a Rule, or the names given twice. O(len(rules))."""
    if isinstance(rules, Rule):
        rules = [rules]
    if not isinstance(rules, Iterable) or isinstance(rules, (str, bytes)):
        raise PassError(
            f"rewrite: rules must be a list of Rule values, got {type(rules).__name__}"
        )
    out = list(rules)
    for i, r in enumerate(out):
        if not isinstance(r, Rule):
            raise PassError(f"rewrite: rules[{i}] is a {type(r).__name__}, expected a Rule")
    names = [r.name for r in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise PassError(f"rewrite: rule names {dupes} are given twice; give each rule a name")
    return out


def variants(rules: Iterable[Rule]) -> list[Rule]:
    """``rule_list(rules)`` with each rule expanded into its ``Rule.variants()`` (one per
    combination of its optional tensor arguments being ``None``; same name). O(variants)."""
    return [v for r in rule_list(rules) for v in r.variants()]


# --- one graph ----------------------------------------------------------------------------------

_DOWNSTREAM_CAP = 256  #: nodes re-queued downstream of one rewrite, at most (the sweep does the rest)


@attrs.frozen
class _Barriers:
    """The preserved calls of a flat program: ``calls``, their names; ``names``, the values
    their signatures name (they must keep their names)."""

    calls: frozenset[str] = frozenset()
    names: frozenset[str] = frozenset()


_NO_BARRIERS = _Barriers()


def _barriers(p: Program) -> _Barriers:
    calls = frozenset(k for k in p.call_signatures if k)
    if not calls or not p.is_flat:
        return _NO_BARRIERS
    names = frozenset(
        a.name for k in calls for sig in (p.call_signatures[k],)
        for a in (*sig.inputs, *sig.outputs) if a.name is not None
    )
    return _Barriers(calls, names)


class _Work(kn.WorkingGraph):
    """The kernel's working copy of one graph (``transforms.kernel.WorkingGraph``: nodes, keys,
    readers, operator index, writes, names, renames), with what the rewrites of that graph need
    to know: where it is (``path``, ``gi``), whether a replacement may be traced per match
    (``per_match``), the preserved calls it must keep whole, the deepest pattern and the run it
    belongs to (``run``: the rewrites done, the skips counted, the guard rows, ``fixpoint``).
    ``effects``: the graph's ``ir.effects.Effects``, what its nodes write (without it, each
    node's ``written_args``)."""

    def __init__(
        self, graph: Graph, path: str, gi: int, per_match: bool, barriers: _Barriers,
        depth: int, run: _Run, effects: Effects | None = None,
    ) -> None:
        super().__init__(graph, effects=effects)
        self.path, self.gi, self.per_match = path, gi, per_match
        self.barriers, self.depth, self.done = barriers, depth, run.done
        self.skipped, self.table, self.fixpoint = run.skipped, run.table, run.fixpoint
        self.deadline, self.cut, self.fakes = run.deadline, run.cut, run.fakes
        self.regrouped: dict[str, set[str]] = {}  # rule -> nodes its regroupings made


def _rewrite_graph(
    graph: Graph, index: Mapping[int, list], run: _Run, path: str, gi: int,
    per_match: bool = True, barriers: _Barriers = _NO_BARRIERS, depth: int = 1,
    effects: Effects | None = None,
) -> tuple[Graph, dict[str, str]]:
    if not any(n.op == CALL_FUNCTION and id(n.target) in index for n in graph.nodes):
        return graph, {}
    w = _Work(graph, path, gi, per_match, barriers, depth, run, effects)
    queue = collections.deque(n.name for n in graph.nodes if n.op == CALL_FUNCTION)
    steps = [0, 4 * len(graph.nodes) + 64]
    recent: collections.deque[str] = collections.deque(maxlen=16)
    applied_any = False
    while True:
        applied = _drain(queue, index, w, steps, recent, len(graph))
        applied_any = applied_any or applied
        if not applied or not w.fixpoint or w.cut:
            break
        queue = _sweep(w, index)  # a sweep that applies nothing ends the rewrite: a fixpoint
    if not applied_any:
        return graph, {}
    return w.finish()


def _sweep(w: _Work, index: Mapping[int, list]) -> collections.deque:
    """Every node that some rule's pattern ends in, in graph order."""
    names = [k for t in index for k in w.by_target.get(t, ())]
    names.sort(key=w.key.__getitem__)
    return collections.deque(names)


def _drain(
    queue: collections.deque, index: Mapping[int, list], w: _Work, steps: list,
    recent: collections.deque, size: int,
) -> bool:
    """Try the rules on each queued node until the queue is empty or ``w.deadline`` has
    passed (then ``w.cut`` says where); whether any applied."""
    queued = set(queue)
    applied = False
    while queue:
        if w.deadline is not None and time.monotonic() > w.deadline:
            w.cut.append(f"graph {w.gi} of module {w.path or '<root>'!r}")
            return applied
        name = queue.popleft()
        queued.discard(name)
        n = w.node.get(name)
        if n is None or n.op != CALL_FUNCTION:
            continue
        for rule, c in index.get(id(n.target), ()):
            made = w.regrouped.get(rule.name) if c.regroups is not None else None
            if made is not None and name in made:
                continue  # a regrouping rule never rewrites its own result: no loop
            pushed = _try_safely(rule, c, n, w)
            if pushed is None:
                continue
            if c.regroups is not None:
                w.regrouped.setdefault(rule.name, set()).update(w.done[-1].created)
            applied = True
            steps[0] += 1
            recent.append(rule.name)
            if steps[0] > steps[1]:
                names = sorted(set(recent))
                raise PassError(
                    f"rewrite: rules {names} keep rewriting each other's results in graph "
                    f"{w.gi} of module {w.path or '<root>'!r} ({steps[0]} rewrites of a {size}"
                    "-node graph): they form a cycle; drop or narrow one of them (a `where`), or "
                    "search with transforms.rewrite.saturate, where a rule and its reverse "
                    "(Rule(..., both_ways=True)) never cycle"
                )
            for m in pushed:
                if m not in queued and m in w.node:
                    queue.append(m)
                    queued.add(m)
            break
    return applied


def _try_safely(rule: Rule, c: Compiled, n: Node, w: _Work) -> list[str] | None:
    """``_try``, with any error that is not purefx's own turned into a ``PassError`` naming
    the rule and the node (a rule or program the engine did not foresee)."""
    try:
        return _try(rule, c, n, w)
    except (PurefxError, LawViolation):
        raise
    except Exception as exc:
        raise PassError(
            f"rule {rule.name!r}: rewriting at %{n.name} in graph {w.gi} of module "
            f"{w.path or '<root>'!r} failed with {type(exc).__name__}: {exc}; this rule or "
            "program is one rewrite cannot handle: narrow the rule (a `where`) or report it"
        ) from exc


def _try(rule: Rule, c: Compiled, n: Node, w: _Work) -> list[str] | None:
    """Take the first match of ``rule`` anchored at ``n`` that every guard lets through
    (``_taken``; each skip counted under the first guard that fails,
    ``RewriteReport.skipped``); the names of the nodes to revisit, or ``None`` when no match
    was taken."""
    for b in match_at(c.pattern, n, w.node.get, w.candidates):
        taken = _taken(rule, c, b, w)
        if isinstance(taken, guards.Guard):
            w.skipped[taken.name] = w.skipped.get(taken.name, 0) + 1
            continue
        return _commit(rule, *taken, w)
    return None


def _first_failing(site: guards.Site, stage: int, w: _Work) -> guards.Guard | None:
    """The first guard of ``stage`` that does not hold at ``site``, else ``None``. O(guards of
    the stage · each guard's cost)."""
    for g in w.table[stage]:
        if not g.holds(site):
            return g
    return None


def _planned(site: guards.Site, w: _Work) -> guards.Site:
    """``site`` with its PLAN facts: the nodes it removes, its results, its inputs, and the
    position for the new nodes (``None`` where no position has every input before it and
    every outside reader after it)."""
    pattern, b = site.compiled.pattern, site.exact
    matched = tuple(b.names[k] for k in pattern.nodes if k in b.names)
    absorbed = tuple(a for a in b.absorbed if a not in matched)
    removed = matched + absorbed
    outs = tuple(b.names.get(o.name) if type(o) is Ref else None for o in pattern.outputs)
    inputs = tuple(b.names[k] for k in pattern.inputs if k in b.names)
    pos = None
    if all(a in w.node for a in absorbed):
        rset = set(removed)
        keys = [w.key[m] for m in removed]
        lo, hi = min(keys), max(keys)
        if all(w.key[i] < lo for i in inputs):
            pos = lo
        elif all(w.key[u] > hi for o in outs if o is not None for u in w.users[o]
                 if u not in rset):
            pos = hi
    site.matched, site.absorbed, site.removed = matched, absorbed, removed
    site.outs, site.inputs, site.pos = outs, inputs, pos
    return site


def _with_replacement(site: guards.Site, w: _Work) -> guards.Site:
    """``site`` with its REPLACEMENT facts: the replacement for this match, the results it
    renames (returns a value already named) and the results it makes aliases of inputs."""
    c, b = site.compiled, site.exact
    vals = sizes.bound_vals(c.pattern, b, w.node.get) if c.concrete or c.by_dtype else {}
    try:
        rep = replacement_for(site.rule, c, b.scalars, vals)
    except PassError as exc:  # not at this match's values (a scale of 0.0 divided by)
        site.untraceable = str(exc)
        return site
    if rep is None:
        return site
    kept = set(_result_sources(site.outs, rep).values())
    site.replacement = rep
    site.renamed = tuple(o for o in site.outs if o is not None and o not in kept)
    site.aliases = _new_aliases(site, rep, w)
    site.shared = result_sharing.new_sharing(site, rep, w)
    return site


def _with_instance(site: guards.Site, inst: _Instance, w: _Work) -> guards.Site:
    """``site`` with its INSTANCE facts: whether a new node raised, and the values of the
    results and of what takes their places."""
    if inst.raised:
        site.raised = True
        return site
    pairs = [(o, new) for o, new in zip(site.outs, inst.results) if o is not None and new]
    site.results = inst.results
    site.old = tuple(inst.old_vals[o] for o, _ in pairs)
    site.new = tuple(_val(inst, new, w) for _, new in pairs)
    return site


def _val(inst: _Instance, name: str, w: _Work) -> Any:
    for node in inst.nodes:
        if node.name == name:
            return node.meta.get("val")
    found = w.node.get(name)
    return found.meta.get("val") if found is not None else None


def _result_sources(outs: tuple, rep: Traced) -> dict[str, str]:
    """Replacement node name -> the result name it takes (the replaced node's, removed with
    the match); a result whose value is an input, or a node already named, gets none."""
    computed = {n.name for n in rep.graph.nodes if n.op not in (PLACEHOLDER, OUTPUT)}
    sources: dict[str, str] = {}
    for o, r in zip(outs, rep.outputs):
        if o is not None and type(r) is Ref and r.name in computed and r.name not in sources:
            sources[r.name] = o
    return sources


def _new_aliases(site: guards.Site, rep: Traced, w: _Work) -> dict[str, str] | None:
    """``{result: outside value}`` for each result the replacement makes an alias of an input
    (returns it or a view of it) where the *matched nodes'* result does not share that
    input's memory: read from the fake values' storages (``guards.shares_storage``), so a
    copy inside the match (``clone``, ``contiguous``, ``to(copy=True)``, a ``reshape`` that
    copies, looked through or matched) makes the result fresh. Without values, the pattern's
    own trace decides, unless the match looks through a node or holds an alias-like one (it
    may copy): then the result counts as fresh. ``None`` when that input is unbound."""
    c, b = site.compiled, site.exact
    rep_alias = guards.result_aliases(rep)
    pat_alias = guards.result_aliases(c.traced)
    order = c.pattern.input_order
    aliases: dict[str, str] = {}
    for o, ra, pa in zip(site.outs, rep_alias, pat_alias):
        if o is None or ra is None:
            continue
        bound = b.names.get(order[ra]) if ra < len(order) else None
        if bound is None:
            return None
        shared = guards.shares_storage(w.node[o].meta.get("val"), w.node[bound].meta.get("val"))
        if shared or (shared is None and ra == pa and not _may_copy(site, w)):
            continue
        aliases[o] = bound
    return aliases


def _may_copy(site: guards.Site, w: _Work) -> bool:
    """Whether the match looks through a node or holds an alias-like one (it may copy)."""
    return bool(site.absorbed) or any(ops.is_alias_like(w.node[m].target) for m in site.matched)


@attrs.frozen
class _Instance:
    """A replacement instantiated for one match, not yet in the graph: ``nodes`` in order,
    ``results`` the graph name taking each pattern result's place (``None`` for a literal
    result, ``""`` for a literal where the pattern computes one), ``drawn`` the fresh names it
    took (given back if it is not committed), ``old_vals`` the results' values before, and
    ``raised``: a node raised on the fake values of its (known) inputs."""

    nodes: tuple[Node, ...]
    results: tuple[str | None, ...]
    drawn: tuple[str, ...]
    old_vals: Mapping[str, Any] = MappingProxyType({})
    raised: bool = False


def _instantiate(site: guards.Site, w: _Work) -> _Instance:
    """The replacement's nodes for this match, named and with a ``val`` each; stops at the
    first node that raises on the fake values of its inputs (``raised``): the replacement
    cannot run where this match runs."""
    c, b, rep = site.compiled, site.exact, site.replacement
    pattern = c.pattern
    sources = _result_sources(site.outs, rep)
    env: dict[str, Any] = {}
    rep_ph = [n.name for n in rep.graph.nodes if n.op == PLACEHOLDER]
    for pp, rp in zip(pattern.input_order, rep_ph):
        if pp in b.names:
            env[rp] = ref(b.names[pp])
    sentinels = {(type(v), v): pos for pos, v in rep.sentinels}
    frames = _common_stack([w.node[m] for m in site.matched])
    anchor_meta = w.node[b.names[pattern.anchor.name]].meta
    old_vals = {o: w.node[o].meta.get("val") for o in site.outs if o is not None}
    w.release(site.removed)  # the removed nodes' names may be reused
    w.reserve(sources.values())  # before fresh names: an inner node must not take one
    scratch: dict[str, Node] = {}
    made = kn.Drawn()  # the nodes made: their fresh names are given back if not committed

    def val_of(name: str) -> Any:
        found = scratch.get(name)
        found = found if found is not None else w.node.get(name)
        return found.meta.get("val") if found is not None else None

    kept = set(sources.values())

    def drawn() -> tuple[str, ...]:
        return tuple(n for n in made.names if n not in kept)

    w.listener = made
    try:
        for rn in rep.graph.nodes:
            if rn.op in (PLACEHOLDER, OUTPUT):
                continue
            name = sources.get(rn.name) or w.fresh(_base(rn))
            args = bind_scalars(rn.args, sentinels, b.scalars, env)
            kwargs = bind_scalars(rn.kwargs, sentinels, b.scalars, env)
            try:
                val = guards.fake_run(rn.target, args, kwargs, val_of, w.fakes)
            except kn.FakeRunFailed:
                # the replacement raises on this match's values (shapes the pattern allows and
                # the replacement does not, inductor's rule 24 with fewer k/v heads): not taken
                w.make(rn.op, rn.target, args, kwargs, name=name)
                return _Instance(tuple(scratch.values()), (), drawn(), old_vals, raised=True)
            scratch[name] = w.make(
                rn.op, rn.target, args, kwargs, name=name, stack=frames, anchor_meta=anchor_meta,
                val=val if val is not None else old_vals.get(name),
            )
            env[rn.name] = ref(name)
    finally:
        w.listener = None
    results = tuple(
        None if o is None else (env[r.name].name if type(r) is Ref and r.name in env else "")
        for o, r in zip(site.outs, rep.outputs)
    )
    return _Instance(tuple(scratch.values()), results, drawn(), MappingProxyType(old_vals))


def _refuse_literal_results(rule: Rule, site: guards.Site, inst: _Instance, w: _Work) -> None:
    if "" in inst.results:
        _give_back(inst, site, w)
        returned = next(r for r, x in zip(site.replacement.outputs, inst.results) if x == "")
        raise PassError(
            f"rule {rule.name!r}: its replacement returns {returned!r} where the pattern returns "
            "a computed value; return a tensor computed from the arguments"
        )


def _give_back(inst: _Instance, site: guards.Site, w: _Work) -> None:
    """Roll an instance back: the fresh names its nodes drew (what the kernel's listener
    heard, ``kernel.Drawn``) given back, the removed nodes' names taken again."""
    w.release(inst.drawn)
    w.reserve(site.removed)


def _commit(rule: Rule, site: guards.Site, inst: _Instance, w: _Work) -> list[str]:
    """Put the instance in the graph in place of the match; the nodes to revisit."""
    rset = set(site.removed)
    outside = {o: tuple(u for u in w.users[o] if u not in rset)
               for o in site.outs if o is not None}
    for m in site.removed:
        w.erase(m)
    for j, node in enumerate(inst.nodes):
        w.add(node, (*site.pos, j))
    new_names = [n.name for n in inst.nodes]
    pushed = list(new_names)
    for o, new in zip(site.outs, inst.results):
        if o is None:
            continue
        if new == o:
            pushed.extend(u for u in w.users.get(o, ()) if u in w.node)
            continue
        pushed.extend(w.replace_uses(o, new, outside.get(o, ())))
    for name in new_names:
        pushed.extend(w.users.get(name, ()))
    if w.fixpoint:
        starts = new_names + [new for new in inst.results if new]
        pushed.extend(w.downstream(starts, w.depth, _DOWNSTREAM_CAP))
    w.done.append(Rewrite(rule.name, w.path, w.gi, site.matched, tuple(new_names)))
    return pushed


def _base(rn: Node) -> str:
    """The base of the name of a replacement node's instance: the replacement's own name
    without its suffix (``mul_2`` -> ``mul``), else the operator's last name part."""
    return rn.name.rstrip("0123456789").rstrip("_") or target_name(rn.target).split(".")[-1]


def _common_stack(nodes: list[Node]) -> Any:
    """The module stack every one of ``nodes`` runs in; ``None`` when one has none."""
    stacks = [n.meta.get("nn_module_stack") for n in nodes]
    if not stacks or any(s is None for s in stacks):
        return None
    return common_stack(stacks)



__all__ = [
    "Rewrite", "RewriteReport", "apply_match", "apply_rules", "matches", "program_level",
    "rule_list",
]


# --- search hooks: the matches of a rule, and one match applied ---------------------------------


def matches(p: Program, rule: Rule) -> tuple[Match, ...]:
    """Every match of ``rule`` in ``p`` that ``rewrite`` could take now, in graph order (module
    graphs as ``p.walk()`` first reaches them, a shared graph once; in each, by the node the
    pattern ends in, then the matcher's order), each variant of its ``optional`` arguments.

    The rule is taken as right (as ``apply_rules`` takes it: call ``check_rule`` first) and
    its assumptions as granted. Matches may overlap: taking one may undo another
    (``apply_match`` then refuses the stale one).

    **Laws:** ``p`` is not changed; for a program with one match, ``apply_match(p,
    matches(p, rule)[0])`` equals ``rewrite(p, [rule])`` when the rewritten program holds no
    new match. Complexity: O(nodes + candidates · (pattern size + one instantiation)).
    """
    out: list[Match] = []
    level = program_level(p)
    for mid, path, gi, graph, per_match, barriers in _graph_sites(p):
        for variant in rule.variants():
            c = variant.at_level(level)
            if c is None:
                continue  # this variant does not exist at the program's level
            w = _work(p, mid, graph, path, gi, per_match, barriers, c)
            for n in graph.nodes:
                if n.op != CALL_FUNCTION or n.target is not c.pattern.anchor.target:
                    continue
                for b in match_at(c.pattern, n, w.node.get, w.candidates):
                    found = _taken(variant, c, b, w)
                    if isinstance(found, guards.Guard):
                        continue
                    site, inst = found
                    _give_back(inst, site, w)
                    out.append(_match(variant, c, site, path, gi, graph, level, n.name))
    return tuple(out)


def apply_match(p: Program, m: Match) -> Program:
    """``p`` with the match ``m`` (from ``matches(p, rule)``) rewritten: one rewrite, taken
    as ``rewrite`` takes it (the same guards, new nodes named, placed and given values the same
    way, results renamed in the signature, state folded for a ``fold_state`` rule).

    Raises ``PassError`` naming the rule, the node and the module when ``m`` is no match of
    ``p`` (its graph is not one of ``p``'s: a match of another program, or of ``p`` before
    another rewrite), when ``m`` was not made by ``matches``, or when a guard declines it now
    (naming the guard and its reason).

    **Laws:** ``p`` is not changed; the result is a new Program (never ``p``). Complexity:
    O(nodes of the graph + one instantiation).
    """
    if not isinstance(m, Match) or m.definition is None or m.binding is None:
        raise PassError(
            f"apply_match: expected a Match from matches(p, rule), got {type(m).__name__}"
        )
    where = f"rule {m.rule!r} at %{m.anchor} in graph {m.graph} of module {m.module or '<root>'!r}"
    site_of = {(path, gi): (mid, graph, per_match, barriers)
               for mid, path, gi, graph, per_match, barriers in _graph_sites(p)}
    found = site_of.get((m.module, m.graph))
    if found is None or not (found[1] is m.source or found[1] == m.source):
        raise PassError(
            f"apply_match: the match of {where} is not a match in this program (that graph is "
            "not one of its graphs: a match of another program, or of this one before another "
            "rewrite); list the matches of this program with matches(p, rule)"
        )
    mid, graph, per_match, barriers = found
    rule, level = m.definition, m.level
    c = rule.compiled(level)
    w = _work(p, mid, graph, m.module, m.graph, per_match, barriers, c)
    taken = _taken(rule, c, m.binding, w)
    if isinstance(taken, guards.Guard):
        raise PassError(
            f"apply_match: guard {taken.name!r} declines the match of {where}: {taken.reason}"
        )
    site, inst = taken
    _commit(rule, site, inst, w)
    new_graph, renames = w.finish()
    mod = p.module_table()[mid]
    graphs = tuple(new_graph if i == m.graph else g for i, g in enumerate(mod.graphs))
    q = kn.finalised(p, p.replace(modules=p.modules.set(mid, mod.replace(graphs=graphs))),
                     {p.root: renames} if mid == p.root and m.graph == 0 else {})
    if rule.fold_state and mid == p.root and m.graph == 0:
        q = fold_into_state(q, set(w.done[-1].created))
    return q


# --- helpers ------------------------------------------------------------------------------------


def _graph_sites(p: Program):
    """``(module id, path, graph index, graph, per_match, barriers)`` for each distinct module
    graph of ``p``, as the engine visits them. ``per_match``: a graph run by several calls may
    see other shapes than its vals say, so a replacement traced per match's shapes is not
    instantiated there."""
    table = p.module_table()
    order = list(dict.fromkeys(mid for _, mid in p.walk()))
    multi = _called_more_than_once(p, order, table)
    barriers = _barriers(p)
    for mid in order:
        path = p.first_path(mid) or ""
        for gi, graph in enumerate(table[mid].graphs):
            yield (mid, path, gi, graph, mid not in multi,
                   barriers if mid == p.root else _NO_BARRIERS)


def _work(p, mid, graph, path, gi, per_match, barriers, c) -> _Work:
    """The working graph ``matches`` and ``apply_match`` judge a match on: the one ``rewrite``
    builds for that graph (its writes from ``graph_effects``, as ``rewrite`` reads them)."""
    run = _Run([], {}, _by_stage(guards.GUARDS), True)
    return _Work(graph, path, gi, per_match, barriers, c.pattern.size, run,
                 graph_effects(p, mid, graph))


def _taken(rule: Rule, c, b, w: _Work):
    """``(site, instance)`` for binding ``b`` when every guard holds, else the first guard
    that does not (``guards.GUARDS``, stage by stage; nothing committed)."""
    exact = sizes.recheck(rule, c, b, w.node.get, c.level, w.users.get)
    site = guards.Site(w, rule, c, b, exact)
    failing = _first_failing(site, guards.MATCH, w)
    if failing is None:
        site = _planned(site, w)
        failing = _first_failing(site, guards.PLAN, w)
    if failing is None:
        site = _with_replacement(site, w)
        failing = _first_failing(site, guards.REPLACEMENT, w)
    if failing is not None:
        return failing
    inst = _instantiate(site, w)
    if not inst.raised:
        _refuse_literal_results(rule, site, inst, w)
    failing = _first_failing(_with_instance(site, inst, w), guards.INSTANCE, w)
    if failing is not None:
        _give_back(inst, site, w)
        return failing
    return site, inst


def _match(rule: Rule, c, site, path: str, gi: int, graph, level: str, anchor: str) -> Match:
    base = guards.match_value(rule, c.pattern, site.exact, site.view)
    return Match(base.rule, MappingProxyType(dict(base.nodes)), base.inputs, path, gi, anchor,
                 site.binding, rule, level, graph)


