"""Hypothesis strategy: drawn programs with a pattern's sites planted in them.

:func:`planted_programs` draws a Program (``ir.strategies.programs`` by default) and plants one
or more instances of the given pattern graphs into its root graph, each at a drawn live value
with its readers around it, so that a pass over those patterns (a rewrite's rules) has work on
most draws, on any torch and any seed, where plain drawn programs hold a site by luck alone. The
law tests of a rule set draw from it (``tests/test_rewrite.py``).

How a site is planted: a tensor value ``x`` of the root graph is drawn among those that have a
reader that reaches the output (a live reader) and no reader that writes its arguments; the
pattern's ops are inserted just before one live reader, its first tensor argument bound to
``x``, the others to values drawn from those defined before the reader; the reader, and every
later reader of ``x`` in the same module frame that does not write its arguments, then reads the
pattern's first result instead of ``x``. The result is live, so dead-code removal keeps it. A
site is planted only where the pattern runs on the values chosen (its ops' fake run succeeds,
and so does one run on small real tensors of the values' dtypes and sizes: a dtype without a
kernel is refused there) and its result has ``x``'s dtype, shape and strides (so every
redirected reader still runs); elsewhere the draw plants nothing there, and the program is drawn
as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import attrs
import torch
from hypothesis import strategies as st

from ir.args import Ref, map_refs, ref, thaw
from ir.fake_run import FakeRunFailed, fake_value, hint, same_layout, same_val
from ir.graph import Graph
from ir.node import CALL_FUNCTION, OUTPUT, PLACEHOLDER, Node
from ir.program import Program
from ir.torch_seam import op_schema

PLANTED = "planted_"
"""The prefix of a planted node's name (what :func:`planted_count` counts)."""


def planted_programs(
    patterns: Sequence[Graph],
    programs: st.SearchStrategy[Program] | None = None,
    *,
    min_sites: int = 1,
    max_sites: int = 3,
) -> st.SearchStrategy[Program]:
    """Programs from ``programs`` with up to ``max_sites`` instances of ``patterns`` planted.

    Parameters:
        patterns: at least one pattern as an ``ir`` ``Graph`` (placeholders are its tensor
            arguments in order, scalars literals, its output one result or a tuple of them),
            e.g. ``transforms.machinery.trace.trace(rule.pattern, rule.example_inputs,
            TRAINING, rule.name, "pattern", sentinels=False).graph``.
        programs: flat programs to plant into (default ``ir.strategies.programs()``).
        min_sites / max_sites: how many plantings are tried per draw (each a drawn pattern at a
            drawn value; see the module docstring for where one plants nothing).

    Generates a Program that ``ir.verify``-s where the drawn one does; its planted nodes are
    named ``planted_*``. Shrinks towards the drawn program's shrink, the first pattern, fewer
    sites and the first live value. Cost per site: O(nodes) plus one fake run per pattern op.
    """
    patterns = tuple(patterns)
    if not patterns or not all(isinstance(g, Graph) for g in patterns):
        raise ValueError("planted_programs: patterns must be a non-empty sequence of ir Graphs")
    if not 0 <= min_sites <= max_sites:
        raise ValueError(f"planted_programs: need 0 <= min_sites <= max_sites, got "
                         f"{min_sites}, {max_sites}")
    if programs is None:
        from ir.strategies.programs import programs as drawn

        programs = drawn()

    @st.composite
    def draw(d: Any) -> Program:
        p = d(programs)
        root = p.modules[p.root]
        graph = root.graphs[0]
        for k in range(d(st.integers(min_sites, max_sites))):
            pattern = patterns[d(st.integers(0, len(patterns) - 1))]
            graph = _plant(d, graph, pattern, k)
        if graph is root.graphs[0]:
            return p
        module = attrs.evolve(root, graphs=(graph, *root.graphs[1:]))
        return attrs.evolve(p, modules=p.modules.set(p.root, module))

    return draw()


def planted_count(p: Program) -> int:
    """How many planted nodes the root graph of ``p`` holds (0 after a pass removed them all).
    O(nodes)."""
    return sum(n.name.startswith(PLANTED) for n in p.modules[p.root].graphs[0].nodes)


def _writes(n: Node) -> bool:
    schema = op_schema(n.target)
    return schema is None or schema.is_mutable


def _live(graph: Graph) -> set[str]:
    live: set[str] = set()
    for n in reversed(graph.nodes):
        if n.op == OUTPUT or n.name in live:
            live.update(r.name for r in n.inputs())
    return live


def _runs(made: Sequence[Node], vals: dict[str, Any]) -> bool:
    # a fake run passes where a kernel for the dtype is missing (``relu`` of bools): the ops run
    # once on small real tensors of the values' dtypes and sizes
    env: dict[str, Any] = {}

    def read(r: Ref) -> Any:
        if r.name not in env:
            v = vals[r.name]
            env[r.name] = torch.zeros([int(hint(s)) for s in v.shape], dtype=v.dtype)
        return env[r.name]

    try:
        for n in made:
            env[n.name] = n.target(*thaw(n.args, read), **dict(thaw(n.kwargs, read)))
    except Exception:  # noqa: BLE001 - an operator's refusals share no base class
        return False
    return True


def _plant(d: Any, graph: Graph, pattern: Graph, k: int) -> Graph:
    nodes = graph.nodes
    index = {n.name: i for i, n in enumerate(nodes)}
    users = graph.users()
    live = _live(graph)
    # a value some reader writes (in place, or through an op without a schema) is never chosen:
    # redirecting part of its readers would split what the write is seen by
    candidates = [
        n for n in nodes
        if n.name in live and isinstance(n.meta.get("val"), torch.Tensor)
        and any(nodes[index[u]].op == CALL_FUNCTION and u in live for u in users[n.name])
        and not any(nodes[index[u]].op == CALL_FUNCTION and _writes(nodes[index[u]])
                    for u in users[n.name])
    ]
    if not candidates:
        return graph
    x = candidates[d(st.integers(0, len(candidates) - 1))]
    readers = [nodes[index[u]] for u in users[x.name]
               if nodes[index[u]].op == CALL_FUNCTION and u in live]
    first = readers[d(st.integers(0, len(readers) - 1))]
    at = index[first.name]
    frame = first.meta.get("nn_module_stack")
    before = [n for n in nodes[:at] if isinstance(n.meta.get("val"), torch.Tensor)]
    vals = {n.name: n.meta.get("val") for n in nodes}
    taken = set(index)
    bound: dict[str, Ref] = {}
    for j, ph in enumerate(pattern.placeholders):
        bound[ph.name] = x.ref if j == 0 else before[d(st.integers(0, len(before) - 1))].ref
    made: list[Node] = []
    for n in pattern.nodes:
        if n.op != CALL_FUNCTION:
            continue
        name = f"{PLANTED}{k}_{n.name}"
        while name in taken:
            name += "_"
        taken.add(name)
        args = map_refs(n.args, lambda r: bound[r.name])
        kwargs = map_refs(n.kwargs, lambda r: bound[r.name])
        try:
            val = fake_value(n.target, args, kwargs, lambda r: vals.get(r.name))
        except FakeRunFailed:
            return graph  # the pattern does not run on the values chosen: nothing planted
        if val is None:
            return graph
        vals[name] = val
        meta: dict[str, Any] = {"val": val}
        if frame is not None:
            meta["nn_module_stack"] = frame
        made.append(Node(CALL_FUNCTION, name, n.target, args, kwargs, MappingProxyType(meta)))
        bound[n.name] = ref(name)
    out = pattern.outputs
    result = out[0] if isinstance(out, (tuple, list)) else out
    if not isinstance(result, Ref) or result.name not in bound or not made:
        return graph
    new = bound[result.name]
    if not (same_val(vals[new.name], x.meta["val"]) and same_layout(vals[new.name], x.meta["val"])):
        return graph  # the result cannot stand where x stood
    if any(n.op == PLACEHOLDER for n in nodes[at:]) or not _runs(made, vals):
        return graph

    def redirect(n: Node) -> Node:
        if n.op != CALL_FUNCTION or index[n.name] < at or x.name not in users or \
                n.meta.get("nn_module_stack") != frame or n.name not in users[x.name]:
            return n
        swap = (lambda r: new if r.name == x.name else r)
        return attrs.evolve(n, args=map_refs(n.args, swap), kwargs=map_refs(n.kwargs, swap))

    return Graph.of([*nodes[:at], *made, *(redirect(n) for n in nodes[at:])])


__all__ = ["PLANTED", "planted_count", "planted_programs"]
