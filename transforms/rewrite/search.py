"""Search hooks: the matches of a rule in a program, and one match applied.

``matches(p, rule)`` lists every place where ``rewrite`` could take ``rule`` in ``p`` (every
guard of ``transforms.rewrite.guards.GUARDS`` holding), each as a ``Match``: a frozen value
naming the module graph, the matched nodes and the bindings. ``apply_match(p, m)`` takes one
of them: the same guards, the same instantiation and finalisation as ``rewrite`` (the engine's
own steps, ``transforms.rewrite.engine``), one rewrite, a new Program. A search (greedy with
look-ahead, beam, ``saturate``'s tests) enumerates and applies through these two.
"""

from __future__ import annotations

from types import MappingProxyType

from ir.errors import PassError
from ir.node import CALL_FUNCTION
from ir.program import Program
from transforms.rewrite import engine, guards, sizes
from transforms.rewrite.match import match_at
from transforms.rewrite.rule import Match, Rule
from transforms.rewrite.trace import level_of


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
    level = level_of(engine._graphs(p))
    for mid, path, gi, graph, per_match, barriers in _graph_sites(p):
        for variant in rule.variants():
            c = variant.compiled(level)
            w = _work(graph, path, gi, per_match, barriers, c)
            for n in graph.nodes:
                if n.op != CALL_FUNCTION or n.target is not c.pattern.anchor.target:
                    continue
                for b in match_at(c.pattern, n, w.node.get, w.candidates):
                    found = _taken(variant, c, b, w)
                    if isinstance(found, guards.Guard):
                        continue
                    site, inst = found
                    engine._give_back(inst, site, w)
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
    w = _work(graph, m.module, m.graph, per_match, barriers, c)
    taken = _taken(rule, c, m.binding, w)
    if isinstance(taken, guards.Guard):
        raise PassError(
            f"apply_match: guard {taken.name!r} declines the match of {where}: {taken.reason}"
        )
    site, inst = taken
    engine._commit(rule, site, inst, w)
    nodes = sorted(w.node.values(), key=lambda x: w.key[x.name])
    new_graph = type(graph).of(nodes)
    mod = p.module_table()[mid]
    graphs = tuple(new_graph if i == m.graph else g for i, g in enumerate(mod.graphs))
    q = p.replace(modules=p.modules.set(mid, mod.replace(graphs=graphs)))
    renames = engine._resolve(w.renames)
    if mid == p.root and m.graph == 0 and renames:
        q = q.replace(signature=engine._renamed_signature(q, renames))
    if rule.fold_state and mid == p.root and m.graph == 0:
        q = engine.fold_into_state(q, set(w.done[-1].created))
    return q


# --- helpers ------------------------------------------------------------------------------------


def _graph_sites(p: Program):
    """``(module id, path, graph index, graph, per_match, barriers)`` for each distinct module
    graph of ``p``, as the engine visits them."""
    table = p.module_table()
    order = list(dict.fromkeys(mid for _, mid in p.walk()))
    multi = engine._called_more_than_once(p, order, table)
    barriers = engine._barriers(p)
    for mid in order:
        path = p.first_path(mid) or ""
        for gi, graph in enumerate(table[mid].graphs):
            yield (mid, path, gi, graph, mid not in multi,
                   barriers if mid == p.root else engine._NO_BARRIERS)


def _work(graph, path, gi, per_match, barriers, c) -> engine._Work:
    run = engine._Run([], {}, engine._by_stage(guards.GUARDS), True)
    return engine._Work(graph, path, gi, per_match, barriers, c.pattern.size, run)


def _taken(rule: Rule, c, b, w: engine._Work):
    """``(site, instance)`` for binding ``b`` when every guard holds, else the first guard
    that does not (the engine's ``_try`` for one binding, nothing committed)."""
    exact = sizes.recheck(rule, c, b, w.node.get, c.level, w.users.get)
    site = guards.Site(w, rule, c, b, exact)
    steps = ((guards.MATCH, None), (guards.PLAN, engine._planned),
             (guards.REPLACEMENT, engine._with_replacement))
    for stage, fill in steps:
        if fill is not None:
            site = fill(site, w)
        failing = guards.first_failing(site, stage, w.table[stage])
        if failing is not None:
            return failing
    inst = engine._instantiate(site, w)
    if not inst.raised:
        engine._refuse_literal_results(rule, site, inst, w)
    site = engine._with_instance(site, inst, w)
    failing = guards.first_failing(site, guards.INSTANCE, w.table[guards.INSTANCE])
    if failing is not None:
        engine._give_back(inst, site, w)
        return failing
    return site, inst


def _match(rule: Rule, c, site, path: str, gi: int, graph, level: str, anchor: str) -> Match:
    base = guards.match_value(rule, c.pattern, site.exact, site.view)
    return Match(base.rule, MappingProxyType(dict(base.nodes)), base.inputs, path, gi, anchor,
                 site.binding, rule, level, graph)


__all__ = ["apply_match", "matches"]
