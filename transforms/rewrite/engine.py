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
from transforms.rewrite import sizes
from transforms.rewrite.check import check_rule
from transforms.rewrite.fold import fold_into_state
from transforms.rewrite.match import Binding, Pattern, match_at
from transforms.rewrite.rule import Compiled, Match, Rule, replacement_for
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
            (unless ``trusted``); the verdict stays with the rule.

    Returns:
        The rewritten Program; ``p`` itself (``is``) when no rule matched. New nodes take the
        name of the node whose value they replace (so outputs and signatures keep their names),
        the innermost module common to the matched nodes (``nn_module_stack``) and a ``val``
        computed from the matched inputs' fake tensors (else the replaced node's). A match is
        skipped where a value inside it is read outside, where it holds a mutating, effectful
        or random op, where an input is written in place or a write in place lies between its
        nodes, and (for a replacement traced per match, ``Compiled.concrete``) where its
        inputs' shapes are unknown or several calls run the graph.

    Raises:
        PassError: naming the rule, when a rule cannot be traced or is malformed, when
        ``check_rule`` finds it wrong (with the counterexample), when its ``where`` raises, or
        when rules keep rewriting each other's results past the step cap (a cycle; names them).

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
    only the nodes it created and their users.
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
    if not rules:
        return p, RewriteReport(MappingProxyType(counts), ())
    table = p.module_table()
    order = list(dict.fromkeys(mid for _, mid in p.walk()))
    graphs = [g for mid in order for g in table[mid].graphs]
    level = level_of(graphs)
    compiled = [(r, r.compiled(level)) for r in rules]
    compiled.sort(key=lambda rc: -rc[1].benefit)  # stable: ties keep the order given
    index: dict[int, list[tuple[Rule, Compiled]]] = {}
    for r, c in compiled:
        index.setdefault(id(c.pattern.anchor.target), []).append((r, c))
    multi = _called_more_than_once(p, order, table)
    done: list[Rewrite] = []
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
            out, renames = _rewrite_graph(graph, index, done, path, gi, per_match)
            new_graphs.append(out)
            if mid == p.root and gi == 0:
                renamed_root = renames
        if any(a is not b for a, b in zip(new_graphs, mod.graphs)):
            changed[mid] = mod.replace(graphs=tuple(new_graphs))
    for rw in done:
        counts[rw.rule] += 1
    report = RewriteReport(MappingProxyType(counts), tuple(done))
    if not changed:
        return p, report
    q = p.replace(modules=p.modules.update(changed))
    if renamed_root:
        q = q.replace(signature=_renamed_signature(q, renamed_root))
    folding = {r.name for r in rules if r.fold_state}
    if folding:
        root_path = p.first_path(p.root) or ""
        created = {
            name for rw in done if rw.rule in folding and rw.module == root_path and rw.graph == 0
            for name in rw.created
        }
        q = fold_into_state(q, created)
    return q, report


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


def _ensure_checked(rule: Rule) -> None:
    if rule.trusted:
        return
    if rule._verdict is None:
        try:
            check_rule(rule)
            rule._verdict = True
        except LawViolation as exc:
            rule._verdict = exc
    if rule._verdict is not True:
        raise PassError(
            f"rule {rule.name!r} is wrong, so rewrite refuses it (mark it Rule(..., "
            f"trusted=True) to skip the check): {rule._verdict}"
        ) from rule._verdict


def _renamed_signature(q: Program, renames: Mapping[str, str]):
    sig = q.signature
    outs = tuple(
        attrs.evolve(s, name=renames.get(s.name, s.name)) if s.name in renames else s
        for s in sig.outputs
    )
    return attrs.evolve(sig, outputs=outs)


# --- one graph ----------------------------------------------------------------------------------


class _Work:
    """The mutable working copy of one graph that the driver rewrites (local to one call)."""

    def __init__(self, graph: Graph) -> None:
        self.node: dict[str, Node] = {}
        self.key: dict[str, tuple] = {}
        self.users: dict[str, dict[str, None]] = {}
        self.by_target: dict[int, dict[str, None]] = {}
        self.written: set[str] = set()
        self.mutations: list[tuple] = []  #: sorted keys of the nodes that write in place
        for i, n in enumerate(graph.nodes):
            self.add(n, (i,))
        self.taken = Names(self.node)

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


def _rewrite_graph(
    graph: Graph, index: Mapping[int, list], done: list[Rewrite], path: str, gi: int,
    per_match: bool = True,
) -> tuple[Graph, dict[str, str]]:
    if not any(n.op == CALL_FUNCTION and id(n.target) in index for n in graph.nodes):
        return graph, {}
    w = _Work(graph)
    queue = collections.deque(n.name for n in graph.nodes if n.op == CALL_FUNCTION)
    queued = set(queue)
    renames: dict[str, str] = {}
    cap = 4 * len(graph.nodes) + 64
    steps = 0
    recent: collections.deque[str] = collections.deque(maxlen=16)
    applied_any = False
    while queue:
        name = queue.popleft()
        queued.discard(name)
        n = w.node.get(name)
        if n is None or n.op != CALL_FUNCTION:
            continue
        for rule, c in index.get(id(n.target), ()):
            if c.concrete and not per_match:
                continue
            pushed = _try(rule, c, n, w, renames, done, path, gi)
            if pushed is None:
                continue
            applied_any = True
            steps += 1
            recent.append(rule.name)
            if steps > cap:
                names = sorted(set(recent))
                raise PassError(
                    f"rewrite: rules {names} keep rewriting each other's results in graph "
                    f"{gi} of module {path or '<root>'!r} ({steps} rewrites of a {len(graph)}"
                    "-node graph): they form a cycle; drop or narrow one of them (a `where`)"
                )
            for m in pushed:
                if m not in queued and m in w.node:
                    queue.append(m)
                    queued.add(m)
            break
    if not applied_any:
        return graph, {}
    nodes = sorted(w.node.values(), key=lambda x: w.key[x.name])
    return Graph.of(nodes), _resolve(renames)


def _resolve(renames: dict[str, str]) -> dict[str, str]:
    out = {}
    for old, new in renames.items():
        while new in renames:
            new = renames[new]
        out[old] = new
    return out


def _try(rule, c: Compiled, n: Node, w: _Work, renames, done, path, gi) -> list[str] | None:
    pattern = c.pattern
    for b in match_at(pattern, n, w.node.get, w.candidates):
        b = sizes.recheck(rule, c, b, w.node.get, None, w.users.get)
        if b is None:
            continue
        plan = _plan(rule, c, b, w)
        if plan is None:
            continue
        vals = {}
        if c.concrete:
            for i, ph in _pattern_inputs(rule, pattern).items():
                bound = b.names.get(ph)
                vals[i] = w.node[bound].meta.get("val") if bound is not None else None
        rep = replacement_for(rule, c, b.scalars, vals)
        if rep is None:
            continue
        return _apply(rule, c, b, plan, rep, w, renames, done, path, gi)
    return None


def _plan(rule: Rule, c: Compiled, b: Binding, w: _Work) -> tuple | None:
    """Check that the match is safe; return (position key, output names) or None."""
    pattern = c.pattern
    matched = [b.names[k] for k in pattern.nodes if k in b.names]
    mset = set(matched)
    for m in matched:
        t = w.node[m].target
        if ops.is_mutating(t) or ops.is_effectful(t) or ops.is_random(t):
            return None
    outs = [b.names.get(o.name) if type(o) is Ref else None for o in pattern.outputs]
    out_set = {o for o in outs if o is not None}
    for m in matched:
        if m not in out_set and any(u not in mset for u in w.users[m]):
            return None  # an interior value is read outside the match
    inputs = [b.names[k] for k in pattern.inputs if k in b.names]
    if any(i in w.written for i in inputs):
        return None  # an input is written in place somewhere: do not move reads of it
    rep_outputs = c.replacement.outputs
    for o, r in zip(outs, rep_outputs):
        if o is not None and o in w.written and type(r) is Ref and r.name not in {
            n.name for n in c.replacement.compute_nodes()
        }:
            return None  # would make a written value an alias of an input
    keys = [w.key[m] for m in matched]
    lo, hi = min(keys), max(keys)
    if w.mutates_between(lo, hi):
        return None  # the match spans a write in place (maybe of a view of one of its inputs)
    if all(w.key[i] < lo for i in inputs):
        pos = lo
    elif all(w.key[u] > hi for o in out_set for u in w.users[o] if u not in mset):
        pos = hi
    else:
        return None
    if rule.where is not None:
        match = _match_value(rule, pattern, b, w)
        try:
            ok = rule.where(match)
        except PurefxError:
            raise
        except Exception as exc:
            raise PassError(
                f"rule {rule.name!r}: its where() raised {type(exc).__name__}: {exc} on a match "
                f"at %{w.node[matched[-1]].name}; make where() return a bool for every Match"
            ) from exc
        if not ok:
            return None
    return pos, outs


def _match_value(rule: Rule, pattern: Pattern, b: Binding, w: _Work) -> Match:
    nodes = {k: w.node[b.names[k]] for k in pattern.nodes if k in b.names}
    trace_inputs = _pattern_inputs(rule, pattern)
    inputs = []
    for i, x in enumerate(rule.example_inputs):
        if i in trace_inputs:
            bound = b.names.get(trace_inputs[i])
            inputs.append(w.node[bound] if bound is not None else None)
        else:
            inputs.append(b.scalars.get(i, x))
    return Match(rule.name, MappingProxyType(nodes), tuple(inputs))


def _pattern_inputs(rule: Rule, pattern: Pattern) -> dict[int, str]:
    return dict(zip(pattern.tensor_args, pattern.input_order))


def _apply(
    rule, c: Compiled, b: Binding, plan, rep: Traced, w: _Work, renames, done, path, gi
) -> list[str]:
    pos, outs = plan
    pattern = c.pattern
    matched = [b.names[k] for k in pattern.nodes if k in b.names]
    frames = _common_stack([w.node[m] for m in matched])
    anchor_meta = w.node[b.names[pattern.anchor.name]].meta
    # replacement placeholders -> the graph values bound to the pattern's (same positions)
    pat_ph = list(pattern.input_order)
    rep_ph = [n.name for n in rep.graph.nodes if n.op == PLACEHOLDER]
    env: dict[str, Any] = {}
    for pp, rp in zip(pat_ph, rep_ph):
        if pp in b.names:
            env[rp] = ref(b.names[pp])
    sentinels = {value: pos_ for pos_, value in rep.sentinels}
    # the name each replacement result takes: the old output node's (removed with the match)
    result_names: dict[str, str] = {}
    for o, r in zip(outs, rep.outputs):
        if o is not None and type(r) is Ref and r.name not in env and r.name not in result_names:
            result_names[r.name] = o
    # drop the matched nodes first, so their names can be reused
    outside_users = {
        o: [u for u in w.users[o] if u not in set(matched)] for o in outs if o is not None
    }
    old_vals = {m: w.node[m].meta.get("val") for m in matched}
    for m in matched:
        w.remove(m)
    for m in matched:
        w.taken.discard(m)
    for name in result_names.values():
        w.taken.add(name)  # before fresh names are drawn: an inner node must not take it
    new_names: list[str] = []
    j = 0
    for rn in rep.graph.nodes:
        if rn.op in (PLACEHOLDER, OUTPUT):
            continue
        old_val = None
        if rn.name in result_names:
            name = result_names[rn.name]
            old_val = old_vals.get(name)
        else:
            name = _fresh(w, rn)
        args = _instantiate(rn.args, env, sentinels, b.scalars)
        kwargs = _instantiate(rn.kwargs, env, sentinels, b.scalars)
        meta = _new_meta(rn.target, args, kwargs, w, frames, anchor_meta, old_val)
        node = Node(rn.op, name, rn.target, args, kwargs, meta)
        w.add(node, (*pos, j))
        j += 1
        env[rn.name] = ref(name)
        new_names.append(name)
    pushed = list(new_names)
    for o, r in zip(outs, rep.outputs):
        if o is None:
            continue
        new = env.get(r.name) if type(r) is Ref else None
        if new is None:
            raise PassError(
                f"rule {rule.name!r}: its replacement returns {r!r} where the pattern returns a "
                "computed value; return a tensor computed from the arguments"
            )
        if new.name == o:
            pushed.extend(u for u in w.users.get(o, ()) if u in w.node)
            continue
        renames[o] = new.name
        for u in outside_users.get(o, ()):
            if u not in w.node:
                continue
            old, key = w.node[u], w.key[u]
            w.remove(u)
            w.add(old.replace(args=_swap(old.args, o, new), kwargs=_swap(old.kwargs, o, new)), key)
            pushed.append(u)
    for name in new_names:
        pushed.extend(w.users.get(name, ()))
    done.append(Rewrite(rule.name, path, gi, tuple(matched), tuple(new_names)))
    return pushed


def _swap(tree: Any, old: str, new: Ref) -> Any:
    return map_refs(tree, lambda r: new if r.name == old else r)


def _fresh(w: _Work, rn: Node) -> str:
    base = rn.name.rstrip("0123456789").rstrip("_") or target_name(rn.target).split(".")[-1]
    return fresh_name(base, w.taken)


def _instantiate(tree: Any, env: Mapping[str, Any], sentinels: Mapping, scalars: Mapping) -> Any:
    if type(tree) is Ref:
        return env.get(tree.name, tree)
    if type(tree) is tuple:
        return tuple(_instantiate(x, env, sentinels, scalars) for x in tree)
    if type(tree) is IList:
        return IList(tuple(_instantiate(x, env, sentinels, scalars) for x in tree.items))
    if type(tree) is IDict:
        return IDict(tuple((k, _instantiate(v, env, sentinels, scalars)) for k, v in tree.items))
    if isinstance(tree, (int, float)) and not isinstance(tree, bool) and tree in sentinels:
        pos = sentinels[tree]
        if pos in scalars:
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


def _new_meta(
    target, args, kwargs, w: _Work, stack, anchor_meta, old_val=None
) -> Mapping[str, Any]:
    meta: dict[str, Any] = {}
    if stack is not None:
        meta["nn_module_stack"] = stack
    if "stack_trace" in anchor_meta:
        meta["stack_trace"] = anchor_meta["stack_trace"]
    val = _fake_val(target, args, kwargs, w)
    if val is None:
        val = old_val  # a result's value is the replaced node's (same shape and dtype)
    if val is not None:
        meta["val"] = val
    return MappingProxyType(meta)


def _fake_val(target, args, kwargs, w: _Work) -> Any:
    missing = []
    modes = []

    def on_ref(r: Ref) -> Any:
        n = w.node.get(r.name)
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
    except Exception:  # noqa: BLE001 - no val is better than a wrong one; lower needs none
        return None



__all__ = ["Rewrite", "RewriteReport", "apply_rules", "rewrite", "rewrite_report"]
