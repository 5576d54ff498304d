"""``split_hop_bodies``: a set-grad or autocast body runs in the modules that made its nodes.

Export wraps code that runs under ``torch.no_grad()`` / ``torch.enable_grad()`` or
``torch.autocast`` in a higher-order op whose body is a subgraph:
``wrap_with_set_grad_enabled(enabled, body, *operands)`` and
``wrap_with_autocast(device, dtype, enabled, cache_enabled, body, *operands)``. The body's nodes
keep the module stacks of the code that made them (a rotary embedding inside an attention
layer, a ``Linear`` called inside the region), but the call itself carries one stack, often the
caller's, so outlining would leave the whole body in one module.

This pass cuts each such body into its *module runs*: maximal stretches of body nodes with one
module stack. Each run becomes a call of the same higher-order op, with the same mode arguments,
on a body of its own; values that one run makes and a later one reads leave the first call as
outputs and enter the second as operands. Every call, its body and the ``getitem`` nodes that
read its results carry the run's module stack, so ``outline`` places them, and the body with
them, in the module that made those nodes. Each call sets the mode on entry and restores the
caller's on exit, as the original did; the values computed are the same, because every node
still runs under the same mode.
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Mapping
from typing import Any

import attrs

from ir import ops
from ir.args import EMPTY_DICT, Ref, ref
from ir.graph import Graph
from ir.module import SUBGRAPH, Module, ModuleId
from ir.module_stack import Frame, stack_frames
from ir.names import Names, target_name
from ir.node import CALL_FUNCTION, GET_ATTR, OUTPUT, PLACEHOLDER, Node
from ir.program import Program
from ir.signature import TENSOR, ArgSpec, CallSignature
from ir.torch_seam import HigherOrderOperator
from transforms import kernel as kn
from transforms.machinery.call_targets import call_targets
from transforms.machinery.each_graph import signature_names
from transforms.machinery.module_table import table_as
from transforms.machinery.pass_checks import require_flat

log = logging.getLogger("purefx")

TRACEPOINT = "torch.ops.higher_order._export_tracepoint"
_INPUTS, _OUTPUTS = "module_call_inputs", "module_call_outputs"  # tracepoint kinds
# mode-setting higher-order op (as printed) -> position of its body argument
_SET_GRAD_AT = 1
BODY_ARGUMENT: Mapping[str, int] = {
    "torch.ops.higher_order.wrap_with_set_grad_enabled": _SET_GRAD_AT,
    "torch.ops.higher_order.wrap_with_autocast": 4,
}

StackKey = tuple  # the items of an ``nn_module_stack`` dict: comparable, hashable


def split_hop_bodies(p: Program) -> Program:
    """Split every set-grad / autocast call of the flat root graph into one call per module run
    of its body, each carrying that run's module stack.

    Parameters:
        p: a flat Program (as ``import_ep`` makes it). An outlined Program (one whose root graph
            calls modules) raises ``PassError``: run this pass before ``outline``.

    Returns:
        A Program in which each ``wrap_with_set_grad_enabled`` / ``wrap_with_autocast`` call
        whose body's nodes have one module stack carries that stack (with its ``get_attr`` and
        result ``getitem`` nodes), and a call whose body spans several stacks is replaced by one
        call per maximal run of body nodes with one stack, in body order. A new body is a
        subgraph module named ``<body>_<k>`` next to the old one, which is dropped when no node
        reads it any more. A ``getitem`` that read the old call keeps its name and reads the new
        call that makes its value; values passed between runs get new ``getitem`` nodes. Bodies
        nested in a body are split first, so a nested call lands in the run of its nodes' stack.
        A body node without a stack joins the run before it (the first run if none); a body
        ``get_attr`` (a nested body) goes into each run that reads it. Where the body hands an
        operand back unchanged, the readers of that result read the operand. A call whose result
        is read other than by integer ``getitem``, or whose body returns a constant, is left as
        it is (logged at DEBUG).

        A preserved call made inside a body (``preserve_module_call_signature`` on a module
        called under ``no_grad``) is left by export with an empty signature and its
        ``_export_tracepoint`` nodes in the body. For a set-grad body of the root graph, the
        tracepoints are dropped (they are identities) and the signature gets the values they
        marked, named as the root graph holds them after the split, so ``outline`` can preserve
        the call. The mode is then set inside the preserved module's graph, not around its
        call: a module swapped in for it runs in the caller's grad mode (same values). Other
        bodies that would move into a preserved call (autocast ones, where a swapped module
        would run without autocast, and nested bodies) are left as they are.

    **Laws:**

    - identity: a Program without such a call, or whose calls already carry their bodies'
      single stacks, is returned as is (``split_hop_bodies(p) is p``); hence idempotent;
    - semantics: ``lower(split_hop_bodies(p))`` computes what ``lower(p)`` computes, with the
      same ``requires_grad`` and autocast dtypes on every value, and leaves grad mode and
      autocast state as they were;
    - names: every root node other than the split calls and their ``get_attr`` nodes keeps its
      name (a ``getitem`` changes meta and arguments; one that reads an operand handed back is
      gone, and its readers read the operand), and every other node keeps its meta;
    - ``verify`` holds of the result whenever it holds of ``p``.

    A driver on the rewriting kernel (``transforms.kernel``): each graph it changes (the root, a
    body with nested calls, a body without tracepoints, each run's new body) is streamed
    through a ``WorkingGraph``, which names and derives the new nodes (``derive``: the anchor's
    meta with the run's stack) and rewires the readers of a handed-back operand (``replace``);
    new attribute and module names come from ``kernel.fresh_id``.

    Complexity: O(n) in the nodes of the root graph and of the bodies, each body read once.
    """
    require_flat(p, "split_hop_bodies")
    graph = p.root_module.graph
    if graph is None:
        return p
    if not any(_target_body_position(t) is not None for t in call_targets(graph)):
        return p
    return _Splitter(p).run()


def _target_body_position(target: Any) -> int | None:
    if not isinstance(target, HigherOrderOperator):
        return None  # checked first: naming an operator costs microseconds
    return BODY_ARGUMENT.get(target_name(target))


def _stack(node: Node) -> dict | None:
    return node.meta.get("nn_module_stack") or None


def _key(stack: Mapping | None) -> StackKey | None:
    return tuple(stack.items()) if stack else None


class _Run:
    """A maximal stretch of body nodes with one module stack, as it is collected."""

    def __init__(self, stack: dict | None) -> None:
        self.stack = stack
        self.nodes: list[Node] = []
        self.inputs: dict[str, None] = {}  # body values it reads from outside, first read first
        self.outputs: dict[str, None] = {}  # values it makes that a later run or the output reads


class _Splitter:
    """The module table as it is rewritten; each body is rewritten once (``done``)."""

    def __init__(self, p: Program) -> None:
        self.p = p
        self.table: dict[ModuleId, Module] = dict(p.module_table())
        self.ids = Names(self.table)
        self.done: dict[ModuleId, Graph] = {}
        self.dropped: set[ModuleId] = set()
        self.signatures: dict[str, CallSignature] = {}  # preserved calls made inside a body

    def run(self) -> Program:
        p = self.p
        self._rewrite(p.root, p.root_module.graph)
        if len(self.table) == len(p.modules) and all(
            self.table.get(mid) is mod for mid, mod in p.module_table().items()
        ):
            return p
        held = {c for mod in self.table.values() for _, c in mod.children}
        for mid in self.dropped - held:
            del self.table[mid]
        signatures = p.call_signatures.update(self.signatures)
        return p.replace(modules=table_as(p, self.table), call_signatures=signatures)

    # --- one graph ---------------------------------------------------------------------------

    def _rewrite(self, owner: ModuleId, graph: Graph) -> Graph:
        """``graph`` (of module ``owner``) with its set-grad / autocast calls split; records the
        owner's new children in the table. Returns ``graph`` itself when nothing changes."""
        users = graph.users()
        by_name = graph.by_name()
        out: list[Node] = []
        moved: set[str] = set()  # getitems re-emitted with their call
        split_reads: set[str] = set()  # get_attr nodes of bodies that were replaced
        # the kernel's working graph names and derives the new nodes; a getitem of an operand
        # the body hands back is replaced there by the operand (its readers are rewired)
        w = kn.WorkingGraph(graph, indexed=False)
        kids = Names(name for name, _ in self.table[owner].children)
        if owner == self.p.root:  # a root attribute name must not shadow state either
            kids.update(fqn.partition(".")[0] for fqn in self.p.state_order)
        new_children: list[tuple[str, ModuleId]] = []

        for node in graph.nodes:
            if node.name in moved:
                continue
            node = w.rewired(node)
            at = _target_body_position(node.target) if node.op == CALL_FUNCTION else None
            made = None if at is None else self._split_call(
                owner, node, at, by_name, users, w, kids, new_children
            )
            if made is None:
                out.append(node)
                continue
            out.extend(made)
            moved.update(users[node.name])
            split_reads.add(node.args[at].name)
        if not split_reads:
            return graph
        read = {r.name for n in out for r in n.inputs()}
        for n in out:
            if n.name in split_reads and n.name not in read:
                w.drop(n.name)
            else:
                w.add(n)
        new_graph = w.finish()[0]
        targets = {n.target for n in new_graph.nodes if n.op == GET_ATTR}
        mod = self.table[owner]
        children = []
        for name, mid in mod.children:
            if name in targets or self.table[mid].kind != SUBGRAPH:
                children.append((name, mid))
            else:
                self.dropped.add(mid)
        graphs = (new_graph,) + mod.graphs[1:]
        self.table[owner] = mod.replace(children=tuple(children + new_children), graphs=graphs)
        return new_graph

    def _body(self, owner: ModuleId, target: str) -> tuple[ModuleId, Graph] | None:
        """The body module that ``get_attr[target]`` in ``owner`` reads, with nested calls in its
        graph split first (once per body)."""
        mid = self.p.resolve(target, owner)
        if mid is None or self.table[mid].kind != SUBGRAPH or self.table[mid].graph is None:
            return None
        if mid not in self.done:
            self.done[mid] = self._rewrite(mid, self.table[mid].graph)
        return mid, self.done[mid]

    # --- one call ----------------------------------------------------------------------------

    def _split_call(
        self,
        owner: ModuleId,
        call: Node,
        at: int,
        by_name: Mapping[str, Node],
        users: Mapping[str, tuple[str, ...]],
        w: kn.WorkingGraph,
        kids: Names,
        new_children: list[tuple[str, ModuleId]],
    ) -> list[Node] | None:
        """The nodes that replace ``call`` and the ``getitem`` nodes reading it, or ``None`` to
        keep them as they are."""
        read = by_name.get(call.args[at].name) if isinstance(call.args[at], Ref) else None
        if read is None or read.op != GET_ATTR:
            return None
        found = self._body(owner, read.target)
        if found is None:
            return None
        body_id, body = found
        getitems = [by_name[u] for u in users[call.name]]
        if not all(_is_index(g, call.name) for g in getitems):
            log.debug("split_hop_bodies: %s is read other than by getitem; kept", call.name)
            return None
        # a preserved call swapped for a module that autocast must reach would run outside
        # the region (see the docstring): only set-grad bodies give up their tracepoints
        traced = self._traced_calls(body) if owner == self.p.root and at == _SET_GRAD_AT else {}
        if traced:
            body, traced = _untraced(body, traced)
        runs = _runs(body)
        if not runs or (len(runs) == 1 and _in_place(runs[0].stack, call, getitems) and not traced):
            return None
        if self._enters_preserved(call, runs, traced):
            log.debug("split_hop_bodies: the body of %s enters a preserved call; kept", call.name)
            return None
        returned = body.outputs
        if not isinstance(returned, (tuple, list)) or not all(isinstance(v, Ref) for v in returned):
            log.debug("split_hop_bodies: the body of %s returns a constant; kept", call.name)
            return None
        if len(runs) == 1 and not traced:
            return self._restack(call, at, read, runs[0].stack, getitems, w)
        operands = call.args[at + 1 :]
        if len(operands) != len(body.placeholders):
            return None
        outer: dict[str, Any] = {ph.name: v for ph, v in zip(body.placeholders, operands)}
        readers: dict[int, list[Node]] = {}
        for g in getitems:
            readers.setdefault(g.args[1], []).append(g)
        handed_back = self._handed_back(returned, readers, outer, by_name, users)
        for i in handed_back:
            for g in readers.get(i, ()):
                w.replace(g.name, outer[returned[i].name])
        returned = [v for i, v in enumerate(returned) if i not in handed_back]
        # ordered (a dict, not a set): it decides the order of a run's outputs
        crossing = dict.fromkeys(r.name for ins, outs in traced.values() for r in ins + outs)
        _wire(runs, body, returned, crossing)
        by_value: dict[str, list[Node]] = {}
        for i, v in enumerate(body.outputs):
            if i not in handed_back:
                by_value.setdefault(v.name, []).extend(readers.get(i, ()))
        body_nodes = body.by_name()
        made: list[Node] = []
        for k, run in enumerate(runs):
            name = kn.fresh_id(f"{read.target}_{k}", kids)
            mid = kn.fresh_id(
                name if owner == self.p.root else f"{owner}.{name}", self.ids
            )
            self.table[mid] = _piece(run, body, body_nodes, self.table[body_id])
            new_children.append((name, mid))
            stack = run.stack
            attr = w.derive(read, base=read.name, op=GET_ATTR, target=name, args=(),
                            kwargs=EMPTY_DICT, meta=_stacked(stack))
            args = call.args[:at] + (attr.ref,) + tuple(outer[v] for v in run.inputs)
            # the body's own vals of what the run returns (no fake run: the nodes are the body's)
            vals = tuple(body_nodes[v].meta.get("val") for v in run.outputs)
            hop = w.derive(call, name=call.name if k == 0 else None, base=call.name, args=args,
                           meta={**_stacked(stack), "val": vals})
            hop_name = hop.name
            made += [attr, hop]
            for i, v in enumerate(run.outputs):
                named = by_value.get(v, [])
                for g in named:
                    made.append(g.replace(args=(ref(hop_name), i)).with_meta(**_stacked(stack)))
                if named:
                    outer.setdefault(v, named[0].ref)  # a returned operand keeps its root name
                elif v in crossing or any(v in later.inputs for later in runs[k + 1 :]):
                    g = w.derive(body_nodes[v], base=v, op=CALL_FUNCTION, target=operator.getitem,
                                 args=(ref(hop_name), i), kwargs=EMPTY_DICT, meta=_stacked(stack))
                    made.append(g)
                    outer[v] = g.ref
        for fqn, (ins, outs) in traced.items():
            self.signatures[fqn] = _filled(self.p.call_signatures[fqn], ins, outs, outer)
        log.debug("split_hop_bodies: %s split into %d calls", call.name, len(runs))
        return made

    def _handed_back(
        self, returned: Any, readers: Mapping[int, list[Node]], outer: Mapping[str, Any],
        by_name: Mapping[str, Node], users: Mapping[str, tuple[str, ...]],
    ) -> set[int]:
        """Output positions where the body returns one of its operands unchanged (as export
        does for a value a preserved call inside it passes on): the readers of that position
        read the operand itself, unless the position's ``getitem`` is named by a signature or
        returned by the graph."""
        named = self.named
        found = set()
        for i, v in enumerate(returned):
            if not isinstance(outer.get(v.name), Ref):
                continue
            if all(
                g.name not in named and all(by_name[u].op != OUTPUT for u in users[g.name])
                for g in readers.get(i, ())
            ):
                found.add(i)
        return found

    @functools.cached_property
    def named(self) -> set[str]:
        """Every value name that a signature of the program names (built once)."""
        return {s.name for s in self.p.signature.outputs if s.name} | signature_names(self.p)

    def _traced_calls(self, body: Graph) -> dict[str, tuple[tuple[Ref, ...], tuple[Ref, ...]]]:
        """Preserved calls made inside ``body`` whose signature export left empty: fqn -> the
        values its ``_export_tracepoint`` nodes mark as its inputs and outputs. Only calls with
        one tracepoint of each kind, tensor arguments and one call of the module count."""
        marks: dict[str, dict[str, list[Node]]] = {}
        for node in body.nodes:
            path = _tracepoint_path(node)
            if path is not None:
                marks.setdefault(path, {}).setdefault(str(node.kwargs.get("kind")), []).append(node)
        found = {}
        signatures = self.p.call_signatures
        for fqn, kinds in marks.items():
            sig = signatures.get(fqn)
            ins, outs = kinds.get(_INPUTS, []), kinds.get(_OUTPUTS, [])
            if (
                sig is None or sig.inputs or sig.outputs or f"{fqn}@1" in signatures
                or len(ins) != 1 or len(outs) != 1
                or not all(isinstance(a, Ref) for a in ins[0].args + outs[0].args)
            ):
                continue
            found[fqn] = (ins[0].args, outs[0].args)
        return found

    def _enters_preserved(self, call: Node, runs: list[_Run], traced: Mapping) -> bool:
        """Whether a run would move into a preserved call that ``call`` is not already in and
        whose signature cannot be read from its tracepoints (``traced``): its operands would
        cross that call's signature, which export left empty for calls made inside a body."""
        preserved = self.p.call_signatures
        if len(preserved) <= 1:
            return False
        around = {f.call_name for f in _frames(_stack(call))}
        return any(
            f.call_name in preserved and f.call_name not in around and f.call_name not in traced
            for run in runs
            for f in _frames(run.stack)
        )

    def _restack(
        self, call: Node, at: int, read: Node, stack: dict | None, getitems: list[Node],
        w: kn.WorkingGraph,
    ) -> list[Node]:
        """A call whose body has one stack, moved there: same body, new stack on its nodes."""
        attr = w.derive(read, base=read.name, op=GET_ATTR, target=read.target, args=(),
                        kwargs=EMPTY_DICT, meta=_stacked(stack))
        args = call.args[:at] + (attr.ref,) + call.args[at + 1 :]
        made = [attr, call.replace(args=args).with_meta(**_stacked(stack))]
        return made + [g.with_meta(**_stacked(stack)) for g in getitems]


def _frames(stack: dict | None) -> tuple[Frame, ...]:
    return (stack_frames(stack) or ()) if stack else ()


def _is_index(node: Node, call: str | None) -> bool:
    """Whether ``node`` is ``getitem(%call, i)`` (any Ref when ``call`` is ``None``)."""
    return (
        node.op == CALL_FUNCTION
        and ops.is_getitem(node.target)
        and len(node.args) == 2
        and isinstance(node.args[0], Ref)
        and (call is None or node.args[0].name == call)
        and type(node.args[1]) is int
    )


def _in_place(stack: dict | None, call: Node, getitems: list[Node]) -> bool:
    """Whether ``call`` and its ``getitem`` readers already carry the body's ``stack``."""
    key = _key(stack)
    return key is None or all(_key(_stack(n)) == key for n in (call, *getitems))


def _runs(body: Graph) -> list[_Run]:
    """The maximal runs of computing body nodes with one module stack, in body order (a node
    without a stack joins the run before it; ``get_attr`` nodes go with their readers)."""
    runs: list[_Run] = []
    pending: list[Node] = []  # stackless nodes before the first stack
    for node in body.nodes:
        if node.op in (PLACEHOLDER, OUTPUT, GET_ATTR):
            continue
        stack = _stack(node)
        if stack is None:
            (runs[-1].nodes if runs else pending).append(node)
            continue
        if not runs or _key(runs[-1].stack) != _key(stack):
            runs.append(_Run(stack))
        if pending:
            runs[-1].nodes += pending
            pending = []
        runs[-1].nodes.append(node)
    if pending:
        runs.append(_Run(None))
        runs[-1].nodes += pending
    return runs


def _wire(
    runs: list[_Run], body: Graph, returned: tuple | list, crossing: Mapping[str, None]
) -> None:
    """Fill each run's inputs and outputs: what it reads from placeholders or earlier runs, and
    what later runs or the body's output read from it (a returned placeholder goes through the
    last run), and the ``crossing`` values a preserved call's signature names."""
    made_by: dict[str, _Run] = {n.name: run for run in runs for n in run.nodes}
    attrs = {n.name for n in body.nodes if n.op == GET_ATTR}
    for run in runs:
        for node in run.nodes:
            for r in node.inputs():
                source = made_by.get(r.name)
                if source is run or r.name in attrs:
                    continue
                run.inputs[r.name] = None
                if source is not None:
                    source.outputs[r.name] = None
    last = runs[-1]
    for v in returned:
        source = made_by.get(v.name)
        if source is None:
            last.inputs[v.name] = None
            source = last
        source.outputs[v.name] = None
    for v in crossing:
        source = made_by.get(v)
        if source is not None:
            source.outputs[v] = None


def _tracepoint_path(node: Node) -> str | None:
    """The path of the preserved call an ``_export_tracepoint`` node marks; ``None`` for
    another node."""
    if not (node.op == CALL_FUNCTION and isinstance(node.target, HigherOrderOperator)
            and target_name(node.target) == TRACEPOINT):
        return None
    return str(node.kwargs.get("path", "")).removeprefix("_export_root.")


def _untraced(body: Graph, traced: Mapping) -> tuple[Graph, dict]:
    """``body`` without the tracepoints of the ``traced`` calls (a ``getitem`` of a tracepoint
    is read as the value the tracepoint passed on: tracepoints are identities), and ``traced``
    with its values read the same way."""
    marked = {str(p): None for p in traced}
    w = kn.WorkingGraph(body, indexed=False)  # a read getitem is replaced by what it reads
    gone: set[str] = set()
    for node in body.nodes:
        if _tracepoint_path(node) in marked:
            gone.add(node.name)
            w.drop(node.name)
        elif _is_index(node, None) and node.args[0].name in gone:
            value = body.node(node.args[0].name).args[node.args[1]]
            w.replace(node.name, w.alias.get(value.name, value))
        else:
            w.keep(node)
    alias = w.alias
    renamed = {
        fqn: tuple(tuple(alias.get(r.name, r) for r in refs) for refs in marks)
        for fqn, marks in traced.items()
    }
    return w.finish()[0], renamed


def _filled(sig: CallSignature, ins: tuple, outs: tuple, outer: Mapping[str, Any]) -> CallSignature:
    """``sig`` with the flat inputs and outputs its tracepoints marked, named as the root graph
    now holds them."""
    named = [outer.get(r.name) for r in ins + outs]
    if not all(isinstance(v, Ref) for v in named):
        return sig  # left empty: outlining names the value that cannot cross
    specs = tuple(ArgSpec(TENSOR, v.name) for v in named)
    return attrs.evolve(sig, inputs=specs[: len(ins)], outputs=specs[len(ins) :])


def _piece(run: _Run, graph: Graph, body_nodes: Mapping[str, Node], body: Module) -> Module:
    """The body module of one run: its inputs, the nested bodies it reads, its nodes, its
    outputs (picked from the body ``graph`` through a ``kernel.WorkingGraph``; a value of an
    earlier run enters as a placeholder derived from its node)."""
    w = kn.WorkingGraph(graph, indexed=False)
    for v in run.inputs:
        n = body_nodes[v]
        w.add(n if n.op == PLACEHOLDER else w.derive(
            n, name=v, op=PLACEHOLDER, target=v, args=(), kwargs=EMPTY_DICT
        ))
    attrs: dict[str, None] = {}
    for node in run.nodes:
        for r in node.inputs():
            if body_nodes[r.name].op == GET_ATTR:
                attrs[r.name] = None
    for a in attrs:
        w.add(body_nodes[a])
    for node in run.nodes:
        w.add(node)
    new_graph = w.returning(tuple(ref(v) for v in run.outputs))
    read = {body_nodes[a].target for a in attrs}
    children = tuple((n, c) for n, c in body.children if n in read)
    return Module(type_name=None, kind=SUBGRAPH, children=children, graphs=(new_graph,))


def _stacked(stack: dict | None) -> dict[str, Any]:
    """The meta a node moved to module stack ``stack`` (``None``: kept where it is) changes."""
    return {} if stack is None else {"nn_module_stack": stack}
