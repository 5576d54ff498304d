"""``cse``: nodes that compute what an earlier node of their graph computed read that node."""

from __future__ import annotations

import math
from typing import Any

from ir import ops
from ir.args import IDict, IList, ISlice, Ref
from ir.effects import Effects, binds_symbols, graph_effects
from ir.gcpause import gc_paused
from ir.graph import Graph
from ir.module import ModuleId
from ir.node import CALL_FUNCTION, CALL_METHOD, GET_ATTR, Node
from ir.program import Program
from transforms import kernel as kn
from transforms.machinery.each_graph import map_graphs, signature_names
from transforms.machinery.pass_checks import require_program

__all__ = ["cse", "literal_key"]


@gc_paused
def cse(p: Program, *, listener: kn.Listener | None = None) -> Program:
    """Merge the nodes of each graph that compute the same value from the same values.

    A driver on the rewriting kernel (``transforms.kernel``): each graph is streamed through a
    ``WorkingGraph``, a merged node is ``replace`` d by its representative there, and the
    output specs follow the kernel's finalisation (``finalised``).

    Parameters:
        p: a Program, flat or outlined (each graph of the module table once).
        listener: a ``kernel.Listener`` told of each merge (``replaced(node, representative)``,
            then ``erased(node)``); ``None``: nobody.

    Returns:
        ``p`` itself when no two nodes merge; else a Program in which a node whose key equals
        that of an earlier node of its graph is gone and every use of it (later nodes, the
        outputs, the root's output specs) reads the earlier node. The key is the node's op,
        target, module call (its ``nn_module_stack``: values are not moved across module calls,
        so ``outline`` still sees the same call boundaries) and arguments, with each value
        argument replaced by its representative and each literal by ``literal_key`` (which
        keeps literal types: ``x * 2`` and ``x * 2.0``, ``1`` and ``True``, ``0.0`` and
        ``-0.0`` differ), arguments in schema order with defaults filled where the operator
        has a schema (``add(x, y)`` and ``add(x, y, alpha=1)`` merge). Only ``get_attr`` reads
        and operators that are pure (``ops.impurity`` empty: not mutating, random, effectful
        or higher-order) merge; ``call_module`` nodes never do. A value that is written in
        place anywhere in its graph, directly or through a view, alias or module call
        (``ir.effects.graph_effects``), never merges (so a copy later written in
        place stays a copy); a node that reads a written value merges only with one that read
        it between the same writes. A node that a preserved call signature names, or that
        defines unbacked symbols (``binds_symbols``), is kept.

    Raises:
        NotAProgramError: ``p`` is not a Program.

    **Laws:**

    - identity: a program without repeated computations is returned as is; hence
      idempotent: ``f(f(p)) is f(p)``;
    - semantics: ``lower(f(p))`` returns the same outputs and leaves the same state as
      ``lower(p)`` (two outputs that computed one value may now be one tensor);
    - monotone: ``f(p).node_count() <= p.node_count()``; input specs and preserved call
      signatures unchanged; kept nodes keep their names and meta;
    - ``verify`` holds of the result whenever it holds of ``p``.

    Complexity: O(n) in the nodes of all graphs (times the size of a node's arguments).
    """
    require_program(p, "cse")
    named = signature_names(p)
    renames: dict[ModuleId, dict[str, str]] = {}  # module -> merged name -> representative

    def merge(mid: ModuleId, graph: Graph) -> Graph:
        effects = graph_effects(p, mid, graph)
        version: dict[str, int] = {}  # alias group -> writes seen so far
        seen: dict[Any, Ref] = {}
        w = kn.WorkingGraph(graph, indexed=False, listener=listener)
        for n in graph.nodes:
            node = w.rewired(n)
            if (
                _mergeable(node, effects)
                and n.name not in named
                and not effects.is_written(n.name)
                and not binds_symbols(n)
            ):
                key = _key(node, effects, version)
                found = seen.get(key)
                if found is not None:
                    w.replace(n.name, found)
                    continue
                seen[key] = node.ref
            w.add(node)
            for group in dict.fromkeys(effects.group(v) for v in effects.writes(n.name)):
                version[group] = version.get(group, 0) + 1
        out, merged = w.finish()
        if merged:
            renames.setdefault(mid, {}).update(merged)
        return out

    return kn.finalised(p, map_graphs(p, merge), renames)


def _mergeable(node: Node, effects: Effects) -> bool:
    if node.op == GET_ATTR:
        return True
    return node.op in (CALL_FUNCTION, CALL_METHOD) and not effects.has_effect(node.name)


def _key(node: Node, effects: Effects, version: dict[str, int]) -> tuple:
    args: Any = node.args
    kwargs: Any = node.kwargs
    if node.op == CALL_FUNCTION and ops.facts(node.target).params:
        normal = ops.normalized_args(node.target, args, kwargs)
        if normal is not None:
            args, kwargs = normal, ()
    versions = tuple(
        version.get(effects.group(r.name), 0)
        for r in node.inputs()
        if effects.is_written(r.name)
    )
    frames = node.module_frames
    return (
        node.op,
        _target_key(node.target),
        frames,
        literal_key(args),
        literal_key(kwargs),
        versions,
    )


def _target_key(target: Any) -> Any:
    try:
        hash(target)
    except TypeError:
        return ("id", id(target))
    return (type(target), target)


def literal_key(value: Any) -> Any:
    """A hashable key of an argument tree that is equal for two trees exactly when they pass
    the same arguments: literal types are kept (``2`` and ``2.0``, ``1`` and ``True`` differ),
    floats compare by their bits' value (``0.0`` and ``-0.0`` differ; NaN literals are equal
    to each other: an operator treats every NaN alike), ``Ref`` leaves by name, containers by
    kind (tuple, list, dict, slice) and items; any other object (a tensor, a script object)
    by identity. O(size of the tree)."""
    kind = type(value)
    if kind is Ref:
        return ("ref", value.name)
    if kind is float:
        return (float, "nan" if math.isnan(value) else value.hex())
    if kind is complex:
        return (complex, literal_key(value.real), literal_key(value.imag))
    if kind is tuple:
        return (tuple, tuple(literal_key(v) for v in value))
    if kind is IList:
        return (IList, tuple(literal_key(v) for v in value.items))
    if kind is IDict:
        return (IDict, tuple((literal_key(k), literal_key(v)) for k, v in value.items))
    if kind is ISlice:
        return (ISlice, literal_key((value.start, value.stop, value.step)))
    if value is None or kind in (bool, int, str):
        return (kind, value)
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    if isinstance(value, (int, float, str, tuple)):  # subclasses: torch.Size, enums
        return (kind, value)
    if kind.__module__.startswith("torch") and not hasattr(value, "shape"):
        return (kind, value)  # dtype, device, layout, memory_format
    return ("id", id(value))


