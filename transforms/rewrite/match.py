"""Matching a traced pattern against a graph, in a normal form.

Two calls match when they call the same operator and their arguments, put in schema order with
defaults filled and keywords made positional (``ir.ops.normalized_args``), match position by
position: a pattern placeholder matches any value (the same one at each of its uses), a scalar
sentinel matches any int or float (the same value at each use), a literal matches an equal
literal (``1`` matches ``1.0``, ``True`` only ``True``), and the first two arguments of a
commutative operator (``ir.ops.is_commutative``) match in either order. ``meta`` (shapes, dtypes)
plays no part.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs

from ir import ops
from ir.args import IList, Ref
from ir.node import CALL_FUNCTION, PLACEHOLDER, Node
from transforms.rewrite.trace import Traced


@attrs.frozen
class Pattern:
    """A traced pattern prepared for matching (build it with ``prepare``).

    ``inputs``: placeholder names (wildcards); ``sentinels``: ``{sentinel value: argument
    position}``; ``nodes``: ``{name: node}`` of its compute nodes; ``args``: each compute node's
    normalized arguments; ``outputs``: the pattern's results; ``anchor``: the compute node that
    matching starts from (the first result computed by the pattern); ``others``: the other result
    nodes, matched after the anchor's tree when it does not reach them.
    """

    inputs: frozenset[str]
    sentinels: Mapping[Any, int]
    nodes: Mapping[str, Node]
    args: Mapping[str, tuple]
    outputs: tuple
    anchor: Node
    others: tuple[Node, ...]
    input_order: tuple[str, ...]  #: placeholder names in order
    tensor_args: tuple[int, ...]  #: the rule argument position of each placeholder

    @property
    def size(self) -> int:
        """The number of compute nodes."""
        return len(self.nodes)


def prepare(traced: Traced) -> Pattern | None:
    """The pattern of a traced function, or ``None`` when it computes nothing or one of its
    nodes is not a ``call_function`` (the caller says why).

    **Laws:** a pure function of ``traced``. Complexity: O(pattern nodes)."""
    nodes = {n.name: n for n in traced.compute_nodes()}
    args: dict[str, tuple] = {}
    for n in nodes.values():
        if n.op != CALL_FUNCTION:
            return None
        norm = ops.normalized_args(n.target, n.args, n.kwargs)
        args[n.name] = norm if norm is not None else _plain_args(n)
    roots = [o for o in traced.outputs if isinstance(o, Ref) and o.name in nodes]
    if not roots:
        return None
    order = tuple(n.name for n in traced.graph.nodes if n.op == PLACEHOLDER)
    anchor = nodes[roots[0].name]
    others = tuple(dict.fromkeys(nodes[r.name] for r in roots[1:] if r.name != anchor.name))
    return Pattern(
        frozenset(order), {s: i for i, s in traced.sentinels}, nodes, args, traced.outputs,
        anchor, others, order, traced.tensor_args,
    )


def _plain_args(node: Node) -> tuple:
    return tuple(node.args) + tuple(v for _, v in node.kwargs.items)


def normal_args(node: Node) -> tuple:
    """``node``'s arguments in the matching normal form: ``ir.ops.normalized_args`` for an
    operator with a schema, else its args followed by its kwargs' values.

    **Laws:** two nodes calling one overload with the same arguments, spelled positionally or by
    keyword, defaults given or left out, have equal normal forms. Complexity: O(arguments)."""
    norm = ops.normalized_args(node.target, node.args, node.kwargs)
    return norm if norm is not None else _plain_args(node)


@attrs.frozen
class Binding:
    """A match: pattern name -> graph node name for placeholders and compute nodes; sentinel
    position -> the scalar it matched."""

    names: Mapping[str, str]
    scalars: Mapping[int, Any]


def match_at(
    pattern: Pattern,
    node: Node,
    lookup: Callable[[str], Node | None],
    candidates: Callable[[Any], Iterator[Node]],
) -> Iterator[Binding]:
    """Every way ``pattern`` matches with its anchor at ``node``, lazily, in a fixed order.

    ``lookup(name)`` gives the graph's current node of that name (``None`` if there is none);
    ``candidates(target)`` the graph's nodes calling ``target`` (for results the anchor's tree
    does not reach).

    **Laws:** every binding maps each matched pattern node to a distinct graph node calling the
    same target, with normal-form arguments that match position by position (wildcards bound
    consistently); deterministic (the order of ``candidates`` and of the graph's arguments).
    Complexity: O(pattern size) per binding tried, times 2 per commutative node.
    """
    matcher = _Matcher(pattern, lookup, candidates)
    yield from matcher.run(node)


class _Matcher:
    def __init__(self, pattern: Pattern, lookup, candidates) -> None:
        self.p = pattern
        self.lookup = lookup
        self.candidates = candidates

    def run(self, node: Node) -> Iterator[Binding]:
        for names, scalars, used in self.node(self.p.anchor, node, {}, {}, frozenset()):
            yield from self.rest(0, names, scalars, used)

    def rest(self, i: int, names: dict, scalars: dict, used: frozenset) -> Iterator[Binding]:
        if i == len(self.p.others):
            yield Binding(names, scalars)
            return
        other = self.p.others[i]
        if other.name in names:
            yield from self.rest(i + 1, names, scalars, used)
            return
        for cand in self.candidates(other.target):
            if cand.name in used:
                continue
            for n2, s2, u2 in self.node(other, cand, names, scalars, used):
                yield from self.rest(i + 1, n2, s2, u2)

    def node(self, pnode: Node, tnode: Node, names: dict, scalars: dict, used: frozenset):
        if tnode.op != CALL_FUNCTION or tnode.target is not pnode.target:
            return
        if tnode.name in used:
            return
        names = {**names, pnode.name: tnode.name}
        used = used | {tnode.name}
        pargs = self.p.args[pnode.name]
        targs = normal_args(tnode)
        if len(pargs) != len(targs):
            return
        yield from self.seq(pargs, targs, 0, names, scalars, used)
        if (
            ops.is_commutative(tnode.target)
            and len(targs) >= 2
            and _defaults_hold(tnode.target, targs)
        ):
            swapped = (targs[1], targs[0], *targs[2:])
            yield from self.seq(pargs, swapped, 0, names, scalars, used)

    def seq(self, pargs, targs, i, names, scalars, used):
        if i == len(pargs):
            yield names, scalars, used
            return
        for n2, s2, u2 in self.arg(pargs[i], targs[i], names, scalars, used):
            yield from self.seq(pargs, targs, i + 1, n2, s2, u2)

    def arg(self, p: Any, t: Any, names: dict, scalars: dict, used: frozenset):
        if type(p) is Ref:
            if type(t) is not Ref:
                return
            bound = names.get(p.name)
            if bound is not None:
                if bound == t.name:
                    yield names, scalars, used
                return
            if p.name in self.p.inputs:
                yield {**names, p.name: t.name}, scalars, used
                return
            pnode = self.p.nodes.get(p.name)
            tnode = self.lookup(t.name)
            if pnode is None or tnode is None:
                return
            yield from self.node(pnode, tnode, names, scalars, used)
            return
        if _is_number(p) and p in self.p.sentinels and not isinstance(p, bool):
            if not _is_number(t):
                return
            pos = self.p.sentinels[p]
            if pos in scalars:
                if scalars[pos] == t:
                    yield names, scalars, used
                return
            yield names, {**scalars, pos: t}, used
            return
        if isinstance(p, (tuple, IList)):
            if not isinstance(t, (tuple, IList)) or len(p) != len(t):
                return
            yield from self.seq(tuple(p), tuple(t), 0, names, scalars, used)
            return
        if _literal_equal(p, t):
            yield names, scalars, used


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _literal_equal(p: Any, t: Any) -> bool:
    if _is_number(p) and _is_number(t):
        return p == t
    if isinstance(p, bool) or isinstance(t, bool):
        return type(p) is type(t) and p == t
    if type(t) is Ref:
        return False
    try:
        return type(p) is type(t) and bool(p == t)
    except Exception:  # noqa: BLE001 - a literal whose == does not give a bool
        return p is t


def _defaults_hold(target: Any, args: tuple) -> bool:
    params = ops.facts(target).params
    return all(
        _literal_equal(p.default, a) for p, a in zip(params[2:], args[2:])
    )


__all__ = ["Binding", "Pattern", "match_at", "normal_args", "prepare"]
