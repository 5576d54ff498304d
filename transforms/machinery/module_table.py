"""The module table after outlining: the new graphs in place, holders made, the rest dropped.

``outline`` builds one graph per module call; ``with_outlined_modules`` puts them into the
Program: each module gets its graph variants (and a type and kind where it had none), paths
that held no module get holder modules, modules that state aliasing shows to be one object
become one id, higher-order-op subgraphs move under the module whose graph reads them, and
modules no path reaches any more are dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
from pyrsistent import pmap

from ir.args import Ref
from ir.graph import Graph
from ir.module import PLAIN, Module, ModuleId, kind_of_type
from ir.program import Program


def with_outlined_modules(
    p: Program,
    root_graph: Graph,
    variants: dict[ModuleId, list[Graph]],
    types: dict[ModuleId, str | None],
    subgraph_owner: dict[str, ModuleId],
    canon: dict[str, ModuleId],
    *,
    dropped_inputs: dict[str, str],
) -> Program:
    """``p`` with ``root_graph`` as the root's graph and ``variants[mid]`` as module ``mid``'s
    graphs (``types[mid]`` its type where the module has none); ``subgraph_owner`` maps a
    root subgraph attribute to the module whose graph reads it, ``canon`` a path to the module
    id it is one object with, and the root's input specs named in ``dropped_inputs`` (state
    sunk into ``get_attr`` reads) are dropped. Modules shared between old and new table are
    kept as they are (``is``). Complexity: O(modules + children).
    """
    modules = dict(p.module_table())
    for mid, graphs in variants.items():
        if mid not in modules:
            _ensure_path(modules, p.root, mid)
        mod = modules[mid]
        type_name = mod.type_name or types.get(mid)
        kind = mod.kind if mod.kind != PLAIN else kind_of_type(type_name)
        # built whole: its graphs are new, so ``Module.replace`` would find a change anyway
        modules[mid] = Module(
            type_name, kind, mod.children, tuple(graphs), leaf=mod.leaf, peers=mod.peers
        )
    root = modules[p.root].replace(graphs=(root_graph,))
    modules[p.root] = root
    signature = named_outputs(p.signature, root_graph.outputs)
    if dropped_inputs:
        inputs = tuple(s for s in signature.inputs if s.name not in dropped_inputs)
        signature = attrs.evolve(signature, inputs=inputs)
    _move_subgraphs(modules, p.root, subgraph_owner)
    if canon:  # children at aliased paths name the one module they are
        for mid, mod in list(modules.items()):
            kids = tuple((n, canon.get(c, c)) for n, c in mod.children)
            if kids != mod.children:
                modules[mid] = mod.replace(children=kids)
    reachable = reachable_modules(modules.__getitem__, p.root)
    # one new map (built in bulk, faster than setting each changed module in an evolver)
    table = pmap({mid: modules[mid] for mid in reachable})
    return p.replace(modules=table, signature=signature)


# --- helpers ----------------------------------------------------------------------------------


def named_outputs(signature: Any, out: Any) -> Any:
    """Output specs naming the values the root now returns (``out``: its graph's returned
    tree) at their positions: a read of an in-place result becomes a read of the state or
    input it mutated, an inlined value is read under its new name. ``signature`` itself when
    no name changes. O(outputs)."""
    values = out if isinstance(out, tuple) else (out,)
    if len(values) != len(signature.outputs):
        return signature
    specs = tuple(
        attrs.evolve(spec, name=value.name)
        if spec.name is not None and isinstance(value, Ref) and value.name != spec.name
        else spec
        for value, spec in zip(values, signature.outputs)
    )
    if all(a is b for a, b in zip(specs, signature.outputs)):
        return signature
    return attrs.evolve(signature, outputs=specs)


def _ensure_path(modules: dict[ModuleId, Module], root: ModuleId, path: str) -> None:
    """Create holder modules so that ``path`` exists (ids are paths)."""
    if not path or path in modules:
        return
    parent, _, name = path.rpartition(".")
    _ensure_path(modules, root, parent)
    parent_id = parent if parent else root
    modules[path] = Module()
    modules[parent_id] = modules[parent_id].with_child(name, path)


def _move_subgraphs(
    modules: dict[ModuleId, Module], root: ModuleId, owner: dict[str, ModuleId]
) -> None:
    """Re-parent higher-order-op subgraph modules under the module whose graph reads them."""
    for name, new_owner in owner.items():
        if new_owner in ("", root):
            continue
        sub = modules[root].child(name)
        if sub is None:
            continue
        kids = tuple((n, c) for n, c in modules[root].children if n != name)
        modules[root] = modules[root].replace(children=kids)
        modules[new_owner] = modules[new_owner].with_child(name, sub)


def table_as(p: Program, modules: Mapping[ModuleId, Module]) -> Any:
    """``p.modules`` made to hold exactly ``modules``: the ids not in it dropped, the modules
    that are not already there set, every other entry shared (``p.modules`` itself when none
    changes). O(modules)."""
    table = p.modules.evolver()
    for mid in p.modules:
        if mid not in modules:
            del table[mid]
    for mid, mod in modules.items():
        if p.modules.get(mid) is not mod:
            table[mid] = mod
    return table.persistent()


def reachable_modules(module_of: Callable[[ModuleId], Module], root: ModuleId) -> list[ModuleId]:
    """Every module id reachable from ``root`` through children (``module_of`` looks one up)."""
    seen: dict[ModuleId, None] = {}
    stack = [root]
    while stack:
        mid = stack.pop()
        if mid in seen:
            continue
        seen[mid] = None
        for _, child in module_of(mid).children:
            stack.append(child)
    return list(seen)
