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
  changes dtype or shape, the ``val`` of each call of it and of everything downstream of those
  calls is derived again, up to the root, or the edit is refused where the change reaches a
  signature (an output spec, a preserved call) or a call whose graph was traced at the old
  shapes;
- **finalisation** (``renamed_outputs``, ``renamed_calls``): output specs and preserved call
  signatures follow the values that replaced the ones they named;
- the **listener hook** (``Listener``): a driver that may roll an edit back (the rule engine
  gives names back when a rule is not taken) hears of each node emitted and erased.

``rewrite_nodes`` (``transforms.edit``) and the rule engine (``transforms.rewrite.engine``) are
drivers on it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

import attrs

from ir import signature as sg
from ir.args import Ref, thaw
from ir.errors import PassError
from ir.fake_run import META, FakeRunFailed, describe, fake_value, same_val
from ir.graph import Graph
from ir.module import ModuleId, split_call_target
from ir.names import target_name
from ir.node import CALL_FUNCTION, CALL_METHOD, CALL_MODULE, OUTPUT, Node
from ir.program import Program

__all__ = [
    "META",
    "FakeRunFailed",
    "Listener",
    "base_name",
    "describe",
    "fake_value",
    "new_meta",
    "rederive_callers",
    "renamed_calls",
    "renamed_outputs",
    "same_val",
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


# --- writes --------------------------------------------------------------------------------------


# --- listener ------------------------------------------------------------------------------------


class Listener(Protocol):
    """What a driver that may roll an edit back hears from the kernel."""

    def emitted(self, node: Node) -> None:
        """``node`` was put in the graph being built."""

    def erased(self, name: str) -> None:
        """The node named ``name`` left the graph being built."""


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
    order: list[tuple[str, ModuleId]] = []
    seen: set[ModuleId] = set()
    for path, mid in p.walk():
        if mid not in seen:
            seen.add(mid)
            order.append((path, mid))
    for path, mid in reversed(order):  # children before their callers
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
                raise PassError(
                    f"{where} changes the dtype or shape of %{reads[0]}, and node {node.name!r} "
                    f"({target_name(node.target)}) no longer runs on it ({exc}); keep the "
                    "value's dtype and shape"
                ) from exc
        else:  # pragma: no cover - placeholders and get_attr read nothing
            nodes.append(node)
            continue
        old = node.meta.get("val")
        if new is None or same_val(old, new):
            nodes.append(node)
            continue
        if node.name in named:
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
        f"{where} changes the dtype or shape of %{read}, which call {node.name!r} of module "
        f"{node.target!r} reads (its graph was traced at the old shapes); keep the value's "
        "dtype and shape"
    )
