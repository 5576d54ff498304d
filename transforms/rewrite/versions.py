"""Writes in place that the e-graph sees functionally: the versions of a fresh intermediate.

``t2 = add_(t, r)`` writes ``t``'s memory; where ``t`` is a *fresh intermediate* (a pure
compute result, no input, state or view, whose memory no other value shares) nothing but the
writes and the readers of ``t`` can see that memory, so the write is the functional
``add(t, r)`` giving a new *version*: readers of ``t`` before the write read the old version,
readers after it (of ``t`` or of ``t2``) the new one. ``versions`` decides which written
values are such intermediates, reading the shared effect/alias analysis
(``ir.effects.graph_effects``: alias groups, what each node writes); the e-graph builds the
functional e-node of each such write (``egraph.from_graph``) and the extraction emits the
functional operator (``extracted.Builder``). Every other write (into an input, state, a view,
memory another value shares) stays a barrier: its values are leaves (``egraph.value_roles``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs
import torch

from ir import ops
from ir.effects import Effects, aliased_args, graph_effects, view_base
from ir.fake_run import FakeRunFailed, fake_value
from ir.graph import Graph
from ir.module import ModuleId
from ir.node import CALL_FUNCTION, OUTPUT, Node
from ir.program import Program

__all__ = ["Versions", "versions"]


@attrs.frozen
class Versions:
    """The writes of one graph seen functionally.

    - ``functional``: writer node name -> the functional operator it stands for
      (``ir.ops.functional_twin``);
    - ``members``: the names of the values of those alias groups (each base and its writers):
      not *written* for the e-graph, which holds a class per version;
    - ``rebind``: node name -> ``{argument name: the value it reads there}`` for each node
      that reads a member by an older name after a write (``relu(t)`` after ``add_(t, r)``
      reads the writer's version);
    - ``barriers``: the base of each written alias group left a barrier -> why (for the
      report and the tests)."""

    functional: Mapping[str, Any]
    members: frozenset[str]
    rebind: Mapping[str, Mapping[str, str]]
    barriers: Mapping[str, str]


NONE = Versions(MappingProxyType({}), frozenset(), MappingProxyType({}), MappingProxyType({}))


def versions(p: Program, mid: ModuleId, graph: Graph) -> Versions:
    """Which writes of ``graph`` (of module ``mid`` of ``p``) the e-graph sees functionally.

    An alias group (``Effects.group``) that some node writes is seen functionally when it is
    one fresh intermediate and its writes: exactly one value of the group is not a writer
    (the *base*), a pure ``call_function`` whose result is one tensor in new memory (its
    operator aliases no argument, ``ir.effects.aliased_args``; it is its own
    ``ir.effects.view_base``; not random, no effect); every other value is an in-place
    ``call_function`` writing one value of the group (``Effects.writes``), with a functional
    twin (``ir.ops.functional_twin``) that gives the shape, dtype and strides the write
    leaves (one fake run), neither random nor effectful otherwise, reading no value that
    stays written (``_demote``); and the graph's output reads no version but the last. A view, a module call or anything else
    that may share the memory joins the group (the analysis' alias groups), and the group
    stays a barrier; so do writes into inputs and state (a placeholder or ``get_attr`` base).

    **Laws:** a pure function of ``p`` and the graph; a value not in ``members`` is written
    exactly when ``graph_effects`` says so; every node reading a member after a write of its
    group reads the latest version by name or has it in ``rebind``. Complexity: O(n α(n))
    plus one fake run per write.
    """
    effects = graph_effects(p, mid, graph)
    if not effects.writers:
        return NONE
    by_name = graph.by_name()
    written = {effects.group(v) for w in effects.writers for v in effects.writes(w)}
    groups: dict[str, list[Node]] = {}
    for n in graph.nodes:
        if n.op != OUTPUT and effects.group(n.name) in written:
            groups.setdefault(effects.group(n.name), []).append(n)
    out = graph.output_node
    returned = frozenset(r.name for r in out.inputs()) if out is not None else frozenset()
    functional: dict[str, Any] = {}
    barriers: dict[str, str] = {}
    accepted: dict[str, list[Node]] = {}
    for g, nodes in groups.items():
        why = _refusal(nodes, effects, by_name, returned)
        if why is None:
            accepted[g] = nodes
            for w in nodes:
                if effects.writes(w.name):
                    functional[w.name] = ops.functional_twin(w.target)
        else:
            barriers[nodes[0].name] = why
    _demote(accepted, barriers, functional, effects)
    members = frozenset(n.name for nodes in accepted.values() for n in nodes)
    rebind: dict[str, dict[str, str]] = {}
    latest: dict[str, str] = {}
    for n in graph.nodes:
        if n.op == OUTPUT:
            break
        for r in n.inputs():
            if r.name not in members:
                continue
            now = latest.get(effects.group(r.name), r.name)
            if now != r.name:
                rebind.setdefault(n.name, {})[r.name] = now
        if n.name in members:
            latest[effects.group(n.name)] = n.name
    return Versions(
        MappingProxyType(functional), members,
        MappingProxyType({k: MappingProxyType(v) for k, v in rebind.items()}),
        MappingProxyType(barriers),
    )


def _refusal(nodes: list[Node], effects: Effects, by_name: Mapping[str, Node],
             returned: frozenset[str]) -> str | None:
    """Why the written alias group of ``nodes`` (graph order) stays a barrier, or ``None``;
    ``returned``: the names the graph's output reads."""
    base = nodes[0]
    writers = [n for n in nodes if effects.writes(n.name)]
    others = [n for n in nodes if not effects.writes(n.name)]
    if len(others) != 1 or others[0] is not base:
        shown = ", ".join(f"%{n.name}" for n in others[:4])
        return f"the written memory is shared by {len(others)} values ({shown})"
    if base.op != CALL_FUNCTION:
        what = {"placeholder": "an input or state (a placeholder), written for the caller",
                "get_attr": "state (get_attr), written for later calls"}
        return f"%{base.name} is {what.get(base.op, f'a {base.op}')}"
    if (effects.has_effect(base.name) or effects.is_random(base.name)
            or aliased_args(base) or view_base(base.name, by_name.get) != base.name
            or not isinstance(base.meta.get("val"), torch.Tensor)):
        return f"%{base.name} is not a fresh tensor computed by a pure operator"
    members = {n.name for n in nodes}
    for w in writers:
        if w.op == CALL_FUNCTION and ops.unknown_facts(w.target):
            return f"%{w.name}: {ops.unknown_facts(w.target)}"
        if w.op != CALL_FUNCTION or ops.functional_twin(w.target) is None:
            return f"%{w.name} writes in place with no functional twin"
        if effects.is_random(w.name) or ops.is_effectful(w.target):
            return f"%{w.name} is random or has an effect besides its write"
        wrote = effects.writes(w.name)
        if len(wrote) != 1 or wrote[0] not in members or aliased_args(w) != wrote:
            return f"%{w.name} writes other values than its first argument"
        if not _twin_keeps(w, by_name):
            return (f"%{w.name}'s functional twin gives another shape, dtype or layout than "
                    "the write leaves")
    for n in nodes[:-1]:
        if n.name in returned:
            return f"the output reads %{n.name} after it is written in place"
    return None


def _demote(accepted: dict[str, list[Node]], barriers: dict[str, str],
            functional: dict[str, Any], effects: Effects) -> None:
    """Make a barrier of each accepted group one of whose writes reads a value that stays
    written (a barrier's, directly or as the demotion spreads): such a write is a leaf of
    the e-graph (a read after a write), so it cannot be its twin's e-node. A worklist over
    the groups' writes: O(n)."""
    readers: dict[str, list[tuple[str, str]]] = {}  # group read -> (group, the write reading)
    todo: list[tuple[str, str, str]] = []
    for g, nodes in accepted.items():
        for w in nodes:
            if w.name not in functional:
                continue
            for r in w.inputs():
                rg = effects.group(r.name)
                if rg == g or not effects.is_written(r.name):
                    continue
                if rg in accepted:
                    readers.setdefault(rg, []).append((g, w.name))
                else:
                    todo.append((g, w.name, r.name))
    while todo:
        g, w, r = todo.pop()
        nodes = accepted.pop(g, None)
        if nodes is None:
            continue
        barriers[nodes[0].name] = (f"%{w} reads %{r}, which a barrier's write writes (a read "
                                   "after a write is a leaf)")
        for n in nodes:
            functional.pop(n.name, None)
        todo.extend((h, v, nodes[0].name) for h, v in readers.get(g, ()))


def _twin_keeps(w: Node, by_name: Mapping[str, Node]) -> bool:
    """Whether the functional twin of the write ``w``, run on the fake values of its
    arguments, gives what ``w`` leaves in memory: the same shape, dtype, device and strides
    (``add_`` keeps its first argument's dtype where ``add`` promotes, and its layout where
    ``add`` may choose another; a reader of strides would see the difference). One fake run."""
    val = w.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return False
    try:
        out = fake_value(ops.functional_twin(w.target), w.args, w.kwargs,
                         lambda r: by_name[r.name].meta.get("val") if r.name in by_name else None)
    except FakeRunFailed:
        return False
    return (isinstance(out, torch.Tensor) and out.shape == val.shape and out.dtype == val.dtype
            and out.device == val.device and (val.numel() <= 1 or out.stride() == val.stride()))
