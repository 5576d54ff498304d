"""Matching a traced pattern against a graph, in a normal form.

Two calls match when they call the same operator and their arguments, in the normal form below,
match position by position:

- arguments in schema order with defaults filled and keywords made positional
  (``ir.ops.normalized_args``), then spelled one way (``ir.ops.canonical_args``): negative
  dimensions made positive by the input's rank, ``transpose``'s two dimensions (and a
  reduction's dimension list) in increasing order, a floating ``dtype`` argument equal to the
  input's dtype dropped (``softmax(x, -1, dtype=torch.float32)`` on float32 ``x`` is
  ``softmax(x, -1)``); ranks and dtypes are read from ``meta['val']``;
- a pattern placeholder matches any value (the same one at each of its uses);
- a scalar sentinel matches a literal of its own type (a float sentinel a ``float``, an int one an
  ``int``; the same value at each use);
- any other literal matches a literal of the same type and value (``literal_equal``: ``0.0`` is
  not ``-0.0``, ``True`` not ``1``), as ``ir.alpha`` keys literals; an int and a float of the
  same value (``1`` and ``1.0``, ``same_number``) match by value, making the binding ``loose``:
  the pattern re-traced at the match's dtypes must compute the matched nodes' dtypes;
- the first two arguments of a commutative operator (``ir.ops.is_commutative``) match in either
  order;
- *sizes are wildcards*: an int (or a list of ints, of any length) in a size argument
  (``ir.ops.facts(t).size_args``: ``view``'s and ``expand``'s sizes, ``slice``'s bounds) matches
  any int (list of ints), and where the pattern node's input has another rank than the graph
  node's, a dimension argument matches any dimension. A binding that used either is ``loose``:
  ``transforms.rewrite.sizes.recheck`` re-traces the pattern at the matched shapes and keeps it
  only when the exact pattern matches there (``strict=True`` turns the wildcards off).

Nodes that compute nothing (``ir.ops.computes_nothing``: eval-mode dropout, a ``.to`` or
``clone`` that keeps the dtype and layout, ``alias``) are looked through: the pattern drops its
own (``prepare``), and on the graph side a match may pass through them; they are listed in
``Binding.absorbed`` and go with the match. A cast that changes only the dtype is looked
through too, making the binding ``loose``: the pattern traced at the matched dtypes (where its
``.float()`` may be a cast) decides. ``meta`` plays no other part.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs
import torch

from ir import ops
from ir.args import IDict, IList, Ref
from ir.errors import PassError
from ir.node import CALL_FUNCTION, PLACEHOLDER, Node
from transforms.machinery.trace import Traced


@attrs.frozen
class Pattern:
    """A traced pattern prepared for matching (build it with ``prepare``).

    ``inputs``: placeholder names (wildcards); ``sentinels``: ``{sentinel value: argument
    position}``; ``nodes``: ``{name: node}`` of its compute nodes (those that compute nothing
    dropped); ``args``: each compute node's arguments in the normal form; ``outputs``: the
    pattern's results; ``anchor``: the compute node that matching starts from (the first result
    computed by the pattern); ``others``: the other result nodes, matched after the anchor's
    tree when it does not reach them; ``ranks``: each compute node's input rank (``None``:
    unknown), for dimension arguments.
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
    ranks: Mapping[str, int | None] = attrs.field(factory=dict)
    typed_sentinels: Mapping[tuple, int] = attrs.field(factory=dict)
    """``{(type, sentinel value): argument position}``: what ``sentinels`` says, typed."""
    holes: Mapping[int, Any] = attrs.field(factory=dict)
    """``{argument position: example value}`` of the rule's hyperparameters (``Rule(...,
    hyper(...))``) whose literals ``with_holes`` turned into ``Hole`` wildcards in ``args``."""

    @property
    def size(self) -> int:
        """The number of compute nodes."""
        return len(self.nodes)

    def bind(self, p: Any, t: Any, scalars: Mapping[int, Any]) -> Any:
        """Pattern argument ``p`` (a ``Hole`` or a sentinel) matched to literal ``t``, for the
        matcher and the e-matcher: ``scalars`` (argument position -> bound value) with ``t``
        bound at ``p``'s position (``scalars`` itself when it holds that value there already,
        ``same_literal``); ``NOT_ADMITTED`` when ``t`` is of another kind (a float sentinel
        binds floats, an int one ints; ``Hole.admits``) or another value is bound there;
        ``None`` when ``p`` is neither. O(len(t))."""
        if type(p) is Hole:
            pos, value = p.position, p.admits(t)
        elif type(p) in (int, float) and (type(p), p) in self.typed_sentinels:
            pos = self.typed_sentinels[(type(p), p)]
            value = t if type(t) is type(p) else NOT_ADMITTED
        else:
            return None
        if value is NOT_ADMITTED or pos not in scalars:
            return value if value is NOT_ADMITTED else {**scalars, pos: value}
        return scalars if same_literal(scalars[pos], value) else NOT_ADMITTED

    def wildcards(self, pnode: Node, rank: int | None) -> frozenset[int]:
        """The argument positions of compute node ``pnode`` that match any int (list of ints)
        against a call whose first input has rank ``rank`` (``None``: unknown): its operator's
        sizes (``ir.ops.facts(t).size_args``), and its dimensions where ``rank`` is not the
        pattern's. O(arguments)."""
        found = ops.facts(pnode.target)
        prank = self.ranks.get(pnode.name)
        across = rank is not None and prank is not None and rank != prank
        return frozenset((*found.size_args, *(found.dim_args if across else ())))

    def holes_moved(self, scalars: Mapping[int, Any]) -> bool:
        """Whether a hyperparameter bound in ``scalars`` holds another value than its example
        (the match is then ``loose``). O(holes)."""
        return any(not same_literal(scalars[i], e) for i, e in self.holes.items()
                   if i in scalars)

    def holds_sentinel(self, p: Any) -> bool:
        """Whether literal ``p`` (or an item of list ``p``) is one of the sentinels."""
        items = p if isinstance(p, (tuple, list, IList)) else (p,)
        return any((type(x), x) in self.typed_sentinels for x in items)


def prepare(traced: Traced) -> Pattern | None:
    """The pattern of a traced function, or ``None`` when it computes nothing (once the nodes
    that compute nothing are dropped) or one of its nodes is not a ``call_function`` (the
    caller says why).

    Nodes that compute nothing at the traced inputs (``ir.ops.computes_nothing``) are dropped
    and their readers read their input instead; metadata checks (``_assert_tensor_metadata``)
    are dropped.

    **Laws:** a pure function of ``traced``. Complexity: O(pattern nodes)."""
    vals = {n.name: n.meta.get("val") for n in traced.graph.nodes}
    subst: dict[str, Any] = {}
    nodes: dict[str, Node] = {}
    args: dict[str, tuple] = {}
    ranks: dict[str, int | None] = {}
    for n in traced.compute_nodes():
        if n.op != CALL_FUNCTION:
            return None
        if ops.is_metadata_check(n.target):
            continue
        canon, rank, first = canonical_form(
            n.target, _substitute(n.args, subst), _substitute(n.kwargs, subst), vals.get,
            n.meta.get("val"))
        if ops.computes_nothing(n.target, canon, first, n.meta.get("val")) and type(
            canon[0]
        ) is Ref:
            subst[n.name] = canon[0]
            continue
        nodes[n.name] = n
        args[n.name] = canon
        ranks[n.name] = rank
    outputs = _substitute(tuple(traced.outputs), subst)
    roots = [o for o in outputs if isinstance(o, Ref) and o.name in nodes]
    if not roots or any(  # a result that was only a no-op of an input: nothing to replace
        type(o) is Ref and o.name in subst and type(r) is Ref and r.name not in nodes
        for o, r in zip(traced.outputs, outputs)
    ):
        return None
    order = tuple(n.name for n in traced.graph.nodes if n.op == PLACEHOLDER)
    anchor = nodes[roots[0].name]
    others = tuple(dict.fromkeys(nodes[r.name] for r in roots[1:] if r.name != anchor.name))
    return Pattern(
        frozenset(order), {s: i for i, s in traced.sentinels}, nodes, args, outputs,
        anchor, others, order, traced.tensor_args, ranks,
        {(type(s), s): i for i, s in traced.sentinels},
    )


def _substitute(tree: Any, subst: Mapping[str, Any]) -> Any:
    if not subst:
        return tree
    if type(tree) is Ref:
        return subst.get(tree.name, tree)
    if type(tree) is tuple:
        return tuple(_substitute(x, subst) for x in tree)
    if type(tree) is IList:
        return IList(tuple(_substitute(x, subst) for x in tree.items))
    if type(tree) is IDict:
        return IDict(tuple((k, _substitute(v, subst)) for k, v in tree.items))
    return tree


def _first_val(args: tuple, val_of: Callable[[str], Any]) -> Any:
    """The ``val_of`` of the first tensor argument (or first element of a first list)."""
    for a in args:
        if type(a) is Ref:
            return val_of(a.name)
        if type(a) in (tuple, IList) and a and type(a[0]) is Ref:
            return val_of(a[0].name)
    return None


def normal_args(node: Node, lookup: Callable[[str], Node | None] | None = None) -> tuple:
    """``node``'s arguments in the matching normal form: ``ir.ops.normalized_args`` for an
    operator with a schema (else its args followed by its kwargs' values), then, when
    ``lookup`` (name -> node) is given, ``ir.ops.canonical_args`` at the rank and dtype of the
    first tensor argument's ``meta['val']``.

    **Laws:** two nodes calling one overload with the same arguments, spelled positionally or by
    keyword, defaults given or left out (with ``lookup``: negative or positive dimensions,
    transpose's dimensions in either order, a dtype equal to the input's given or not), have
    equal normal forms. Complexity: O(arguments)."""
    if lookup is None:
        return _normalized(node.target, node.args, node.kwargs)
    return _canonical(node, lambda name: _val(lookup(name)))[0]


def _val(node: Node | None) -> Any:
    return node.meta.get("val") if node is not None else None


def _normalized(target: Any, args: tuple, kwargs: Any) -> tuple:
    """``ir.ops.normalized_args`` for an operator with a schema, else the args followed by the
    kwargs' values (an ``IDict`` or a dict)."""
    norm = ops.normalized_args(target, args, kwargs)
    if norm is not None:
        return norm
    return (*args, *(v for _, v in (kwargs.items if type(kwargs) is IDict else kwargs.items())))


def canonical_form(target: Any, args: tuple, kwargs: Any, val_of: Callable[[str], Any],
                   out: Any) -> tuple[tuple, int | None, Any]:
    """``(canonical args, input rank, first tensor argument's val)`` of a call
    ``target(*args, **kwargs)``: ``normal_args`` without a node, ``ir.ops.canonical_args`` at
    the rank and dtype of the first tensor argument's value (``val_of``: name -> fake value)
    and at the static shape of the result's value ``out``. The one normal form of the matcher
    (``prepare``, ``match_at``) and of the e-graph (``egraph.enode_of``, ``egraph.passes_on``).
    O(arguments)."""
    raw = _normalized(target, args, kwargs)
    first = _first_val(raw, val_of)
    rank, dtype = (first.dim(), first.dtype) if isinstance(first, torch.Tensor) else (None, None)
    shape = (tuple(out.shape) if isinstance(out, torch.Tensor)
             and all(type(d) is int for d in out.shape) else None)
    return ops.canonical_args(target, raw, rank, dtype, shape), rank, first


def _canonical(node: Node, val_of: Callable[[str], Any]) -> tuple[tuple, int | None, Any]:
    """``canonical_form`` of ``node``."""
    return canonical_form(node.target, node.args, node.kwargs, val_of, node.meta.get("val"))


def literal_equal(p: Any, t: Any) -> bool:
    """Whether pattern literal ``p`` matches graph literal ``t``: the same type and value, as
    ``ir.alpha`` keys literals (``1`` is not ``1.0``, ``0.0`` not ``-0.0``, ``True`` not ``1``;
    a float NaN matches a float NaN). The matcher calls it as a module global.

    **Laws:** reflexive for every literal; symmetric; ``False`` whenever the types differ.
    O(size of the literal)."""
    if type(p) is not type(t):
        return False
    if type(p) is float:
        return p.hex() == t.hex() or (math.isnan(p) and math.isnan(t))
    if type(p) is complex:
        return repr(p) == repr(t)
    if type(p) is Ref:
        return False
    try:
        return bool(p == t)
    except Exception:  # noqa: BLE001 - a literal whose == does not give a bool
        return p is t


def same_literal(a: Any, b: Any) -> bool:
    """``literal_equal``, but two lists (a tuple, a list or an ``IList``) are one value when
    their items are equal: how bound hyperparameters, sizes and dimensions are compared.
    O(size of the literals)."""
    if isinstance(a, (tuple, list, IList)) and isinstance(b, (tuple, list, IList)):
        return tuple(a) == tuple(b)
    return literal_equal(a, b)


def same_number(p: Any, t: Any) -> bool:
    """Whether literals ``p`` and ``t``, an int and a float (either way round), hold the same
    finite value with the same sign (``1`` and ``1.0``; not ``0`` and ``-0.0``, nor ``True``).
    Such a literal matches *by value*: the binding is ``loose``, and
    ``transforms.rewrite.sizes.recheck`` keeps it only where the pattern traced at the match's
    dtypes computes the same dtypes as the matched nodes (``x * 1`` on a float32 ``x`` is
    ``x * 1.0``; on an int64 ``x`` it is not: ``x * 1.0`` is float).

    **Laws:** symmetric; ``False`` when the types are the same (``literal_equal`` decides
    those). O(1)."""
    types = {type(p), type(t)}
    if types != {int, float}:
        return False
    f, i = (p, t) if type(p) is float else (t, p)
    if not math.isfinite(f) or f != int(f) or int(f) != i:
        return False
    return math.copysign(1.0, f) == math.copysign(1.0, float(i)) or f != 0


class HyperparameterNotTraced(PassError):
    """A hyperparameter's example appears nowhere in a pattern's trace (``with_holes``)."""


@attrs.frozen
class Hole:
    """A literal of a pattern that is a wildcard: the uses of hyperparameter ``position`` (a
    rule argument declared with ``transforms.rewrite.hyper``) whose ``example`` value the
    pattern's trace holds there. It matches a graph literal of the example's kind (an int an
    ``int``, a bool a ``bool``, a string a ``str``, a tuple a list of ints of any length) and
    binds it, the same value at each use; ``Binding.scalars[position]`` holds it (a list as a
    tuple). A value other than the example makes the binding ``loose``: the pattern traced
    again with the bound values (``transforms.rewrite.sizes.recheck``) decides."""

    position: int
    example: Any

    def admits(self, t: Any) -> Any:
        """``t`` as the value this hole binds (a list as a tuple), or ``NOT_ADMITTED`` when
        ``t`` is of another kind. O(len(t))."""
        e = self.example
        if type(e) is tuple:
            if isinstance(t, (tuple, list, IList)) and all(type(x) is int for x in t):
                return tuple(t)
            return NOT_ADMITTED
        return t if type(t) is type(e) else NOT_ADMITTED


NOT_ADMITTED = object()  #: what ``Hole.admits`` gives for a literal of another kind


def with_holes(
    pattern: Pattern, hypers: Mapping[int, Any], what: str = "rule",
    others: Mapping[int, Pattern | None] | None = None,
) -> Pattern:
    """``pattern`` with each literal of ``args`` that equals a hyperparameter's example value
    (``hypers``: ``{argument position: example}``; typed as ``literal_equal`` compares: ``1``
    is not ``True``) replaced by a ``Hole``; a tuple example is looked for as a whole list
    first, an int one also inside lists (``stride=2`` traces as ``[2, 2]``). ``pattern`` itself
    when ``hypers`` is empty.

    ``others``: ``{position: the pattern traced with that hyperparameter alone given another
    value}`` (``None`` where it could not be traced so, as ``groups`` with the example weight).
    Where one is given, only the literals that differ there become that hyperparameter's
    holes: a default ``dilation=[1, 1]`` stays a literal beside a ``stride`` whose example is
    ``(1, 1)``. Where none is, every literal of the example's value does, and the re-check at
    the bound values (``sizes.recheck``) keeps only what matches.

    Raises ``PassError`` naming ``what`` when a hyperparameter's example appears nowhere in the
    pattern (a match could not bind it), or where two hyperparameters' examples are equal and
    both appear (which one a literal stands for is unknown: give them distinct examples).

    **Laws:** a pure function; ``match_at`` of the result on the pattern's own graph binds each
    hole to its example. Complexity: O(size of the pattern's arguments · len(hypers))."""
    if not hypers:
        return pattern
    found: dict[int, int] = dict.fromkeys(hypers, 0)
    moved = {i: _moved(pattern, o) for i, o in (others or {}).items() if o is not None}

    def owner(lit: Any, path: tuple) -> Hole | None:
        owners = [i for i, e in hypers.items()
                  if ((type(e) is tuple and isinstance(lit, (tuple, list, IList))
                       and tuple(lit) == e and all(type(x) is int for x in lit))
                      or (type(e) is not tuple and literal_equal(e, lit)))
                  and (i not in moved or path in moved[i])]
        if len(owners) > 1:
            raise PassError(
                f"{what}: hyperparameters {owners} have the same example value {lit!r}, which "
                "the pattern holds; give each hyperparameter a distinct example value"
            )
        if not owners:
            return None
        found[owners[0]] += 1
        return Hole(owners[0], hypers[owners[0]])

    def walk(tree: Any, path: tuple) -> Any:
        if type(tree) is Ref:
            return tree
        if isinstance(tree, (tuple, list, IList)):
            if tree and all(type(x) is int for x in tree):
                hole = owner(tree, path)
                if hole is not None:
                    return hole
            items = tuple(walk(x, (*path, j)) for j, x in enumerate(tree))
            return IList(items) if type(tree) is IList else type(tree)(items)
        hole = owner(tree, path) if type(tree) in (int, bool, str) else None
        return tree if hole is None else hole

    args = {k: walk(v, (k,)) for k, v in pattern.args.items()}
    missing = sorted(i for i, k in found.items() if not k)
    if missing:
        raise HyperparameterNotTraced(
            f"{what}: hyperparameter(s) {missing} (examples "
            f"{[hypers[i] for i in missing]}) appear nowhere in the pattern's trace; a "
            "hyperparameter must be a literal argument of an operator the pattern calls (give "
            "it an example value that no other argument of the pattern has)"
        )
    return attrs.evolve(pattern, args=args, holes=dict(hypers))


def _moved(pattern: Pattern, other: Pattern) -> set[tuple] | None:
    """The paths ``(node, index, ...)`` of the literals of ``pattern.args`` that differ in
    ``other`` (the same pattern traced with one hyperparameter changed); ``None`` (no
    evidence) when the two are not the same nodes with the same argument shapes."""
    if list(pattern.args) != list(other.args):
        return None
    out: set[tuple] = set()

    def diff(a: Any, b: Any, path: tuple) -> bool:
        if type(a) is Ref or type(b) is Ref:
            return type(a) is type(b)
        if isinstance(a, (tuple, list, IList)) and isinstance(b, (tuple, list, IList)):
            if len(a) != len(b):
                out.add(path)
                return True
            same = True
            for j, (x, y) in enumerate(zip(a, b)):
                same = diff(x, y, (*path, j)) and same
            if any(p[:len(path)] == path and len(p) > len(path) for p in out):
                out.add(path)
            return same
        if not literal_equal(a, b):
            out.add(path)
        return True

    for k, a in pattern.args.items():
        b = other.args[k]
        if len(a) != len(b) or not diff(tuple(a), tuple(b), (k,)):
            return None
    return out


@attrs.frozen
class Binding:
    """A match: pattern name -> graph node name for placeholders and compute nodes; sentinel
    position -> the scalar it matched.

    ``absorbed``: graph nodes that compute nothing which the match looks through (eval-mode
    dropout, a ``.to`` or ``clone`` keeping dtype and layout, ``alias``), and the metadata checks
    that read a matched interior value (added by ``absorb_checks``); they go with the match.
    ``loose``: a size or dimension wildcard bound a value other than the pattern's own: take the
    binding only after ``transforms.rewrite.sizes.recheck``."""

    names: Mapping[str, str]
    scalars: Mapping[int, Any]
    absorbed: tuple[str, ...] = ()
    loose: bool = False


def match_at(
    pattern: Pattern,
    node: Node,
    lookup: Callable[[str], Node | None],
    candidates: Callable[[Any], Iterable[Node]],
    *,
    strict: bool = False,
) -> Iterator[Binding]:
    """Every way ``pattern`` matches with its anchor at ``node``, lazily, in a fixed order.

    ``lookup(name)`` gives the graph's current node of that name (``None`` if there is none);
    ``candidates(target)`` the graph's nodes calling ``target`` (for results the anchor's tree
    does not reach). ``strict``: sizes and dimensions must be equal (no wildcard; no binding is
    ``loose``).

    **Laws:** every binding maps each matched pattern node to a distinct graph node calling the
    same target, with normal-form arguments that match position by position (wildcards bound
    consistently), through graph nodes that compute nothing (``absorbed``, distinct from the
    matched ones); deterministic (the order of ``candidates`` and of the graph's arguments).
    Complexity: O(pattern size + nodes looked through) per binding tried, times 2 per
    commutative node.
    """
    matcher = _Matcher(pattern, lookup, candidates, strict)
    yield from matcher.run(node)


def absorb_checks(
    pattern: Pattern, binding: Binding, lookup: Callable[[str], Node | None],
    users: Callable[[str], Iterable[str] | None],
) -> Binding:
    """``binding`` with the metadata checks (``ir.ops.is_metadata_check``) that read a matched
    interior value (a matched compute node that is no result of the pattern, or an absorbed
    node) added to ``absorbed``: they check a value the rewrite removes.

    ``users(name)``: the names of the nodes that read node ``name``. **Laws:** ``binding``
    itself when there is none; never adds a node twice. O(readers of the matched nodes)."""
    results = {binding.names.get(o.name) for o in pattern.outputs if type(o) is Ref}
    interior = [
        binding.names[k] for k in pattern.nodes if k in binding.names
        and binding.names[k] not in results
    ] + list(binding.absorbed)
    found: list[str] = []
    seen = set(binding.absorbed)
    for name in interior:
        for u in users(name) or ():
            if u in seen:
                continue
            n = lookup(u)
            if (n is not None and n.op == CALL_FUNCTION and ops.is_metadata_check(n.target)
                    and not any(r.name != name for r in n.inputs())):
                found.append(u)
                seen.add(u)
    if not found:
        return binding
    return attrs.evolve(binding, absorbed=binding.absorbed + tuple(found))


class _State:
    """One partial binding (immutable by convention: each step makes a new one)."""

    __slots__ = ("absorbed", "loose", "names", "scalars", "used")

    def __init__(self, names: dict, scalars: dict, used: frozenset, absorbed: tuple,
                 loose: bool) -> None:
        self.names = names
        self.scalars = scalars
        self.used = used
        self.absorbed = absorbed
        self.loose = loose

    def with_(self, names: dict | None = None, scalars: dict | None = None,
              used: frozenset | None = None, absorbed: tuple | None = None,
              loose: bool | None = None) -> _State:
        return _State(
            self.names if names is None else names,
            self.scalars if scalars is None else scalars,
            self.used if used is None else used,
            self.absorbed if absorbed is None else absorbed,
            self.loose if loose is None else loose,
        )


class _Matcher:
    def __init__(self, pattern: Pattern, lookup, candidates, strict: bool) -> None:
        self.p = pattern
        self.lookup = lookup
        self.val_of = lambda name: _val(lookup(name))
        self.candidates = candidates
        self.strict = strict

    def run(self, node: Node) -> Iterator[Binding]:
        start = _State({}, {}, frozenset(), (), False)
        for s in self.node(self.p.anchor, node, start):
            yield from self.rest(0, s)

    def rest(self, i: int, s: _State) -> Iterator[Binding]:
        if i == len(self.p.others):
            yield Binding(s.names, s.scalars, s.absorbed,
                          s.loose or self.p.holes_moved(s.scalars))
            return
        other = self.p.others[i]
        if other.name in s.names:
            yield from self.rest(i + 1, s)
            return
        for cand in self.candidates(other.target):
            if cand.name in s.used:
                continue
            for s2 in self.node(other, cand, s):
                yield from self.rest(i + 1, s2)

    def node(self, pnode: Node, tnode: Node, s: _State) -> Iterator[_State]:
        if tnode.op != CALL_FUNCTION or tnode.target is not pnode.target:
            return
        if tnode.name in s.used:
            return
        pargs = self.p.args[pnode.name]
        targs, rank, _ = _canonical(tnode, self.val_of)
        if len(pargs) != len(targs):
            return
        s = s.with_(names={**s.names, pnode.name: tnode.name}, used=s.used | {tnode.name})
        prank = self.p.ranks.get(pnode.name)
        if not self.strict and rank is not None and prank is not None and rank != prank:
            s = s.with_(loose=True)  # another rank: only a re-check at these shapes can say
        wild = frozenset() if self.strict else self.p.wildcards(pnode, rank)
        yield from self.seq(pargs, targs, 0, s, wild)
        if (
            ops.is_commutative(tnode.target)
            and len(targs) >= 2
            and _defaults_hold(tnode.target, targs)
        ):
            swapped = (targs[1], targs[0], *targs[2:])
            yield from self.seq(pargs, swapped, 0, s, wild)

    def seq(self, pargs, targs, i, s: _State, wild: frozenset[int] = frozenset()):
        if i == len(pargs):
            yield s
            return
        if (i in wild and _ints(pargs[i]) and _ints(targs[i])
                and not self.p.holds_sentinel(pargs[i])):
            differ = not same_literal(pargs[i], targs[i])
            nxt = s.with_(loose=True) if differ else s
            yield from self.seq(pargs, targs, i + 1, nxt, wild)
            return
        for s2 in self.arg(pargs[i], targs[i], s):
            yield from self.seq(pargs, targs, i + 1, s2, wild)

    def arg(self, p: Any, t: Any, s: _State) -> Iterator[_State]:
        if type(p) is Ref:
            if type(t) is not Ref:
                return
            bound = s.names.get(p.name)
            if bound is not None:
                yield from self.reach(bound, t, s)
                return
            if p.name in self.p.inputs:
                yield s.with_(names={**s.names, p.name: t.name})
                step = self.step(t, s)
                if step is not None:  # or bind the value a no-op passes on
                    yield from self.arg(p, *step)
                return
            pnode = self.p.nodes.get(p.name)
            tnode = self.lookup(t.name)
            if pnode is None or tnode is None:
                return
            yield from self.node(pnode, tnode, s)
            step = self.step(t, s)
            if step is not None:
                yield from self.arg(p, *step)
            return
        bound = self.p.bind(p, t, s.scalars)
        if bound is not None:
            if bound is not NOT_ADMITTED:
                yield s if bound is s.scalars else s.with_(scalars=bound)
            return
        if isinstance(p, (tuple, IList)):
            if not isinstance(t, (tuple, IList)) or len(p) != len(t):
                return
            yield from self.seq(tuple(p), tuple(t), 0, s)
            return
        if literal_equal(p, t):
            yield s
        elif same_number(p, t):  # 1 and 1.0: the re-check at the match's dtypes decides
            yield s if self.strict else s.with_(loose=True)

    def reach(self, bound: str, t: Ref, s: _State) -> Iterator[_State]:
        """``t`` is the graph value ``bound``, or passes it on through nodes that compute
        nothing (each absorbed)."""
        while t.name != bound:
            step = self.step(t, s)
            if step is None:
                return
            t, s = step
        yield s

    def step(self, t: Ref, s: _State) -> tuple[Ref, _State] | None:
        """When graph value ``t`` is computed by a node that computes nothing (and is no
        matched node), the value it passes on and the state with the node absorbed."""
        if t.name in s.absorbed:
            tnode = self.lookup(t.name)
            args = _normalized(tnode.target, tnode.args, tnode.kwargs) if tnode is not None else ()
            return (args[0], s) if args and type(args[0]) is Ref else None
        tnode = self.lookup(t.name)
        if (tnode is None or tnode.op != CALL_FUNCTION or tnode.name in s.used
                or not ops.facts(tnode.target).identity):
            return None
        targs, _, first = _canonical(tnode, self.val_of)
        if not targs or type(targs[0]) is not Ref:
            return None
        out = tnode.meta.get("val")
        if not ops.computes_nothing(tnode.target, targs, first, out):
            if self.strict or not _only_casts(tnode.target, first, out):
                return None
            s = s.with_(loose=True)  # a cast the pattern's trace may hold at these dtypes
        return targs[0], s.with_(used=s.used | {tnode.name}, absorbed=(*s.absorbed, tnode.name))


def _only_casts(target: Any, val_in: Any, val_out: Any) -> bool:
    """A conversion (``ir.ops.SAME_METADATA``) that changes its input's dtype and nothing else
    (device, layout, shape kept): it computes something, but a pattern traced at other dtypes
    may lack it where the program has it (``.float()`` of a float32 example is nothing)."""
    return (
        ops.facts(target).identity == ops.SAME_METADATA
        and isinstance(val_in, torch.Tensor) and isinstance(val_out, torch.Tensor)
        and (val_in.device, val_in.layout, val_in.shape)
        == (val_out.device, val_out.layout, val_out.shape)
    )


def _ints(x: Any) -> bool:
    """An int, or a sequence of ints (a size or dimension list)."""
    if type(x) is int:
        return True
    return isinstance(x, (tuple, IList)) and all(type(d) is int for d in x)


def _defaults_hold(target: Any, args: tuple) -> bool:
    params = ops.facts(target).params
    return all(
        literal_equal(p.default, a) for p, a in zip(params[2:], args[2:])
    )


__all__ = [
    "NOT_ADMITTED", "Binding", "Hole", "HyperparameterNotTraced", "Pattern", "absorb_checks",
    "canonical_form", "literal_equal", "match_at", "normal_args", "prepare", "same_literal",
    "same_number", "with_holes",
]
