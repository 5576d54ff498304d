"""What ``saturate``'s guards read of an e-graph (``EClassView``): its answers to
``guards.MemoryView``, and the layout walk with its record of the classes whose members may
differ in strides.

The guards themselves are ``transforms.rewrite.guards``' (``alias_guard``, ``sharing_guard``,
and the layout walk ``follow_layout``), written once for both drivers; here is only how an
e-graph answers them. An e-class is not one value: it may hold several e-nodes, a class's
value may be missing, and what reads it may still be added. So the answers are conservative
where ``rewrite``'s working graph would know: a class escapes past ``egraph.ESCAPE_CAP``
classes followed, its sources are unknown past it, and strides or sharing that cannot be
compared refuse a value of other strides.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ir import ops
from ir.effects import shares_first
from ir.fake_memo import FakeMemo
from ir.graph import Graph
from ir.node import OUTPUT
from transforms.rewrite.egraph import ESCAPE_CAP, EGraph, ENode, GraphEGraph, escapes, walk_classes
from transforms.rewrite.guards import fake_run, follow_layout, same_sharing, same_strides


class EClassView:
    """What the guards read of one e-graph: its answers to ``guards.MemoryView`` (for the
    alias and sharing guards), and the layout walk with its record of the classes whose
    members may differ in strides (*mixed*).

    ``pinned``: the classes returned or read by a leaf (``GraphEGraph.roots``: what
    escapes); ``fixed``: those read by a leaf (``read_by_leaves``; default ``pinned``); both
    as built, taken to their canonical ids at each question (merges go on).

    - ``reach(c)``: ``(escapes, False)``: whether ``c`` escapes (``egraph.escapes``: it, or a
      view of it up its parents, is pinned or is a leaf; ``True`` past ``ESCAPE_CAP``); never
      written: a value written in place that the e-graph does not see functionally is a
      leaf, and so is every node that reads it (``egraph.value_roles``), no pattern matches a
      leaf, and a write seen functionally (``versions``) is built as its functional twin;
    - ``sources(c)``: ``c`` and the classes whose memory it may be, down its e-nodes that may
      give their first argument's memory (``ir.effects.shares_first``); ``None`` past
      ``ESCAPE_CAP`` classes. O(classes followed x their parents) per question;
    - ``restride(c, new, memo)``: whether a value of other strides may join class ``c`` (a
      fused kernel's result laid out otherwise: an attention's ``(B, L, H, E)`` memory order
      for a ``(B, H, L, E)`` result).

    The layout walk is ``guards.follow_layout`` up the class's parent e-nodes (run again
    with the search's memo; nothing to compare refuses; a sharing flip is not followed),
    refused where a class followed is a leaf or is read by one (``fixed``: the program's own
    effects, module calls and writes see it), or a reader's class is a leaf. A class the
    graph returns may take other strides, as in ``rewrite`` (the caller gets the same values;
    the in-context law compares values, dtypes, shapes and aliasing, not strides): so
    ``return x @ w1, relu(x @ w2)`` fuses by columns, its first output a strided half. Where
    a reader's sharing flipped (``reshape``), refused where two of the classes followed and
    such readers escape (``pinned``): outputs that shared memory would not.
    The classes whose strides may now differ are marked mixed; an e-node added later that
    reads a mixed class is refused where it is a view or reads strides (it was run on one
    layout only), and its own class is marked mixed. Sound, not complete.
    """

    def __init__(self, eg: EGraph, pinned: frozenset[int],
                 fixed: frozenset[int] | None = None) -> None:
        self.eg = eg
        self.pinned = pinned
        self.fixed = pinned if fixed is None else fixed
        self.mixed: set[int] = set()

    def reach(self, c: int) -> tuple[bool, bool]:
        return escapes(self.eg, c, {self.eg.find(x) for x in self.pinned}), False

    def sources(self, c: int) -> set[int] | None:
        eg, seen = self.eg, set()
        for x in walk_classes(eg, (c,), lambda x: (
                n.children[0] for n in eg.classes.get(x, ()) if n.children and shares_first(n.op))):
            if len(seen) >= ESCAPE_CAP:
                return None
            seen.add(x)
        return seen

    def is_mixed(self, c: int) -> bool:
        c = self.eg.find(c)
        return any(self.eg.find(x) == c for x in self.mixed)

    def may_read(self, e: ENode) -> bool:
        """Whether the new e-node ``e`` may read its children as they are: no view or stride
        reader of a mixed class."""
        if not self.mixed or not any(self.is_mixed(c) for c in e.children):
            return True
        return not (ops.is_view(e.op) or ops.reads_strides(e.op))

    def inherit(self, e: ENode, c: int) -> None:
        """Mark ``c`` (the class of the new e-node ``e``) mixed where ``e`` reads one."""
        if self.mixed and any(self.is_mixed(x) for x in e.children):
            self.mixed.add(self.eg.find(c))

    def restride(self, c: int, new: Any, memo: FakeMemo) -> bool:
        """Whether a value of strides ``new`` may join class ``c`` (see the class); marks the
        classes whose strides may then differ. ``memo``: the search's fake runs."""
        eg = self.eg
        fixed = {eg.find(x) for x in self.fixed}

        def readers(x: int, _restrided: bool, _vals: object) -> list[tuple | None]:
            if x in fixed or eg.data[x].leaf:
                return [None]
            owners = ((e, eg.find(o)) for e, o in eg.parents.get(x, ()))
            return [None if eg.data[o].leaf else (e, e.op, o, x) for e, o in owners]

        def rerun(enode: ENode, vals: dict[int, Any]) -> Any:
            env = {f"#{i}": vals.get(ch, eg.data[ch].val)
                   for i, ch in enumerate(map(eg.find, enode.children))}
            return fake_run(enode.op, enode.args, enode.kwargs, env, memo)

        walked = follow_layout(eg.find(c), new, readers, rerun, lambda x: eg.data[x].val,
                               strides=partial(same_strides, single=True),
                               sharing=same_sharing, follow_flips=False)
        if walked is None:
            return False
        vals, flipped = walked
        if flipped and len({eg.find(x) for x in self.pinned} & (set(vals) | flipped)) > 1:
            return False  # returned values that shared memory no longer do (or the reverse)
        self.mixed.update(vals)
        return True


def read_by_leaves(geg: GraphEGraph, graph: Graph) -> frozenset[int]:
    """The classes (as built) that a leaf node of ``graph`` reads: the part of
    ``geg.roots`` that is not there only because the output returns it. O(n)."""
    out: set[int] = set()
    for n in graph.nodes:
        if n.op == OUTPUT or n.name not in geg.leaves:
            continue
        stale = geg.versions.rebind.get(n.name) or {}
        for r in n.inputs():
            name = stale.get(r.name, r.name)
            if name in geg.class_of:
                out.add(geg.class_of[name])
    return frozenset(out)


__all__ = ["EClassView", "read_by_leaves"]
