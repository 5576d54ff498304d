"""Inlining: every module call back into the root graph, the inverse of ``outline``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ir import ops
from ir.args import IDict, IList, Ref, map_refs
from ir.effects import same_tensor
from ir.errors import PassError
from ir.graph import Graph
from ir.module import MODULE_LIST, PLAIN, SUBGRAPH, Module, ModuleId, split_call_target
from ir.names import Names
from ir.node import CALL_FUNCTION, CALL_MODULE, GET_ATTR, OUTPUT, PLACEHOLDER, Node
from ir.program import Program
from transforms import kernel as kn
from transforms.machinery.each_graph import with_root_graph
from transforms.machinery.module_table import named_outputs, reachable_modules, table_as


def inline(program: Program) -> Program:
    """Replace every ``call_module`` by the graph it runs, recursively: a flat Program.

    A call with target ``path@k`` runs graph variant ``k`` of the module at ``path``; its nodes
    are copied into the root graph at the call's place, reading the call's arguments where the
    graph read its placeholders (keyword placeholders by name), and the call's value becomes
    what the graph returns; an integer ``getitem`` of a call that returned a tuple or list is
    that element (no node). ``get_attr`` of state reads the fqn through the path of the call;
    a higher-order-op subgraph read by an inlined graph is registered at the root again. The
    module tree becomes what ``import_ep`` gives: a graph-less holder at every path, shared
    module objects split into one holder per path (their state stays tied), in the same order;
    a path of a shared object through which no computing node ran has no class name, as
    ``import_ep`` records it.
    Nodes keep their names where no other node has taken them first (root placeholders always
    do) and keep their meta as it is: nodes inlined twice from one deduplicated graph carry the
    meta of that graph. The export signature's output names follow the renaming; call
    signatures, state and the call order are kept as they are. After an in-place op on a root
    input (``add_``, ``copy_``, ...), later reads of that input read the op's result, the same
    tensor: the form ``torch.export`` writes, which ``outline`` turns into reads of the input.

    **Laws:** ``inline(p) is p`` for a flat ``p`` as ``import_ep`` gives it: only the root (and
    higher-order-op subgraphs) have graphs, and each module object sits at one path; hence
    idempotent;
    ``inline(outline(p))`` is alpha-equivalent to ``p`` for a flat ``p`` without preserved
    calls that, as ``import_ep`` programs do, reads the result of an in-place op on an input
    rather than the input after it; with preserved calls the pytree plumbing that ``outline``
    adds around them (``tree_unflatten``, ``tree_flatten_spec`` and their ``getitem``\\s)
    stays, so the result is flat and computes the same but is not alpha-equivalent.
    ``lower(inline(p))`` computes what ``lower(p)`` computes; ``verify`` holds of the result
    when it holds of ``p``.

    Raises ``PassError`` naming the node for a call of a module without that graph variant, or
    whose arguments do not match the callee's placeholders. Complexity: O(m) for m nodes in the
    result (a graph called k times is copied k times).
    """
    if _is_flat(program):
        return program
    return _Inliner(program).run()


#: The calls one node of an inlined graph ran in: ``(path, module id, call number)`` per call,
#: outermost first (call numbers count the calls of one path from 0, in graph order).
CallChain = tuple[tuple[str, ModuleId, int], ...]

#: The key torch's module stacks give the root module (``L__self__``; a path follows it).
ROOT_STACK_KEY = "L__self__"


def inline_with_calls(program: Program) -> tuple[Program, list[CallChain]]:
    """``inline(program)``, and per node of the result's root graph (in order, the output node
    last) the calls it ran in before inlining: the hook ``lowering.export_ep`` rebuilds each
    node's ``nn_module_stack`` from.

    Returns ``(program, chains)`` with ``chains[i] == ()`` for every node when ``program`` has
    nothing to inline (then the program is returned as it is), and for root placeholders and the
    output node always. Raises what ``inline`` raises. **Laws:**
    ``inline_with_calls(p)[0] == inline(p)``; ``len(chains) == len(graph)``. Complexity: O(m)
    for m nodes in the result, like ``inline``.
    """
    if _is_flat(program):
        return program, [()] * len(program.root_module.graph)
    inliner = _Inliner(program)
    flat = inliner.run()
    return flat, inliner.frames_of + [()]


def restacked(flat: Program, chains: Sequence[CallChain], p: Program) -> Program:
    """``flat`` (``inline_with_calls(p)``'s program) whose nodes each carry the module stack of
    the calls they ran in (``chains``, per node): a node inlined from a deduplicated graph then
    names the call it ran in, not the call its graph was first recorded for, and a node the
    outlining added (preserved-call plumbing) names its call too. Class names come from ``p``.
    Nodes that ran in the root keep their meta. O(n * depth)."""
    graph = flat.root_module.graph
    if flat is p:
        return flat
    keys = _stack_keys(graph)
    w = kn.WorkingGraph(graph, indexed=False)
    for node, chain in zip(graph.nodes, chains):
        w.add(_restacked(node, chain, p, keys) if chain else node)  # the output: no chain
    return with_root_graph(flat, w.finish()[0])


def _stack_keys(graph: Graph) -> dict[str, str]:
    """Module path -> the identity key its stack entries use (torch's ``L__self__a.b`` or an
    object id), from the first stack that names the path: every call of a path gets one key."""
    keys: dict[str, str] = {}
    seen: set[int] = set()
    for node in graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if not stack or id(stack) in seen:
            continue
        seen.add(id(stack))
        for key, (path, _) in stack.items():
            keys.setdefault(path, key.partition("@")[0])
    return keys


def _restacked(node: Node, frames: CallChain, p: Program, keys: dict[str, str]) -> Node:
    """``node`` with the module stack of the calls ``frames`` (and its own deeper entries);
    class names come from ``p``, the outlined Program whose module ids ``frames`` name."""
    old = dict(node.meta.get("nn_module_stack") or {})
    items = list(old.items())
    if items and items[0][1][0] == "":
        stack = dict(items[:1])
    else:
        stack = {keys.get("", ROOT_STACK_KEY): ("", p.root_module.type_name)}
    for path, mid, number in frames:
        base = keys.get(path, f"{ROOT_STACK_KEY}{path}")
        stack[base if number == 0 else f"{base}@{number}"] = (path, p.modules[mid].type_name)
    inner = frames[-1][0] + "."
    for key, (path, type_name) in items:
        if path.startswith(inner):
            stack[key] = (path, type_name)
    return node.with_meta(nn_module_stack=stack)


def _is_flat(p: Program) -> bool:
    """No module but the root has a graph and no module object sits at two paths."""
    if not p.is_flat:
        return False
    seen: set[ModuleId] = set()
    for _, mid in p.walk():
        mod = p.modules[mid]
        if mid in seen or (mid != p.root and mod.graphs and mod.kind != SUBGRAPH):
            return False
        seen.add(mid)
    return True


class _Inliner:
    """Streams the flat graph into a ``kernel.WorkingGraph`` as it inlines: each node copied in
    is named there after its own name, which it keeps unless a node placed before took it."""

    def __init__(self, program: Program) -> None:
        self.p = program
        graph = program.root_module.graph
        self.w = kn.WorkingGraph(graph, indexed=False)
        self.w.take_only((graph.output_node.name,))
        self.subgraphs: dict[str, ModuleId] = {}  # root-level name -> subgraph module
        self.input_of: dict[str, str] = {}  # root input or in-place result -> that root input
        self.latest: dict[str, Ref] = {}  # root input -> its latest in-place result
        self.ran: set[str] = set()  # module paths some inlined computing node ran in
        # the calls being inlined, and per node placed the calls it ran in (``CallChain``)
        self.frames: list[tuple[str, ModuleId, int]] = []
        self.frames_of: list[CallChain] = []
        self.calls: dict[str, int] = {}  # path -> how many of its calls were inlined

    def run(self) -> Program:
        p = self.p
        output = p.root_module.graph.output_node
        out = map_refs(self._inline(p.root, 0, (), p.root_module.graph, {}, root=True),
                       self._current)
        self.w.add(output.replace(args=(out,) + output.args[1:]))
        return p.replace(
            modules=self._modules(self.w.finish()[0]),
            signature=named_outputs(p.signature, out),
        )

    # --- graphs -----------------------------------------------------------------------------

    def _inline(
        self, mid: ModuleId, variant: int, chain: tuple[str, ...], graph: Graph,
        bound: dict[str, Any], root: bool = False,
    ) -> Any:
        """Copy ``graph`` (module ``mid``, called through the paths ``chain``) with its
        placeholders ``bound``; return what it returns, in temporaries."""
        path = chain[-1] if chain else ""
        env: dict[str, Any] = dict(bound)
        calls: set[str] = set()

        def read(r: Ref) -> Any:
            found = env.get(r.name, _UNDEFINED)
            if found is _UNDEFINED:
                raise PassError(
                    f"node {node.name!r} in module {path or '<root>'!r} reads %{r.name} before "
                    "it is defined; run ir.verify on the Program"
                )
            return found

        for node in graph.nodes:
            if node.op == PLACEHOLDER:
                if root:
                    env[node.name] = self._emit(node)
                    self.input_of[env[node.name].name] = env[node.name].name
                continue
            if node.op == OUTPUT:
                return map_refs(node.args[0] if node.args else None, read)
            args, kwargs = map_refs(node.args, read), map_refs(node.kwargs, read)
            if node.op == CALL_MODULE:
                env[node.name] = self._call(mid, chain, node, args, kwargs)
                calls.add(node.name)
            elif _folds(node, args, calls):
                env[node.name] = args[0][args[1]]
            elif node.op == GET_ATTR:
                env[node.name] = self._emit(node, target=self._attr(mid, path, node))
            else:
                env[node.name] = self._emit_op(node, args, kwargs)
                self.ran.update(chain)
        raise PassError(f"graph of module {path or '<root>'!r} has no output node")

    def _call(
        self, mid: ModuleId, chain: tuple[str, ...], node: Node, args: tuple, kwargs: IDict
    ) -> Any:
        path = chain[-1] if chain else ""
        target, variant = split_call_target(node.target)
        child = self.p.resolve(target, mid)
        graphs = self.p.modules[child].graphs if child is not None else ()
        if variant >= len(graphs):
            raise PassError(
                f"node {node.name!r} in module {path or '<root>'!r} calls graph {variant} of "
                f"{target!r}, which has {len(graphs)} graphs"
            )
        graph = graphs[variant]
        holders = graph.placeholders
        if len(args) + len(kwargs) != len(holders):
            raise PassError(
                f"node {node.name!r} passes {len(args) + len(kwargs)} arguments to "
                f"{node.target!r}, whose graph takes {len(holders)}"
            )
        bound = {h.name: a for h, a in zip(holders, args)}
        by_key = dict(kwargs.items)
        for h in holders[len(args):]:
            if h.name not in by_key:
                raise PassError(
                    f"node {node.name!r} does not pass {node.target!r}'s placeholder "
                    f"{h.name!r} (keyword placeholders are passed by their name)"
                )
            bound[h.name] = by_key[h.name]
        sub_path = f"{path}.{target}" if path else target
        number = self.calls.get(sub_path, 0)
        self.calls[sub_path] = number + 1
        self.frames.append((sub_path, child, number))
        try:
            return self._inline(child, variant, chain + (sub_path,), graph, bound)
        finally:
            self.frames.pop()

    def _attr(self, mid: ModuleId, path: str, node: Node) -> str:
        """The root-relative target of a ``get_attr`` read in the module at ``path``."""
        found = self.p.resolve(node.target, mid)
        if found is not None and self.p.modules[found].kind == SUBGRAPH:
            name = node.target.rsplit(".", 1)[-1]
            taken = Names(self.subgraphs)
            while self.subgraphs.get(name, found) != found:
                name = kn.fresh_id(name, taken)
            self.subgraphs[name] = found
            return name
        return self.p.attr_fqn(mid, path, node.target)

    def _emit_op(self, node: Node, args: Any, kwargs: Any) -> Ref:
        """Emit a computing node; reads of a mutated root input read its latest in-place result
        (the same tensor), as export writes them and as ``outline`` had them before it made
        such reads across calls read the input itself."""
        made = self._emit(node, args=map_refs(args, self._current),
                          kwargs=map_refs(kwargs, self._current))
        written = same_tensor(self.w.node[made.name])  # the input (or its in-place result) it is
        if written is not None:
            source = self.input_of.get(written)
            if source is not None:
                self.input_of[made.name] = source
                self.latest[source] = made
        return made

    def _current(self, r: Ref) -> Ref:
        source = self.input_of.get(r.name)
        return r if source is None else self.latest.get(source, r)

    def _emit(self, node: Node, **changes: Any) -> Ref:
        """Place a copy of ``node`` (named after it by the working graph) with ``changes``."""
        self.frames_of.append(tuple(self.frames))
        made = self.w.copy(node, **changes)
        self.w.add(made)
        return made.ref

    # --- the module tree --------------------------------------------------------------------

    def _modules(self, graph: Graph) -> Any:
        """Holders per path (as ``import_ep`` makes them) and the subgraphs the root reads."""
        p = self.p
        modules: dict[ModuleId, Module] = {}
        subgraph_ids: set[ModuleId] = set()
        for mid in self.subgraphs.values():
            subgraph_ids.update(reachable_modules(p.modules.__getitem__, mid))
        ids: dict[str, ModuleId] = {"": p.root}
        taken = Names(subgraph_ids)
        taken.add(p.root)

        def holder_id(path: str) -> ModuleId:
            found = ids.get(path)
            if found is None:
                found = ids[path] = kn.fresh_id(path, taken)
            return found

        for path, mid in p.walk():
            mod = p.modules[mid]
            if mod.kind == SUBGRAPH:
                continue
            kids = tuple(
                (name, holder_id(f"{path}.{name}" if path else name))
                for name, child in mod.children
                if p.modules[child].kind != SUBGRAPH
            )
            if path:
                type_name, kind = mod.type_name, mod.kind
                if path not in self.ran and len(p.module_paths(mid)) > 1:
                    # an object at several paths: import_ep knows the class of a path only
                    # from the module stacks of the nodes that ran in it
                    type_name, kind = None, _untyped_kind(kids)
                modules[holder_id(path)] = Module(type_name, kind, kids)
            else:
                kids += tuple(self.subgraphs.items())
                modules[p.root] = mod.replace(children=kids, graphs=(graph,))
        for mid in subgraph_ids:
            modules[mid] = p.modules[mid]
        return table_as(p, modules)


_UNDEFINED = object()


def _folds(node: Node, args: tuple, calls: set[str]) -> bool:
    """An integer ``getitem`` of a call that returned a tuple or list."""
    return (
        node.op == CALL_FUNCTION
        and ops.is_getitem(node.target)
        and len(args) == 2
        and type(node.args[0]) is Ref
        and node.args[0].name in calls
        and type(args[0]) in (tuple, IList)
        and type(args[1]) is int
        and -len(args[0]) <= args[1] < len(args[0])
    )


def _untyped_kind(kids: tuple) -> str:
    """The kind ``import_ep`` gives a holder of unknown class: a ModuleList when its children
    are ``0 .. n-1`` (a ModuleList is never called, so no stack names its class)."""
    names = [name for name, _ in kids]
    return MODULE_LIST if names and names == [str(i) for i in range(len(names))] else PLAIN
