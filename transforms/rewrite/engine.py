"""``rewrite``: user rules written as PyTorch functions, applied to a fixpoint.

A ``Rule`` pairs a *pattern* and a *replacement*, two plain functions of tensors and Python
scalars with the same results, and example inputs to trace them with::

    relu_relu = Rule(lambda x: torch.relu(torch.relu(x)), torch.relu, (torch.randn(4),))
    q = rewrite(p, [relu_relu])

The pattern is traced at the level of the program it is applied to (training IR, or core aten
after ``run_decompositions``; ``transforms.rewrite.trace``), the replacement at the training level
(what the user wrote: ``silu``, ``scaled_dot_product_attention``). Matching is on the IR in a
normal form (``transforms.rewrite.match``). Each rule is checked with ``check_rule``
(``transforms.rewrite.check``) the first time ``rewrite`` meets it, unless it is ``trusted``.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import attrs
import torch

from ir import ops
from ir.args import IDict, IList, Ref, map_refs, ref, thaw
from ir.errors import PassError, PurefxError
from ir.graph import Graph
from ir.module import ModuleId
from ir.names import Names, fresh_name, target_name
from ir.node import CALL_FUNCTION, CALL_MODULE, OUTPUT, PLACEHOLDER, Node
from ir.program import Program
from transforms.law_violation import LawViolation
from transforms.rewrite import guards, sizes
from transforms.rewrite.check import check_rule
from transforms.rewrite.fold import fold_into_state
from transforms.rewrite.match import Binding, Pattern, match_at
from transforms.rewrite.rule import Compiled, Match, Rule, replacement_for, rule_cache
from transforms.rewrite.trace import Traced, level_of


@attrs.frozen
class Rewrite:
    """One rewrite that was applied: the rule, the module path and graph of the rewritten graph,
    the names of the nodes it replaced and of those it created."""

    rule: str
    module: str
    graph: int
    replaced: tuple[str, ...]
    created: tuple[str, ...] = ()


@attrs.frozen
class RewriteReport:
    """What ``rewrite_report`` did: ``counts`` ``{rule name: rewrites applied}`` (every rule
    listed, in the order given) and ``rewrites``, each applied ``Rewrite`` in order."""

    counts: Mapping[str, int]
    rewrites: tuple[Rewrite, ...]


# --- the pass -----------------------------------------------------------------------------------


def rewrite(p: Program, rules: Iterable[Rule]) -> Program:
    """Apply ``rules`` to every graph of ``p`` until none matches.

    Parameters:
        p: a Program, flat (``import_ep``, at the training or core aten level) or outlined
            (after ``transforms.transform``); every distinct module graph is rewritten once,
            so a graph shared by several calls is rewritten once.
        rules: ``Rule`` values. Each is checked with ``check_rule`` the first time it is met
            (unless ``trusted``); the verdict is kept beside the rule (``rule_verdict``).

    Returns:
        The rewritten Program; ``p`` itself (``is``) when no rule matched. New nodes take the
        name of the node whose value they replace (so outputs and signatures keep their names),
        the innermost module common to the matched nodes (``nn_module_stack``) and a ``val``
        computed from the matched inputs' fake tensors (else the replaced node's). A match is
        skipped where a value inside it is read outside, where it holds a mutating, effectful
        or random op, where an input is written in place or a write in place lies between its
        nodes, and (for a replacement traced per match, ``Compiled.concrete``) where its
        inputs' shapes are unknown or several calls run the graph; and where a guard of
        ``transforms.rewrite.guards`` says the program around it would change:
        ``alias_guard`` (a fresh result made an alias of an input or state value that a write
        or the caller can reach), ``barrier_guard`` (the match crosses a preserved call's
        boundary, or renames a value its signature names) and ``dtype_guard`` (a value taking
        a result's place has another dtype or shape). Nodes the match looks through
        (``Binding.absorbed``) are removed with it. A replacement whose trace depends on
        dtypes (``Compiled.by_dtype``) is traced at each match's dtypes.

    Raises:
        PassError: naming the rule, when a rule cannot be traced or is malformed, when
        ``check_rule`` finds it wrong (with the counterexample), when its ``where`` raises, when
        its replacement reads a tensor argument its pattern ignores, when rules keep rewriting
        each other's results past the step cap (a cycle; names them), and for any other error
        met while rewriting (naming the rule and the node): never a raw exception.

    **Laws:**

    - semantics: ``lower(rewrite(p, rules))`` computes what ``lower(p)`` does, up to each rule's
      tolerance (``check_rule``);
    - purity: ``p`` and its tensors are untouched; deterministic (rules in the order of their
      benefit then as given, nodes in graph order);
    - idempotence: ``rewrite(rewrite(p, rules), rules) == rewrite(p, rules)`` (a fixpoint);
    - identity: ``rewrite(p, []) is p``;
    - ``verify`` holds of the result whenever it holds of ``p``.

    Complexity: O(n · r) per sweep over n nodes, where r is the number of rules whose pattern
    ends in the node's operator (rules are indexed by that operator); each rewrite re-examines
    the nodes it created, the readers it rewired and the nodes downstream of its new nodes
    within the deepest pattern (at most 256), then one closing sweep per graph proves the
    fixpoint (``FIXPOINT``); a program whose level changes under the rewrites (core aten
    receiving a training-level operator) gets one more round at the new level when some
    pattern traces differently there.
    """
    return rewrite_report(p, rules)[0]


def rewrite_report(p: Program, rules: Iterable[Rule]) -> tuple[Program, RewriteReport]:
    """``rewrite(p, rules)`` and a ``RewriteReport`` of what it rewrote where.

    Same contract, laws and complexity as ``rewrite``.
    """
    rules = _check_rules(rules)
    if rules:
        level = level_of(_graphs(p))
        for r in rules:
            r.compiled(level)  # a malformed rule is refused before its check runs
            _ensure_checked(r)
    return apply_rules(p, rules)


def _graphs(p: Program) -> list[Graph]:
    table = p.module_table()
    order = dict.fromkeys(mid for _, mid in p.walk())
    return [g for mid in order for g in table[mid].graphs]


def apply_rules(p: Program, rules: Iterable[Rule]) -> tuple[Program, RewriteReport]:
    """``rewrite_report(p, rules)`` without running ``check_rule`` on the rules: the one path
    that instantiates replacements, shared by ``rewrite`` and the laws that check a rule
    (``check_rule`` rewrites the pattern's own program with it).

    Same contract, laws and complexity as ``rewrite``, for rules taken as right.
    """
    rules = _check_rules(rules)
    counts = {r.name: 0 for r in rules}
    done: list[Rewrite] = []
    q = p
    if rules:
        level = level_of(_graphs(p))
        for _ in range(_LEVEL_ROUNDS):
            nxt = _round(q, rules, level, done)
            if nxt is q or not FIXPOINT:
                q = nxt
                break
            q = nxt
            # the replacements may have put operators of another level in: the rules are
            # traced again at the program's new level until it holds (a fixpoint there)
            now = level_of(_graphs(q))
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
    return q, RewriteReport(MappingProxyType(counts), tuple(done))


def _same_at_both_levels(rules: list[Rule], a: str, b: str) -> bool:
    """Whether every rule's pattern traces to the same graph at levels ``a`` and ``b`` (none
    holds an operator that one level decomposes): a fixpoint at one is one at the other."""
    return all(_pattern_key(r.compiled(a)) == _pattern_key(r.compiled(b)) for r in rules)


def _pattern_key(c: Compiled) -> tuple:
    return tuple((n.op, n.name, n.target, n.args, n.kwargs) for n in c.traced.graph.nodes)


_LEVEL_ROUNDS = 8  #: rounds at a new level after a rewrite changed the program's level, at most


def _round(p: Program, rules: list[Rule], level: str, done: list[Rewrite]) -> Program:
    """Every graph of ``p`` rewritten to a fixpoint with the rules traced at ``level``;
    appends the rewrites to ``done``; ``p`` itself when none applied."""
    table = p.module_table()
    order = list(dict.fromkeys(mid for _, mid in p.walk()))
    compiled = [(r, r.compiled(level)) for r in rules]
    compiled.sort(key=lambda rc: -rc[1].benefit)  # stable: ties keep the order given
    index: dict[int, list[tuple[Rule, Compiled]]] = {}
    for r, c in compiled:
        index.setdefault(id(c.pattern.anchor.target), []).append((r, c))
    multi = _called_more_than_once(p, order, table)
    barriers = _barriers(p)
    depth = max(c.pattern.size for _, c in compiled)
    start = len(done)
    changed: dict[ModuleId, Any] = {}
    renamed_root: dict[str, str] = {}
    for mid in order:
        mod = table[mid]
        new_graphs = []
        for gi, graph in enumerate(mod.graphs):
            path = p.first_path(mid) or ""
            # a graph run by several calls may see other shapes than its vals say: a
            # replacement traced per match's shapes is not instantiated there
            per_match = mid not in multi
            out, renames = _rewrite_graph(
                graph, index, done, path, gi, per_match,
                barriers if mid == p.root else _NO_BARRIERS, depth,
            )
            new_graphs.append(out)
            if mid == p.root and gi == 0:
                renamed_root = renames
        if any(a is not b for a, b in zip(new_graphs, mod.graphs)):
            changed[mid] = mod.replace(graphs=tuple(new_graphs))
    if not changed:
        return p
    q = p.replace(modules=p.modules.update(changed))
    if renamed_root:
        q = q.replace(signature=_renamed_signature(q, renamed_root))
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


def _check_rules(rules: Iterable[Rule]) -> list[Rule]:
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


def rule_verdict(rule: Rule) -> BaseException | bool | None:
    """``check_rule``'s verdict on ``rule`` as ``rewrite`` keeps it (in ``rule_cache``, a memo
    keyed by the rule): ``True`` (right), the ``LawViolation``, or ``None`` before the first
    ``rewrite`` that met the rule. O(1)."""
    return rule_cache(rule).verdict


def _ensure_checked(rule: Rule) -> None:
    if rule.trusted:
        return
    cache = rule_cache(rule)
    if cache.verdict is None:
        try:
            check_rule(rule, apply=apply_rules)
            cache.verdict = True
        except LawViolation as exc:
            cache.verdict = _without_frames(exc)
        except PurefxError:
            raise
        except Exception as exc:  # a check that broke is no verdict: say so, keep none
            raise PassError(
                f"rule {rule.name!r}: check_rule failed with {type(exc).__name__}: {exc}; "
                "mark the rule Rule(..., trusted=True) to skip the check, or report it"
            ) from exc
    if cache.verdict is not True:
        raise PassError(
            f"rule {rule.name!r} is wrong, so rewrite refuses it (mark it Rule(..., "
            f"trusted=True) to skip the check): {cache.verdict}"
        ) from cache.verdict


def _without_frames(exc: BaseException) -> BaseException:
    """``exc`` with the tracebacks of it and its causes dropped: a verdict kept beside a rule
    must hold no frame that holds the rule (the memo would never let the rule go)."""
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        e.__traceback__ = None
        e = e.__cause__ or e.__context__
    return exc


def _renamed_signature(q: Program, renames: Mapping[str, str]):
    sig = q.signature
    outs = tuple(
        attrs.evolve(s, name=renames.get(s.name, s.name)) if s.name in renames else s
        for s in sig.outputs
    )
    return attrs.evolve(sig, outputs=outs)


# --- one graph ----------------------------------------------------------------------------------

FIXPOINT = True
"""Whether the worklist reaches a true fixpoint: after each rewrite the nodes downstream of the
new nodes (within the deepest pattern) are revisited, and the graph is swept again until a
sweep applies nothing. ``False`` gives the old worklist (only the direct readers of new nodes
revisited, one pass), which misses matches two or more readers downstream of a rewrite; a
test switches it off to show that ``rewrite`` is then not idempotent."""

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


class _Work:
    """The mutable working copy of one graph that the driver rewrites (local to one call), and
    what the rewrites of that graph need to know: where it is (``path``, ``gi``), whether a
    replacement may be traced per match (``per_match``), the preserved calls it must keep
    whole, the deepest pattern, the rewrites done and the renames of results."""

    def __init__(
        self, graph: Graph, path: str, gi: int, per_match: bool, barriers: _Barriers,
        depth: int, done: list[Rewrite],
    ) -> None:
        self.node: dict[str, Node] = {}
        self.key: dict[str, tuple] = {}
        self.users: dict[str, dict[str, None]] = {}
        self.by_target: dict[int, dict[str, None]] = {}
        self.written: set[str] = set()
        self.mutations: list[tuple] = []  #: sorted keys of the nodes that write in place
        for i, n in enumerate(graph.nodes):
            self.add(n, (i,))
        self.taken = Names(self.node)
        self.path, self.gi, self.per_match = path, gi, per_match
        self.barriers, self.depth, self.done = barriers, depth, done
        self.renames: dict[str, str] = {}

    def add(self, n: Node, key: tuple) -> None:
        self.node[n.name] = n
        self.key[n.name] = key
        self.users.setdefault(n.name, {})
        for r in n.inputs():
            self.users.setdefault(r.name, {})[n.name] = None
        if n.op == CALL_FUNCTION:
            self.by_target.setdefault(id(n.target), {})[n.name] = None
            written = ops.facts(n.target).written
            if written or ops.is_mutating(n.target):
                bisect.insort(self.mutations, key)
            if written:
                for pos in written:
                    if pos < len(n.args) and type(n.args[pos]) is Ref:
                        self.written.add(n.args[pos].name)

    def remove(self, name: str) -> None:
        n = self.node.pop(name)
        key = self.key.pop(name)
        for r in n.inputs():
            readers = self.users.get(r.name)
            if readers is not None:
                readers.pop(name, None)
        if n.op == CALL_FUNCTION:
            self.by_target[id(n.target)].pop(name, None)
            at = bisect.bisect_left(self.mutations, key)
            if at < len(self.mutations) and self.mutations[at] == key:
                del self.mutations[at]

    def mutates_between(self, lo: tuple, hi: tuple) -> bool:
        """Whether a node that writes in place lies strictly between keys ``lo`` and ``hi``."""
        at = bisect.bisect_right(self.mutations, lo)
        return at < len(self.mutations) and self.mutations[at] < hi

    def candidates(self, target: Any):
        return [self.node[k] for k in list(self.by_target.get(id(target), ()))]

    def downstream(self, names: Iterable[str], depth: int) -> list[str]:
        """The readers of ``names`` and their readers, ``depth`` levels deep (at most
        ``_DOWNSTREAM_CAP`` of them), in the order found."""
        seen = dict.fromkeys(names)
        level = list(seen)
        found: list[str] = []
        for _ in range(depth):
            nxt = []
            for v in level:
                for u in self.users.get(v, ()):
                    if u not in seen:
                        seen[u] = None
                        nxt.append(u)
                        found.append(u)
                        if len(found) >= _DOWNSTREAM_CAP:
                            return found
            level = nxt
        return found


def _rewrite_graph(
    graph: Graph, index: Mapping[int, list], done: list[Rewrite], path: str, gi: int,
    per_match: bool = True, barriers: _Barriers = _NO_BARRIERS, depth: int = 1,
) -> tuple[Graph, dict[str, str]]:
    if not any(n.op == CALL_FUNCTION and id(n.target) in index for n in graph.nodes):
        return graph, {}
    w = _Work(graph, path, gi, per_match, barriers, depth, done)
    queue = collections.deque(n.name for n in graph.nodes if n.op == CALL_FUNCTION)
    steps = [0, 4 * len(graph.nodes) + 64]
    recent: collections.deque[str] = collections.deque(maxlen=16)
    applied_any = False
    while True:
        applied = _drain(queue, index, w, steps, recent, len(graph))
        applied_any = applied_any or applied
        if not applied or not FIXPOINT:
            break
        queue = _sweep(w, index)  # a sweep that applies nothing ends the rewrite: a fixpoint
    if not applied_any:
        return graph, {}
    nodes = sorted(w.node.values(), key=lambda x: w.key[x.name])
    return Graph.of(nodes), _resolve(w.renames)


def _sweep(w: _Work, index: Mapping[int, list]) -> collections.deque:
    """Every node that some rule's pattern ends in, in graph order."""
    names = [k for t in index for k in w.by_target.get(t, ())]
    names.sort(key=w.key.__getitem__)
    return collections.deque(names)


def _drain(
    queue: collections.deque, index: Mapping[int, list], w: _Work, steps: list,
    recent: collections.deque, size: int,
) -> bool:
    """Try the rules on each queued node until the queue is empty; whether any applied."""
    queued = set(queue)
    applied = False
    while queue:
        name = queue.popleft()
        queued.discard(name)
        n = w.node.get(name)
        if n is None or n.op != CALL_FUNCTION:
            continue
        for rule, c in index.get(id(n.target), ()):
            if c.concrete and not w.per_match:
                continue
            pushed = _try_safely(rule, c, n, w)
            if pushed is None:
                continue
            applied = True
            steps[0] += 1
            recent.append(rule.name)
            if steps[0] > steps[1]:
                names = sorted(set(recent))
                raise PassError(
                    f"rewrite: rules {names} keep rewriting each other's results in graph "
                    f"{w.gi} of module {w.path or '<root>'!r} ({steps[0]} rewrites of a {size}"
                    "-node graph): they form a cycle; drop or narrow one of them (a `where`)"
                )
            for m in pushed:
                if m not in queued and m in w.node:
                    queue.append(m)
                    queued.add(m)
            break
    return applied


def _resolve(renames: dict[str, str]) -> dict[str, str]:
    out = {}
    for old, new in renames.items():
        while new in renames:
            new = renames[new]
        out[old] = new
    return out


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
    """Take the first match of ``rule`` anchored at ``n`` that is safe in its program; the
    names of the nodes to revisit, or ``None`` when no match was taken."""
    for b in match_at(c.pattern, n, w.node.get, w.candidates):
        b = sizes.recheck(rule, c, b, w.node.get, c.level, w.users.get)
        if b is None:
            continue
        plan = _plan(rule, c, b, w)
        if plan is None:
            continue
        vals = _input_vals(c.pattern, b, w) if c.concrete or c.by_dtype else {}
        rep = replacement_for(rule, c, b.scalars, vals)
        if rep is None:
            continue
        sources = _result_sources(plan.outs, rep)
        if not _context_allows(c, rep, b, plan, sources, w):
            continue
        inst = _instantiate(rule, c, b, plan, rep, sources, w)
        if inst is None:
            continue
        return _commit(rule, plan, inst, w)
    return None


@attrs.frozen
class _Plan:
    """A match that may be taken where it is: ``matched``, the graph nodes bound to the
    pattern's compute nodes; ``removed``, those and the ``Binding.absorbed`` nodes (all go);
    ``outs``, the graph node of each pattern result (``None`` for a literal); ``pos``, the key
    the new nodes are placed at; ``outside``, each result's readers outside the match."""

    matched: tuple[str, ...]
    removed: tuple[str, ...]
    outs: tuple[str | None, ...]
    pos: tuple
    outside: Mapping[str, tuple[str, ...]]


def _plan(rule: Rule, c: Compiled, b: Binding, w: _Work) -> _Plan | None:
    """Check that the match is safe in its graph (beyond the guards that need the
    replacement); the plan to take it, or ``None``."""
    pattern = c.pattern
    matched = tuple(b.names[k] for k in pattern.nodes if k in b.names)
    absorbed = getattr(b, "absorbed", ())
    if absorbed:
        absorbed = tuple(a for a in absorbed if a not in matched)
        if any(a not in w.node for a in absorbed):
            return None
    removed = matched + absorbed
    rset = set(removed)
    for m in matched:
        t = w.node[m].target
        if ops.is_mutating(t) or ops.is_effectful(t) or ops.is_random(t):
            return None
    outs = tuple(b.names.get(o.name) if type(o) is Ref else None for o in pattern.outputs)
    out_set = {o for o in outs if o is not None}
    for m in removed:
        if m not in out_set and any(u not in rset for u in w.users[m]):
            return None  # an interior (or absorbed) value is read outside the match
    inputs = [b.names[k] for k in pattern.inputs if k in b.names]
    if any(i in w.written for i in inputs):
        return None  # an input is written in place somewhere: do not move reads of it
    keys = [w.key[m] for m in removed]
    lo, hi = min(keys), max(keys)
    if w.mutates_between(lo, hi):
        return None  # the match spans a write in place (maybe of a view of one of its inputs)
    outside = {o: tuple(u for u in w.users[o] if u not in rset) for o in out_set}
    if all(w.key[i] < lo for i in inputs):
        pos = lo
    elif all(w.key[u] > hi for us in outside.values() for u in us):
        pos = hi
    else:
        return None
    if not guards.barrier_guard(w, removed, w.barriers.calls):
        return None  # the match crosses a preserved call's boundary
    if rule.where is not None and not _where_holds(rule, pattern, b, w, matched):
        return None
    return _Plan(matched, removed, outs, pos, outside)


def _where_holds(rule: Rule, pattern: Pattern, b: Binding, w: _Work, matched) -> bool:
    match = _match_value(rule, pattern, b, w)
    try:
        return bool(rule.where(match))
    except PurefxError:
        raise
    except Exception as exc:
        raise PassError(
            f"rule {rule.name!r}: its where() raised {type(exc).__name__}: {exc} on a match "
            f"at %{w.node[matched[-1]].name}; make where() return a bool for every Match"
        ) from exc


def _match_value(rule: Rule, pattern: Pattern, b: Binding, w: _Work) -> Match:
    nodes = {k: w.node[b.names[k]] for k in pattern.nodes if k in b.names}
    trace_inputs = dict(zip(pattern.tensor_args, pattern.input_order))
    inputs = []
    for i, x in enumerate(rule.example_inputs):
        if i in trace_inputs:
            bound = b.names.get(trace_inputs[i])
            inputs.append(w.node[bound] if bound is not None else None)
        else:
            inputs.append(b.scalars.get(i, x))
    return Match(rule.name, MappingProxyType(nodes), tuple(inputs))


def _input_vals(pattern: Pattern, b: Binding, w: _Work) -> dict[int, Any]:
    """Rule argument position -> the matched input's ``meta['val']`` (or ``None``)."""
    vals = {}
    for i, ph in zip(pattern.tensor_args, pattern.input_order):
        bound = b.names.get(ph)
        vals[i] = w.node[bound].meta.get("val") if bound is not None else None
    return vals


def _result_sources(outs: tuple, rep: Traced) -> dict[str, str]:
    """Replacement node name -> the result name it takes (the replaced node's, removed with
    the match); a result whose value is an input, or a node already named, gets none."""
    computed = {n.name for n in rep.graph.nodes if n.op not in (PLACEHOLDER, OUTPUT)}
    sources: dict[str, str] = {}
    for o, r in zip(outs, rep.outputs):
        if o is not None and type(r) is Ref and r.name in computed and r.name not in sources:
            sources[r.name] = o
    return sources


def _context_allows(
    c: Compiled, rep: Traced, b: Binding, plan: _Plan, sources: Mapping[str, str], w: _Work
) -> bool:
    """The guards that need the replacement but not its instance: no result renamed across a
    preserved signature, no fresh result made an alias of an outside value that a write or
    the caller can reach (``guards``)."""
    kept = set(sources.values())
    renamed = [o for o in plan.outs if o is not None and o not in kept]
    if renamed and not guards.barrier_guard(
        w, plan.removed, w.barriers.calls, renamed, w.barriers.names
    ):
        return False
    aliases = _new_aliases(c, rep, b, plan)
    if aliases is None:
        return False
    return not aliases or guards.alias_guard(w, aliases)


def _new_aliases(c: Compiled, rep: Traced, b: Binding, plan: _Plan) -> dict[str, str] | None:
    """``{result: outside value}`` for each result the replacement makes an alias of an input
    the pattern's result was not an alias of; ``None`` when that input is unbound."""
    rep_alias = guards.result_aliases(rep)
    pat_alias = guards.result_aliases(c.traced)
    order = c.pattern.input_order
    aliases: dict[str, str] = {}
    for o, ra, pa in zip(plan.outs, rep_alias, pat_alias):
        if o is None or ra is None or ra == pa:
            continue
        bound = b.names.get(order[ra]) if ra < len(order) else None
        if bound is None:
            return None
        aliases[o] = bound
    return aliases


@attrs.frozen
class _Instance:
    """A replacement instantiated for one match, not yet in the graph: ``nodes`` in order,
    ``results`` the graph name taking each pattern result's place (``None`` for a literal
    result), ``drawn`` the fresh names it took (given back if it is not committed)."""

    nodes: tuple[Node, ...]
    results: tuple[str | None, ...]
    drawn: tuple[str, ...]


def _instantiate(
    rule: Rule, c: Compiled, b: Binding, plan: _Plan, rep: Traced, sources: Mapping[str, str], w: _Work
) -> _Instance | None:
    """The replacement's nodes for this match, named and with a ``val`` each; ``None`` (and
    ``w`` as it was) when a value taking a result's place has another dtype or shape than the
    result (``guards.dtype_guard``), or when a replacement node raises on the fake values of
    its (known) inputs: the replacement cannot run where this match runs."""
    pattern = c.pattern
    env: dict[str, Any] = {}
    rep_ph = [n.name for n in rep.graph.nodes if n.op == PLACEHOLDER]
    for pp, rp in zip(pattern.input_order, rep_ph):
        if pp in b.names:
            env[rp] = ref(b.names[pp])
    sentinels = {(type(v), v): pos for pos, v in rep.sentinels}
    frames = _common_stack([w.node[m] for m in plan.matched])
    anchor_meta = w.node[b.names[pattern.anchor.name]].meta
    old_vals = {o: w.node[o].meta.get("val") for o in plan.outs if o is not None}
    for m in plan.removed:
        w.taken.discard(m)  # the removed nodes' names may be reused
    w.taken.update(sources.values())  # before fresh names: an inner node must not take one
    scratch: dict[str, Node] = {}
    drawn: list[str] = []

    def lookup(name: str) -> Node | None:
        found = scratch.get(name)
        return found if found is not None else w.node.get(name)

    for rn in rep.graph.nodes:
        if rn.op in (PLACEHOLDER, OUTPUT):
            continue
        if rn.name in sources:
            name = sources[rn.name]
        else:
            name = _fresh(w, rn)
            drawn.append(name)
        args = _bind(rn.args, env, sentinels, b.scalars)
        kwargs = _bind(rn.kwargs, env, sentinels, b.scalars)
        val = _fake_val(rn.target, args, kwargs, lookup)
        if val is RAISED:
            # the replacement raises on this match's values (shapes the pattern allows and
            # the replacement does not, inductor's rule 24 with fewer k/v heads): not taken
            _give_back(_Instance(tuple(scratch.values()), (), tuple(drawn)), plan, w)
            return None
        meta = _new_meta(val if val is not None else old_vals.get(name), frames, anchor_meta)
        scratch[name] = Node(rn.op, name, rn.target, args, kwargs, meta)
        env[rn.name] = ref(name)
    results = tuple(
        None if o is None else (env[r.name].name if type(r) is Ref and r.name in env else "")
        for o, r in zip(plan.outs, rep.outputs)
    )
    inst = _Instance(tuple(scratch.values()), results, tuple(drawn))
    old = [old_vals[o] for o, new in zip(plan.outs, results) if o is not None and new]
    new = [lookup(n).meta.get("val") for o, n in zip(plan.outs, results) if o is not None and n]
    if "" in results:
        _give_back(inst, plan, w)
        returned = next(r for r, x in zip(rep.outputs, results) if x == "")
        raise PassError(
            f"rule {rule.name!r}: its replacement returns {returned!r} where the pattern returns "
            "a computed value; return a tensor computed from the arguments"
        )
    if not guards.dtype_guard(old, new):
        _give_back(inst, plan, w)
        return None
    return inst


def _give_back(inst: _Instance, plan: _Plan, w: _Work) -> None:
    for name in inst.drawn:
        w.taken.discard(name)
    w.taken.update(plan.removed)


def _commit(rule: Rule, plan: _Plan, inst: _Instance, w: _Work) -> list[str]:
    """Put the instance in the graph in place of the match; the nodes to revisit."""
    for m in plan.removed:
        w.remove(m)
    for j, node in enumerate(inst.nodes):
        w.add(node, (*plan.pos, j))
    new_names = [n.name for n in inst.nodes]
    pushed = list(new_names)
    for o, new in zip(plan.outs, inst.results):
        if o is None:
            continue
        if new == o:
            pushed.extend(u for u in w.users.get(o, ()) if u in w.node)
            continue
        w.renames[o] = new
        for u in plan.outside.get(o, ()):
            if u not in w.node:
                continue
            old, key = w.node[u], w.key[u]
            w.remove(u)
            w.add(old.replace(args=_swap(old.args, o, ref(new)),
                              kwargs=_swap(old.kwargs, o, ref(new))), key)
            pushed.append(u)
    for name in new_names:
        pushed.extend(w.users.get(name, ()))
    if FIXPOINT:
        starts = new_names + [new for new in inst.results if new]
        pushed.extend(w.downstream(starts, w.depth))
    w.done.append(Rewrite(rule.name, w.path, w.gi, plan.matched, tuple(new_names)))
    return pushed


def _swap(tree: Any, old: str, new: Ref) -> Any:
    return map_refs(tree, lambda r: new if r.name == old else r)


def _fresh(w: _Work, rn: Node) -> str:
    base = rn.name.rstrip("0123456789").rstrip("_") or target_name(rn.target).split(".")[-1]
    return fresh_name(base, w.taken)


def _bind(tree: Any, env: Mapping[str, Any], sentinels: Mapping, scalars: Mapping) -> Any:
    if type(tree) is Ref:
        return env.get(tree.name, tree)
    if type(tree) is tuple:
        return tuple(_bind(x, env, sentinels, scalars) for x in tree)
    if type(tree) is IList:
        return IList(tuple(_bind(x, env, sentinels, scalars) for x in tree.items))
    if type(tree) is IDict:
        return IDict(tuple((k, _bind(v, env, sentinels, scalars)) for k, v in tree.items))
    if type(tree) in (int, float):
        pos = sentinels.get((type(tree), tree))  # typed: an int literal is no float sentinel
        if pos is not None and pos in scalars:
            return scalars[pos]
    return tree


def _common_stack(nodes: list[Node]) -> Any:
    stacks = [n.meta.get("nn_module_stack") for n in nodes]
    if not stacks or any(s is None for s in stacks):
        return None
    common = list(stacks[0].items())
    for s in stacks[1:]:
        items = list(s.items())
        k = 0
        while k < min(len(common), len(items)) and common[k] == items[k]:
            k += 1
        common = common[:k]
    return dict(common)


def _new_meta(val: Any, stack: Any, anchor_meta: Mapping[str, Any]) -> Mapping[str, Any]:
    """A new node's meta: the common module ``stack``, the anchor's ``stack_trace`` and ``val``
    (its fake value, else the replaced node's: a result has the same shape and dtype)."""
    meta: dict[str, Any] = {}
    if stack is not None:
        meta["nn_module_stack"] = stack
    if "stack_trace" in anchor_meta:
        meta["stack_trace"] = anchor_meta["stack_trace"]
    if val is not None:
        meta["val"] = val
    return MappingProxyType(meta)


def _fake_val(target, args, kwargs, lookup) -> Any:
    missing = []
    modes = []

    def on_ref(r: Ref) -> Any:
        n = lookup(r.name)
        v = n.meta.get("val") if n is not None else None
        if v is None:
            missing.append(r.name)
        else:
            modes.extend(
                t.fake_mode for t in (v if isinstance(v, (tuple, list)) else (v,))
                if isinstance(t, torch.Tensor) and hasattr(t, "fake_mode")
            )
        return v

    a = thaw(args, on_ref)
    k = thaw(kwargs, on_ref)
    if missing or not modes:
        return None
    try:
        with modes[0]:
            return target(*a, **k)
    except Exception:  # noqa: BLE001 - torch's errors share no base class
        return RAISED  # every input's val is known: the replacement fails on this match


class _Raised:
    """What ``_fake_val`` gives when the operator raised on fake values of known inputs."""

    __slots__ = ()


RAISED: Any = _Raised()



__all__ = [
    "FIXPOINT", "Rewrite", "RewriteReport", "apply_rules", "rewrite", "rewrite_report",
    "rule_verdict",
]
