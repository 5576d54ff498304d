"""E-matching: a rule's traced pattern (``match.Pattern``) matched over an e-graph's classes.

The pattern representation is the matcher's own (``transforms.rewrite.match.prepare``): each
pattern node's arguments in the normal form, placeholders as wildcards, scalar arguments as
sentinels. Here a pattern node matches an *e-node* (same operator, arguments matching position
by position), a pattern placeholder binds an *e-class* (the same class at each use), a pattern
node reached through an argument is matched against every e-node of the child class. Literals
match as ``match.literal_equal`` says (by type and value); commutative operators in either
order. Matching is strict: sizes and dimensions are compared as they are (the e-graph holds the
program's exact shapes), but for those of an operator returning a list (``split_with_sizes``'
sizes, its dimension across ranks), which match any ints and make the match ``loose``, so that
the reverse of ``SHARED_INPUT_MM`` unfuses a ``split`` the program holds (``_EMatcher``).

Hyperparameters (``Rule(..., hyper(...))``): a pattern literal that ``match.with_holes`` made a
``Hole`` matches an e-node's literal of the example's kind (an int, a bool, a string, a list of
ints) and binds it, the same value at each use; ``EMatch.scalars`` holds it at the
hyperparameter's position, and the replacement is traced with it (``rule.replacement_for``). A
match that bound another value than an example, or whose inputs have other dtypes than the
rule's examples, is ``loose``: ``exact`` keeps it only where the pattern traced at the bound
values and the matched shapes matches the same e-nodes with the same inputs (what
``sizes.recheck`` does for ``rewrite``). Optional tensor arguments (``optional(...)``) are
matched through the rule's variants (``Rule.variants``): the variant traced with ``None`` there
matches an e-node whose argument is the literal ``None``, the others a class.

Patterns with several results (``x @ w1, x @ w2 -> split(x @ cat(w1, w2))``): the anchor (the
first result) is matched as above; each other result the anchor's tree does not reach is then
matched among the e-nodes of its operator that read a class the match has bound (an input of
the pattern or a matched node's class: for the shared matmuls, the parents of ``x``'s class),
never among all e-nodes of the operator. Each such candidate counts toward the rule's match
limit as a match does (``ematch_counted``), so a pattern with a common shared input (every
``matmul`` reading ``x``) is banned by the scheduler instead of enumerating all pairs.
``EMatch.results`` holds the class of each result, in the pattern's order; a match whose
results are not distinct classes is dropped (one value cannot be two results of a rewrite).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

import attrs
import torch

from ir import ops
from ir.args import EMPTY_DICT, IList, Ref
from ir.node import CALL_FUNCTION, PLACEHOLDER, Node
from transforms.rewrite.egraph import EGraph, ENode
from transforms.rewrite.match import NOT_ADMITTED, Pattern, literal_equal, same_literal
from transforms.rewrite.rule import Match

__all__ = [
    "EMatch", "ematch", "ematch_counted", "ematch_value", "exact", "result_nodes",
    "single_result",
]


@attrs.frozen
class EMatch:
    """One match: ``root`` (the class the pattern's result is in; its first result's for a
    pattern with several), ``inputs`` (pattern placeholder name -> class), ``scalars`` (rule
    argument position -> literal), ``nodes`` (pattern node name -> the e-node it matched).
    ``loose``: a hole bound another value than its example, or a list-valued operator's
    size or dimension matched another than the pattern's (``exact`` decides). ``results``:
    the class of each result of a pattern with several, in order (empty for one result)."""

    root: int
    inputs: Mapping[str, int]
    scalars: Mapping[int, Any]
    nodes: Mapping[str, ENode]
    loose: bool = False
    results: tuple[int, ...] = ()


def ematch_value(rule: Any, m: EMatch, vals: Mapping[int, Any]) -> Match:
    """The ``Match`` a rule's ``where`` sees for the e-match ``m`` (``guards.match_value``'s
    twin on the e-graph): a tensor argument is a placeholder ``Node`` whose ``val`` is
    ``vals[position]`` (its class's fake value), a scalar one the bound literal (else the
    example's), each pattern node a ``call_function`` ``Node`` of the matched e-node's
    operator (no arguments, no meta). O(pattern)."""
    inputs = []
    for i, x in enumerate(rule.example_inputs):
        if isinstance(x, torch.Tensor):
            inputs.append(Node(PLACEHOLDER, f"arg{i}", f"arg{i}", (), EMPTY_DICT,
                               MappingProxyType({"val": vals.get(i)})))
        else:
            inputs.append(m.scalars.get(i, x))
    nodes = {
        k: Node(CALL_FUNCTION, k, n.op, (), EMPTY_DICT, MappingProxyType({}))
        for k, n in m.nodes.items()
    }
    return Match(rule.name, nodes, tuple(inputs))


def single_result(pattern: Pattern) -> bool:
    """Whether the pattern has one computed result."""
    outs = [o for o in pattern.outputs if type(o) is Ref]
    return len(outs) == 1 and len(pattern.outputs) == 1 and not pattern.others


def result_nodes(pattern: Pattern) -> tuple[str, ...] | None:
    """The pattern node of each result, in order, where every result is a distinct computed
    node of the pattern (what ``ematch`` matches); ``None`` where one is an input, a literal
    or another result again (such a rewrite would make one value two results, or return an
    input: ``saturate`` does not apply it). O(results)."""
    names = tuple(o.name if type(o) is Ref else None for o in pattern.outputs)
    if any(n is None or n not in pattern.nodes for n in names) or len(set(names)) != len(names):
        return None
    return names


def ematch(eg: EGraph, pattern: Pattern, by_op: Mapping[Any, list[tuple[ENode, int]]],
           limit: int, deadline: float = math.inf) -> list[EMatch]:
    """The matches of ``pattern`` in ``eg``: ``ematch_counted``'s matches."""
    return ematch_counted(eg, pattern, by_op, limit, deadline)[0]


def ematch_counted(eg: EGraph, pattern: Pattern, by_op: Mapping[Any, list[tuple[ENode, int]]],
                   limit: int, deadline: float = math.inf) -> tuple[list[EMatch], int]:
    """The matches of ``pattern`` (its results distinct computed nodes: ``result_nodes``) in
    ``eg`` and the work counted against ``limit``: the matches plus, for a pattern with
    several results, the candidates tried for its other results. Stops once the count passes
    ``limit`` (the caller takes that as "too many": the scheduler bans the rule a while).

    ``by_op``: the e-nodes by operator, each with its canonical class (built once per
    iteration). ``deadline`` (a ``time.monotonic`` value): the matches found by then, looked
    at every 256 candidates. Deterministic up to the deadline: classes in the order of
    ``by_op``.

    **Laws:** each match maps every pattern node to an e-node of the same operator whose
    arguments match, placeholders bound consistently; a pattern's results are distinct
    classes. Complexity: O(candidates x pattern size x alternatives per class), candidates
    for the other results at most ``limit + 1``."""
    found: list[EMatch] = []
    m = _EMatcher(eg, pattern)
    seen: set[tuple] = set()
    outs = result_nodes(pattern) if not single_result(pattern) else None
    tried = [0]
    for i, (enode, c) in enumerate(by_op.get(pattern.anchor.target, ())):
        if i % 256 == 255 and time.monotonic() > deadline:
            return found, len(found) + tried[0]
        states = m.node(pattern.anchor, enode, ({}, {}, {}))
        if outs is not None:
            states = m.others(states, eg.find(c), tried, limit)
        for s in states:
            names, scalars, nodes = s
            results: tuple[int, ...] = ()
            if outs is not None:
                results = tuple(eg.find(c) if n == pattern.anchor.name
                                else _class_of(eg, nodes[n]) for n in outs)
                if len(set(results)) != len(results):
                    continue
            key = (eg.find(c), tuple(sorted((k, eg.find(v)) for k, v in names.items())),
                   tuple(sorted((k, repr(v)) for k, v in scalars.items())), results)
            if key in seen:
                continue
            seen.add(key)
            loose = pattern.holes_moved(scalars) or m.sized(nodes)
            found.append(EMatch(eg.find(c), dict(names), dict(scalars), dict(nodes), loose,
                                results))
            if len(found) + tried[0] > limit:
                return found, len(found) + tried[0]
        if tried[0] > limit:
            return found, len(found) + tried[0]
    return found, len(found) + tried[0]


def _class_of(eg: EGraph, enode: ENode) -> int:
    found = eg.lookup(enode)
    return -1 if found is None else found


_State = tuple  # (names: pattern input -> class, scalars: position -> literal, nodes)


class _EMatcher:
    """Matches ``pattern`` over ``eg``. ``strict``: no size wildcards (``exact``'s re-check).

    Sizes of list-valued operators are wildcards (``_wild``): ``split_with_sizes(m, [5, 6],
    1)`` traced at a rule's examples matches a program's ``split_with_sizes(m, [4096, 4096],
    1)`` (and its dimension where the input's rank differs), and the match is then ``loose``
    (``sized``): ``exact`` keeps it only where the pattern traced at the matched shapes matches
    strictly. Only there: no pattern matched a list of the program before such lists became
    e-nodes (``egraph.value_roles``), so no earlier match changes; other operators' sizes
    match strictly, as before."""

    def __init__(self, eg: EGraph, pattern: Pattern, strict: bool = False) -> None:
        self.eg = eg
        self.p = pattern
        self.swaps = {n.name: ops.is_commutative(n.target) for n in pattern.nodes.values()}
        self.strict = strict
        self.lists = frozenset(n.name for n in pattern.nodes.values()
                               if _list_valued(n.target))

    def _wild(self, pnode: Any, enode: ENode) -> frozenset[int]:
        """The argument positions of ``pnode`` that match any int (list of ints) against
        ``enode`` (``Pattern.wildcards`` at its input's rank), for a list-valued operator."""
        if self.strict or pnode.name not in self.lists:
            return frozenset()
        val = self.eg.data[self.eg.find(enode.children[0])].val if enode.children else None
        return self.p.wildcards(pnode, val.dim() if isinstance(val, torch.Tensor) else None)

    def sized(self, nodes: Mapping[str, ENode]) -> bool:
        """Whether a match (pattern node -> e-node) bound a wildcard size or dimension to
        another value than the pattern's: the match is loose."""
        if self.strict or not self.lists:
            return False
        for name, enode in nodes.items():
            pnode = self.p.nodes[name]
            wild = self._wild(pnode, enode)
            pargs = self.p.args[name]
            if any(not same_literal(pargs[i], enode.canon[i]) for i in wild if i < len(pargs)):
                return True
        return False

    def others(self, states: Iterator[_State], anchor_class: int, tried: list[int],
               limit: float) -> Iterator[_State]:
        """Each state of the anchor's tree extended by the pattern's other results, each
        matched among the e-nodes of its operator that read a class already bound (an input
        or a matched node's class); ``tried[0]`` counts the candidates, none tried past
        ``limit``."""
        for s in states:
            yield from self._other(0, s, anchor_class, tried, limit)

    def _other(self, i: int, s: _State, anchor_class: int, tried: list[int],
               limit: float) -> Iterator[_State]:
        others = self.p.others
        while i < len(others) and others[i].name in s[2]:
            i += 1  # reached by the tree of the anchor or of an earlier result
        if i == len(others):
            yield s
            return
        pnode = others[i]
        eg = self.eg
        bound = {eg.find(c) for c in s[0].values()}
        bound.add(anchor_class)
        bound.update(c for c in (_class_of(eg, n) for n in s[2].values()) if c >= 0)
        seen: set[tuple] = set()
        for c in sorted(bound):
            for enode, _ in eg.parents.get(c, ()):
                if enode.op is not pnode.target:
                    continue
                enode = eg.canonical(enode)
                if enode.key in seen:
                    continue
                seen.add(enode.key)
                if tried[0] > limit:
                    return
                tried[0] += 1
                for s2 in self.node(pnode, enode, s):
                    yield from self._other(i + 1, s2, anchor_class, tried, limit)

    def node(self, pnode: Any, enode: ENode, s: _State) -> Iterator[_State]:
        if enode.op is not pnode.target:
            return
        pargs = self.p.args[pnode.name]
        targs = enode.canon
        if len(pargs) != len(targs):
            return
        s = (s[0], s[1], {**s[2], pnode.name: enode})
        wild = self._wild(pnode, enode)
        yield from self.seq(pargs, targs, 0, s, enode, wild)
        if self.swaps[pnode.name] and len(targs) >= 2:
            yield from self.seq(pargs, (targs[1], targs[0], *targs[2:]), 0, s, enode)

    def seq(self, pargs: tuple, targs: tuple, i: int, s: _State, en: ENode,
            wild: frozenset[int] = frozenset()) -> Iterator[_State]:
        if i == len(pargs):
            yield s
            return
        if (i in wild and _ints(pargs[i]) and _ints(targs[i])
                and not self.p.holds_sentinel(pargs[i])):
            yield from self.seq(pargs, targs, i + 1, s, en, wild)  # ``sized`` says loose
            return
        for s2 in self.arg(pargs[i], targs[i], s, en):
            yield from self.seq(pargs, targs, i + 1, s2, en, wild)

    def arg(self, p: Any, t: Any, s: _State, en: ENode) -> Iterator[_State]:
        if type(p) is Ref:
            if type(t) is not Ref:
                return
            c = self.eg.find(en.children[int(t.name[1:])])
            if p.name in self.p.inputs:
                bound = s[0].get(p.name)
                if bound is None:
                    yield ({**s[0], p.name: c}, s[1], s[2])
                elif self.eg.find(bound) == c:
                    yield s
                return
            pnode = self.p.nodes.get(p.name)
            if pnode is None:
                return
            for child in list(self.eg.classes.get(c, ())):
                yield from self.node(pnode, child, s)
            return
        bound = self.p.bind(p, t, s[1])
        if bound is not None:
            if bound is not NOT_ADMITTED:
                yield (s[0], bound, s[2])
            return
        if isinstance(p, (tuple, list, IList)):  # a given list and a default one alike
            if not isinstance(t, (tuple, list, IList)) or len(p) != len(t):
                return
            yield from self.seq(tuple(p), tuple(t), 0, s, en)
            return
        if literal_equal(p, t):
            yield s


def _list_valued(target: Any) -> bool:
    """Whether ``target``'s schema returns one list of tensors (``split``, ``unbind``)."""
    if not callable(target) or isinstance(target, str):
        return False
    facts = ops.facts(target)
    return facts.results == 1 and facts.schema.rstrip().endswith("[]")


def _ints(x: Any) -> bool:
    """An int, or a list of ints (a size or dimension argument)."""
    if type(x) is int:
        return True
    return isinstance(x, (tuple, list, IList)) and all(type(d) is int for d in x)


def exact(eg: EGraph, rule: Any, compiled: Any, m: EMatch) -> bool:
    """Whether match ``m`` of ``compiled.pattern`` (``rule`` at ``compiled.level``) stands: a
    match that is not ``loose`` and whose inputs have the examples' dtypes does; else the
    pattern traced again at the matched classes' shapes and dtypes with the bound
    hyperparameters (``sizes.pattern_at``) must match, strictly, the same anchor e-node with the
    same inputs and the same scalars. ``False`` where it cannot be traced there or an input's
    shape is unknown or symbolic.

    **Laws:** what is kept is a match of the pattern's own trace at the bound values (a
    default ``dilation=[1, 1]`` is not taken for a ``stride`` hole). Complexity: one trace per
    new (rule, shapes, dtypes, hyperparameters), memoised by ``sizes``; O(pattern size x
    alternatives) to match."""
    from transforms.rewrite.sizes import input_shapes, pattern_at  # they import the matcher

    pattern: Pattern = compiled.pattern
    position = dict(zip(pattern.input_order, pattern.tensor_args))
    vals = {position[k]: v for k, c in m.inputs.items()
            if (v := eg.data[eg.find(c)].val) is not None}  # a class without one: the example's
    shapes = input_shapes(rule, vals)
    if shapes is None:
        return False
    examples = rule.example_inputs  # every value in vals is a tensor of static sizes now
    if not m.loose and all(v.dtype == examples[i].dtype for i, v in vals.items()):
        return True
    bound = tuple((i, m.scalars[i]) for i in sorted(pattern.holes) if i in m.scalars)
    found = pattern_at(rule, compiled.level, tuple(shapes), bound)
    anchor = m.nodes.get(pattern.anchor.name)
    if found is None or anchor is None:
        return False
    want_inputs = {position[k]: eg.find(c) for k, c in m.inputs.items()}
    want_scalars = {k: v for k, v in m.scalars.items() if k not in pattern.holes}
    where = dict(zip(found.input_order, found.tensor_args))
    matcher = _EMatcher(eg, found, strict=True)
    states = matcher.node(found.anchor, anchor, ({}, {}, {}))
    if not single_result(found):  # the other results too, among the same candidates
        states = matcher.others(states, eg.find(m.root), [0], math.inf)
    for names, scalars, _ in states:
        got = {where[k]: eg.find(c) for k, c in names.items()}
        if got == want_inputs and set(scalars) == set(want_scalars) and all(
            literal_equal(scalars[k], v) for k, v in want_scalars.items()
        ):
            return True
    return False
