"""E-matching: a rule's traced pattern (``match.Pattern``) matched over an e-graph's classes.

The pattern representation is the matcher's own (``transforms.rewrite.match.prepare``): each
pattern node's arguments in the normal form, placeholders as wildcards, scalar arguments as
sentinels. Here a pattern node matches an *e-node* (same operator, arguments matching position
by position), a pattern placeholder binds an *e-class* (the same class at each use), a pattern
node reached through an argument is matched against every e-node of the child class. Literals
match as ``match.literal_equal`` says (by type and value); commutative operators in either
order. Matching is strict: sizes and dimensions are compared as they are (the e-graph holds the
program's exact shapes; no re-trace is needed).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from ir import ops
from ir.args import IList, Ref
from transforms.rewrite.egraph import EGraph, ENode
from transforms.rewrite.match import Pattern, literal_equal

__all__ = ["EMatch", "ematch"]


@attrs.frozen
class EMatch:
    """One match: ``root`` (the class the pattern's result is in), ``inputs`` (pattern
    placeholder name -> class), ``scalars`` (rule argument position -> literal), ``nodes``
    (pattern node name -> the e-node it matched)."""

    root: int
    inputs: Mapping[str, int]
    scalars: Mapping[int, Any]
    nodes: Mapping[str, ENode]


def single_result(pattern: Pattern) -> bool:
    """Whether the pattern has one computed result (what ``ematch`` handles)."""
    outs = [o for o in pattern.outputs if type(o) is Ref]
    return len(outs) == 1 and len(pattern.outputs) == 1 and not pattern.others


def ematch(eg: EGraph, pattern: Pattern, by_op: Mapping[Any, list[tuple[ENode, int]]],
           limit: int, deadline: float = math.inf) -> list[EMatch]:
    """The matches of ``pattern`` (one computed result) in ``eg``, at most ``limit`` (the
    caller takes more than ``limit`` as "too many": the scheduler bans the rule a while).

    ``by_op``: the e-nodes by operator, each with its canonical class (built once per
    iteration). ``deadline`` (a ``time.monotonic`` value): the matches found by then, looked
    at every 256 candidates. Deterministic up to the deadline: classes in the order of
    ``by_op``.

    **Laws:** each match maps every pattern node to an e-node of the same operator whose
    arguments match, placeholders bound consistently. Complexity: O(candidates x pattern
    size x alternatives per class)."""
    found: list[EMatch] = []
    m = _EMatcher(eg, pattern)
    seen: set[tuple] = set()
    for i, (enode, c) in enumerate(by_op.get(pattern.anchor.target, ())):
        if i % 256 == 255 and time.monotonic() > deadline:
            return found
        for s in m.node(pattern.anchor, enode, ({}, {}, {})):
            names, scalars, nodes = s
            key = (eg.find(c), tuple(sorted((k, eg.find(v)) for k, v in names.items())),
                   tuple(sorted((k, repr(v)) for k, v in scalars.items())))
            if key in seen:
                continue
            seen.add(key)
            found.append(EMatch(eg.find(c), dict(names), dict(scalars), dict(nodes)))
            if len(found) > limit:
                return found
    return found


_State = tuple  # (names: pattern input -> class, scalars: position -> literal, nodes)


class _EMatcher:
    def __init__(self, eg: EGraph, pattern: Pattern) -> None:
        self.eg = eg
        self.p = pattern
        self.swaps = {n.name: ops.is_commutative(n.target) for n in pattern.nodes.values()}

    def node(self, pnode: Any, enode: ENode, s: _State) -> Iterator[_State]:
        if enode.op is not pnode.target:
            return
        pargs = self.p.args[pnode.name]
        targs = enode.canon
        if len(pargs) != len(targs):
            return
        s = (s[0], s[1], {**s[2], pnode.name: enode})
        yield from self.seq(pargs, targs, 0, s, enode)
        if self.swaps[pnode.name] and len(targs) >= 2:
            yield from self.seq(pargs, (targs[1], targs[0], *targs[2:]), 0, s, enode)

    def seq(self, pargs: tuple, targs: tuple, i: int, s: _State, en: ENode) -> Iterator[_State]:
        if i == len(pargs):
            yield s
            return
        for s2 in self.arg(pargs[i], targs[i], s, en):
            yield from self.seq(pargs, targs, i + 1, s2, en)

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
        pos = self.p.typed_sentinels.get((type(p), p)) if type(p) in (int, float) else None
        if pos is not None:
            if type(t) is not type(p):
                return
            if pos in s[1]:
                if literal_equal(s[1][pos], t):
                    yield s
                return
            yield (s[0], {**s[1], pos: t}, s[2])
            return
        if isinstance(p, (tuple, IList)):
            if not isinstance(t, (tuple, IList)) or len(p) != len(t):
                return
            yield from self.seq(tuple(p), tuple(t), 0, s, en)
            return
        if literal_equal(p, t):
            yield s
