"""``rewrite_nodes``: a pass written as a function over nodes, with an edit context.

A user's pass that is not a pattern (quantize the large linears, observe every activation) is a
``visit(node, e)`` function: it looks at one node, emits new operations through ``e`` and returns
``None`` (keep the node) or the value that replaces the node's result::

    def relu_to_gelu(node, e):
        if node.target is torch.ops.aten.relu.default:
            return e.call(torch.ops.aten.gelu.default, *e.args)

    q = rewrite_nodes(p, relu_to_gelu)

``rewrite_nodes`` does the bookkeeping: fresh names, module stacks and fake ``val``s of new
nodes, rewiring every use (later nodes, outputs, output specs, preserved call signatures),
dropping what is left unused and pure, and new state (buffers, constants) at either level, flat
(``import_ep``) or outlined (``transform``), with the signature edits each level needs.

A node that writes in place (``add_``, ``copy_``, a train-mode ``aten.batch_norm``'s running
statistics: ``ir.effects.written_args``) is replaced or dropped by what the visit re-does of
its writes, matched by the tensor written (a state fqn, a graph input, else the value), never by
name: every write re-done (``e.write_buffer`` of the buffer, or an emitted in-place write of the
same tensor before the node), the node goes; some, a ``PassError`` naming the writes left; none,
the node stays where it was for its writes, and only its result's readers read the replacement.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch

from ir import ops
from ir import signature as sg
from ir import state as st
from ir.args import EMPTY_DICT, Ref, freeze, iter_refs, map_refs, map_refs_in
from ir.effects import (
    aliased_args,
    graph_effects,
    inert_dropout,
    is_pure,
    same_tensor,
    written_args,
)
from ir.errors import EditRefused, PassError, PurefxError
from ir.fake_memo import FakeMemo
from ir.fake_run import guards_refused, refused_guard
from ir.gcpause import gc_paused
from ir.graph import Graph
from ir.module import ModuleId
from ir.names import target_name
from ir.node import (
    CALL_FUNCTION,
    CALL_METHOD,
    CALL_MODULE,
    GET_ATTR,
    OUTPUT,
    PLACEHOLDER,
    Node,
)
from ir.program import Program, require_program
from transforms import kernel as kn
from transforms.machinery import trace as tr
from transforms.machinery.each_graph import walked_graphs
from transforms.new_state import NewState

__all__ = ["Edit", "rewrite_nodes"]

Visit = Callable[[Node, "Edit"], "Ref | None"]

_COPY = torch.ops.aten.copy_.default
_BEFORE_USER_OUTPUTS = (*sg.MUTATION_KINDS, sg.OUTPUT_TOKEN)
_NO_MODE = object()
_META = kn.META  # the program's vals are meta tensors: run new nodes on them as they are


@gc_paused
def rewrite_nodes(p: Program, visit: Visit) -> Program:
    """Call ``visit(node, e)`` on every node of every graph of ``p`` and apply its edits.

    Parameters:
        p: a Program, flat (``import_ep``) or outlined (``transform``).
        visit: ``(node, e) -> Ref | None``, called once for each node but the output of each
            graph, in graph order; graphs in module-walk order, each module's graphs once (a
            graph shared by several calls is visited once). ``node`` is the node as it is in
            ``p`` (its arguments as they were); ``e`` (an ``Edit``) has its arguments as they
            are now (``e.args``), emits new nodes (``e.call``, ``e.apply``), adds state
            (``e.constant``, ``e.add_buffer``, ``e.write_buffer``) and tells values and the
            state they read (``e.val``, ``e.state``). ``visit`` returns ``None`` to keep the
            node, or a ``Ref`` (from ``e``, or one of the node's inputs) whose value replaces
            the node's result: every later use reads it instead, outputs, output specs and
            preserved call signatures included; when the replacement has another dtype,
            shape or strides, the ``val`` of each later node it reaches is propagated again, across
            graphs: a module graph that then returns another dtype or shape has each of its
            calls, and what follows them, derived again (``transforms.kernel``); a node that
            no longer runs is a ``PassError`` naming it. Nodes emitted while visiting a node go before
            it, except those that read the node's own result (``node.ref``), directly or
            through another such node: they go right after it and keep reading the node
            itself, so ``return e.call(f, node.ref)`` puts ``f`` on every use of the node.
            Assigning ``e.args`` / ``e.kwargs`` changes the visited node's arguments in place
            (same name, ``val`` propagated again); ``e.drop()`` drops it if nothing reads it
            and no signature names it. A node that writes in place, replaced or dropped: see
            "A node that writes" below.

    Returns:
        ``p`` itself (``is p``) when ``visit`` changed nothing; else a new Program. Replaced
        nodes and nodes the edit left unused are dropped when they are pure (``ir.ops``
        impurity facts; placeholders, calls of modules and writes are kept) or when they write
        and the visit re-did every write (below), and new constants
        nothing reads with their state; nodes that were unused before (read by nothing, or
        only by what the visit emitted) are left as they are unless ``visit`` calls
        ``e.drop()`` on them; values a signature still names (a root output spec, an argument
        or result of a preserved call) are left as they are even then, as
        ``eliminate_dead_code`` leaves them: the signature would name a value the program no
        longer has, and a pass dropping what nothing reads would not be idempotent (what the
        named value read, named too, would go in a second run); a metadata assert
        (``_assert_tensor_metadata``) the visit emitted goes with the value it checks, so a
        visit whose emitted values all go unused gives ``p`` itself. New state: buffers and constants at
        ``<module path>.<name>``, with the slot, tensor, ``state_order`` entry and, on a flat
        program, the placeholder and ``InputSpec`` (buffers after the parameters and buffers,
        constants after all state, before the user inputs); a buffer write on a flat program
        is a ``buffer_mutation`` output placed before the user outputs (an in-place
        ``aten.copy_`` on an outlined one, or where the graph already writes that buffer in
        place). Later reads of a written buffer see the value written, at both levels.

    Raises:
        PassError: naming the node, when ``visit`` returns something other than ``None`` or a
        ``Ref``; when a new node or the replacement reads a value defined later (a cycle) or
        not at all; when a change of dtype or shape reaches a value that a signature names (a
        root output, a name of a preserved call) or an argument of a module call; when
        ``write_buffer`` writes anything but a buffer (a user input, a parameter, a computed
        value), or a value of another dtype or shape; when an emitted node writes in place
        (``sigmoid_``, ``copy_``, ``out=``) anything but a value the visit emitted (a user
        input, a value the program computes, state) or, before the node, a tensor the visited
        node writes and that node goes; when a new node cannot run on the fake values of its
        arguments; for a node that writes, replaced or dropped: when the visit re-did some of
        its writes only (naming the node and each write left, by buffer fqn or input name),
        all of them while something still reads the node at the end, or all of them of a node
        that does more than write (random, an effect, a module call, an unknown operator).
        Each of these is an ``EditRefused`` (``ir.errors``, a ``PassError``): the edit asked
        for is wrong, a bug of the pass, which ``lowering.pass_laws.check_laws`` reports
        (law ``"edit_refused"``) even where ``allowed_errors`` admit ``PassError``. A
        ``PassError`` the visit raises itself passes through as it is (a program the pass
        declines), and so does one that is not the edit's fault (an operator without a kernel
        for the program's vals).

    **A node that writes.** What a node writes is ``ir.effects.written_args`` of it (the
    operator table's row under its literal arguments), each value followed through its aliases
    (``ir.effects.aliased_args``: views, in-place results) to the tensor it is: a buffer or
    parameter (by fqn), an input of the graph, else the value. While visiting it, the visit
    re-does the write of a tensor by ``e.write_buffer`` of that buffer, or by an emitted
    operator that writes that tensor in place before the node. When the visit replaces the
    node or calls ``e.drop()``: every write re-done, the node goes (with ``e.drop()``, when
    nothing reads it at the end) and the re-done writes stand for its own; some re-done, a
    ``PassError``; none re-done, the node stays where it was for its writes (its result's
    readers read the replacement; ``e.drop()`` keeps it), so that no write is lost or done
    twice. A visit that keeps the node (returns ``None``) and writes one of its buffers adds a
    write before it.

    **Laws:**

    - identity: ``rewrite_nodes(p, lambda n, e: None) is p``; a visit that changes nothing
      gives ``p`` itself;
    - purity: ``p``, its nodes and tensors are never written (``tensor._version`` unchanged);
    - semantics: with a visit that replaces each value by an equal one, ``lower`` of the result
      computes what ``lower(p)`` computes;
    - ``verify`` holds of the result whenever it holds of ``p``.

    Complexity: O(n + s) in the nodes of the distinct graphs and the signatures' entries (one
    pass over each graph, one freeze at the end), plus the cost of ``visit`` and of what it emits (fake propagation per new node, one
    ``torch.export`` per distinct ``e.apply`` function and argument shapes).
    """
    require_program(p, "rewrite_nodes")
    return _Editor(p, visit).run()


class Edit:
    """The edit context ``rewrite_nodes`` hands to ``visit`` with each node.

    One object serves the whole call (its fields follow the node being visited); keep no
    reference to it past ``visit``. ``args`` / ``kwargs`` are the node's arguments with earlier
    replacements applied; ``node`` is the node being visited; ``graph`` the graph it is in, as
    it is in the input (names are per graph: key what you remember across nodes by it);
    ``module_id`` the module that graph belongs to.
    """

    __slots__ = ("_ed", "_kwargs", "args", "graph", "node")

    def __init__(self, editor: _Editor) -> None:
        self._ed = editor
        self.node: Node | None = None
        self.graph: Graph | None = None
        self.args: tuple = ()
        self._kwargs: Any = EMPTY_DICT

    @property
    def module_id(self) -> ModuleId:
        """The ``ModuleId`` of the module whose graph is visited (``e.graph``'s): what
        ``ir.effects.graph_effects(p, e.module_id, e.graph)`` takes to say what that graph
        writes and what may alias what. O(1)."""
        return self._ed.mid

    @property
    def kwargs(self) -> dict[str, Any]:
        """The node's keyword arguments, rewired, as a new dict (``**e.kwargs`` passes them on).
        Assign ``e.kwargs`` (or ``e.args``) to change the visited node's arguments: it keeps
        its name and place, and its ``val`` is propagated again."""
        return dict(self._kwargs.items)

    @kwargs.setter
    def kwargs(self, value: Mapping[str, Any]) -> None:
        self._kwargs = freeze(dict(value), _as_is)

    def drop(self) -> None:
        """Drop the visited node if, at the end, nothing reads it (a node nobody read before
        the pass: ``not e.graph.users()[node.name]``) and it is pure, or if it writes state or
        values in place and this visit re-does every one of those writes (``write_buffer``, an
        emitted in-place operator on the same tensor); else keep it. A value a signature names
        (a root output spec, a preserved call's argument or result) is kept too, as
        ``eliminate_dead_code`` keeps it. A visit that re-does some of its writes only, or all
        of them while the node is still read or named at the end, is a ``PassError`` (see
        ``rewrite_nodes``: "A node that writes"). What it alone read is dropped too, on the
        same terms. O(1)."""
        self._ed.drop_here()

    def call(self, target: Any, *args: Any, **kwargs: Any) -> Ref:
        """Emit ``target(*args, **kwargs)`` (an ``aten`` operator, usually) and return its value.

        The new node is named after the operator (a fresh name), runs in the visited node's
        module (its ``nn_module_stack`` and ``stack_trace``), and its ``val`` is computed by
        fake propagation from its arguments' ``val``. It goes before the visited node, or right
        after it when it reads the node's result. An operator that writes an argument in
        place (``sigmoid_``, ``copy_``, ``out=``) may write only a value the visit emitted;
        anything else is a ``PassError`` (use the functional operator, or ``write_buffer``).
        O(1) plus one fake run."""
        return self._ed.emit(CALL_FUNCTION, target, args, kwargs)

    def apply(self, fn: Callable, *args: Any) -> Ref | tuple:
        """Trace ``fn(*args)`` (a PyTorch function of tensors and Python scalars) at the
        program's level, at the shapes and dtypes of the arguments' ``val``, and emit its
        nodes; return its result (a ``Ref``, or a tuple of them for several results).

        Tensor arguments are ``Ref`` s; scalars are traced as literals. A dynamic size of an
        argument (a symbol of the program, ``s0``) is traced as a dynamic dimension with the
        program's range for it (``torch.export.Dim``; one ``Dim`` per symbol, so arguments of
        one size stay of one size), so the emitted nodes hold at every size the program does.
        ``fn`` that fixes such a size (``int(x.shape[0])``, ``x.view(5, 4)``, a branch on a
        size) is a ``PassError`` naming the node and the dimension: keep ``fn``'s sizes
        symbolic (``x.shape[0]`` as it is, ``-1``), or emit with ``e.call``. One
        ``torch.export`` per function and argument shapes (remembered for the rest of the
        call)."""
        return self._ed.apply(fn, args)

    def val(self, x: Any) -> Any:
        """The fake tensor (``meta["val"]``) of ``Ref`` ``x``, or ``x`` itself for a literal;
        ``None`` for a node without one.

        Its sizes are the program's: a dynamic one is a ``torch.SymInt`` of the program's shape
        env. Read it symbolically (pass it on, compare ``.node.expr``); ``int(size)``, ``if
        size > 8`` and the like ask the env for a guard, which would fix the size for the input
        program too: ``rewrite_nodes`` refuses it with a ``PassError`` naming the node and the
        dimension (a size the program's ranges fix to one value is no guard and passes)."""
        return self._ed.val(x)

    def is_input(self, x: Any) -> bool:
        """Whether ``Ref`` ``x`` is an input of the graph being edited (a placeholder: a user
        input, state of a flat program, an argument of an outlined module's graph). A pass that
        would return such a value where a fresh one was returned makes the result an alias of
        what the caller passed (the semantics law refuses it): this is how it asks first."""
        return self._ed.is_input(x)

    def constant(self, tensor: torch.Tensor) -> Ref:
        """A new lifted constant holding ``tensor`` (held as it is, never written), owned by
        the visited node's module: a ``constant_tensor`` input of a flat program, a
        ``get_attr`` of an outlined one. Not in ``state_dict``."""
        return self._ed.new_state(st.CONSTANT, "_constant", tensor, True)

    def state(self, x: Any) -> tuple[str, Any] | None:
        """``(fqn, tensor)`` of the state that value ``x`` reads (a state placeholder of a flat
        program, a ``get_attr`` of an outlined one, or state this call added), else ``None``."""
        return self._ed.state(x)

    def add_buffer(self, name: str, tensor: torch.Tensor, persistent: bool = True) -> Ref:
        """A new buffer holding ``tensor``, owned by the visited node's module, at
        ``<module path>.<name>`` (``name_1``, ... when taken); return the value reading it.
        Flat: a ``buffer`` placeholder and ``InputSpec`` after the existing parameters and
        buffers; outlined: a ``get_attr``. Either way a state slot, its tensor, and its fqn
        in ``state_order`` after the parameters and buffers (``NewState``)."""
        if not isinstance(name, str) or not name.isidentifier():
            raise EditRefused(
                f"add_buffer at node {self._ed.here()!r}: name must be a Python identifier, "
                f"got {name!r}"
            )
        return self._ed.new_state(st.BUFFER, name, tensor, persistent)

    def write_buffer(self, buffer: Ref, value: Ref) -> None:
        """Write ``value`` into ``buffer`` (a value ``e.state`` says reads a buffer, or the
        result of an in-place write of one, the same tensor: ``add_(b_count, 1)``). Later
        reads of the buffer in this graph see ``value``. Flat: a ``buffer_mutation`` output and
        ``OutputSpec``, placed before the user outputs; outlined, or where the graph already
        writes the buffer in place (the visited node may): an in-place ``aten.copy_`` node.
        A write of a buffer the visited node writes re-does that node's write: replaced or
        dropped, the node goes once every one of its writes is re-done (``rewrite_nodes``)."""
        self._ed.write_buffer(buffer, value)


class _Editor:
    """The builder of one ``rewrite_nodes`` call: per graph a node list, an alias map and a
    name set; for the program the new state, tensors, specs and mutation outputs."""

    def __init__(self, p: Program, visit: Visit) -> None:
        self.p = p
        self.visit = visit
        self.e = Edit(self)
        self.changed = False
        self.flat = p.is_flat
        self.new = NewState(p)  # the state this call adds
        self._call_names: dict[str, set[str]] | None = None
        self.mutations: dict[str, Ref] = {}  # buffer fqn -> the value written (flat)
        self.traced: dict[Any, tr.Traced] = {}
        self._level: str | None = None
        self._mode: Any = _NO_MODE
        self.fakes = FakeMemo()  # the emitted nodes' fake runs, one per operator and metadata
        self.root_aliases: dict[str, Ref] = {}
        self.live_constants: set[str] = set()  # new constants some node still reads
        self.constants: set[str] = set()  # every new constant
        self.call_aliases: dict[str, dict[str, Ref]] = {}  # module path -> its graphs' aliases
        self.current: Node | None = None  # the visited node, its val propagated again
        self.retyped: set[str] = set()
        self.holder_of: dict[str, str] = {}  # written buffer fqn -> its placeholder (flat)
        self.buffer_values: dict[str, str] = {}  # value written into a buffer -> its fqn (flat)
        self.old_outputs: dict[tuple[ModuleId, int], Any] = {}  # retyped graph -> old result
        self.visit_error: PurefxError | None = None  # the error a visit raised, if any

    # --- the walk -----------------------------------------------------------------------------

    def run(self) -> Program:
        # every fake run of the call, and the visit's own use of sizes (``int(e.val(x).shape[0])``),
        # refuses a guard on the program's shape env: it is shared with ``p``
        with guards_refused(self.fake_mode()):
            try:
                return self.walk()
            except EditRefused:
                raise
            except PassError as exc:
                if exc is self.visit_error:
                    raise  # the visit's own (the pass declines), or not the edit's fault
                # the editor's bookkeeping after the visits (callers re-derived) refused an edit
                raise EditRefused(str(exc)) from exc

    def walk(self) -> Program:
        p = self.p
        table = p.module_table()
        updates: dict[ModuleId, Any] = {}
        for mid in dict.fromkeys(mid for _, mid in p.walk()):  # each module once, walk order
            path = p.first_path(mid)
            mod = table[mid]
            graphs = tuple(self.graph(mid, path, g, gi) for gi, g in enumerate(mod.graphs))
            if any(a is not b for a, b in zip(graphs, mod.graphs)):
                updates[mid] = mod.replace(graphs=graphs)
        if not self.changed:
            return p
        if self.old_outputs:  # module graphs that return another dtype or shape: their callers
            graphs = {mid: m.graphs for mid, m in updates.items()}
            graphs = kn.rederive_callers(
                p, graphs, self.old_outputs, self.old_outputs, mode=self.fake_mode(),
                where="rewrite_nodes",
            )
            updates = {
                mid: (updates.get(mid) or table[mid]).replace(graphs=gs)
                for mid, gs in graphs.items()
            }
        return self.freeze(updates)

    def graph(self, mid: ModuleId, path: str, graph: Graph, gi: int) -> Graph:
        self.mid, self.path = mid, path
        self.is_root = mid == self.p.root and gi == 0
        self.spec_of = (
            {s.name: s for s in self.p.signature.inputs} if self.is_root else {}
        )
        # the kernel's working graph: the names taken, the nodes defined so far (placed as the
        # walk reaches them), new nodes made after the one naming and meta policy; the editor
        # hears of each node made (``emitted``)
        self.work = kn.WorkingGraph(graph, indexed=False, listener=self)
        self.alias: dict[str, Ref] = {}
        self.nodes: list[Node] = []
        self.placeholders = self.work.placeholders  # new placeholders (flat root)
        self.candidates: set[str] = set()  # nodes the edit may have left unused
        self.named = None
        self.graph_changed = False
        self.graph_obj = graph
        self.e.graph = graph
        self.fresh_constants: dict[str, str] = {}  # new constant node -> its fqn
        self.reread: set[str] = set()  # values a replaced node's readers read now
        self.overwritten: dict[str, str] = {}  # value written in place privately -> where
        self.rewritten: dict[str, str] = {}  # writing node whose writes a visit re-did -> them
        alias, e, visit, nodes = self.alias, self.e, self.visit, self.nodes
        place = self.work.add
        retyped = self.retyped = set()  # values whose dtype or shape the edit changed
        pending: list[Node] = []  # what placeholders' visits emitted: after the placeholders
        keep = _as_is
        for node in graph.nodes:
            op = node.op
            if op == OUTPUT:
                nodes.extend(pending)
                nodes.append(self.output(node))
                break
            if pending and op != PLACEHOLDER:
                nodes.extend(pending)
                pending.clear()
            if alias:
                args = map_refs_in(node.args, alias, keep)
                kwargs = map_refs_in(node.kwargs, alias, keep) if node.kwargs.items else node.kwargs
            else:
                args, kwargs = node.args, node.kwargs
            current = self.current = e.node = node
            if retyped and op in (CALL_FUNCTION, CALL_MODULE):
                read = next((r.name for r in node.inputs() if r.name in retyped), None)
                if read is not None:
                    if op == CALL_MODULE:
                        kn.refuse_call(node, read, f"the edit of module {path or '<root>'!r}")
                    current = self.repropagated(node, args, kwargs)
            self.current = current
            e.node, e.args, e._kwargs = node, args, kwargs
            self.before: list[Node] = []
            self.after: list[Node] = []
            self.after_names: set[str] = set()
            self.private_writes: list[tuple[Any, str, str]] = []
            self.redo_writes: list[tuple[Any, str, str]] = []  # emitted writes of node's tensors
            self.redone: set[tuple[str, str]] = set()  # the tensors the visit wrote (write_key)
            self.here_writes: dict[tuple[str, str], str] | None = None  # node's, by write_key
            self.drop_asked = False
            try:
                result = visit(node, e)
            except PurefxError as exc:
                self.visit_error = exc  # raised out of the visit: its own, or e's (EditRefused)
                raise
            except Exception as exc:  # a guard the visit asked for, or the visit's own error
                guard = refused_guard(exc)
                if guard is None:
                    raise
                raise kn.guard_error(self.p, guard, f"visit at node {node.name!r}",
                                     kn.KEEP_SYMBOLIC, error=EditRefused) from exc
            replaced = type(result) is Ref and self.alias.get(result.name, result) != node.ref
            goes = (replaced or self.drop_asked) and (is_pure(node) or self.settle_writes(node))
            if self.redo_writes and not goes:
                self.refuse_rewrite(node, *self.redo_writes[0])
            if self.private_writes and (not replaced or not goes):
                self.refuse_write(*self.private_writes[0])  # the node still reads the value
            if e.args is not args or e._kwargs is not kwargs:
                node_now = self.reargued(current, e.args, e._kwargs)
            elif current is not node:
                node_now = current
            elif args is not node.args or kwargs is not node.kwargs:
                node_now = node.replace(args=args, kwargs=kwargs)
                self.graph_changed = True
            else:
                node_now = node
            place(node_now)
            for n in self.after:
                place(n)
            if op == PLACEHOLDER:
                nodes.append(node_now)
                pending.extend(self.before)
                pending.extend(self.after)
            else:
                nodes.extend(self.before)
                nodes.append(node_now)
                nodes.extend(self.after)
            if result is not None:
                self.replace(node, result)
        else:  # pragma: no cover - verify guarantees an output node
            raise EditRefused(f"graph of module {path or '<root>'!r} has no output node")
        if self.placeholders:
            nodes = self.new.place(nodes, self.p.signature.inputs, self.placeholders)
        if self.candidates:
            # a value a signature still names stays, dropped or not (as ``eliminate_dead_code``
            # keeps it): its going would leave the signature naming a value the program lacks,
            # and what it read, named too, would go only in a second run. What goes with a
            # dropped node is what it alone read, never a value nothing read before the edit
            stays = self.signature_names() - self.alias.keys()
            read_before = {r.name for n in graph.nodes for r in n.inputs()}
            nodes = _drop_unused(nodes, self.candidates, self.fresh_constants, self.work.made,
                                 self.rewritten, read_before, stays)
        if self.rewritten:
            self.check_rewritten_gone(nodes)
        if kn.same_nodes(nodes, graph.nodes) and (
            not self.graph_changed or not (self.alias or self.placeholders or self.mutations)
        ):
            return graph  # what the visit emitted was all dropped: nothing changed
        if not self.is_root and any(r.name in retyped for r in graph.output_node.inputs()):
            by_name = graph.by_name()
            self.old_outputs[(mid, gi)] = kn.output_vals(
                graph, lambda name: by_name[name].meta.get("val")
            )
        for n in nodes:
            fqn = self.fresh_constants.get(n.name)
            if fqn is not None:
                self.live_constants.add(fqn)
        self.changed = True
        if self.alias:
            if self.is_root:
                self.root_aliases = self.alias
            self.call_aliases.setdefault("" if self.flat else path, {}).update(self.alias)
        return kn.built(nodes)

    def replace(self, node: Node, result: Any) -> None:
        if type(result) is not Ref:
            raise EditRefused(
                f"visit returned {result!r} for node {node.name!r}; return None to keep the "
                "node, or a Ref (from e.call, e.apply, ... or one of the node's inputs) to "
                "replace its result"
            )
        result = self.alias.get(result.name, result)
        if result.name == node.name:
            return
        self.check_not_overwritten(result.name, f"visit replaces node {node.name!r} with")
        defined = self.work.node
        if result.name not in defined:
            raise EditRefused(
                f"visit replaces node {node.name!r} with %{result.name}, which is "
                f"{self.undefined(result.name)}; replace a node with a value computed before it "
                "or from it"
            )
        if node.name in self.signature_names():
            old, new = node.meta.get("val"), defined[result.name].meta.get("val")
            if not kn.same_val(old, new):
                raise EditRefused(
                    f"visit replaces node {node.name!r}, which a signature names, with "
                    f"%{result.name} of another dtype or shape ({kn.describe(old)} -> "
                    f"{kn.describe(new)}); keep the value's dtype and shape there"
                )
        if not kn.same_meta(node.meta.get("val"), defined[result.name].meta.get("val")):
            self.retyped.add(node.name)  # its readers' vals are propagated again (strides too)
        self.alias[node.name] = result
        self.reread.add(result.name)
        self.candidates.add(node.name)
        self.graph_changed = True

    def signature_names(self) -> set[str]:
        """Names of this graph's values that a signature names (root outputs, preserved call
        arguments): they keep dtype and shape. (A module graph's outputs may change: the
        calls of the module are derived again, ``kernel.rederive_callers``.)"""
        if self.named is None:
            named: set[str] = set()
            if self.is_root:
                named.update(s.name for s in self.p.signature.outputs if s.name)
            if self._call_names is None:
                self._call_names = kn.protected_names(self.p)
            named.update(self._call_names.get("" if self.flat else self.path, ()))
            self.named = named
        return self.named

    def output(self, node: Node) -> Node:
        alias = self.alias
        args = map_refs_in(node.args, alias, _as_is) if alias else node.args
        if self.is_root and self.flat and self.mutations:
            values = args[0] if args else ()
            values = values if isinstance(values, tuple) else (values,)
            at = self.mutation_index()
            new = tuple(self.mutations.values())
            args = (values[:at] + new + values[at:],) + tuple(args[1:])
        if args is node.args:
            return node
        self.graph_changed = True
        return node.replace(args=args)

    def mutation_index(self) -> int:
        specs = self.p.signature.outputs
        return next(
            (i for i, s in enumerate(specs) if s.kind not in _BEFORE_USER_OUTPUTS),
            len(specs),
        )

    def reargued(self, node: Node, args: Any, kwargs: Any) -> Node:
        """``node`` with the arguments ``visit`` assigned, checked and with its ``val`` again."""
        args = map_refs(freeze(tuple(args), _as_is), self.read)
        kwargs = map_refs(freeze(kwargs, _as_is), self.read)
        late = self.after_names | {node.name}
        cycle = next((r.name for r in iter_refs((args, kwargs)) if r.name in late), None)
        if cycle is not None:
            raise EditRefused(
                f"visit gives node {node.name!r} an argument %{cycle} computed from its own "
                "result (a cycle); emit that value before the node"
            )
        return self.repropagated(node, args, kwargs)

    def repropagated(self, node: Node, args: Any, kwargs: Any) -> Node:
        """``node`` with ``args`` / ``kwargs`` and its ``val`` propagated again; its name joins
        ``retyped`` when the dtype, shape or strides changed (``kn.same_meta``)."""
        self.graph_changed = True
        val = self.fake(node.target, args, kwargs) if node.op == CALL_FUNCTION else None
        if val is None:
            return node.replace(args=args, kwargs=kwargs)
        old = self.e.node.meta.get("val")
        if not kn.same_meta(old, val):
            if node.name in self.signature_names() and not kn.same_val(old, val):
                raise EditRefused(
                    f"the edit at node {self.here()!r} changes node {node.name!r} from "
                    f"{kn.describe(old)} to {kn.describe(val)}, and a signature names it (an "
                    "output spec or a preserved call); keep the value's dtype and shape there"
                )
            self.retyped.add(node.name)
        return node.replace(args=args, kwargs=kwargs).with_meta(val=val)

    # --- emitting -----------------------------------------------------------------------------

    def here(self) -> str:
        node = self.e.node
        return node.name if node is not None else "?"

    def read(self, r: Ref) -> Ref:
        """A Ref the visit gave, with replacements applied; ``PassError`` when it is not
        defined yet (a cycle) or at all."""
        r = self.alias.get(r.name, r)
        name = r.name
        if name in self.work.node or name in self.after_names or name == self.e.node.name:
            if name in self.overwritten:
                self.check_not_overwritten(name, f"a node emitted at node {self.here()!r} reads")
            return r
        raise EditRefused(
            f"a node emitted at node {self.here()!r} reads %{name}, which is "
            f"{self.undefined(name)}; read the "
            "node's arguments (e.args), its result (node.ref) or values emitted before"
        )

    def undefined(self, name: str) -> str:
        return "defined later (a cycle)" if name in self.graph_obj.by_name() else "not defined"

    def emit(
        self, op: str, target: Any, args: tuple, kwargs: Mapping[str, Any], checked: bool = True
    ) -> Ref:
        args = freeze(tuple(args), _as_is)
        kwargs = freeze(dict(kwargs), _as_is)
        args = map_refs(args, self.read)
        kwargs = map_refs(kwargs, self.read)
        here = self.e.node
        late = self.after_names | {here.name}
        after = any(r.name in late for r in iter_refs((args, kwargs)))
        if checked:
            self.check_writes(op, target, args, kwargs, after)
        val = self.fake(target, args, kwargs)
        src = here.meta
        node = self.work.make(op, target, args, kwargs, val=val,
                              stack=src.get("nn_module_stack"), anchor_meta=src)
        if after:
            self.after.append(node)
            self.after_names.add(node.name)
        else:
            self.before.append(node)
            self.work.add(node)
        return node.ref

    def emitted(self, node: Node) -> None:
        """The kernel made ``node`` for this graph (``kernel.Listener``): it may be dropped
        at the end if nothing reads it (a read of new state: see ``new_read``)."""
        if node.op in (PLACEHOLDER, GET_ATTR):
            return
        self.candidates.add(node.name)
        self.graph_changed = True

    def erased(self, name: str) -> None:
        """(``kernel.Listener``) the editor erases nothing through the kernel."""

    def replaced(self, old: str, new: str) -> None:
        """(``kernel.Listener``) the editor's replacements are its own ``alias``."""

    def check_writes(self, op: str, target: Any, args: Any, kwargs: Any, after: bool) -> None:
        """Refuse an emitted node that writes in place memory this call did not create.

        What it writes is ``ir.effects.written_args``'s answer; whose memory each written value
        is (``bases``) is followed through the nodes the kernel made for this call
        (``WorkingGraph.made``) by ``ir.effects.aliased_args``. Memory a made node created is
        the edit's to write. A base that is a tensor the visited node writes itself
        (``write_key``), written before it (``after`` false: the new node does not read the
        visited node's result), re-does that write: it stands once the node goes, and is
        refused when the node stays (``graph``). Any other base must be an intermediate only
        the visited node reads (``read_only_here``: the program's readers, and the readers of
        each node replaced by it, count), written then once the visited node is replaced, and
        read by nothing after the write (``check_not_overwritten``)."""
        ops.meet(target, args, kwargs, self.val)  # an operator outside the table: observed
        for name in written_args(kn.carried(op, "emitted", target, args, kwargs)):
            for base in self.bases(name):
                if not after and self.redoes(self.write_key(base)):
                    self.redo_writes.append((target, name, base))
                    continue
                if not self.read_only_here(base) or any(
                    r.name == base for n in self.after for r in n.inputs()
                ):
                    self.refuse_write(target, name, base)
                self.private_writes.append((target, name, base))  # fine once node is replaced
                self.overwritten[base] = f"{target_name(target)} emitted at node {self.here()!r}"

    # --- a node that writes ----------------------------------------------------------------------

    def drop_here(self) -> None:
        """``e.drop()``: the visited node is a candidate, and its writes are settled."""
        self.drop_asked = True
        self.candidates.add(self.here())

    def write_key(self, name: str) -> dict[tuple[str, str], str]:
        """The tensors a write of value ``name`` writes, each as a key with its description:
        the state (``("state", fqn)``) or graph input (``("input", name)``) whose memory
        ``name`` may be, followed back through every alias (``ir.effects.aliased_args``:
        views, in-place results, getitems, conservatively module calls); a value that is none
        of these and aliases nothing is its own tensor (``("value", name)``). Writes are
        matched by these keys, never by operator or value names. O(nodes the aliases pass
        through)."""
        out: dict[tuple[str, str], str] = {}
        todo, seen = [name], set()
        while todo:
            v = todo.pop()
            if v in seen:
                continue
            seen.add(v)
            fqn = self.fqn_of(Ref(v))
            if fqn is not None:
                slot = self.slot(fqn)
                out[("state", fqn)] = f"{slot.kind if slot is not None else 'state'} {fqn!r}"
                continue
            node = self.lookup(v)
            if node is not None and node.op == PLACEHOLDER:
                out[("input", v)] = (
                    f"user input %{v}" if self.is_root else f"input %{v} of the module's graph"
                )
                continue
            up = aliased_args(node) if node is not None else ()
            if not up:
                out[("value", v)] = f"value %{v}"
            todo.extend(up)
        return out

    def node_writes(self) -> dict[tuple[str, str], str]:
        """The tensors the visited node writes in place (``ir.effects.written_args`` of its
        arguments as they are now), by ``write_key``; computed once per visit."""
        if self.here_writes is None:
            found: dict[tuple[str, str], str] = {}
            for name in written_args(self.e.node):
                found.update(self.write_key(self.alias.get(name, Ref(name)).name))
            self.here_writes = found
        return self.here_writes

    def redoes(self, keys: Mapping[tuple[str, str], str]) -> bool:
        """Whether a write of the tensors ``keys`` writes only tensors the visited node writes
        (a re-do of its writes); recorded in ``redone`` when so."""
        mine = self.node_writes() if keys else {}
        if not mine or not keys.keys() <= mine.keys():
            return False
        self.redone.update(keys)
        return True

    def settle_writes(self, node: Node) -> bool:
        """Whether the visited ``node``, replaced or dropped and not pure, may go: the visit
        re-did every write it makes (``redone``). ``False`` when it re-did none (the node stays
        for its writes) or when the node writes nothing (it is impure for another reason).
        ``PassError`` when it re-did some of them only, or all of them of a node that does more
        than write (draws random numbers, has an effect, is a module call or an operator the
        table lacks). O(the node's written arguments)."""
        writes = self.node_writes()
        if not writes or not self.redone & writes.keys():
            return False
        left = [what for key, what in writes.items() if key not in self.redone]
        how = "replaces" if not self.drop_asked else "drops"
        if left:
            done = [what for key, what in writes.items() if key in self.redone]
            raise EditRefused(
                f"visit {how} node {node.name!r}, which writes {_listed(list(writes.values()))} "
                f"in place, and re-does the write of {_listed(done)} only: the write of "
                f"{_listed(left)} would be lost. Re-do it too (e.write_buffer(buffer, new "
                "value) for a buffer, an in-place operator on that tensor otherwise), or re-do "
                "none of them: the node then stays for its writes"
            )
        more = _more_than_writes(node)
        if more:
            raise EditRefused(
                f"visit {how} node {node.name!r} and re-does its writes of "
                f"{_listed(list(writes.values()))}, but the node {more} besides writing: it "
                "cannot go. Keep it (return None) and re-do none of its writes"
            )
        self.rewritten[node.name] = _listed(list(writes.values()))
        return True

    def check_rewritten_gone(self, nodes: list[Node]) -> None:
        """Refuse a node whose writes a visit re-did that is still in the graph (something
        still reads it): it would write a second time."""
        names = self.rewritten
        for n in nodes:
            if n.name in names:
                readers = [m.name for m in nodes if any(r.name == n.name for r in m.inputs())]
                if not readers:
                    raise EditRefused(
                        f"the visit of node {n.name!r} re-does its writes of {names[n.name]}, "
                        "so the node must go, but a signature names its result (a root output "
                        "spec or a preserved call's argument or result): it stays, and would "
                        "write a second time. Replace it (return a Ref whose value the "
                        "signature can name instead), or re-do none of its writes"
                    )
                raise EditRefused(
                    f"the visit of node {n.name!r} re-does its writes of {names[n.name]}, so "
                    f"the node must go, but {_listed([repr(r) for r in readers])} still "
                    f"read{'s' if len(readers) == 1 else ''} its result: it would write a "
                    "second time. Replace every value read of it (return a Ref from the visit "
                    "of each of its readers, or of the node itself), or re-do none of its writes"
                )

    def refuse_rewrite(self, node: Node, target: Any, name: str, base: str) -> None:
        """The ``PassError`` for an emitted in-place write of a tensor the visited ``node``
        writes too, where the node stays: the tensor would be written twice."""
        raise EditRefused(
            f"{target_name(target)} emitted at node {node.name!r} writes %{name} in place, "
            f"which the node writes too ({_listed(list(self.write_key(base).values()))}), and "
            "the node stays: it would be written twice. Replace the node (return a Ref) or "
            "drop it (e.drop()) so that the emitted write re-does its own, or use the "
            "functional operator"
        )

    def refuse_write(self, target: Any, name: str, base: str) -> None:
        """The ``PassError`` for an emitted node of ``target`` writing value ``name`` (the
        memory of ``base``); ``ir.ops.unknown_facts``' message where the write is the
        conservative default of an operator whose facts are unknown."""
        unknown = ops.unknown_facts(target)
        if unknown:
            raise EditRefused(f"{target_name(target)} emitted at node {self.here()!r}: {unknown}")
        what = self.describe_value(base)
        raise EditRefused(
            f"{target_name(target)} emitted at node {self.here()!r} writes %{name} in "
            f"place, which is {what}; an edit writes only values it created (or an "
            "intermediate only the node it replaces reads): use the functional operator "
            "(without the trailing '_' or out=), or e.write_buffer to write a buffer"
        )

    def check_not_overwritten(self, name: str, doing: str) -> None:
        """Refuse a read of ``name`` after an emitted node wrote it in place (a private write:
        ``check_writes``): whatever reads it then sees the written value."""
        where = self.overwritten.get(name)
        if where is not None:
            raise EditRefused(
                f"{doing} %{name}, which {where} wrote in place before; read the result of "
                "that write instead, or write a copy (aten.clone) of the value"
            )

    def read_only_here(self, name: str) -> bool:
        """Whether value ``name`` is an intermediate of the program that only the visited node
        reads and that shares memory with none of its own inputs, so that writing it in place
        changes no value anyone else sees (``relu(x)`` -> ``relu_(x)`` where nothing else
        reads ``x``); never an input, state, an output, a view, nor a value that stands for a
        node the edit replaced (that node's readers read it now). O(arguments)."""
        node = self.graph_obj.by_name().get(name)
        if node is None or node.op != CALL_FUNCTION or self.fqn_of(Ref(name)) is not None:
            return False
        users = self.graph_obj.users()
        if users.get(name, ()) != (self.e.node.name,) or name in self.reread:
            return False
        made_by = self._result_of(node, users)
        if made_by is None:
            return False
        effects = graph_effects(self.p, self.mid, self.graph_obj)
        return not any(effects.aliases(name, r.name) for r in made_by.inputs())

    def _result_of(self, node: Node, users: Mapping[str, tuple[str, ...]]) -> Node | None:
        """The node whose result ``node``'s value is: ``node`` itself, or, for ``getitem(t,
        i)`` of a multi-result op, the op, where no other node takes its ``i``-th result (its
        other results are other tensors); ``None`` where that is not known. O(readers of the
        op)."""
        if node.target is not operator.getitem:
            return node
        tup, index = (node.args + (None, None))[:2]
        by_name = self.graph_obj.by_name()
        made = by_name.get(tup.name) if isinstance(tup, Ref) else None
        if made is None or made.op != CALL_FUNCTION or not isinstance(index, int):
            return None
        same = [u for u in users.get(made.name, ())
                if by_name[u].target is not operator.getitem or by_name[u].args[1:2] == (index,)]
        return made if same == [node.name] else None

    def bases(self, name: str) -> list[str]:
        """The values not made by this call whose memory value ``name`` may be: ``name``
        itself, or, for a node the kernel made (``WorkingGraph.made``), the bases of every
        argument its result may share memory with (``ir.effects.aliased_args``: views,
        in-place results, ``set_``, Python functions); ``[]`` for a made value in new memory.
        O(made nodes it passes through)."""
        made, out, todo, seen = self.work.made, [], [name], set()
        while todo:
            v = todo.pop()
            if v in seen:
                continue
            seen.add(v)
            node = self.lookup(v) if v in made else None
            if node is None:
                out.append(v)
            else:
                todo.extend(aliased_args(node))
        return out

    def describe_value(self, name: str) -> str:
        node = self.lookup(name)
        if node is not None and node.op == PLACEHOLDER:
            spec = self.spec_of.get(name) or self.new.inputs.get(name)
            if spec is None or spec.kind == sg.USER_INPUT:
                return "a user input" if self.is_root else "an input of the module's graph"
        fqn = self.fqn_of(Ref(name)) if node is not None else None
        if fqn is not None:
            slot = self.slot(fqn)
            return f"{slot.kind} {fqn!r}" if slot is not None else f"state {fqn!r}"
        return "a value the program computes that another node reads or that aliases another"

    def lookup(self, name: str) -> Node | None:
        found = self.work.node.get(name)
        if found is None:
            here = self.current
            if here is not None and name == here.name:
                return here
            found = next((n for n in self.after if n.name == name), None)
        return found

    def node_of(self, x: Any) -> Node | None:
        """The node that value ``x`` (a ``Ref``, replacements applied) is now, if any."""
        return self.lookup(self.alias.get(x.name, x).name) if type(x) is Ref else None

    def is_input(self, x: Any) -> bool:
        node = self.node_of(x)
        return node is not None and node.op == PLACEHOLDER

    def val(self, x: Any) -> Any:
        if type(x) is not Ref:
            return x
        node = self.node_of(x)
        return node.meta.get("val") if node is not None else None

    def fake(self, target: Any, args: Any, kwargs: Any) -> Any:
        try:
            return self.fakes.value(target, args, kwargs, self.val, mode=self.fake_mode())
        except kn.FakeRunFailed as exc:
            if exc.guard is not None:
                raise kn.guard_error(self.p, exc.guard,
                                     f"{target_name(target)} at node {self.here()!r}",
                                     kn.KEEP_SYMBOLIC, error=EditRefused) from exc
            if exc.no_kernel:  # no kernel for these vals: not the arguments' fault
                kind = "meta tensors" if exc.on_meta else "fake tensors"
                raise PassError(  # the program's vals, not the edit: no EditRefused
                    f"{target_name(target)} at node {self.here()!r} has no kernel for the "
                    f"program's vals, which are {kind} ({exc.cause_line}); the arguments are not "
                    "at fault: give the program FakeTensor vals, as torch.export does, or "
                    "register a fake impl for the operator"
                ) from exc
            raise EditRefused(
                f"{target_name(target)} at node {self.here()!r} raises on its "
                f"arguments' values ({type(exc.cause).__name__}: {exc.cause_line}); check the "
                "arguments' shapes and dtypes (e.val)"
            ) from exc

    def fake_mode(self) -> Any:
        """The fake mode of the program's ``val`` s (the first tensor ``val`` found), ``_META``
        when they are meta tensors (hand-built and generated programs), else ``None``."""
        if self._mode is _NO_MODE:
            self._mode = None
            for _, g in walked_graphs(self.p):
                for n in g.nodes:
                    v = n.meta.get("val")
                    if isinstance(v, torch.Tensor):
                        mode = getattr(v, "fake_mode", None)
                        self._mode = mode if mode is not None else (
                            _META if v.device.type == "meta" else None
                        )
                        return self._mode
        return self._mode

    def fake_of(self, tensor: torch.Tensor) -> Any:
        """The ``val`` of a new state tensor, of the program's kind."""
        mode = self.fake_mode()
        if mode is None:
            return None
        # static: a symbolic size would put guards on the program's shape env (shared with p)
        return tensor.to("meta") if mode is _META else mode.from_tensor(tensor, static_shapes=True)

    def level(self) -> str:
        if self._level is None:
            graphs = [g for _, m in self.p.modules.items() for g in m.graphs]
            self._level = tr.level_of(graphs)
        return self._level

    def apply(self, fn: Callable, args: tuple) -> Ref | tuple:
        examples, dynamic, key = [], [], []
        dims: dict[str, Any] = {}  # symbol name -> its torch.export.Dim
        for a in args:
            if type(a) is Ref:
                v = self.val(self.read(a))
                if not isinstance(v, torch.Tensor):
                    raise EditRefused(
                        f"e.apply at node {self.here()!r}: argument %{a.name} has no tensor val; "
                        "apply traces at the arguments' fake values"
                    )
                sizes, spec = self.traced_sizes(a, v, dims)
                examples.append(torch.zeros(sizes, dtype=v.dtype))
                dynamic.append(spec)
                key.append((tuple(str(d) for d in v.shape), v.dtype))
            else:
                examples.append(a)
                key.append((type(a), a))
        cache_key = (fn, self.level(), tuple(key))
        traced = self.traced.get(cache_key)
        if traced is None:
            name = getattr(fn, "__qualname__", repr(fn))
            where = f"e.apply at node {self.here()!r}"
            try:
                traced = tr.trace(fn, examples, self.level(), name, f"edit at node {self.here()!r}",
                                  sentinels=False,
                                  dynamic=dynamic if any(dims.values()) else None)
            except PurefxError as exc:
                fixed = tr.fixed_sizes(exc, dims)
                if fixed is not None:
                    raise kn.guard_error(
                        self.p, fixed, f"{where}: {name}",
                        "keep fn's sizes symbolic (x.shape[0] as it is, -1 in a view, no int() "
                        "and no branch on a size), or emit the nodes with e.call",
                        error=EditRefused,
                    ) from exc
                raise EditRefused(f"{where}: {exc}") from exc
            self.traced[cache_key] = traced
        env: dict[str, Any] = {}
        phs = [n.name for n in traced.graph.nodes if n.op == PLACEHOLDER]
        for ph, pos in zip(phs, traced.tensor_args):
            env[ph] = args[pos]

        def bind(r: Ref) -> Any:
            return env.get(r.name, r)

        for n in traced.compute_nodes():
            out = self.emit(n.op, n.target, map_refs(n.args, bind), dict(map_refs(n.kwargs, bind).items))
            env[n.name] = out
        results = tuple(map_refs(o, bind) for o in traced.outputs)
        return results[0] if len(results) == 1 else results

    def traced_sizes(self, a: Ref, v: torch.Tensor, dims: dict[str, Any]) -> tuple[list, tuple]:
        """The sizes ``e.apply`` traces argument ``a`` (val ``v``) at (each dynamic one at its
        hint) and its ``torch.export`` dynamic shape: a size that is a symbol of the program is
        that symbol's ``Dim`` (made once per symbol, with its range: ``dims``; static, ``None``,
        where the range holds one size), another symbolic size is ``Dim.DYNAMIC``, an int is
        static (``None``)."""
        sizes, spec = [], []
        for i, d in enumerate(v.shape):
            if type(d) is int:
                sizes.append(d)
                spec.append(None)
                continue
            node = d.node
            hint = node.hint
            if hint is None:
                raise EditRefused(
                    f"e.apply at node {self.here()!r}: dimension {i} of argument %{a.name} is "
                    f"a data-dependent size ({node.expr}), which has no example to trace at; "
                    "emit the nodes with e.call"
                )
            sizes.append(int(hint))
            expr = node.expr
            if not getattr(expr, "is_Symbol", False):
                spec.append(torch.export.Dim.DYNAMIC)
                continue
            name = str(expr)
            if name not in dims:
                lo, hi = kn.size_range(self.p, expr, node.shape_env)
                # a range of one size: the program fixes it, so may the trace
                dims[name] = None if lo == hi else torch.export.Dim(name, min=lo, max=hi)
            spec.append(dims[name])
        return sizes, tuple(spec)

    # --- state --------------------------------------------------------------------------------

    def state(self, x: Any) -> tuple[str, Any] | None:
        if type(x) is not Ref:
            return None
        x = self.alias.get(x.name, x)
        fqn = self.fqn_of(x)
        if fqn is None:
            return None
        slot = self.slot(fqn)
        if slot is None:
            return None
        held = self.new.tensors.get(slot.tensor) or self.p.tensor_table().get(slot.tensor)
        return (fqn, held.value if held is not None else None)

    def slot(self, fqn: str) -> st.Slot | None:
        return self.new.slots.get(fqn) or self.p.state_table().get(fqn)

    def fqn_of(self, x: Ref) -> str | None:
        written = self.buffer_values.get(x.name)
        if written is not None:
            return written
        node = self.lookup(x.name)
        if node is None:
            return None
        if node.op == PLACEHOLDER:
            spec = self.spec_of.get(node.name) or self.new.inputs.get(node.name)
            if spec is not None and spec.kind in sg.STATE_INPUT_KINDS:
                return spec.target
            return None
        if node.op == GET_ATTR and type(node.target) is str:
            fqn = self.p.attr_fqn(self.mid, self.path, node.target)
            return fqn if self.slot(fqn) is not None else None
        return None

    def buffer_fqn(self, x: Ref) -> tuple[str | None, bool]:
        """The fqn of the state whose very tensor value ``x`` is (``fqn_of``), followed back
        through in-place writes (``ir.effects.same_tensor``: ``add_(b, 1)`` is ``b``), and
        whether it took such a step (the graph then writes that state in place). O(the
        chain)."""
        seen: set[str] = set()
        fqn = self.fqn_of(x)
        while fqn is None and x.name not in seen:
            seen.add(x.name)
            node = self.lookup(x.name)
            first = same_tensor(node) if node is not None else None
            if first is None:
                return None, False
            x = self.alias.get(first, Ref(first))
            fqn = self.fqn_of(x)
        return fqn, bool(seen)

    def new_state(self, kind: str, name: str, tensor: Any, persistent: bool) -> Ref:
        if not isinstance(tensor, torch.Tensor):
            raise EditRefused(
                f"new state at node {self.here()!r} must be a torch.Tensor, got "
                f"{type(tensor).__name__}"
            )
        val = self.fake_of(tensor)
        self.graph_changed = True
        root = self.is_root and self.flat
        node, fqn = self.work.state_read(self.new, kind, name, tensor, mid=self.mid,
                                         anchor=self.e.node, root=root, val=val,
                                         persistent=persistent)
        if not root:
            self.before.append(node)
        self.work.add(node)
        return self.new_read(node, kind, fqn)

    def new_read(self, node: Node, kind: str, fqn: str) -> Ref:
        """``node``'s value; a new constant is dropped with its state when nothing reads it."""
        if kind == st.CONSTANT:
            self.fresh_constants[node.name] = fqn
            self.constants.add(fqn)
            self.candidates.add(node.name)
        return node.ref

    def write_buffer(self, buffer: Any, value: Any) -> None:
        if type(buffer) is not Ref or type(value) is not Ref:
            raise EditRefused(
                f"write_buffer at node {self.here()!r} takes two Refs (the buffer and the value), "
                f"got {buffer!r}, {value!r}"
            )
        buffer, value = self.read(buffer), self.read(value)
        fqn, in_place = self.buffer_fqn(buffer)
        slot = None if fqn is None else self.slot(fqn)
        if slot is None or slot.kind != st.BUFFER:
            what = "a user input or a computed value" if slot is None else f"a {slot.kind}"
            raise EditRefused(
                f"write_buffer at node {self.here()!r} writes %{buffer.name}, which is {what}; "
                "only buffers (e.state(x) names one, an in-place write of one, or e.add_buffer) "
                "may be written"
            )
        old, new = self.val(buffer), self.val(value)
        if not kn.same_val(old, new):
            raise EditRefused(
                f"write_buffer at node {self.here()!r} writes %{value.name} "
                f"({kn.describe(new)}) into buffer {fqn!r} ({kn.describe(old)}); write a value of "
                "the buffer's dtype and shape"
            )
        self.redoes({("state", fqn): ""})  # a write of a buffer the visited node writes
        written = in_place or graph_effects(self.p, self.mid, self.graph_obj).is_written(buffer.name)
        if self.is_root and self.flat and not written:
            if any(s.target == fqn for s in self.p.signature.outputs if s.kind in sg.MUTATION_KINDS):
                raise EditRefused(
                    f"write_buffer at node {self.here()!r}: buffer {fqn!r} already has a "
                    "buffer_mutation output; write it once"
                )
            holder = self.holder_of.setdefault(fqn, buffer.name)  # the buffer's placeholder
            self.mutations[fqn] = value
            self.alias[holder] = value  # later reads see the new value, as in place
            self.buffer_values[value.name] = fqn  # and e.state of it still names the buffer
            self.graph_changed = True
            return
        self.emit(CALL_FUNCTION, _COPY, (buffer, value), {}, checked=False)

    # --- the end ------------------------------------------------------------------------------

    def freeze(self, updates: dict[ModuleId, Any]) -> Program:
        p = self.p
        self.new.drop(self.constants - self.live_constants)  # new constants nothing reads
        changes: dict[str, Any] = {"modules": p.modules.update(updates) if updates else p.modules}
        sig = p.signature
        renamed = kn.renamed_outputs(sig, {k: v.name for k, v in self.root_aliases.items()})
        outputs = renamed.outputs
        if self.mutations:
            at = self.mutation_index()
            new = tuple(sg.OutputSpec(sg.BUFFER_MUTATION, v.name, fqn) for fqn, v in self.mutations.items())
            outputs = outputs[:at] + new + outputs[at:]
        if outputs != sig.outputs:
            changes["signature"] = sg.ExportSignature(sig.inputs, outputs)
        changes["call_signatures"] = kn.renamed_calls(p, {
            path: {k: v.name for k, v in renames.items()}
            for path, renames in self.call_aliases.items()
        })
        return self.new.apply(p.replace(**changes))


def _as_is(x: Any) -> Any:
    return x


def _listed(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _more_than_writes(node: Node) -> str:
    """What ``node`` does besides writing what ``written_args`` says, as a phrase (``''`` when
    nothing: a call of a verified operator that draws nothing, or is an inert dropout, and has
    no other effect)."""
    if node.op == CALL_MODULE:
        return "is a module call (it may do anything)"
    if node.op not in (CALL_FUNCTION, CALL_METHOD):
        return f"is a {node.op}"
    facts = ops.facts(node.target)
    name = target_name(node.target)
    if facts.kind == ops.HOP:
        return f"is a higher-order op ({name})"
    if not facts.verified:
        return f"calls {name}, whose facts are unknown (not in the verified operator table)"
    if facts.random and not inert_dropout(node):
        return f"draws random numbers ({name})"
    if ops.is_effectful(node.target):
        return f"has a side effect ({name})"
    return ""


def _drop_unused(
    nodes: list[Node], candidates: set[str], constants: Mapping[str, str], fresh: set[str],
    rewritten: Mapping[str, str], read_before: Collection[str], stays: Collection[str],
) -> list[Node]:
    """``nodes`` without the candidates (and, transitively, their inputs: those the edit made
    (``fresh``) or that were read before it (``read_before``)) that nothing reads, that are
    pure or ``rewritten`` (writing nodes whose writes the visit re-did) and that ``stays``
    (the values a signature names) does not name; a metadata check the edit emitted
    (``_assert_tensor_metadata`` after a traced ``.to``) is no reader: it goes with the value it
    checks. O(n)."""
    checks = {
        n.name for n in nodes
        if n.name in fresh and n.op == CALL_FUNCTION and ops.is_metadata_check(n.target)
    }
    uses: dict[str, int] = {}
    for n in nodes:
        if n.name in checks:
            continue
        for r in n.inputs():
            uses[r.name] = uses.get(r.name, 0) + 1
    keep = [True] * len(nodes)
    dropped: set[str] = set()
    for i in range(len(nodes) - 1, -1, -1):
        n = nodes[i]
        if (n.name not in candidates or uses.get(n.name, 0) or n.name in checks
                or n.name in stays):
            continue
        if not is_pure(n) and n.name not in constants and n.name not in rewritten:
            continue
        keep[i] = False
        dropped.add(n.name)
        for r in n.inputs():
            uses[r.name] -= 1
            if r.name in fresh or r.name in read_before:
                candidates.add(r.name)
    if checks and dropped:
        for i, n in enumerate(nodes):
            if n.name in checks and any(r.name in dropped for r in n.inputs()):
                keep[i] = False
    return [n for n, k in zip(nodes, keep) if k]
