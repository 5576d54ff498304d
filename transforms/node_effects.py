"""What a node does besides computing its result: the values it writes in place (through every
alias of them) and whether it has an effect at all, module calls included.

The cleanup passes (``eliminate_dead_code``, ``cse``, ``fold_constants``) ask these questions
of every graph of a program, flat or outlined. Answers are conservative: where purefx cannot
tell whether a result aliases an argument (a module call, a higher-order op, a Python function
that is not size arithmetic), it assumes that it does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ir import ops
from ir import signature as sg
from ir.args import Ref, collect_refs
from ir.graph import Graph
from ir.module import ModuleId, split_call_target
from ir.node import CALL_FUNCTION, CALL_METHOD, CALL_MODULE, GET_ATTR, PLACEHOLDER, Node
from ir.program import Program

__all__ = ["GraphWrites", "binds_symbols", "graph_writes", "has_effect", "written_state"]


@attrs.frozen
class GraphWrites:
    """The writes of one graph.

    - ``group``: node name -> the name standing for its alias group (values that may share
      memory: views, getitems, in-place results, conservatively module and higher-order calls);
    - ``written``: the alias groups some node writes in place;
    - ``writes``: node name -> the groups that node writes (only for nodes that write);
    - ``written_inputs``: positions of the graph's placeholders whose group is written (what a
      call of this graph writes of its arguments).
    """

    group: dict[str, str]
    written: frozenset[str]
    writes: dict[str, tuple[str, ...]]
    written_inputs: frozenset[int]

    def is_written(self, name: str) -> bool:
        """Whether the value ``name`` (or any alias of it) is written in place somewhere."""
        return self.group.get(name, name) in self.written


def graph_writes(p: Program, mid: ModuleId, graph: Graph, memo: dict | None = None) -> GraphWrites:
    """The ``GraphWrites`` of ``graph``, a graph of module ``mid`` of ``p``.

    Inputs that may be one tensor count as one alias group once one of them is written: the
    placeholders of a called graph (a caller may pass one tensor twice), the user inputs of
    the root, and root state inputs that name one tensor key (tied state). A ``call_module`` writes the arguments whose
    placeholders its callee's graph writes
    (found the same way, once per callee graph through ``memo``); an unresolvable call writes
    every argument. A mutating operator writes the arguments its schema marks ``Tensor(a!)``
    (every ``Ref`` argument when it has no schema).

    **Laws:** a value no node writes, directly or through an alias, is not written; the
    answer depends only on ``p``. Complexity: O(n α(n)) in the graph's nodes, plus each callee
    graph once.
    """
    memo = {} if memo is None else memo
    parent: dict[str, str] = {}

    def find(name: str) -> str:
        root = name
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(name, name) != root:  # path compression
            parent[name], name = root, parent[name]
        return root

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[rb] = ra

    direct: dict[str, tuple[str, ...]] = {}  # node -> names it writes
    for n in graph.nodes:
        parent.setdefault(n.name, n.name)
        if n.op in (CALL_FUNCTION, CALL_METHOD):
            facts = ops.facts(n.target)
            if _may_alias(facts):
                for r in n.inputs():
                    union(n.name, r.name)
            if facts.mutating:
                direct[n.name] = _written_names(n, facts)
        elif n.op == CALL_MODULE:
            for r in n.inputs():
                union(n.name, r.name)
            positions = _callee_writes(p, mid, n, memo)
            if positions is None:
                direct[n.name] = tuple(r.name for r in n.inputs())
            else:
                direct[n.name] = tuple(
                    a.name for i, a in enumerate(n.args) if i in positions and type(a) is Ref
                )
    written = {find(v) for vs in direct.values() for v in vs}
    for together in _input_classes(p, mid, graph):
        if any(find(name) in written for name in together):
            for name in together[1:]:
                union(together[0], name)
    writes = {k: tuple(dict.fromkeys(find(v) for v in vs)) for k, vs in direct.items() if vs}
    written = frozenset(g for gs in writes.values() for g in gs)
    group = {name: find(name) for name in parent}
    inputs = frozenset(
        i for i, ph in enumerate(graph.placeholders) if group[ph.name] in written
    )
    return GraphWrites(group, written, writes, inputs)


def written_state(p: Program, memo: dict | None = None) -> frozenset[str]:
    """The tensor keys of the state ``p`` may write: the target of a mutation output spec, or
    state a graph writes in place, directly or through an alias (``graph_writes``): the fqn a
    root placeholder's spec names, or a ``get_attr``'s under each path of its module.

    **Laws:** state whose tensor is not in the answer is read, never written, by every call of
    ``p``. Complexity: O(n α(n)) over the distinct graphs, plus O(state).
    """
    memo = {} if memo is None else memo
    state = p.state_table()
    fqns: list[str] = [s.target for s in p.signature.outputs if s.kind in sg.MUTATION_KINDS]
    specs = {s.name: s.target for s in p.signature.inputs}
    for mid, mod in p.module_table().items():
        for graph in mod.graphs:
            writes = graph_writes(p, mid, graph, memo)
            if not writes.written:
                continue
            for n in graph.nodes:
                if not writes.is_written(n.name):
                    continue
                if n.op == PLACEHOLDER and mid == p.root and n.name in specs:
                    fqns.append(specs[n.name])
                elif n.op == GET_ATTR:
                    fqns.extend(p.attr_fqn(mid, path, n.target) for path in p.module_paths(mid))
    return frozenset(state[f].tensor for f in fqns if f in state)


def has_effect(p: Program, mid: ModuleId, node: Node, memo: dict | None = None) -> bool:
    """Whether ``node`` (of a graph of module ``mid``) does anything besides computing its
    result: an impure operator (``ops.impurity``: mutating, random, effectful, higher-order),
    or a ``call_module`` whose callee graph holds such a node (recursively; an unresolvable or
    leaf module counts as having one). Placeholders, ``get_attr`` and outputs have none.

    ``memo`` (one per pass run) also remembers each target's answer: torch's effect
    registries are read once per target and run, not once per node.

    Complexity: O(1) per operator node; each callee graph is looked at once through ``memo``.
    """
    memo = {} if memo is None else memo
    if node.op in (CALL_FUNCTION, CALL_METHOD):
        target = node.target
        key = ("impure", id(target))
        found = memo.get(key)
        if found is None or found[0] is not target:
            found = memo[key] = (target, bool(ops.impurity(target)))
        return found[1]
    if node.op != CALL_MODULE:
        return False
    return _per_callee(
        p, mid, node, memo, "effect", True,
        lambda child, graph: any(has_effect(p, child, n, memo) for n in graph.nodes),
    )


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


def binds_symbols(node: Node) -> bool:
    """Whether ``node`` defines unbacked symbols (``meta["unbacked_bindings"]``: ``item()``,
    ``nonzero``): later nodes' fake values name them, so the cleanup passes keep such a node
    as it is (never dropped, merged or folded). O(1)."""
    return bool(node.meta.get("unbacked_bindings"))


def _may_alias(facts: ops.OpFacts) -> bool:
    """Whether the result may share memory with an argument (conservative)."""
    if facts.view or facts.alias_like or facts.getitem or facts.inplace or facts.mutating:
        return True
    if facts.kind in (ops.OVERLOAD, ops.PACKET):
        return False  # the schema says so: a functional, non-view operator returns new memory
    return not facts.size_arithmetic  # a higher-order op, a method, a Python function


def _written_names(n: Node, facts: ops.OpFacts) -> tuple[str, ...]:
    """The names of the values ``n`` writes: its schema's written arguments, else all of them."""
    normal = ops.normalized_args(n.target, n.args, n.kwargs) if facts.params else None
    if normal is None or not facts.written:
        if n.op == CALL_METHOD and n.args and type(n.args[0]) is Ref and not facts.written:
            return (n.args[0].name,)  # ``x.add_(y)``: a method writes its receiver
        return tuple(r.name for r in n.inputs())
    names = []
    for i in facts.written:
        value = normal[i] if i < len(normal) else None
        names.extend(r.name for r in _refs(value))
    return tuple(names)


def _refs(value: Any) -> list[Ref]:
    found: list[Ref] = []
    collect_refs(value, found)
    return found


def _callee(p: Program, mid: ModuleId, node: Node) -> tuple[ModuleId, Graph] | None:
    if type(node.target) is not str:
        return None
    path, variant = split_call_target(node.target)
    child = p.resolve(path, mid)
    if child is None:
        return None
    graphs = p.module_table()[child].graphs
    if variant >= len(graphs):
        return None
    return child, graphs[variant]


def _per_callee(
    p: Program, mid: ModuleId, node: Node, memo: dict, kind: str, unknown: Any,
    compute: Callable[[ModuleId, Graph], Any],
) -> Any:
    """``compute(child, graph)`` for the graph that ``node`` (a module call) runs, once per
    graph and ``kind`` through ``memo``; ``unknown`` (the answer that assumes the worst) for a
    callee that cannot be resolved, and while the graph's own answer is being computed (a cycle,
    never in a verified program)."""
    callee = _callee(p, mid, node)
    if callee is None:
        return unknown
    child, graph = callee
    key = (kind, child, id(graph))
    if key not in memo:
        memo[key] = unknown
        memo[key] = compute(child, graph)
    return memo[key]


def _callee_writes(p: Program, mid: ModuleId, node: Node, memo: dict) -> frozenset[int] | None:
    """The input positions the callee of ``node`` writes; ``None`` (all of them) when unknown."""
    return _per_callee(
        p, mid, node, memo, "writes", None,
        lambda child, graph: graph_writes(p, child, graph, memo).written_inputs,
    )

