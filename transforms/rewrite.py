"""``rewrite``: user rules written as PyTorch functions, applied to a fixpoint.

A ``Rule`` pairs a *pattern* and a *replacement*, two plain functions of tensors and Python
scalars with the same results, and example inputs to trace them with::

    relu_relu = Rule(lambda x: torch.relu(torch.relu(x)), torch.relu, (torch.randn(4),))
    q = rewrite(p, [relu_relu])

The pattern is traced at the level of the program it is applied to (training IR, or core aten
after ``run_decompositions``; ``transforms.rewrite_trace``), the replacement at the training level
(what the user wrote: ``silu``, ``scaled_dot_product_attention``). Matching is on the IR in a
normal form (``transforms.rewrite_match``). Each rule is checked with ``check_rule``
(``transforms.rewrite_check``) the first time ``rewrite`` meets it, unless it is ``trusted``.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Callable, Iterable, Mapping, Sequence
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
from transforms.rewrite_fold import fold_into_state
from transforms.rewrite_match import Binding, Pattern, match_at, prepare
from transforms.rewrite_trace import LEVELS, TRAINING, Traced, level_of, trace

# --- rules --------------------------------------------------------------------------------------


class Rule:
    """A rewrite rule: where ``pattern(*args)`` is computed, compute ``replacement(*args)``.

    Parameters:
        pattern: a function of tensors and Python scalars returning a tensor or a tuple of
            tensors; traceable by ``torch.export`` on ``example_inputs``.
        replacement: a function of the same arguments returning as many results.
        example_inputs: the arguments to trace both with (tensors and Python scalars). A float
            argument matches any scalar in the program (the same one at each use); an int
            argument does too unless it is used as a size or dimension (then it is the literal
            given). Matches do not depend on the example tensors' shapes or dtypes.
        name: the rule's name in reports and errors (default: ``pattern -> replacement``).
        where: ``where(match) -> bool``, an extra condition on a ``Match`` (e.g. on the matched
            inputs' dtypes, ``match.val(0).dtype``); a match where it is false is skipped.
        trusted: skip the ``check_rule`` that ``rewrite`` runs the first time it meets the rule.
        max_examples: how many examples ``check_rule`` tries for this rule (default 40).
        fold_state: compute what the replacement derives from state alone (parameters, buffers,
            constants) once, when rewriting a flat program, and hold it as new constant
            tensors (``<module>._folded_<node>``; not in the state dict, whose keys stay). Off by
            default: a rule adds state only when asked to. Outlined programs are not folded.
        specials: whether ``check_rule`` puts special values (0, -0., ±inf, NaN) into the
            tensors it draws (default ``True``). Say ``False`` for a rule that is right for finite
            values only, as any folding of arithmetic is (``conv`` + ``batch_norm``).

    A Rule holds two caches: its traced functions per level (plus, for a replacement that
    computes on its scalar arguments or its tensors' sizes in Python, at most 32 traces for
    concrete scalars, shapes and dtypes),
    and ``check_rule``'s verdict (so a rule set is checked once, not per program). Neither
    changes what a rewrite computes.
    """

    __slots__ = (
        "_traced", "_verdict", "example_inputs", "fold_state", "max_examples", "name",
        "pattern", "replacement", "specials", "trusted", "where",
    )

    def __init__(
        self,
        pattern: Callable,
        replacement: Callable,
        example_inputs: Sequence[Any],
        *,
        name: str | None = None,
        where: Callable[[Match], bool] | None = None,
        trusted: bool = False,
        max_examples: int = 40,
        specials: bool = True,
        fold_state: bool = False,
    ) -> None:
        for arg, value in (("pattern", pattern), ("replacement", replacement)):
            if not callable(value):
                raise PassError(f"Rule: {arg} must be a function, got {type(value).__name__}")
        if where is not None and not callable(where):
            raise PassError(f"Rule: where must be a function of a Match, got {where!r}")
        if not isinstance(example_inputs, (tuple, list)):
            raise PassError(
                f"Rule: example_inputs must be a tuple of tensors and scalars, got "
                f"{type(example_inputs).__name__}"
            )
        for i, x in enumerate(example_inputs):
            if not isinstance(x, (torch.Tensor, int, float)) or isinstance(x, bool):
                raise PassError(
                    f"Rule: example_inputs[{i}] is a {type(x).__name__}; a rule's arguments are "
                    "tensors and Python ints or floats"
                )
        self.pattern = pattern
        self.replacement = replacement
        self.example_inputs = tuple(example_inputs)
        self.name = name or f"{_fn_name(pattern)} -> {_fn_name(replacement)}"
        self.where = where
        self.trusted = bool(trusted)
        self.max_examples = max_examples
        self.specials = bool(specials)
        self.fold_state = bool(fold_state)
        self._traced: dict[Any, Any] = {}
        self._verdict: BaseException | bool | None = None

    def __repr__(self) -> str:
        return f"Rule({self.name!r})"

    def compiled(self, level: str) -> Compiled:
        """The rule traced at ``level`` (``"training"`` or ``"core"``), traced once per level.

        Raises ``PassError`` naming the rule when a function cannot be traced, the pattern
        computes nothing, or the replacement returns other results than the pattern.
        """
        found = self._traced.get(level)
        if found is None:
            found = _compile(self, level)
            self._traced[level] = found  # at most len(LEVELS) entries
        return found


def _fn_name(fn: Callable) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


@attrs.frozen
class Compiled:
    """A rule at one level: its prepared pattern, traced replacement and benefit (compute nodes
    removed per rewrite). ``concrete``: the replacement's trace holds values computed in Python
    from its scalar arguments (``x * (a * b)``) or from the example tensors' shapes
    (``x.reshape(-1, x.shape[-1])``), so it is traced again for each match's scalars, shapes and
    dtypes (``replacement_for``)."""

    pattern: Pattern
    replacement: Traced
    benefit: int
    traced: Traced  #: the pattern's traced function
    concrete: bool = False


def _compile(rule: Rule, level: str) -> Compiled:
    pat = trace(rule.pattern, rule.example_inputs, level, rule.name, "pattern")
    rep = trace(rule.replacement, rule.example_inputs, TRAINING, rule.name, "replacement")
    if len(pat.outputs) != len(rep.outputs):
        raise PassError(
            f"rule {rule.name!r}: the pattern returns {len(pat.outputs)} values, the replacement "
            f"{len(rep.outputs)}; a replacement must return what its pattern returns"
        )
    pattern = prepare(pat)
    if pattern is None:
        raise PassError(
            f"rule {rule.name!r}: the pattern computes nothing that can be matched (traced: "
            f"{[n.target for n in pat.compute_nodes()]}); a pattern must call some operator"
        )
    used = _sentinels_used(pat)
    for pos, value in rep.sentinels:
        if pos not in used and _holds_literal(rep.graph, value):
            raise PassError(
                f"rule {rule.name!r}: the replacement uses scalar argument {pos}, which the "
                "pattern does not; a replacement can only use what the pattern matched"
            )
    benefit = pattern.size - len(rep.compute_nodes())
    return Compiled(pattern, rep, benefit, pat, _is_concrete(rule, rep))


def _other_shapes(x: Any) -> Any:
    """``x`` with each size above 1 made larger (equal sizes stay equal, 0 and 1 stay)."""
    if not isinstance(x, torch.Tensor):
        return x
    return torch.zeros([d if d < 2 else d + 11 for d in x.shape], dtype=x.dtype)


def _is_concrete(rule: Rule, rep: Traced) -> bool:
    """Whether the replacement's trace changes beyond its sentinels when the sentinels and the
    example shapes change (or cannot be traced so): then it folded a scalar argument or a size
    into a literal that no sentinel marks, and is traced per match."""
    try:
        other = trace(rule.replacement, [_other_shapes(x) for x in rule.example_inputs],
                      TRAINING, rule.name, "replacement", salt=1)
    except PassError:
        return True
    back = {s2: s1 for (_, s1), (_, s2) in zip(rep.sentinels, other.sentinels)}
    if len(back) != len(rep.sentinels) or len(other.graph.nodes) != len(rep.graph.nodes):
        return True

    def same(a: Any, b: Any) -> bool:
        if type(a) is not type(b):
            return (isinstance(a, (int, float)) and not isinstance(a, bool)
                    and isinstance(b, (int, float)) and back.get(b, b) == a)
        if isinstance(a, (tuple, IList)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        if isinstance(a, IDict):
            return same(a.items, b.items)
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            return back.get(b, b) == a
        return a == b

    return not all(
        m.op == n.op and m.target == n.target and same(m.args, n.args)
        and same(m.kwargs, n.kwargs)
        for m, n in zip(rep.graph.nodes, other.graph.nodes)
    )


_CONCRETE_CACHE = 32  #: replacements traced per rule for concrete scalar values, at most


def replacement_for(
    rule: Rule, c: Compiled, scalars: Mapping[int, Any], vals: Mapping[int, Any]
) -> Traced | None:
    """The replacement to instantiate for a match binding ``scalars`` (argument position ->
    matched scalar) and tensor arguments whose ``meta['val']`` are ``vals`` (position -> fake
    tensor or None): ``c.replacement`` itself unless ``c.concrete``, then the replacement traced
    with those scalars (the example value for one the pattern did not bind) and tensors of those
    shapes and dtypes, cached on the rule (at most ``_CONCRETE_CACHE`` entries, oldest dropped
    first); ``None`` when a tensor's shape is unknown or symbolic (the match is skipped)."""
    if not c.concrete:
        return c.replacement
    args: list[Any] = []
    key_parts: list[Any] = []
    for i, x in enumerate(rule.example_inputs):
        if isinstance(x, torch.Tensor):
            v = vals.get(i)
            if not isinstance(v, torch.Tensor) or not all(type(d) is int for d in v.shape):
                return None
            args.append(torch.zeros(tuple(v.shape), dtype=v.dtype))
            key_parts.append((tuple(v.shape), str(v.dtype)))
        else:
            value = scalars.get(i, x)
            args.append(value)
            key_parts.append((type(value).__name__, value))
    key = ("concrete", tuple(key_parts))
    found = rule._traced.get(key)
    if found is None:
        found = trace(rule.replacement, args, TRAINING, rule.name, "replacement",
                      sentinels=False)
        concrete = [k for k in rule._traced if isinstance(k, tuple)]
        if len(concrete) >= _CONCRETE_CACHE:
            del rule._traced[concrete[0]]
        rule._traced[key] = found
    return found


def _sentinels_used(traced: Traced) -> set[int]:
    return {pos for pos, value in traced.sentinels if _holds_literal(traced.graph, value)}


def _holds_literal(graph: Graph, value: Any) -> bool:
    found = []

    def walk(tree: Any) -> None:
        if isinstance(tree, (tuple, IList)):
            for x in tree:
                walk(x)
        elif type(tree) is not Ref and type(tree) is type(value) and tree == value:
            found.append(tree)

    for n in graph.nodes:
        walk(n.args)
        walk(tuple(v for _, v in n.kwargs.items))
    return bool(found)


@attrs.frozen
class Match:
    """What ``where`` sees of a match.

    - ``rule``: the rule's name;
    - ``nodes``: ``{pattern node name: matched node}`` for the pattern's compute nodes;
    - ``inputs``: one entry per rule argument: the matched ``Node`` for a tensor argument, the
      matched value for a scalar one (the example value where the pattern did not use it).
    """

    rule: str
    nodes: Mapping[str, Node]
    inputs: tuple

    def val(self, i: int) -> Any:
        """The fake tensor (``meta['val']``) of argument ``i``'s matched node, or its scalar
        value; ``None`` when the node carries no ``val``."""
        x = self.inputs[i]
        return x.meta.get("val") if isinstance(x, Node) else x


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
    counts = {r.name: 0 for r in rules}
    if not rules:
        return p, RewriteReport(MappingProxyType(counts), ())
    table = p.module_table()
    order = list(dict.fromkeys(mid for _, mid in p.walk()))
    graphs = [g for mid in order for g in table[mid].graphs]
    level = level_of(graphs)
    compiled = [(r, r.compiled(level)) for r in rules]
    for r in rules:
        _ensure_checked(r)
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
        from transforms.law_violation import LawViolation
        from transforms.rewrite_check import check_rule

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


def check_rule(rule: Rule, *, max_examples: int | None = None) -> None:
    """Check ``rule`` against its law; raise ``transforms.laws.LawViolation`` when it is wrong.

    See ``transforms.rewrite_check.check_rule`` for what is drawn and compared.
    """
    from transforms.rewrite_check import check_rule as check

    check(rule, max_examples=max_examples)


__all__ = [
    "LEVELS",
    "Compiled",
    "Match",
    "Rewrite",
    "RewriteReport",
    "Rule",
    "check_rule",
    "rewrite",
    "rewrite_report",
]

