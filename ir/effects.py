"""What a graph's nodes do besides computing their results: the one effect and alias analysis.

Every pass that must not drop, merge, move or fold a node that does something else asks here:
which nodes write which values in place, which values may share memory (alias groups), which
values are written through any alias, which inputs of a graph a call of it writes, which nodes
draw random numbers, have an effect, or are asserts. Two levels:

- **one node, without its program** (``is_pure``, ``written_args``, ``aliased_args``,
  ``same_tensor``, ``is_view`` (``shares_first``, its operator part), ``view_base``, ``binds_symbols``, ``is_assert``): what a node's
  operator says, conservative where the operator is a module call or a higher-order op (it may
  write whatever it is given);
- **one graph of a program** (``graph_effects`` -> ``Effects``): the node facts joined over the
  graph's alias groups, with each module call resolved to what its callee's graph does (that
  graph analysed first, once) and each higher-order op to what its body graphs do;
  ``AliasSets``, the union-find it runs on, grown node by node by a pass that edits the graph
  (``transforms.kernel.WorkingGraph.is_written``); ``alias_roots``, which inputs or state reads
  a value's memory may be, in one direction (stage planning's write check).

``Effects`` are computed once per ``(program, module, graph)`` and memoized per Program (an
``ir.memo.WeakMemo``: held as long as the Program lives, never part of it); ``written_state``
likewise once per Program. Answers are conservative: where purefx cannot tell whether a result
aliases an argument (a module call, a higher-order op, a Python function that is not size
arithmetic), it assumes that it does; where it cannot tell what a call writes (a module it
cannot resolve), it assumes every argument is written.

Whether an operator has a side effect is read from torch's effect registries
(``ir.ops.is_effectful``) when a graph is first analysed for a Program: register an operator's
effect before building the programs that call it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import attrs

from ir import ops, opset
from ir import signature as sg
from ir.args import Ref, collect_refs
from ir.errors import PassError
from ir.graph import Graph
from ir.memo import WeakMemo
from ir.module import ModuleId, split_call_target
from ir.node import CALL_FUNCTION, CALL_METHOD, CALL_MODULE, GET_ATTR, PLACEHOLDER, Node
from ir.program import Program, require_program

__all__ = [
    "AliasSets",
    "Effects",
    "alias_roots",
    "aliased_args",
    "binds_symbols",
    "graph_effects",
    "inert_dropout",
    "is_assert",
    "is_pure",
    "is_view",
    "same_tensor",
    "shares_first",
    "state_written",
    "view_base",
    "written_args",
    "written_state",
]

_CALLS = (CALL_FUNCTION, CALL_METHOD)


# --- one node -------------------------------------------------------------------------------------


def is_pure(node: Node) -> bool:
    """Whether ``node`` only computes its result: a ``get_attr`` read, a dropout that keeps its
    input (``inert_dropout``), or a ``call_function`` /
    ``call_method`` whose target is pure (``ops.impurity`` empty: not mutating, random,
    effectful, nor a higher-order op, and in the verified operator table without writes), or
    a call of a verified operator whose only writes are conditions the node's literal
    arguments rule out (``aten.batch_norm(..., training=False, ...)``). An ``OpOverload`` the
    verified table lacks is never pure. Placeholders, outputs and module calls are not (a module
    call may do anything: ``Effects.has_effect`` resolves its callee).

    **Laws:** a pure node dropped when unused, or computed once for two equal calls, changes
    nothing else. O(1) per node (reads torch's effect registries for an operator).
    """
    if node.op == GET_ATTR:
        return True
    if node.op not in _CALLS:
        return False
    if not ops.impurity(node.target) or inert_dropout(node):
        return True
    return _pure_call(node, ops.facts(node.target))


def _pure_call(node: Node, facts: ops.OpFacts) -> bool:
    """Whether a call whose operator is impure only for a conditional write is pure at this
    node: a verified overload that draws nothing, has no effect, and whose table writes are
    ruled out by the node's literal arguments (``aten.batch_norm`` with ``training=False``)."""
    return (
        facts.kind == ops.OVERLOAD
        and facts.verified
        and not facts.mutating
        and not facts.random
        and not ops.is_effectful(node.target)
        and not _node_writes(node, facts)
    )


def inert_dropout(node: Node) -> bool:
    """Whether ``node`` draws nothing although its operator may: a dropout that keeps its input
    (``train`` false or ``p`` 0, as ``ops.computes_nothing`` says; an eval-mode export keeps
    ``aten.dropout(x, 0.1, False)``), or an operator whose one source of randomness is a
    ``dropout_p`` argument given as 0 (``scaled_dot_product_attention(q, k, v)``: its default).
    Such a node is pure and not random, whatever its operator's tags say. Arguments that
    cannot be read (a keyword a schema-less target takes, a ``dropout_p`` computed in the graph)
    say no.

    **Laws:** ``inert_dropout(n)`` implies that running ``n`` twice gives equal results and
    consumes no random numbers. O(arguments)."""
    if node.op not in _CALLS:
        return False
    facts = ops.facts(node.target)
    if facts.identity == ops.EVAL_DROPOUT:
        args = ops.normalized_args(node.target, node.args, node.kwargs)
        if args is None:
            if node.kwargs or len(node.args) < 3:
                return False
            args = node.args
        return ops.computes_nothing(node.target, args, None, None)
    names = [p.name for p in facts.params]
    if not facts.random or facts.mutating or facts.kind != ops.OVERLOAD or "dropout_p" not in names:
        return False
    args = ops.normalized_args(node.target, node.args, node.kwargs)
    p = args[names.index("dropout_p")] if args is not None else None
    return isinstance(p, (int, float)) and not isinstance(p, bool) and p == 0


def written_args(node: Node) -> tuple[str, ...]:
    """The names of the values ``node`` may write in place, without looking at its program: for
    an operator overload, the arguments its row of the verified operator table (``ir.opset``)
    writes under the node's literal arguments (``add_``'s first, ``copy_``'s destination, an
    ``out=`` form's ``out``, ``aten.batch_norm``'s running statistics when ``training`` is not
    ``False``), every value argument of an overload the table lacks; the receiver of an
    in-place method, the first argument of ``operator.setitem`` or ``iadd``; every value
    argument of a mutating target that says nothing of which, of a higher-order op or of a
    ``call_module`` (conservatively); none for any other node.

    **Laws:** a value not in the answer is not written by ``node``; ``()`` for every pure node.
    O(arguments).
    """
    if node.op == CALL_MODULE:
        return _names(node.inputs())
    if node.op not in _CALLS:
        return ()
    facts = ops.facts(node.target)
    if facts.kind == ops.HOP:
        return _names(node.inputs())
    return _node_writes(node, facts)


def shares_first(target: Any) -> bool:
    """Whether a call of operator ``target`` may give memory of its first argument: a view
    operator (``ir.ops.is_view``), an alias-like one that may return its input itself
    (``ir.ops.is_alias_like``: ``reshape``, ``to``, ``contiguous``), or ``getitem``. The
    operator's part of ``is_view``, for callers that hold operators, not nodes (an e-graph's
    e-nodes: ``transforms.rewrite.egraph.escapes``, ``extracted.output_alias``). ``False``
    for what is not an operator. O(1) after the first call per operator."""
    if not callable(target):
        return False
    facts = ops.facts(target)
    return facts.view or facts.alias_like or facts.getitem


def is_view(node: Node) -> bool:
    """Whether ``node``'s result may share memory with its first argument: a view operator
    (schema result ``Tensor(a)``, not written: ``view``, ``slice``, ``t``), an alias-like one
    that may return its input itself (``ir.ops.is_alias_like``: ``reshape``, ``to``,
    ``contiguous``), or a ``getitem``. O(1) after the first call per operator."""
    if node.op == CALL_METHOD:
        return ops.is_alias_like(node.target)
    if node.op != CALL_FUNCTION:
        return False
    facts = ops.facts(node.target)
    return shares_first(node.target) or (
        facts.kind == ops.OVERLOAD and not facts.writes and any(i == 0 for _, i in facts.aliases))


def aliased_args(node: Node) -> tuple[str, ...]:
    """The names of the arguments whose memory ``node``'s result may share, without looking at
    its program: for a view, alias-like or ``getitem`` node its arguments (``view(x)``: ``x``);
    for an in-place or ``out=`` operator the arguments it writes (``add_(a, b)`` returns ``a``;
    ``b`` is only read), except ``set_``, which makes its first argument a view of the others;
    every argument of a module call, a higher-order op or a Python function that is not size
    arithmetic, or of an operator overload the verified table (``ir.opset``) lacks
    (conservatively); for a verified overload, the arguments its row pairs with a result
    (``aten.dropout`` may return its input, although its schema says nothing); none for one
    whose row pairs none (``clone``, ``_to_copy``) and for placeholders, ``get_attr`` and
    outputs.

    This is the step ``graph_effects`` joins alias groups by, and the one a pass asks of a node
    it made and that no ``Effects`` holds yet (the editor's write check).

    **Laws:** a result not in the answer's memory is new memory; ``()`` for every node whose
    operator's verified row says its result is fresh. O(arguments).
    """
    if node.op == CALL_MODULE:
        return _names(node.inputs())
    if node.op not in _CALLS:
        return ()
    facts = ops.facts(node.target)
    return _aliased_inputs(node, facts) if _may_alias(facts) else ()


def view_base(name: str, node_of: Callable[[str], Node | None]) -> str:
    """The value whose memory value ``name`` is through a chain of views: while the node
    ``node_of(name)`` is a view (``is_view``) of a first argument that is a value, that
    argument; ``name`` itself when it is no view (or ``node_of`` knows no such node).
    ``node_of`` reads whatever graph the caller holds (an IR graph's ``by_name().get``, a
    working graph's node map, a traced rule's table).

    **Laws:** ``view_base(view_base(v, f), f) == view_base(v, f)``; writing the answer writes
    ``name``. O(length of the chain) (a cycle, never in a verified graph, stops it).
    """
    seen: set[str] = set()
    while name not in seen:
        seen.add(name)
        node = node_of(name)
        if node is None or not is_view(node) or not node.args or type(node.args[0]) is not Ref:
            return name
        name = node.args[0].name
    return name


def same_tensor(node: Node) -> str | None:
    """The argument whose very tensor ``node``'s result is: the first argument of an operator
    that writes it in place and returns it (``ir.ops.is_inplace``: ``add_(a, b)`` is ``a``,
    ``copy_(d, s)`` is ``d``); ``None`` for every other node, views included (a view is another
    tensor over the same memory: ``view_base``), and for operators that write other arguments
    (``add.out``, train-mode batch norm).

    This is what a pass asks that makes the reads of a written value read the write's result
    instead (``transforms.inline``), or that follows a value back to the input it is.

    **Laws:** ``same_tensor(n) in aliased_args(n)`` and ``in written_args(n)`` whenever it is
    not ``None``. O(1) after the first call per operator.
    """
    if node.op not in _CALLS or not node.args or type(node.args[0]) is not Ref:
        return None
    return node.args[0].name if ops.is_inplace(node.target) else None


def alias_roots(graph: Graph, roots: Collection[str]) -> dict[str, frozenset[str]]:
    """For each value of ``graph`` whose memory may be that of one of ``roots`` (values of
    ``graph``: its inputs, the state it reads), the roots it may share memory with. A root has
    itself; a node's result has the roots of every argument it may share memory with
    (``aliased_args``: views, ``getitem``, in-place and ``out=`` results, and conservatively
    every argument of a module call, a higher-order op, a Python function that is not size
    arithmetic: a higher-order op's results reach every root of its operands). Values with no
    root are left out.

    Unlike ``Effects.group`` the answer is directed: a value reaches the roots it descends from,
    and two roots never share an answer because some third value aliases both (nor because
    they are inputs that may be one tensor: the caller decides how to treat those). A pass
    that must know which input or state a write reaches asks it of the values a writer writes
    (``Effects.writes``), as stage planning does.

    **Laws:** ``r in alias_roots(g, R)[r]`` for ``r`` in ``R``; a write of value ``v`` (through
    any chain of ``aliased_args`` steps) writes no root outside ``alias_roots(g, R).get(v,
    ())``; the answer depends on ``graph`` and ``roots`` only. Complexity: O(n) when each node
    aliases the roots of one argument (its answer is that argument's, shared), plus the sizes
    of the unions for nodes that alias several.
    """
    found: dict[str, frozenset[str]] = {r: frozenset((r,)) for r in roots}
    for n in graph.nodes:
        if n.name in found:
            continue
        reached = [found[r] for r in aliased_args(n) if r in found]
        if not reached:
            continue
        found[n.name] = reached[0] if len(reached) == 1 else frozenset().union(*reached)
    return found


def is_assert(node: Node) -> bool:
    """Whether ``node`` is a runtime check (``ir.ops.is_assert``: ``_assert_tensor_metadata``,
    ``_assert_scalar``, ``_assert_async``, ``sym_constrain_range``, ``torch._check``): it
    computes nothing, writes nothing, and raises on bad input. O(1)."""
    return node.op in _CALLS and ops.is_assert(node.target)


def binds_symbols(node: Node) -> bool:
    """Whether ``node`` defines unbacked symbols (``meta["unbacked_bindings"]``: ``item()``,
    ``nonzero``): later nodes' fake values name them, so the cleanup passes keep such a node
    as it is (never dropped, merged or folded). O(1)."""
    return bool(node.meta.get("unbacked_bindings"))


def _names(refs: Any) -> tuple[str, ...]:
    return tuple(dict.fromkeys(r.name for r in refs))


def _node_writes(node: Node, facts: ops.OpFacts) -> tuple[str, ...]:
    """The values a call node may write: for an operator overload, its verified writes
    (``OpFacts.writes``) that the node's normalized arguments do not rule out
    (``opset.positions_written``; every value argument for an overload the table lacks or
    arguments its schema does not take); for another target, what it declares
    (``_schema_written``)."""
    if facts.kind in (ops.OVERLOAD, ops.PACKET) and facts.qualname:
        if not facts.writes and not facts.mutating:
            return ()
        normal = ops.normalized_args(node.target, node.args, node.kwargs)
        if normal is None or not facts.verified:
            return _names(node.inputs())
        return _names_at(normal, {*opset.positions_written(facts.writes, normal), *facts.written})
    if not facts.mutating:
        return ()
    return _schema_written(node, facts)


def _schema_written(node: Node, facts: ops.OpFacts) -> tuple[str, ...]:
    """The values a mutating operator writes: its schema's written arguments, else all."""
    if not facts.written:
        return _names(node.inputs())
    normal = ops.normalized_args(node.target, node.args, node.kwargs) if facts.params else None
    if normal is None:
        if facts.params:
            return _names(node.inputs())  # arguments its schema does not take
        normal = node.args  # ``x.add_(y)``, ``setitem(x, i, v)``: positions without a schema
    return _names_at(normal, facts.written)


def _names_at(args: tuple, positions: Iterable[int]) -> tuple[str, ...]:
    """The values read by ``args`` at ``positions`` (those past its end skipped), once each."""
    found: list[Ref] = []
    for i in positions:
        if i < len(args):
            collect_refs(args[i], found)
    return _names(found)


# --- one graph ------------------------------------------------------------------------------------


@attrs.frozen(eq=False)
class Effects:
    """What the nodes of one graph do besides computing their results. Build it with
    ``graph_effects``; every question is O(1).

    - ``group(name)``: the value standing for ``name``'s alias group (values that may share
      memory: views, getitems, in-place results, and conservatively the results of module
      calls, higher-order ops and Python functions with their arguments; inputs that may be one
      tensor once one of them is written);
    - ``aliases(a, b)``: whether ``a`` and ``b`` may share memory;
    - ``is_written(name)``: whether some node writes ``name``, or a value of its group, in place;
    - ``writes(node)``: the values ``node`` writes in place, directly (its ``Tensor(a!)``
      arguments; what its callee writes of its arguments for a module call);
    - ``written_inputs``: positions of the graph's placeholders that are written (what a call
      of this graph writes of its arguments);
    - ``writers``: the nodes that write, in graph order;
    - ``has_effect(node)``, ``is_random(node)``, ``is_assert(node)``: whether a node does
      anything besides computing its result (an impure operator, a module call whose callee
      has such a node), draws random numbers (itself or in its callee or body), is an assert.
    """

    _group: Mapping[str, str]
    _written: frozenset[str]  #: the alias groups some node writes
    _writes: Mapping[str, tuple[str, ...]]
    written_inputs: frozenset[int]
    _effect: frozenset[str]
    _random: frozenset[str]
    _asserts: frozenset[str]

    @property
    def writers(self) -> tuple[str, ...]:
        """The nodes that write some value in place, in graph order."""
        return tuple(self._writes)

    def group(self, name: str) -> str:
        """The name standing for the alias group of value ``name`` (``name`` itself when it
        shares memory with no other value, or is not in the graph)."""
        return self._group.get(name, name)

    def aliases(self, a: str, b: str) -> bool:
        """Whether values ``a`` and ``b`` may share memory (``True`` when ``a == b``)."""
        return a == b or self.group(a) == self.group(b)

    def is_written(self, name: str) -> bool:
        """Whether value ``name``, or any value that may share its memory, is written in place
        by some node of the graph."""
        return self._group.get(name, name) in self._written

    def writes(self, node: str) -> tuple[str, ...]:
        """The values node ``node`` writes in place (``()`` for a node that writes nothing)."""
        return self._writes.get(node, ())

    def has_effect(self, node: str) -> bool:
        """Whether node ``node`` does anything besides computing its result."""
        return node in self._effect

    def is_random(self, node: str) -> bool:
        """Whether node ``node`` draws random numbers (or calls a graph that does)."""
        return node in self._random

    def is_assert(self, node: str) -> bool:
        """Whether node ``node`` is a runtime check (``is_assert``)."""
        return node in self._asserts


class AliasSets:
    """Alias groups grown one node at a time, and which of them are written: the union-find
    behind ``graph_effects``, and what a pass that adds nodes to an analysed graph keeps
    (``transforms.kernel.WorkingGraph``), so that both answer "is this value written?" by one
    definition.

    ``over``: the ``Effects`` of the graph the nodes are added to (its groups and written groups
    are the start; nothing of it is copied), or ``None`` to start from single values.

    - ``add(node, writes)``: ``node``'s result joins the group of each argument it may share
      memory with (``aliased_args``), and the values it writes in place (``writes``; default
      ``written_args(node)``) are marked written, with every value of their groups;
    - ``join(a, b)``: one group for ``a`` and ``b`` (a written group stays written);
    - ``mark(name, at)``: ``name``'s group is written (``at``: where the write is, any
      ordered key such as a working graph's sort key);
    - ``group(name)``: the value standing for ``name``'s group;
    - ``is_written(name)``: whether some value of ``name``'s group is written;
    - ``written_after(name, at)``: whether some value of ``name``'s group is written by a
      write marked at a key greater than ``at`` (a write before a value is made cannot change
      what it reads later: the memory is written before the value exists).

    A group only grows: a node taken out later leaves its joins and writes in place
    (conservative: an answer may say written where nothing writes any more). Inputs that may be
    one tensor are joined as ``over`` joined them; a write added later to an input that no node
    of ``over``'s graph wrote joins no other input (callers that add writes to inputs refuse
    them first: ``transforms.edit``'s write check).

    **Laws:** after ``add`` of every node of a graph in order (``over=None``, each node's
    ``graph_effects`` writes), ``is_written`` agrees with that graph's
    ``Effects.is_written`` on every value not joined through an input class; ``is_written(v)``
    once true stays true. Complexity: O(α(n)) amortized per operation, O(arguments) per
    ``add``.
    """

    __slots__ = ("_last", "_over", "_written", "parent")

    def __init__(self, over: Effects | None = None) -> None:
        self._over = over
        self.parent: dict[str, str] = {}
        self._written: set[str] = set()
        self._last: dict[str, Any] = {}  # group -> the greatest key a write was marked at

    def group(self, name: str) -> str:
        """The value standing for ``name``'s alias group."""
        parent, over = self.parent, self._over
        root = name
        while True:
            up = parent.get(root)
            if up is None:
                up = over.group(root) if over is not None else root
            if up == root:
                break
            root = up
        while name != root:  # path compression
            up = parent.get(name)
            if up is None:
                up = over.group(name) if over is not None else name
            parent[name], name = root, up
        return root

    def join(self, a: str, b: str) -> None:
        """Put ``a`` and ``b`` in one group; it is written when either was."""
        ra, rb = self.group(a), self.group(b)
        if ra == rb:
            return
        self.parent[rb] = ra
        if self._is_marked(rb):
            self._written.add(ra)
        last = self._last.pop(rb, None)
        if last is not None and (ra not in self._last or self._last[ra] < last):
            self._last[ra] = last

    def mark(self, name: str, at: Any = None) -> None:
        """``name``'s group is written in place (at key ``at``, when given)."""
        root = self.group(name)
        self._written.add(root)
        if at is not None and (root not in self._last or self._last[root] < at):
            self._last[root] = at

    def add(self, node: Node, writes: tuple[str, ...] | None = None, at: Any = None) -> None:
        """Join ``node``'s result with what it may alias (``aliased_args``) and mark what it
        writes (``writes``, default ``written_args(node)``) at ``at``."""
        for r in aliased_args(node):
            self.join(node.name, r)
        for v in written_args(node) if writes is None else writes:
            self.mark(v, at)

    def written_after(self, name: str, at: Any) -> bool:
        """Whether a write marked at a key greater than ``at`` writes ``name`` or a value of
        its group (writes marked without a key are not counted)."""
        last = self._last.get(self.group(name))
        return last is not None and last > at

    def is_written(self, name: str) -> bool:
        """Whether ``name``, or a value of its group, is written in place."""
        return self._is_marked(self.group(name))

    def _is_marked(self, root: str) -> bool:
        over = self._over
        return root in self._written or (over is not None and root in over._written)


def graph_effects(p: Program, mid: ModuleId, graph: Graph) -> Effects:
    """The ``Effects`` of ``graph``, a graph of module ``mid`` of ``p``.

    A node writes what ``written_args`` says, except that a ``call_module`` writes the
    arguments whose placeholders its callee's graph writes (an unresolvable callee: all of
    them), and a higher-order op writes its value arguments only when it is a mutating one
    (``triton_kernel_wrapper_mutation``) or one of its body graphs (the modules its
    ``get_attr`` arguments name) writes one of its inputs. A result may alias its arguments
    when its operator is a view, alias-like, a ``getitem``, in place or mutating, or is not an
    operator with a schema (module calls, higher-order ops, Python functions that are not size
    arithmetic). Inputs that may be one tensor count as one alias group once one of them is
    written: the placeholders of a graph other than the root's (a caller may pass one tensor
    twice), the user inputs of the root, and root state inputs that name one tensor (tied
    state).

    A node has an effect when its operator is impure (``is_pure``) or it is a module call whose
    callee graph holds a node with an effect (an unresolvable or leaf module: it has one).
    A node is random when its operator is (``ir.ops.is_random``), or its callee or body graph
    holds a random node.

    Memoized per Program, by module and graph identity: a second call for the same graph of the
    same Program returns the same object.

    **Laws:** a value no node writes, directly or through an alias, is not written; the answer
    depends only on ``p``, ``mid`` and ``graph``; the written set holds every tensor that
    running the graph writes (conservative: maybe more). Complexity: O(n α(n)) in the graph's
    nodes, plus each callee or body graph once per Program.
    """
    return _analyse(p, mid, graph, _TABLES(p), ())


_TABLES: WeakMemo[Program, dict] = WeakMemo(lambda p: {})


def _analyse(p: Program, mid: ModuleId, graph: Graph, table: dict, visiting: tuple) -> Effects:
    key = (mid, id(graph))
    hit = table.get(key)
    if hit is not None and hit[0] is graph:
        return hit[1]
    found = _Analysis(p, mid, graph, table, (*visiting, key)).run()
    return table.setdefault(key, (graph, found))[1]


class _Analysis:
    """The work of one ``graph_effects`` call (local to it)."""

    def __init__(self, p: Program, mid: ModuleId, graph: Graph, table: dict,
                 visiting: tuple) -> None:
        self.p, self.mid, self.graph, self.table, self.visiting = p, mid, graph, table, visiting
        self.sets = AliasSets()
        self.find, self.union = self.sets.group, self.sets.join
        self.impure: dict[int, tuple[Any, bool]] = {}  # id(target) -> (target, impure)

    def run(self) -> Effects:
        direct: dict[str, tuple[str, ...]] = {}  # node -> the values it writes
        effect: list[str] = []
        random: list[str] = []
        asserts: list[str] = []
        getattrs = {n.name: n for n in self.graph.nodes if n.op == GET_ATTR}
        for n in self.graph.nodes:
            self.sets.parent.setdefault(n.name, n.name)
            if n.op in _CALLS:
                facts = ops.facts(n.target)
                for r in aliased_args(n):
                    self.union(n.name, r)
                if facts.kind == ops.HOP:
                    bodies = self.bodies(n, getattrs)
                    writes = facts.mutating or any(b is None or b.written_inputs for b in bodies)
                    if writes:
                        direct[n.name] = tuple(
                            r for r in _names(n.inputs()) if r not in getattrs or
                            not self.is_module(getattrs[r])
                        )
                    if facts.random or any(b is None or b._random for b in bodies):
                        random.append(n.name)
                else:
                    writes = _node_writes(n, facts)
                    if writes:
                        direct[n.name] = writes
                    if facts.random and not inert_dropout(n):
                        random.append(n.name)
                    if facts.assertion:
                        asserts.append(n.name)
                if self.is_impure(n.target) and not is_pure(n):
                    effect.append(n.name)
            elif n.op == CALL_MODULE:
                for r in n.inputs():
                    self.union(n.name, r.name)
                callee = self.callee(n)
                if callee is None:
                    direct[n.name] = _names(n.inputs())
                    effect.append(n.name)
                    random.append(n.name)
                    continue
                direct[n.name] = _names(
                    a for i, a in enumerate(n.args) if i in callee.written_inputs and type(a) is Ref
                )
                if callee._effect:
                    effect.append(n.name)
                if callee._random:
                    random.append(n.name)
        direct = {k: v for k, v in direct.items() if v}
        written = {self.find(v) for vs in direct.values() for v in vs}
        for together in _input_classes(self.p, self.mid, self.graph):
            if any(self.find(name) in written for name in together):
                for name in together[1:]:
                    self.union(together[0], name)
        group = {name: self.find(name) for name in self.sets.parent}
        written_groups = frozenset(group.get(v, v) for vs in direct.values() for v in vs)
        inputs = frozenset(
            i for i, ph in enumerate(self.graph.placeholders) if group[ph.name] in written_groups
        )
        return Effects(
            group, written_groups, direct, inputs, frozenset(effect), frozenset(random),
            frozenset(asserts),
        )

    def is_impure(self, target: Any) -> bool:
        found = self.impure.get(id(target))
        if found is None or found[0] is not target:
            found = self.impure[id(target)] = (target, bool(ops.impurity(target)))
        return found[1]

    def resolved(self, child: ModuleId | None, variant: int) -> Effects | None:
        """The effects of graph ``variant`` of module ``child``; ``None`` when there is none,
        or when it is being analysed (a cycle, never in a verified program)."""
        if child is None:
            return None
        graphs = self.p.module_table()[child].graphs
        if variant >= len(graphs):
            return None
        if (child, id(graphs[variant])) in self.visiting:
            return None
        return _analyse(self.p, child, graphs[variant], self.table, self.visiting)

    def callee(self, node: Node) -> Effects | None:
        if type(node.target) is not str:
            return None
        path, variant = split_call_target(node.target)
        return self.resolved(self.p.resolve(path, self.mid), variant)

    def is_module(self, node: Node) -> bool:
        return type(node.target) is str and self.p.resolve(node.target, self.mid) is not None

    def bodies(self, node: Node, getattrs: Mapping[str, Node]) -> list[Effects | None]:
        """The effects of every graph of the modules a higher-order op's ``get_attr``
        arguments name (``None`` for one that cannot be analysed)."""
        out: list[Effects | None] = []
        for r in _names(node.inputs()):
            read = getattrs.get(r)
            if read is None or type(read.target) is not str:
                continue
            child = self.p.resolve(read.target, self.mid)
            if child is None:
                continue  # a tensor, not a body
            graphs = self.p.module_table()[child].graphs
            out.extend(self.resolved(child, i) for i in range(len(graphs)))
        return out


def _aliased_inputs(node: Node, facts: ops.OpFacts) -> tuple[str, ...]:
    """The arguments the result of ``node`` (whose operator may alias, ``_may_alias``) may
    share memory with: for a verified operator overload, those its row pairs with a result
    (``add_(a, b)`` returns ``a``; ``b`` is only read); else every argument."""
    if facts.kind == ops.OVERLOAD and facts.verified:
        normal = ops.normalized_args(node.target, node.args, node.kwargs)
        if normal is not None:
            return _names_at(normal, sorted({i for _, i in facts.aliases}))
    return _names(node.inputs())


def _may_alias(facts: ops.OpFacts) -> bool:
    """Whether the result may share memory with an argument (conservative)."""
    if facts.view or facts.getitem or facts.inplace or facts.mutating:
        return True
    if facts.kind == ops.OVERLOAD:
        return bool(facts.aliases)  # the verified table's (every argument for an unknown one)
    if facts.alias_like:
        return True  # a packet or method that may return its input (``to``, ``reshape``)
    if facts.kind == ops.PACKET:
        return False  # the default overload's schema: a functional, non-view operator
    return not facts.size_arithmetic  # a higher-order op, a method, a Python function


def _input_classes(p: Program, mid: ModuleId, graph: Graph) -> list[list[str]]:
    """The placeholders of ``graph`` that may be one tensor at run time, in classes."""
    names = [ph.name for ph in graph.placeholders]
    if mid != p.root or graph is not p.root_module.graph:
        return [names] if len(names) > 1 else []
    state = p.state_table()
    targets = {s.name: s.target for s in p.signature.inputs}
    classes: dict[Any, list[str]] = {}
    for name in names:
        target = targets.get(name)
        slot = state.get(target) if target is not None else None
        key = ("state", slot.tensor) if slot is not None else ("input",)
        classes.setdefault(key, []).append(name)
    return [c for c in classes.values() if len(c) > 1]


# --- state ----------------------------------------------------------------------------------------


def written_state(p: Program) -> frozenset[str]:
    """The tensor keys (``Slot.tensor``) of the state ``p`` may write: the target of a mutation
    output spec, or state that a graph writes in place, directly or through an alias
    (``graph_effects``): the fqn a root placeholder's spec names, or a ``get_attr``'s under each
    path of its module. Memoized per Program.

    **Laws:** state whose tensor is not in the answer is read, never written, by every call of
    ``p``. Complexity: O(n α(n)) over the distinct graphs, plus O(state), once per Program.
    """
    return _WRITTEN_STATE(p)


def _written_state(p: Program) -> frozenset[str]:
    state = p.state_table()
    fqns: list[str] = [s.target for s in p.signature.outputs if s.kind in sg.MUTATION_KINDS]
    specs = {s.name: s.target for s in p.signature.inputs}
    for mid, mod in p.module_table().items():
        for graph in mod.graphs:
            effects = graph_effects(p, mid, graph)
            if not effects.writers:
                continue
            for n in graph.nodes:
                if not effects.is_written(n.name):
                    continue
                if n.op == PLACEHOLDER and mid == p.root and n.name in specs:
                    fqns.append(specs[n.name])
                elif n.op == GET_ATTR:
                    fqns.extend(p.attr_fqn(mid, path, n.target) for path in p.module_paths(mid))
    return frozenset(state[f].tensor for f in fqns if f in state)


_WRITTEN_STATE: WeakMemo[Program, frozenset[str]] = WeakMemo(_written_state)


def state_written(p: Program, fqn: str) -> bool:
    """Whether a call of ``p`` may write the state at ``fqn`` (a parameter, buffer or
    constant): a mutation output updates it, or a node writes it in place, directly, through a
    view or alias, or through a module call whose callee writes it. State tied to ``fqn`` (one
    tensor under two names) counts: writing one writes the other.

    This is how a pass asks whether state may change between calls (before folding it,
    caching a value computed from it, or dropping a multiplication by it).

    Raises:
        NotAProgramError: ``p`` is not a Program.
        PassError: ``fqn`` names no state of ``p`` (the message lists a few that exist).

    **Laws:** ``False`` only when every call of ``p`` leaves the state's tensor as it was;
    conservative (``True`` where unsure). Complexity: O(n) once per Program, then O(1).
    """
    require_program(p, "state_written")
    slot = p.state_table().get(fqn)
    if slot is None:
        known = sorted(p.state_table())
        shown = ", ".join(repr(k) for k in known[:5]) + (", ..." if len(known) > 5 else "")
        raise PassError(
            f"state_written: {fqn!r} is no state of the program; its state is "
            f"{shown or 'empty'}: pass one of those fqns"
        )
    return slot.tensor in written_state(p)
