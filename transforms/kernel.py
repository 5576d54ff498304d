"""The rewriting kernel: what every pass that emits, replaces or erases nodes of the IR shares.

A graph of the IR is immutable; a pass that edits one builds new node lists and, at the end,
a new Program. What such an edit must get right is the same for every pass, and lives here:

- **fake propagation** (``fake_value``): a new or re-argued node's ``val`` is its operator run
  on its arguments' fake values, under their fake mode (``meta`` tensors as they are), with
  torch's fake-tensor log quieted; one error contract: ``None`` when a value is unknown,
  ``FakeRunFailed`` when the operator raises on known values (each driver says what that means
  for it: a ``PassError``, a rule not taken);
- **naming and ``meta``** of a new node (``base_name``, ``new_meta``): named after its
  operator, in the module stack it runs in, with the anchor's ``stack_trace`` and its ``val``;
- **writes** a new node makes: ``ir.effects.written_args`` of the node (the one effect
  analysis), which a driver checks before it lets a node in;
- **metadata across graphs** (``rederive_callers``): when the value a module graph returns
  changes dtype, shape or strides (``same_meta``), the ``val`` of each call of it and of
  everything downstream of those calls is derived again, up to the root, or the edit is refused where the change reaches a
  signature (an output spec, a preserved call) or a call whose graph was traced at the old
  shapes;
- **finalisation** (``finalised``, over ``renamed_outputs`` and ``renamed_calls``): output
  specs and preserved call signatures follow the values that replaced the ones they named, and
  the state a pass added (``NewState``) is put in the program;
- **new state reads** (``WorkingGraph.state_read``): the placeholder (flat root) or
  ``get_attr`` that reads new state, named among the graph's names, placed among the root's
  inputs at ``finish``;
- the **working graph** (``WorkingGraph``): the one mutable working copy of a graph a driver
  edits (local to one call, never shared): its nodes by name with a sort key each, their
  readers, the call_function nodes of each operator, whether a value is written in place
  (``is_written``: ``ir.effects``' answer, writes through views and aliases counted) and the
  sorted keys of the nodes that write, the names taken (``fresh`` draws one after
  the naming policy, ``release`` / ``reserve`` give back and take), the results renamed; it
  makes every node through one door (``make_carrying``: named ``name`` or fresh after a base,
  the meta given, ``made`` and the listener told; ``make`` gives it ``new_meta``, ``copy`` a
  node's own meta; ``carried`` is the node under a name a driver without a working graph
  gives), places it (``add``), rewires the
  readers of a value (``replace_uses``), erases a node (``erase``) and finishes into a new
  ``Graph`` and its renames (``finish``); streamed (``indexed=False``), it places the nodes in
  order (``keep``: ``rewired`` to the values that replaced their arguments), replaces a node by
  a value (``replace``) and leaves one out (``drop``);
- **dynamic sizes** (``guard_error``, ``dynamic_sizes``): every fake run of a pass refuses a
  guard on the program's shape env (``ir.fake_run.guards_refused``: the env is shared with the
  input program, whose sizes it would fix); the refusal is a ``PassError`` naming the node, the
  dimension (its input and range) and what to do instead;
- the **listener hook** (``Listener``): a driver that may roll an edit back hears of each node
  the working graph makes, erases and replaces; ``Drawn`` records the names made so that the
  rule engine gives them back when a rule is not taken (``WorkingGraph.release``).

Drivers on it: the rule engine (``transforms.rewrite.engine``; its working copy is an indexed
``WorkingGraph`` with the rewrite's context), ``rewrite_nodes`` (``transforms.edit``: names,
makes and keeps the nodes it has defined through a streamed one), and ``cse``,
``fold_constants``, ``eliminate_dead_code`` and ``fold_into_state``, which stream each graph
they change through one (those that replace values or add state end in ``finalised``).

Graphs named anew (``WorkingGraph.take_only``, ``copy``, ``renamed``, ``read_as``; new
inputs are ``make_carrying(PLACEHOLDER, ...)``; ``fresh_id`` for module ids;
``FxWorkingGraph`` for torch.fx's names): ``inline`` and ``restacked`` stream the flat graph
through one, each node copied in keeping its name where it is free; ``split_by_tags`` builds
its root and children in ``FxWorkingGraph`` s and reorders, re-tags and re-returns through
``WorkingGraph`` s; the stage split makes each stage's inputs, size reads and body through
one; ``export_ep`` names the state it lifts to placeholders through one. Graphs built from
scratch (outlining, sinking, deduplication, the preserved-call plumbing) make their nodes with
``make_carrying`` and put them together with ``built``. The default pipeline's other passes
(``remove_effect_tokens``, ``functional_to_inplace``, ``hold_foreign_state``,
``split_hop_bodies``, ``fix_module_stacks``, ``fill_call_gaps``) stream their graphs through one,
making the node that stands for another with ``derive`` (through ``make_carrying``), moving
later readers with ``read_as`` and closing a body with ``returning``.
"""

from __future__ import annotations

import bisect
import builtins
import functools
import keyword
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

import attrs

from ir import signature as sg
from ir.args import EMPTY_DICT, Ref, map_refs, map_refs_in, thaw
from ir.effects import AliasSets, Effects, written_args
from ir.errors import PassError
from ir.fake_run import (
    META,
    FakeRunFailed,
    RefusedGuard,
    describe,
    fake_value,
    same_layout,
    same_val,
)
from ir.graph import Graph
from ir.module import ModuleId, split_call_target
from ir.names import Names, fresh_name, target_name
from ir.node import (
    CALL_FUNCTION,
    CALL_METHOD,
    CALL_MODULE,
    EMPTY_META,
    GET_ATTR,
    OUTPUT,
    PLACEHOLDER,
    Node,
    frozen_meta,
    new_node,
)
from ir.program import Program
from transforms.new_state import NewState

__all__ = [
    "KEEP",
    "META",
    "Drawn",
    "FakeRunFailed",
    "FxNames",
    "FxWorkingGraph",
    "Listener",
    "WorkingGraph",
    "base_name",
    "built",
    "carried",
    "describe",
    "dynamic_sizes",
    "fake_value",
    "finalised",
    "fresh_id",
    "guard_error",
    "new_meta",
    "rederive_callers",
    "renamed_calls",
    "renamed_outputs",
    "resolved",
    "same_meta",
    "same_nodes",
    "same_val",
    "size_range",
]


# --- naming and meta -----------------------------------------------------------------------------


def base_name(target: Any) -> str:
    """The base of a new node's name: ``add`` for ``aten.add.Tensor``, ``relu`` for
    ``torch.relu``."""
    name = target_name(target).split(".")
    if len(name) >= 3 and name[0] == "aten":
        return name[1]
    return name[-1] or "_"


def new_meta(val: Any, stack: Any, anchor_meta: Mapping[str, Any]) -> Mapping[str, Any]:
    """A new node's meta: its module ``stack`` (``nn_module_stack``; ``None``: none), the
    anchor's ``stack_trace`` (the node it stands in for, or is emitted at) and its ``val``."""
    meta: dict[str, Any] = {}
    if stack is not None:
        meta["nn_module_stack"] = stack
    if "stack_trace" in anchor_meta:
        meta["stack_trace"] = anchor_meta["stack_trace"]
    if val is not None:
        meta["val"] = val
    return MappingProxyType(meta)


#: ``carried`` / ``WorkingGraph.make_carrying``: leave this entry of the meta as it is.
KEEP: Any = object()


# --- listener ------------------------------------------------------------------------------------


class Listener(Protocol):
    """What a driver that may roll an edit back hears from a ``WorkingGraph``."""

    def emitted(self, node: Node) -> None:
        """``node`` was made (named, ``meta`` and ``val`` given) for the graph being built."""

    def erased(self, name: str) -> None:
        """The node named ``name`` left the graph being built."""

    def replaced(self, old: str, new: str) -> None:
        """The readers of value ``old`` read value ``new`` from now on."""


class Drawn:
    """A ``Listener`` that records the names of the nodes made while it listens (``names``,
    in order) and of those erased (``erased``): what a driver gives back when it does not
    take an edit (``WorkingGraph.release(drawn.names)``)."""

    __slots__ = ("erased_names", "names")

    def __init__(self) -> None:
        self.names: list[str] = []
        self.erased_names: list[str] = []

    def emitted(self, node: Node) -> None:
        self.names.append(node.name)

    def erased(self, name: str) -> None:
        self.erased_names.append(name)

    def replaced(self, old: str, new: str) -> None:
        """(Nothing to give back: a replacement draws no name.)"""


# --- the working graph ---------------------------------------------------------------------------


class WorkingGraph:
    """The mutable working copy of one graph that a driver edits (local to one call).

    - ``node``: name -> the node as it is now; ``key``: name -> its sort key (a tuple: the
      ``i``-th node of the input at ``(i,)``, nodes placed between at longer keys);
    - ``users``: name -> its readers (a dict used as an ordered set);
    - ``by_target``: ``id(target)`` -> the call_function nodes of that operator;
    - ``is_written(name)``: whether a node writes value ``name`` in place, directly or through
      a value that may share its memory (a view, an in-place result, an input that may be the
      same tensor), as ``ir.effects`` defines it: the input graph's ``Effects`` for its nodes,
      and for each node placed since, its ``written_args`` joined over its ``aliased_args``
      (``ir.effects.AliasSets``); ``written_after(name)``: the same, counting only writes
      placed after ``name`` (what the rewrite guard ``input_written`` asks); ``mutations``: the
      sorted keys of the nodes that write in place;
    - ``taken``: the names taken (a ``Names`` set: ``fresh`` draws a new one);
    - ``made``: the names of the nodes ``make_carrying`` made (the values the edit created,
      not those of the input graph; names given back by ``release`` leave it);
    - ``renames``: old -> new name of each result whose readers were moved to another value;
      ``alias``: the same as ``Ref`` s, what a node placed later reads instead (``keep``);
    - ``new`` / ``placeholders``: the ``NewState`` that new state is read from
      (``state_read``) and the new root placeholders, put among the root's inputs at ``finish``;
    - ``listener``: told of each node made (``make_carrying``, ``state_read``), erased
      (``erase``, ``drop``) and replaced (``replace_uses``, ``replace``); ``None``: nobody.

    ``indexed=False`` places none of ``graph``'s nodes (the driver places them with ``add`` or
    ``keep`` as it walks, in order) and keeps no ``users`` / ``by_target`` / writes
    index: a driver that streams the graph in order (``rewrite_nodes``, ``cse``,
    ``fold_constants``, ``eliminate_dead_code``) pays for the node map only (the names taken
    are gathered when a name is first drawn); ``finish`` gives the nodes in the order placed.
    ``effects``: ``graph``'s ``ir.effects.Effects`` (what its nodes write, module calls and
    higher-order ops resolved to what their graphs write); without it, each node's
    ``written_args`` and ``aliased_args`` (conservative: a module call writes its arguments).
    Indexed graphs of a Program should be given it, so that every driver asks "is it
    written?" of the one analysis.

    Complexity: O(n) to build (``indexed``; O(1) streamed), O(readers) per ``add`` /
    ``erase``, O(arguments) per ``keep``, O(log m) per write-ordered query over ``m`` writing
    nodes, O(n log n) to ``finish`` (O(n) streamed).
    """

    __slots__ = ("_taken", "alias", "by_target", "graph", "indexed", "key", "listener", "made",
                 "mutations", "new", "node", "placeholders", "renames", "sets", "users")

    def __init__(
        self, graph: Graph, *, effects: Effects | None = None, listener: Listener | None = None,
        indexed: bool = True,
    ) -> None:
        self.graph = graph
        self.indexed = indexed
        self.listener = listener
        self.node: dict[str, Node] = {}
        self.key: dict[str, tuple] = {}
        self.users: dict[str, dict[str, None]] = {}
        self.by_target: dict[int, dict[str, None]] = {}
        self.sets = AliasSets(effects)
        self.mutations: list[tuple] = []
        self.renames: dict[str, str] = {}
        self.alias: dict[str, Ref] = {}
        self.new: NewState | None = None
        self.placeholders: list[Node] = []
        self._taken: Names | None = None
        self.made: set[str] = set()
        if indexed:
            for i, n in enumerate(graph.nodes):
                if effects is None:
                    self.add(n, (i,))
                    continue
                self.node[n.name] = n
                self._index(n, (i,))  # its joins and writes are ``effects``'
                writes = effects.writes(n.name)
                if writes:
                    self.mutations.append((i,))
                    for v in writes:
                        self.sets.mark(v, (i,))  # where: for ``written_after``
            self._taken = Names(self.node)

    # --- names -----------------------------------------------------------------------------------

    @property
    def taken(self) -> Names:
        """The names taken: the input graph's, and every name drawn or reserved since."""
        if self._taken is None:
            self._taken = Names(n.name for n in self.graph.nodes)
        return self._taken

    def fresh(self, base: str) -> str:
        """A name after ``base`` (``base``, ``base_1``, ...) that no node has or had; taken."""
        return fresh_name(base, self.taken)

    def release(self, names: Iterable[str]) -> None:
        """Give ``names`` back: a later ``fresh`` may draw them again (a rolled-back edit)."""
        for name in names:
            self.taken.discard(name)
            self.made.discard(name)

    def reserve(self, names: Iterable[str]) -> None:
        """Take ``names``: no ``fresh`` draws them."""
        self.taken.update(names)

    # --- nodes -----------------------------------------------------------------------------------

    def make_carrying(
        self, op: str, target: Any = None, args: Any = (), kwargs: Any = EMPTY_DICT, *,
        meta: Mapping[str, Any] = EMPTY_META, val: Any = KEEP, stack: Any = KEEP,
        name: str | None = None, base: str | None = None,
    ) -> Node:
        """A new node, not yet placed, that carries ``meta`` whole (``carried``): the meta of
        the node it copies, moves to another graph or stands in for (a value read as state, a
        copy made where it is read, a call's result in its caller, a new input), with its
        ``val`` and its ``nn_module_stack`` set when given (``KEEP``: as ``meta`` has them).
        Named ``name`` (taken as given) or a fresh name after ``base`` (default
        ``base_name(target)``); a placeholder's ``target`` defaults to its name. Its name joins
        ``made`` and the listener hears of it, as of every node ``make`` and ``copy`` make.
        O(meta)."""
        if name is None:
            name = self.fresh(base if base is not None else _base_of(target))
        if target is None and op == PLACEHOLDER:
            target = name
        return self._heard(carried(op, name, target, args, kwargs, meta, val=val, stack=stack))

    def _heard(self, node: Node) -> Node:
        self.made.add(node.name)
        if self.listener is not None:
            self.listener.emitted(node)
        return node

    def make(
        self, op: str, target: Any, args: Any, kwargs: Any, *, val: Any = None,
        stack: Any = None, anchor_meta: Mapping[str, Any] = MappingProxyType({}),
        name: str | None = None, base: str | None = None,
    ) -> Node:
        """``make_carrying`` with the meta of a node new to the program: ``new_meta(val,
        stack, anchor_meta)``. O(1)."""
        return self.make_carrying(op, target, args, kwargs, meta=new_meta(val, stack, anchor_meta),
                                  name=name, base=base)

    def add(self, n: Node, key: tuple = (), writes: tuple[str, ...] | None = None) -> None:
        """Place node ``n`` at ``key``; ``writes``: what it writes in place (default: what
        ``ir.effects.written_args`` says of it), joined with what its result may alias
        (``is_written``). Unindexed: the node map only."""
        self.node[n.name] = n
        if not self.indexed:
            return
        self._index(n, key)
        if writes is None:
            writes = written_args(n)
        if writes:
            bisect.insort(self.mutations, key)
        self.sets.add(n, writes, key)

    def _index(self, n: Node, key: tuple) -> None:
        self.key[n.name] = key
        self.users.setdefault(n.name, {})
        for r in n.inputs():
            self.users.setdefault(r.name, {})[n.name] = None
        if n.op == CALL_FUNCTION:
            self.by_target.setdefault(id(n.target), {})[n.name] = None

    def state_read(
        self, new: NewState, kind: str, base: str, tensor: Any, *, mid: ModuleId, anchor: Node,
        root: bool, val: Any = None, persistent: bool = True,
    ) -> tuple[Node, str]:
        """The node that reads ``tensor`` as new state of ``kind`` (``st.BUFFER`` or
        ``st.CONSTANT``) held by ``new``, and the state's fqn. ``root`` (the root graph of a flat
        program): a placeholder of state ``<module>.<base>`` (fresh) of the module call
        ``anchor`` runs in, with its input spec (``NewState.root_input``), put among the root's
        inputs at ``finish``; else a ``get_attr`` of a new attribute ``base`` (fresh) of module
        ``mid``, state under each of its paths (``NewState.attribute``). The node is named fresh
        among ``taken`` with ``val`` as its meta ``val``; the listener hears of it; the driver
        places it (``add`` / ``keep``). O(1) amortized."""
        self.new = new
        meta = frozen_meta({"val": val} if val is not None else None)
        if root:
            fqn = new.root_input(kind, base, tensor, anchor, persistent)
            name = self.fresh(new.placeholder_base(kind, fqn))
            new.read_by(kind, fqn, name)
            node = carried(PLACEHOLDER, name, name, meta=meta)
            self.placeholders.append(node)
        else:
            local, fqn = new.attribute(kind, mid, base, tensor, persistent)
            node = carried(GET_ATTR, self.fresh(local), local, meta=meta)
        if self.listener is not None:  # state, not memory this run made: not in ``made``
            self.listener.emitted(node)
        return node, fqn

    def rewired(self, n: Node) -> Node:
        """Node ``n`` reading the values that replaced its arguments (``replace``,
        ``replace_uses``); ``n`` itself when none of them was replaced. Not placed. O(its
        arguments)."""
        alias = self.alias
        if not alias:
            return n
        args = map_refs_in(n.args, alias, _same)
        kwargs = map_refs_in(n.kwargs, alias, _same) if n.kwargs.items else n.kwargs
        if args is n.args and kwargs is n.kwargs:
            return n
        return n.replace(args=args, kwargs=kwargs)

    def keep(self, n: Node) -> Node:
        """Place node ``n``, ``rewired``, after the nodes placed so far (a streamed graph,
        ``indexed=False``); returns it as placed. O(its arguments)."""
        n = self.rewired(n)
        self.add(n)
        return n

    def leave_out(self, names: Collection[str]) -> None:
        """Stream the input graph: every node placed (``keep``) but those ``names`` name, which
        are left out (``drop``, in graph order). O(nodes)."""
        if self.alias or self.listener is not None:
            for n in self.graph.nodes:
                if n.name in names:
                    self.drop(n.name)
                else:
                    self.keep(n)
            return
        node = self.node
        for n in self.graph.nodes:
            if n.name not in names:
                node[n.name] = n

    def drop(self, name: str) -> None:
        """Leave the input's node ``name`` out of a streamed graph (it was not placed); the
        listener hears of it as erased. O(1)."""
        if self.listener is not None:
            self.listener.erased(name)

    def replace(self, name: str, by: Ref) -> None:
        """The input's node ``name`` replaced by value ``by``: every reader (placed later, when
        streamed) reads ``by``, the node leaves the graph (or is never placed) and ``renames``
        records it, so that ``finish`` and ``finalised`` make the signatures name ``by``.
        O(readers · their arguments)."""
        if name in self.node:
            self.replace_uses(name, by.name)
            self.erase(name)
            return
        # streamed, not placed: its readers come later and read ``by`` (``rewired``)
        self.renames[name] = by.name
        self.alias[name] = by
        if self.listener is not None:
            self.listener.replaced(name, by.name)
            self.listener.erased(name)

    def erase(self, name: str) -> Node:
        """Take node ``name`` out of the graph (its name stays taken); the listener hears of it.
        Returns the node. O(its inputs + log writing nodes)."""
        n = self.node.pop(name)
        if self.indexed:
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
        if self.listener is not None:
            self.listener.erased(name)
        return n

    def replace_uses(self, old: str, new: str, readers: Iterable[str] | None = None) -> list[str]:
        """Every reader of ``old`` (those of ``readers`` still in the graph, when given) made to
        read ``new`` instead, each at its own key; ``renames[old] = new``. Returns the readers
        rewired. O(readers · their arguments)."""
        self.renames[old] = new
        to = self.alias[old] = Ref(new)
        if self.listener is not None:
            self.listener.replaced(old, new)
        names = list(self.users.get(old, ())) if readers is None else list(readers)
        done: list[str] = []
        for u in names:
            if u not in self.node:
                continue
            n, key = self.node[u], self.key[u]
            self.erase(u)

            def swap(r: Ref) -> Ref:
                return to if r.name == old else r

            self.add(n.replace(args=map_refs(n.args, swap), kwargs=map_refs(n.kwargs, swap)),
                     key)
            done.append(u)
        return done

    def val(self, name: str) -> Any:
        """The ``val`` of node ``name`` as it is now; ``None`` when it has none or is gone."""
        n = self.node.get(name)
        return n.meta.get("val") if n is not None else None

    # --- graphs named anew: copies, renames (inline, the splits, export) ------------------------

    def take_only(self, names: Iterable[str] = ()) -> None:
        """The names taken are ``names`` only, not the input graph's (those drawn since join
        them): for a driver that places every node under a name it draws (``copy``), so that
        each keeps its own name where no node placed before took it. O(names)."""
        self._taken = Names(names)

    def copy(self, n: Node, base: str | None = None, *, name: str | None = None,
             **changes: Any) -> Node:
        """Node ``n`` (of this graph or of another: a callee's, a part's) with ``changes``
        (``args``, ``kwargs``, ``target``, ...) applied, its meta as it is, named as
        ``make_carrying`` names (``base`` defaults to its own name, which it keeps where no
        node took it); ``n`` itself when nothing changes. O(its arguments)."""
        if name is None:
            name = self.fresh(n.name if base is None else base)
        if name == n.name:
            name = n.name  # the same string: ``replace`` then shares ``n`` when nothing changes
        return self._heard(n.replace(name=name, **changes))

    def renamed(self, n: Node, name: str) -> Node:
        """The input's node ``n`` under ``name`` (drawn with ``fresh``; not placed): the nodes
        placed after it with ``keep`` read it by that name (``rewired``). O(1)."""
        if name == n.name:
            return n
        self.read_as(n.name, Ref(name))
        return n.replace(name=name)

    def read_as(self, old: str, by: Ref, *, rename: bool = False) -> None:
        """The nodes placed from now on with ``keep`` (``rewired``) read ``by`` where they read
        value ``old``, which stays where it is; unlike ``replace``, no node leaves the graph.
        ``rename=False``: a value read under another name (a state read as a stage's own
        input). ``rename=True``: ``by`` stands for ``old`` from here on (an in-place write for
        the value it wrote, for the readers after it); ``renames`` records it, so that
        ``finish`` and ``finalised`` make the signatures name ``by``, and the listener hears
        of it as replaced. O(1)."""
        self.alias[old] = by
        if rename:
            self.renames[old] = by.name
            if self.listener is not None:
                self.listener.replaced(old, by.name)

    # --- queries ---------------------------------------------------------------------------------

    def is_written(self, name: str) -> bool:
        """Whether some node writes value ``name`` in place, directly or through a value that
        may share its memory (``ir.effects``' definition: ``Effects.is_written`` for the input
        graph's nodes, ``AliasSets`` for the nodes placed since). Indexed only; conservative: a
        node erased since may still count. O(α(n))."""
        return self.sets.is_written(name)

    def written_after(self, name: str) -> bool:
        """Whether a node placed after ``name`` writes it in place, directly or through a value
        that may share its memory (``is_written``'s definition, with the writes before ``name``
        left out: memory written before a value is made is what that value reads, before and
        after any edit). Indexed only; conservative as ``is_written``. O(α(n))."""
        return self.sets.written_after(name, self.key[name])

    def mutates_between(self, lo: tuple, hi: tuple) -> bool:
        """Whether a node that writes in place lies strictly between keys ``lo`` and ``hi``."""
        at = bisect.bisect_right(self.mutations, lo)
        return at < len(self.mutations) and self.mutations[at] < hi

    def candidates(self, target: Any) -> list[Node]:
        """The call_function nodes of operator ``target``, in the order placed."""
        return [self.node[k] for k in list(self.by_target.get(id(target), ()))]

    def downstream(self, names: Iterable[str], depth: int, cap: int) -> list[str]:
        """The readers of ``names`` and their readers, ``depth`` levels deep (at most ``cap``
        of them), in the order found."""
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
                        if len(found) >= cap:
                            return found
            level = nxt
        return found

    # --- the end ---------------------------------------------------------------------------------

    def finish(self) -> tuple[Graph, dict[str, str]]:
        """The new ``Graph`` (the nodes in key order; streamed, in the order placed; the new
        root placeholders of ``state_read`` among the inputs, ``NewState.place``) and the
        renames, each followed to its last value (``a -> b -> c`` gives ``a -> c``). A streamed
        graph whose nodes are the input's gives the input graph itself. O(n log n) (streamed:
        O(n))."""
        if self.indexed:
            nodes = sorted(self.node.values(), key=lambda x: self.key[x.name])
        else:
            nodes = list(self.node.values())
            if not self.renames and same_nodes(nodes, self.graph.nodes):
                return self.graph, {}
        if self.placeholders:
            new = self.new
            nodes = new.place(nodes, new.p.signature.inputs, self.placeholders)
        return type(self.graph).of(nodes), resolved(self.renames)


    # --- nodes that stand for others (the default pipeline's drivers) ---------------------------

    def derive(
        self, anchor: Node, *, name: str | None = None, base: str | None = None,
        meta: Mapping[str, Any] | None = None, **fields: Any,
    ) -> Node:
        """A new node that stands for ``anchor`` (takes its place, or is emitted for it), not
        yet placed: ``anchor`` with ``fields`` (``op``, ``target``, ``args``, ``kwargs``)
        replaced, its meta ``anchor.meta`` with ``meta``'s entries put over it (``val``,
        ``nn_module_stack``: the anchor's own ``val`` when the driver knows it still holds, or
        the one it derived), so that every other entry (``stack_trace``, ...) is kept. Named
        ``name`` (taken as given: a name the driver frees, the anchor's or a reader's) or a
        fresh name after ``base`` (default ``base_name`` of its target); its name joins
        ``made``; the listener hears of it. O(size of ``meta``)."""
        target = fields.get("target", anchor.target)
        if name is not None:
            self.reserve((name,))
        return self.make_carrying(
            fields.get("op", anchor.op), target, fields.get("args", anchor.args),
            fields.get("kwargs", anchor.kwargs),
            meta=anchor.meta if not meta else MappingProxyType({**anchor.meta, **meta}), name=name,
            base=base,
        )

    def returning(self, result: Any) -> Graph:
        """The graph of the nodes placed (streamed, in the order placed: picked from the input
        graph, derived or made), ending in a new output node that returns ``result`` (an
        argument tree of ``Ref`` s), named ``output`` fresh among the names placed (the graph
        is a new one, a piece of the input, not the input edited). O(n)."""
        taken = Names(self.node)
        out = new_node(OUTPUT, fresh_name("output", taken), "output", (result,), EMPTY_DICT,
                       EMPTY_META)
        return type(self.graph).of([*self.node.values(), out])


def _same(r: Ref) -> Ref:
    return r


def same_nodes(a: list[Node], b: tuple[Node, ...]) -> bool:
    """Whether ``a`` holds the very nodes of ``b`` in order (nothing to rebuild). O(n)."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def resolved(renames: Mapping[str, str]) -> dict[str, str]:
    """``renames`` (old -> new) with each chain followed to its end. O(renames · chain)."""
    out = {}
    for old, new in renames.items():
        while new in renames:
            new = renames[new]
        out[old] = new
    return out


# --- finalisation --------------------------------------------------------------------------------


def renamed_outputs(sig: sg.ExportSignature, renames: Mapping[str, str]) -> sg.ExportSignature:
    """``sig`` with each output spec that names a renamed value (old -> new name) naming the
    new one; ``sig`` itself when none does. O(specs)."""
    if not renames:
        return sig
    outs = tuple(
        attrs.evolve(s, name=renames[s.name]) if s.name in renames else s for s in sig.outputs
    )
    if all(a is b for a, b in zip(outs, sig.outputs)):
        return sig
    return attrs.evolve(sig, outputs=outs)


def finalised(
    p: Program, q: Program, renames: Mapping[ModuleId, Mapping[str, str]],
    new: NewState | None = None,
) -> Program:
    """The end of a pass that edited ``p``'s graphs into ``q`` (``q is p``: none changed):
    the root's output specs (``renamed_outputs``) and the preserved call signatures
    (``renamed_calls``) name the values that replaced the ones they named (``renames``: the
    module whose graphs a driver edited -> old -> new names, as ``WorkingGraph.finish`` gives
    them), and the state the pass added (``new``) is in the program (``NewState.apply``).
    ``p`` itself when nothing changed. O(specs + signatures + paths + new state)."""
    if q is p and (new is None or not new.slots):
        return p
    changes: dict[str, Any] = {}
    root = renames.get(p.root)
    if root:
        sig = renamed_outputs(q.signature, root)
        if sig is not q.signature:
            changes["signature"] = sig
    if renames and p.call_signatures:
        if p.is_flat:
            by_path = {"": root} if root else {}
        else:
            by_path = {path: renames[mid] for path, mid in p.walk() if renames.get(mid)}
        calls = renamed_calls(q, by_path)
        if calls is not q.call_signatures:
            changes["call_signatures"] = calls
    if changes:
        q = q.replace(**changes)
    return new.apply(q) if new is not None else q


def renamed_calls(p: Program, renames: Mapping[str, Mapping[str, str]]) -> Any:
    """``p.call_signatures`` with the names each preserved call's signature gives renamed:
    ``renames`` maps the path of the module whose graphs hold the call's values (``""`` for
    all of a flat program's) to old -> new names. The same map when nothing changed."""
    calls = p.call_signatures
    if not renames:
        return calls
    flat = p.is_flat
    for call, csig in p.call_signatures.items():
        names = renames.get("" if flat else split_call_target(call)[0])
        if not names:
            continue
        renamed = csig.renamed(inputs=names, outputs=names)
        if renamed != csig:
            calls = calls.set(call, renamed)
    return calls


def protected_names(p: Program) -> dict[str, frozenset[str]]:
    """The names preserved call signatures give, by the path of the module whose graphs hold
    them (all under ``""`` for a flat program): a value they name keeps its dtype and shape.
    O(signatures)."""
    flat = p.is_flat
    out: dict[str, set[str]] = {}
    for call, csig in p.call_signatures.items():
        path = "" if flat else split_call_target(call)[0]
        out.setdefault(path, set()).update(a.name for a in csig.inputs + csig.outputs if a.name)
    return {k: frozenset(v) for k, v in out.items()}


def same_meta(a: Any, b: Any) -> bool:
    """``same_val`` and ``same_layout``: same dtype, shape, device and strides. A value that
    differs from the one it replaces in any of them has its readers' ``val`` s derived again
    (the editor's ``retyped``, ``rederive_callers``): a stride change reaches them as a shape
    change does (a ``view`` that no longer runs on the new strides is refused, naming it).
    O(size of the values)."""
    return same_val(a, b) and same_layout(a, b)


# --- dynamic sizes -------------------------------------------------------------------------------


def dynamic_sizes(p: Program) -> dict[str, str]:
    """Each symbol of ``p``'s dynamic sizes (by name: ``s0``) -> what it is, for a message:
    ``dimension 0 of input %x, 2..32`` (the first root input with a dimension of exactly that
    size, and its range from ``p.range_constraints``). O(root placeholders + constraints)."""
    ranges: dict[str, str] = {}
    for sym, vr in (getattr(p.range_constraints, "value", None) or {}).items():
        lo, hi = getattr(vr, "lower", "?"), getattr(vr, "upper", "?")
        ranges[str(sym)] = f"{lo}..{'' if str(hi) in ('oo', 'int_oo') else hi}"
    found: dict[str, str] = {}
    graph = p.root_module.graph
    for n in graph.nodes if graph is not None else ():
        if n.op != "placeholder":
            continue
        v = n.meta.get("val")
        for i, d in enumerate(getattr(v, "shape", ())):
            name = str(getattr(getattr(d, "node", None), "expr", d))
            if name in ranges and name not in found:
                found[name] = f"dimension {i} of input %{n.name}, {ranges[name]}"
    for name, r in ranges.items():
        found.setdefault(name, r)
    return found


def guard_error(p: Program, guard: RefusedGuard, where: str, instead: str, *,
                error: type[PassError] = PassError) -> PassError:
    """The ``PassError`` (of type ``error``: the editor's is ``EditRefused``) for a guard
    ``guard`` that a fake run at ``where`` (``"e.apply at node 'relu'"``) asked for on ``p``'s
    shape env (``ir.fake_run.guards_refused`` refused it): it names the dynamic sizes the guard
    reads (``dynamic_sizes``), says that the result would be right at this size only, and what
    to do ``instead``. O(``dynamic_sizes``)."""
    known = dynamic_sizes(p)
    sizes = [f"{s} ({known[s]})" if s in known else s for s in guard.symbols] or ["a size"]
    return error(
        f"{where} would fix the dynamic size {', '.join(sizes)} ({guard.text}): the "
        "result would hold at this size only, and the program keeps it dynamic; "
        f"{instead}"
    )


def size_range(p: Program, symbol: Any, shape_env: Any = None) -> tuple[int, int | None]:
    """The sizes ``symbol`` (a sympy symbol of ``p``'s dynamic sizes) may take: ``(min, max)``
    from ``p.range_constraints`` (by name), else from ``shape_env``'s ranges; ``max`` ``None``
    when unbounded. ``(0, None)`` when neither knows it. O(constraints)."""
    name = str(symbol)
    vr = next((v for k, v in (getattr(p.range_constraints, "value", None) or {}).items()
               if str(k) == name), None)
    if vr is None and shape_env is not None:
        vr = getattr(shape_env, "var_to_range", {}).get(symbol)
    if vr is None:
        return 0, None
    lo, hi = _finite(vr.lower), _finite(vr.upper)
    return (max(lo, 0) if lo is not None else 0), hi


def _finite(bound: Any) -> int | None:
    if getattr(bound, "is_finite", None) is False:  # oo, -oo, int_oo
        return None
    try:
        return int(bound)
    # oo raises AttributeError in some sympy releases, OverflowError in others; a symbol
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None


KEEP_SYMBOLIC = (
    "keep sizes symbolic: do not turn a size of e.val(x) into an int or compare it in the "
    "pass, emit the computation with e.call (read a size as a value with "
    "e.call(torch.ops.aten.sym_size.int, x, dim))"
)


# --- metadata across graphs ----------------------------------------------------------------------


def output_vals(graph: Graph, val_of: Callable[[str], Any]) -> Any:
    """The tree of ``val`` s ``graph`` returns, each read by name with ``val_of``."""
    out = graph.output_node
    return thaw(out.args[0], lambda r: val_of(r.name)) if out.args else None


def rederive_callers(
    p: Program,
    graphs: Mapping[ModuleId, tuple[Graph, ...]],
    changed: Iterable[tuple[ModuleId, int]],
    old_outputs: Mapping[tuple[ModuleId, int], Any],
    *,
    mode: Any = None,
    where: str = "the edit",
) -> dict[ModuleId, tuple[Graph, ...]]:
    """The graphs of ``p`` (``graphs`` holds the new ones of the modules an edit changed) with
    the ``val`` of every call of a graph in ``changed`` (whose returned value changed dtype or
    shape; ``old_outputs`` holds what it returned before), and of every node downstream of
    those calls, derived again; up to the root, as far as a change reaches.

    Returns the graphs it changed, by module (with those of ``graphs``).

    Raises:
        PassError: naming the node, where a change reaches an output spec of the root, a value
        a preserved call signature names, a call of a module (its graph was traced at the old
        shapes), a call whose own ``val`` was not the graph's old result (a graph shared by
        calls at other shapes), or an operator that no longer runs on the new values.

    Complexity: O(call_module nodes of the program) to find the calls, plus O(nodes of each
    graph that calls a changed one) and one fake run per node whose inputs changed.
    """
    out = dict(graphs)
    changed_set = set(changed)
    if not changed_set:
        return out
    table = p.module_table()
    protected = protected_names(p)
    outputs_named = frozenset(s.name for s in p.signature.outputs if s.name)
    for mid in reversed(dict.fromkeys(mid for _, mid in p.walk())):  # children before callers
        path = p.first_path(mid)
        mod_graphs = list(out.get(mid, table[mid].graphs))
        touched = False
        for gi, graph in enumerate(mod_graphs):
            calls = [
                n for n in graph.nodes
                if n.op == CALL_MODULE and _callee(p, mid, n.target) in changed_set
            ]
            if not calls:
                continue
            is_root = mid == p.root and gi == 0
            named = protected.get(path, frozenset()) | (outputs_named if is_root else frozenset())
            new_graph, out_changed, old_out = _rederive_graph(
                p, mid, graph, calls, out, old_outputs, named, is_root, mode, where
            )
            if new_graph is not graph:
                mod_graphs[gi] = new_graph
                touched = True
            if out_changed:
                changed_set.add((mid, gi))
                old_outputs = {**old_outputs, (mid, gi): old_out}
        if touched:
            out[mid] = tuple(mod_graphs)
    return out


def _callee(p: Program, mid: ModuleId, target: Any) -> tuple[ModuleId, int] | None:
    if type(target) is not str:
        return None
    path, variant = split_call_target(target)
    child = p.resolve(path, mid)
    return None if child is None else (child, variant)


def _rederive_graph(
    p: Program,
    mid: ModuleId,
    graph: Graph,
    calls: list[Node],
    graphs: Mapping[ModuleId, tuple[Graph, ...]],
    old_outputs: Mapping[tuple[ModuleId, int], Any],
    named: frozenset[str],
    is_root: bool,
    mode: Any,
    where: str,
) -> tuple[Graph, bool, Any]:
    table = p.module_table()
    by_name = graph.by_name()
    vals: dict[str, Any] = {}  # the new val of each retyped node
    start = {n.name for n in calls}
    nodes: list[Node] = []
    first = min(graph.nodes.index(n) for n in calls)

    def val_of(r: Ref) -> Any:
        if r.name in vals:
            return vals[r.name]
        n = by_name.get(r.name)
        return n.meta.get("val") if n is not None else None

    nodes.extend(graph.nodes[:first])
    edited = False
    for node in graph.nodes[first:]:
        if node.op == OUTPUT:
            nodes.append(node)
            break
        reads = [r.name for r in node.inputs() if r.name in vals]
        if node.name in start:
            if reads:
                refuse_call(node, reads[0], where)
            callee = _callee(p, mid, node.target)
            child, variant = callee
            cgraph = graphs.get(child, table[child].graphs)[variant]
            old = old_outputs.get(callee)
            if old is not None and not same_val(node.meta.get("val"), old):
                raise PassError(
                    f"{where} changes the dtype or shape of what module {node.target!r} returns, "
                    f"and its call {node.name!r} runs it at other shapes (a graph shared by "
                    "calls at several shapes); keep the value's dtype and shape there"
                )
            cby = cgraph.by_name()
            new = output_vals(cgraph, lambda name, cby=cby: cby[name].meta.get("val"))
        elif not reads:
            nodes.append(node)
            continue
        elif node.op == CALL_MODULE:
            refuse_call(node, reads[0], where)
        elif node.op in (CALL_FUNCTION, CALL_METHOD):
            try:
                new = fake_value(node.target, node.args, node.kwargs, val_of,
                                 method=node.op == CALL_METHOD, mode=mode)
            except FakeRunFailed as exc:
                if exc.guard is not None:
                    raise guard_error(p, exc.guard, f"{where}, at node {node.name!r},",
                                      KEEP_SYMBOLIC) from exc
                raise PassError(
                    f"{where} changes the dtype or shape of %{reads[0]}, and node {node.name!r} "
                    f"({target_name(node.target)}) no longer runs on it ({exc}); keep the "
                    "value's dtype and shape"
                ) from exc
        else:  # pragma: no cover - placeholders and get_attr read nothing
            nodes.append(node)
            continue
        old = node.meta.get("val")
        if new is None or same_meta(old, new):
            nodes.append(node)
            continue
        if node.name in named and not same_val(old, new):
            raise PassError(
                f"{where} changes node {node.name!r} from {describe(old)} to {describe(new)}, "
                "and a signature names it (an output spec or a preserved call); keep the "
                "value's dtype and shape there"
            )
        vals[node.name] = new
        edited = True
        nodes.append(node.replace(meta=MappingProxyType({**node.meta, "val": new})))
    output = graph.output_node
    changed_out = any(r.name in vals for r in output.inputs())
    old_out = None
    if changed_out:
        if is_root:  # pragma: no cover - an output spec names every root output
            raise PassError(f"{where} changes what the program returns; keep its dtype and shape")
        old_out = output_vals(graph, lambda name: by_name[name].meta.get("val"))
    return (Graph.of(nodes) if edited else graph), changed_out, old_out


def refuse_call(node: Node, read: str, where: str) -> None:
    raise PassError(
        f"{where} changes the dtype, shape or strides of %{read}, which call {node.name!r} of "
        f"module {node.target!r} reads (its graph was traced at the old shapes); keep the "
        "value's dtype, shape and strides"
    )


# --- names outside a graph: module ids, attributes -----------------------------------------------


def fresh_id(base: str, taken: Names) -> str:
    """A module id or a module's attribute name after ``base`` (``base``, ``base_1``, ...) not
    in ``taken``, which it joins: the naming policy of ``WorkingGraph.fresh``, for the names a
    pass gives next to a graph's (the module table, a module's children). Amortized O(1)."""
    return fresh_name(base, taken)


# --- torch.fx's naming policy (the names torch's passes give) ------------------------------------


class FxNames:
    """Node names as an fx ``Graph`` gives them when nodes are created one by one: a candidate
    is made an identifier; a taken one (or a Python keyword, builtin or a name fx's code needs)
    gets the next ``_<n>`` suffix counted per base name, a trailing ``_<n>`` being read as one.
    ``create`` is amortized O(1) per name."""

    _ILLEGAL = frozenset(keyword.kwlist) | frozenset(dir(builtins)) | frozenset(
        ("inf", "nan", "NoneType", "torch", "device", "fx_pytree", "pytree")
    )

    def __init__(self) -> None:
        self.used: set[str] = set()
        self.counts: dict[str, int] = {}

    def create(self, candidate: str) -> str:
        """The name fx gives a node it is asked to call ``candidate``; taken."""
        candidate = re.sub(r"[^0-9a-zA-Z_]+", "_", candidate) or "_unnamed"
        if candidate[0].isdigit():
            candidate = f"_{candidate}"
        base, number = _FX_NAME.match(candidate).group(1, 2)
        if number is None or candidate in self.used:
            count = self.counts.get(base, 0)
            if candidate in self._ILLEGAL:
                count += 1
                candidate = f"{base}_{count}"
        else:
            count = int(number)
        while candidate in self.used:
            count += 1
            candidate = f"{base}_{count}"
        self.used.add(candidate)
        self.counts[base] = count
        return candidate


_FX_NAME = re.compile(r"^([a-zA-Z_][0-9a-zA-Z_]*?)(?:_(\d+))?$")


class FxWorkingGraph(WorkingGraph):
    """A streamed ``WorkingGraph`` (``indexed=False``) whose new names are torch.fx's
    (``FxNames``), drawn from none taken: the graph a pass builds anew under the names torch
    gives it (``split_by_tags``' root and children). ``fresh`` draws from ``fx``; ``copy``,
    ``make`` and ``make_carrying`` name through it (``taken``, ``release`` and ``reserve`` are
    the base policy's, not ``fx``'s). O(1) to build."""

    __slots__ = ("fx",)

    def __init__(self, graph: Graph, *, listener: Listener | None = None) -> None:
        super().__init__(graph, listener=listener, indexed=False)
        self.fx = FxNames()

    def fresh(self, base: str) -> str:
        """The name fx gives a node asked to be called ``base`` (``FxNames.create``)."""
        return self.fx.create(base)


# --- nodes that carry a node's meta, graphs built from scratch -----------------------------------


def carried(
    op: str, name: str, target: Any, args: Any = (), kwargs: Any = EMPTY_DICT,
    meta: Mapping[str, Any] = EMPTY_META, *, val: Any = KEEP, stack: Any = KEEP,
) -> Node:
    """Node ``name`` that carries ``meta`` whole, its ``val`` and ``nn_module_stack`` set when
    given (``KEEP``: as ``meta`` has them; a value that is not known is not given): where a new
    node's meta is not ``new_meta``'s (its anchor's trace and module stack) but that of the node
    it stands for (a placeholder or ``get_attr`` that keeps a value's name in another graph, a
    copy of a node). The name is the caller's (a driver with no working graph: sinking); a
    working graph names and makes its nodes through ``WorkingGraph.make_carrying``. O(meta)."""
    if val is KEEP and stack is KEEP:
        got = meta if isinstance(meta, MappingProxyType) else MappingProxyType(dict(meta))
        return new_node(op, name, target, args, kwargs, got)
    entries = dict(meta)
    if val is not KEEP:
        entries["val"] = val
    if stack is not KEEP:
        entries["nn_module_stack"] = stack
    return new_node(op, name, target, args, kwargs, MappingProxyType(entries))


def built(nodes: Iterable[Node]) -> Graph:
    """The graph of ``nodes``, in order, that a driver building graphs from scratch made
    (outlining makes one graph per module call from the nodes of the flat graph, its new nodes
    ``make_carrying`` s; sinking rebuilds a graph with ``get_attr`` reads in
    place of placeholders): the one place such a graph is put together. O(nodes)."""
    return Graph.of(nodes)


# --- operator base names -----------------------------------------------------------------------


def _base_of(target: Any) -> str:
    """``base_name(target)``, remembered for the last 4096 hashable targets (naming an operator
    costs microseconds; the cache is bounded and changes no answer). O(1) after the first."""
    try:
        return _cached_base(target)
    except TypeError:  # an unhashable target
        return base_name(target)


@functools.lru_cache(maxsize=4096)
def _cached_base(target: Any) -> str:
    return base_name(target)


