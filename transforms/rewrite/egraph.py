"""An e-graph of one IR graph: hash-consed e-nodes, union-find with rebuilding, class data.

An *e-node* is an operator call whose tensor arguments are *e-classes* (sets of values known
equal): ``(target, canonical arguments with each child spelled by its position, child
classes)``. Two e-nodes with the same operator, literals and (canonical) child classes are one
e-node (hash-consing). ``union(a, b)`` records that two classes hold equal values;
``rebuild()`` restores the invariants after unions, as egg does: a worklist of merged classes,
each parent e-node re-canonicalised, and parents that became equal merged in turn (congruence
closure, upward merging).

Per-class data (``ClassData``): the fake value (``val``: shape, dtype, strides; a list of
fake values for a class of a ``split``, read by ``getitem`` e-nodes) every member computes,
whether the class is a *leaf* (an opaque value: see ``value_roles``) and the original node it
stands for. Members of one class agree on shape, dtype and device, and on strides
except where ``saturate`` proved that no reader sees them (``eclass_view.EClassView``: a fused
kernel's layout, the strided halves of a ``split``).

What is a leaf is decided in one place, ``value_roles``, which reads the shared effect/alias
analysis (``ir.effects.graph_effects``). A write in place of a fresh intermediate is no leaf:
it is the e-node of its functional twin, a new version of the written value (``versions``). A node that computes nothing (``ir.ops.computes_nothing``:
eval-mode dropout, a ``.to`` that keeps the dtype, ``alias``) is no e-node: its value is its
input's class (``passes_on``), as the matcher looks through such nodes and the patterns drop
them (``match.prepare``).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs
import torch

from ir import ops
from ir.args import EMPTY_DICT, IDict, IList, ISlice, Ref
from ir.effects import graph_effects, shares_first
from ir.graph import Graph
from ir.module import ModuleId
from ir.node import CALL_FUNCTION, OUTPUT, Node
from ir.program import Program
from transforms.rewrite.match import canonical_form
from transforms.rewrite.versions import NONE, Versions, versions

LEAF = "leaf"  #: the operator of a leaf e-node (its literal is the node's name)

__all__ = [
    "ESCAPE_CAP", "LEAF", "ClassData", "EGraph", "ENode", "GraphEGraph", "covered", "escapes",
    "from_graph",
    "passes_on", "value_roles", "walk_classes",
]


@attrs.frozen
class ENode:
    """One e-node: ``op`` (an operator, or ``LEAF``), ``canon`` (the canonical arguments,
    ``ir.ops.canonical_args`` form, each child spelled ``Ref("#i")``), ``args``/``kwargs`` (the
    arguments to emit it with, children spelled the same way), ``children`` (class ids).
    ``rule``: the rule whose replacement made it first (``None`` for the program's own);
    ``folds``: that replacement is a ``fold_state=True`` rule's (``saturate`` folds what it
    computes from state alone, as ``rewrite`` does).
    ``key``: what hash-consing compares (operator, literals spelled with their types, children
    as they are). Two e-nodes are equal when their keys are."""

    op: Any
    canon: tuple
    args: tuple
    kwargs: Any
    children: tuple[int, ...]
    spelled: Any = attrs.field(eq=False, repr=False)
    rule: str | None = attrs.field(default=None, eq=False)  #: the rule that made it first
    #: made by the replacement of a ``fold_state=True`` rule: where it reads only invariant
    #: classes its value is folded into a constant (``saturate``), so extraction charges nothing
    folds: bool = attrs.field(default=False, eq=False)

    @property
    def key(self) -> tuple:
        """The hash-consing key with the children as stored (canonicalise them first)."""
        return (self.op, self.spelled, self.children)

    def with_children(self, children: tuple[int, ...]) -> ENode:
        """The same e-node over other child classes (``self`` when they are the same)."""
        if children == self.children:
            return self
        return attrs.evolve(self, children=children)


@attrs.define
class ClassData:
    """What one e-class knows of its value: ``val`` (fake tensor or ``None``), ``leaf``
    (opaque: a placeholder, state read, random, effectful, written or read-after-write value),
    ``origin`` (the original node's name, ``None`` for a class made by a rule), ``invariant``
    (the same at every call: computed from unwritten state alone, ``cost.invariant_values``;
    marked only where the caller froze the state, ``from_graph(frozen_state=True)``, and then
    an e-node whose children are all invariant costs nothing per call), ``covers`` (for a
    class a rule of several results made to compute them together, such as the fused
    ``x @ cat(w1, w2)``: the original nodes' names of the values it computes; see
    ``covered``)."""

    val: Any
    leaf: bool
    origin: str | None
    invariant: bool = False
    covers: frozenset[str] = frozenset()


def covered(data: ClassData) -> frozenset[str]:
    """The program values a class computes: its original node's, and those it was made to
    compute together (``ClassData.covers``). Empty for a class a rule made otherwise. O(1)
    plus the size of the set."""
    own = frozenset() if data.origin is None else frozenset((data.origin,))
    return own | data.covers


def spell(tree: Any) -> Any:
    """``tree`` as a hashable key: floats by their hex (``0.0`` is not ``-0.0``), bools and
    complex numbers with their type, containers by kind, anything unhashable by its repr.
    O(size of the tree)."""
    kind = type(tree)
    if kind is Ref:
        return ("#", tree.name)
    if kind is float:
        return ("f", tree.hex())
    if kind is bool:
        return ("b", tree)
    if kind is complex:
        return ("c", repr(tree))
    if kind in (tuple, list):
        return ("t", tuple(spell(x) for x in tree))
    if kind is IList:
        return ("l", tuple(spell(x) for x in tree.items))
    if kind is IDict:
        return ("d", tuple((k, spell(v)) for k, v in tree.items))
    if kind is ISlice:
        return ("s", spell((tree.start, tree.stop, tree.step)))
    try:
        hash(tree)
    except TypeError:
        return ("r", repr(tree))
    return (kind.__name__, tree)


class EGraph:
    """A mutable e-graph (private to one ``saturate`` call; never shared).

    ``add(enode, data)`` returns the class of a (hash-consed) e-node; ``union(a, b)`` merges two
    classes; ``rebuild()`` restores congruence; ``find(c)`` is the canonical id. ``classes``
    maps each canonical id to its e-nodes; ``data`` to its ``ClassData``; ``parents`` to the
    ``(e-node, class)`` pairs reading it.

    Complexity: ``add`` O(arguments); ``union`` O(1) amortised; ``rebuild`` O(parents of the
    merged classes) times α(n); the e-graph holds at most ``limits.node_limit`` e-nodes.
    """

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.classes: dict[int, list[ENode]] = {}
        self.data: dict[int, ClassData] = {}
        self.parents: dict[int, list[tuple[ENode, int]]] = {}
        self.memo: dict[tuple, int] = {}
        self.pending: list[int] = []
        self.size = 0  #: e-nodes added
        #: per rewrite by a rule of several results: ``(matched class, the replacement's
        #: result e-node)`` for each result (``extracted.plan`` tries them together)
        self.groups: list[tuple[tuple[int, ENode], ...]] = []

    def find(self, c: int) -> int:
        """The canonical id of class ``c`` (with path halving)."""
        parent = self.parent
        while parent[c] != c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c

    def canonical(self, enode: ENode) -> ENode:
        """``enode`` with its children canonical."""
        return enode.with_children(tuple(self.find(c) for c in enode.children))

    def lookup(self, enode: ENode) -> int | None:
        """The class holding ``enode`` (canonicalised), or ``None``."""
        found = self.memo.get(self.canonical(enode).key)
        return None if found is None else self.find(found)

    def add(self, enode: ENode, data: ClassData) -> int:
        """The class of ``enode``: the existing one, or a new class with ``data``."""
        enode = self.canonical(enode)
        found = self.memo.get(enode.key)
        if found is not None:
            return self.find(found)
        c = len(self.parent)
        self.parent.append(c)
        self.classes[c] = [enode]
        self.data[c] = data
        self.parents[c] = []
        self.memo[enode.key] = c
        for child in set(enode.children):
            self.parents[child].append((enode, c))
        self.size += 1
        return c

    def union(self, a: int, b: int) -> bool:
        """Record that classes ``a`` and ``b`` are equal; ``False`` when they already were.
        The merged class keeps the data of the one with an original node (a leaf stays a
        leaf), else of the larger."""
        a, b = self.find(a), self.find(b)
        if a == b:
            return False
        da, db = self.data[a], self.data[b]
        if len(self.classes[a]) < len(self.classes[b]):
            a, b, da, db = b, a, db, da
        self.parent[b] = a
        self.classes[a].extend(self.classes.pop(b))
        self.parents[a].extend(self.parents.pop(b))
        kept = self.data.pop(b)
        if da.origin is None and db.origin is not None:
            da.origin = db.origin
        da.leaf = da.leaf or db.leaf
        da.invariant = da.invariant or db.invariant
        da.covers = da.covers | db.covers
        if da.val is None:
            da.val = kept.val
        self.pending.append(a)
        return True

    def rebuild(self) -> int:
        """Restore congruence after unions (egg's rebuild): each merged class's parents are
        re-canonicalised; two parents that became one e-node merge their classes, which goes
        on up the graph. Returns the number of classes merged by congruence."""
        merged = 0
        while self.pending:
            todo = {self.find(c) for c in self.pending}
            self.pending = []
            for c in todo:
                merged += self._repair(self.find(c))
        for c, nodes in self.classes.items():
            seen: dict[tuple, ENode] = {}
            for n in nodes:
                n = self.canonical(n)
                seen.setdefault(n.key, n)
            self.classes[c] = list(seen.values())
        return merged

    def _repair(self, c: int) -> int:
        merged = 0
        fresh: dict[tuple, tuple[ENode, int]] = {}
        snapshot, self.parents[c] = self.parents[c], []
        for enode, owner in snapshot:
            self.memo.pop(enode.key, None)
            enode = self.canonical(enode)
            owner = self.find(owner)
            found = fresh.get(enode.key)
            if found is not None and self.find(found[1]) != owner:
                if self.union(found[1], owner):
                    merged += 1
                owner = self.find(owner)
            other = self.memo.get(enode.key)
            if other is not None and self.find(other) != owner:
                if self.union(other, owner):
                    merged += 1
                owner = self.find(owner)
            self.memo[enode.key] = owner
            fresh[enode.key] = (enode, owner)
        self.parents[self.find(c)].extend((n, self.find(o)) for n, o in fresh.values())
        return merged

    def nodes_count(self) -> int:
        """The e-nodes held now (after hash-consing). O(classes)."""
        return sum(len(v) for v in self.classes.values())


# --- the graph's values: leaves and e-nodes -------------------------------------------------------


def value_roles(p: Program, mid: ModuleId, graph: Graph,
                seen: Versions | None = None) -> frozenset[str]:
    """The names of ``graph``'s nodes that are *leaves* of its e-graph: their value is taken as
    it is, never rewritten nor merged with another.

    A node is a leaf unless it is a pure ``call_function`` (no effect, not random, not writing:
    ``ir.effects``; or one that computes nothing, ``passes_on``: eval-mode dropout draws no
    random numbers) whose result is one tensor, or one list of tensors read only by
    ``getitem`` s at int positions (``split``, ``unbind``, ``chunk``: its class holds the list,
    its ``getitem`` s are e-nodes reading it; a list returned or read whole is a leaf), that
    neither is written in place (directly or through an alias: a written half of a ``split``
    writes the list's whole group) nor reads a value that is (a read after a write).
    Placeholders (inputs, state reads), ``get_attr``, module calls, metadata checks and
    symbolic sizes are leaves.
    Writes that the e-graph sees functionally (``versions``: in-place writes of a fresh
    intermediate, ``seen``, computed when not given) are no writes here: the writer is the
    e-node of its functional twin, its base and the readers of either are e-nodes as any.

    The one adapter between the e-graph and the program's effect facts: it reads the shared
    effect/alias analysis, ``ir.effects.graph_effects``.

    **Laws:** a pure function of ``p`` and the graph. Complexity: O(n α(n)).
    """
    effects = graph_effects(p, mid, graph)
    seen = versions(p, mid, graph) if seen is None else seen
    members, functional = seen.members, seen.functional

    def written(name: str) -> bool:
        return name not in members and effects.is_written(name)

    vals = {n.name: n.meta.get("val") for n in graph.nodes}
    lists = _projected_lists(graph, vals)
    leaves = []
    for n in graph.nodes:
        if n.op == OUTPUT:
            continue
        if (
            n.op != CALL_FUNCTION
            or not (isinstance(n.meta.get("val"), torch.Tensor) or n.name in lists)
            or ops.is_metadata_check(n.target)
            or (effects.has_effect(n.name) and passes_on(n, vals) is None
                and n.name not in functional)
            or written(n.name)
            or any(written(r.name) for r in n.inputs())
        ):
            leaves.append(n.name)
    return frozenset(leaves)


def _projected_lists(graph: Graph, vals: Mapping[str, Any]) -> frozenset[str]:
    """The ``call_function`` nodes of ``graph`` whose result is one list of tensors (an
    operator whose schema returns one ``Tensor[]``: ``split``, ``split_with_sizes``,
    ``unbind``, ``chunk``, ``tensor_split``) or several tensors (core aten's
    ``_native_batch_norm_legit_no_training``, ``native_layer_norm``: without them no
    pattern holding a batch norm matched at core aten) read only by ``getitem`` s at int positions
    within it: the list never reaches anything whole (not returned, not an argument of
    another operator), so its class may hold the list and each ``getitem`` be an e-node
    reading it. Effects and writes are ``value_roles``' to judge. O(n)."""
    candidates: set[str] = set()
    for n in graph.nodes:
        val = vals.get(n.name)
        if (n.op == CALL_FUNCTION and isinstance(val, (list, tuple)) and val
                and all(isinstance(v, torch.Tensor) for v in val)
                and ops.facts(n.target).results >= 1):
            candidates.add(n.name)
    if not candidates:
        return frozenset()
    for n in graph.nodes:
        read = [r.name for r in n.inputs() if r.name in candidates]
        if not read:
            continue
        if not (n.op == CALL_FUNCTION and ops.facts(n.target).getitem and not n.kwargs
                and len(n.args) == 2 and type(n.args[0]) is Ref
                and type(n.args[1]) is int
                and 0 <= n.args[1] < len(vals[n.args[0].name])):
            candidates.difference_update(read)  # read whole, returned, or an odd index
    return frozenset(candidates)


def passes_on(n: Node, val_of: Mapping[str, Any]) -> str | None:
    """The name of the value that node ``n`` gives unchanged (``ir.ops.computes_nothing``:
    ``alias``, eval-mode dropout, a ``.to``/``clone`` keeping dtype, device, layout and shape),
    or ``None``. ``val_of``: node name -> fake value. O(arguments)."""
    if n.op != CALL_FUNCTION or not ops.facts(n.target).identity:
        return None
    out = n.meta.get("val")
    canon, _, first = canonical_form(n.target, n.args, n.kwargs, val_of.get, out)
    if not canon or type(canon[0]) is not Ref:
        return None
    return canon[0].name if ops.computes_nothing(n.target, canon, first, out) else None


def enode_of(target: Any, args: tuple, kwargs: Any, child_of: Mapping[str, int],
             val_of: Mapping[str, Any], out_val: Any) -> ENode:
    """The e-node of ``target(*args, **kwargs)`` whose ``Ref`` s name values of ``child_of``
    (name -> class) with fake values ``val_of`` (name -> val) and result ``out_val``.

    The canonical arguments follow the matcher's normal form (``ir.ops.normalized_args`` then
    ``ir.ops.canonical_args`` at the first tensor argument's rank and dtype and the result's
    shape), so that ``softmax(x, -1)`` and ``softmax(x, dim=1)`` on a 2-D ``x`` are one
    e-node. O(arguments)."""
    order: dict[str, int] = {}

    def place(tree: Any) -> Any:
        kind = type(tree)
        if kind is Ref:
            i = order.setdefault(tree.name, len(order))
            return Ref(f"#{i}")
        if kind is tuple:
            return tuple(place(x) for x in tree)
        if kind is IList:
            return IList(tuple(place(x) for x in tree.items))
        if kind is IDict:
            return IDict(tuple((k, place(v)) for k, v in tree.items))
        return tree

    canon = place(canonical_form(target, args, kwargs, val_of.get, out_val)[0])
    emit_args = place(tuple(args))
    emit_kwargs = place(kwargs)
    children = tuple(child_of[name] for name in order)
    return ENode(target, canon, emit_args, emit_kwargs, children, spell(canon))


def leaf(name: str) -> ENode:
    """The leaf e-node of the node named ``name``."""
    return ENode(LEAF, (name,), (), EMPTY_DICT, (), (LEAF, name))


@attrs.define
class GraphEGraph:
    """The e-graph of one IR graph: ``eg``; ``class_of`` (node name -> class id as built: a
    written value's class is its own version, before the write); ``own`` (node name -> its
    own e-node, for pure nodes and for writes seen functionally, whose own e-node is their
    functional twin's); ``position`` (node name -> index in the graph); ``roots`` (the classes
    read by leaves and the output: what must be computed); ``leaves`` (leaf node names);
    ``versions`` (the writes seen functionally, ``versions.versions``)."""

    eg: EGraph
    class_of: dict[str, int]
    own: dict[str, ENode]
    position: dict[str, int]
    roots: tuple[int, ...]
    leaves: frozenset[str]
    versions: Versions = NONE


def from_graph(p: Program, mid: ModuleId, graph: Graph, *,
               frozen_state: bool = False) -> GraphEGraph:
    """The e-graph of ``graph`` (of module ``mid`` of ``p``): a leaf class per leaf node
    (``value_roles``), an e-node per pure node, in graph order (equal pure computations become
    one class by hash-consing); a node that computes nothing (``passes_on``) takes its input's
    class and has no e-node of its own (the program keeps it where it is still read). A write
    in place of a fresh intermediate (``versions``) is the e-node of its functional twin
    (``add_(t, r)``: ``add(t, r)``), a new class: the *version* that every later reader of
    the written memory reads (``Versions.rebind``), while earlier readers read the old one.

    ``frozen_state``: the classes of values computed from unwritten state alone are marked
    ``ClassData.invariant`` (with ``search_result.plan(..., frozen=True)`` extraction counts
    an e-node reading only such classes as free: the caller folds them into constants; with
    ``frozen=False`` only the e-nodes of ``fold_state`` rules, ``ENode.folds``); else none is
    (every e-node is charged).

    **Laws:** a pure function of its arguments; every class holds one original value.
    Complexity: O(n) e-nodes, O(n α(n)) in all."""
    from transforms.rewrite.cost import invariant_values  # cost reads the program only

    eg = EGraph()
    seen = versions(p, mid, graph)
    leaves = value_roles(p, mid, graph, seen)
    once = invariant_values(p, mid, graph) if frozen_state else frozenset()
    class_of: dict[str, int] = {}
    own: dict[str, ENode] = {}
    val_of: dict[str, Any] = {}
    position: dict[str, int] = {}
    roots: list[int] = []
    for i, n in enumerate(graph.nodes):
        position[n.name] = i
        val_of[n.name] = n.meta.get("val")
        stale = seen.rebind.get(n.name)
        reads: Mapping[str, int] = class_of if stale is None else ChainMap(
            {old: class_of[now] for old, now in stale.items()}, class_of)
        if n.op == OUTPUT or n.name in leaves:
            roots.extend(reads[r.name] for r in n.inputs() if r.name in reads)
            if n.op != OUTPUT:
                class_of[n.name] = eg.add(leaf(n.name), ClassData(
                    val_of[n.name], True, n.name, n.name in once))
            continue
        source = passes_on(n, val_of)
        if source is not None and source in reads:
            class_of[n.name] = eg.find(reads[source])
            continue
        target = seen.functional.get(n.name, n.target)
        e = enode_of(target, n.args, n.kwargs, reads, val_of, val_of[n.name])
        own[n.name] = e
        class_of[n.name] = eg.add(e, ClassData(val_of[n.name], False, n.name, n.name in once))
        whole = (own.get(n.args[0].name) if ops.facts(n.target).getitem and n.args
                 and type(n.args[0]) is Ref
                 and isinstance(val_of.get(n.args[0].name), (list, tuple)) else None)
        if whole is not None and whole.children:
            # a projection of a list the program splits (``split(x @ cat(w1, w2))[0]``): the
            # value split covers it, as the fused value a rule makes covers its results'
            # (``covered``), so it is never fused again with its own projection
            data = eg.data[eg.find(whole.children[0])]
            data.covers = data.covers | {n.name}
    return GraphEGraph(eg, class_of, own, position, tuple(dict.fromkeys(roots)), leaves, seen)


ESCAPE_CAP = 64  #: classes followed by ``escapes``, at most (past it: escapes)


def escapes(eg: EGraph, c: int, pinned: set[int]) -> bool:
    """Whether the value of class ``c`` reaches outside the graph's pure part: ``c``, or a
    view of it (e-nodes whose operator may give its first argument's memory,
    ``ir.effects.shares_first``: views, alias-like operators, and the ``getitem`` s of a list
    of views such as a ``split``, followed up the parents), is in
    ``pinned`` (canonical ids of the classes returned or read by a leaf: ``GraphEGraph.roots``)
    or is a leaf; ``True`` past ``ESCAPE_CAP`` classes followed. Two results of one rewrite
    that are views of one buffer may not both escape (``saturate``, ``extracted.plan``).
    O(classes followed x their parents)."""
    views = walk_classes(
        eg, (c,), lambda x: (o for n, o in eg.parents.get(x, ()) if shares_first(n.op)))
    return any(i >= ESCAPE_CAP or x in pinned or eg.data[x].leaf for i, x in enumerate(views))


def reachable(eg: EGraph, roots: Iterable[int]) -> set[int]:
    """The classes reachable from ``roots`` through any e-node. O(e-nodes)."""
    return set(walk_classes(eg, roots, lambda c: (x for n in eg.classes[c] for x in n.children)))


def walk_classes(
    eg: EGraph, roots: Iterable[int], step: Callable[[int], Iterable[int]]
) -> Iterator[int]:
    """Each class reached from ``roots`` once (canonical ids), depth first: a class, then
    those ``step(class)`` names, asked once the caller is done with it (a caller that stops
    early asks no more). O(classes reached + the ids ``step`` gives)."""
    seen: set[int] = set()
    todo = [eg.find(r) for r in roots]
    while todo:
        c = todo.pop()
        if c in seen:
            continue
        seen.add(c)
        yield c
        todo.extend(eg.find(x) for x in step(c))
