"""``fold_into_state``: nodes a rewrite created that read only state become new constants.

A rule such as conv + batch-norm folding computes a new weight from parameters and buffers. In a
graph that is computed on every call; with ``Rule(..., fold_state=True)`` it is computed once,
when the program is rewritten, and held as new constant tensors (``Program.state`` kind
``constant``, outside the state dict, so ``state_dict`` keeps its keys).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch

from ir import signature as sg
from ir import state as st
from ir.args import thaw
from ir.effects import graph_effects, is_pure, written_state
from ir.node import CALL_FUNCTION, CALL_MODULE, PLACEHOLDER
from ir.program import Program
from transforms import kernel as kn
from transforms.new_state import NewState

_STATE_INPUTS = (sg.PARAMETER, sg.BUFFER, sg.CONSTANT_TENSOR)


def fold_into_state(p: Program, created: Collection[str]) -> Program:
    """Compute the nodes named in ``created`` that read only state that ``p`` never writes
    (parameters, buffers, constants) or other such nodes, and read their results from new
    constants instead.

    Parameters:
        p: a flat Program (its root graph holds the computation; an outlined one is returned as
            it is).
        created: names of root-graph nodes that may be folded (the nodes rules with
            ``fold_state=True`` created).

    Returns:
        ``p`` itself when nothing folds; else a Program whose folded nodes are gone, with one
        new ``constant_tensor`` placeholder (after the state inputs, before the user inputs:
        ``NewState``) and state entry ``<module>._folded_<node>`` for each folded value that
        something else reads. The tensors are computed under ``torch.no_grad`` from the
        program's tensors, never written. State that ``p`` writes (a buffer a ``buffer_mutation``
        output or an in-place op updates: ``written_state``) is not folded: its value changes
        from call to call. Nor is a node whose own value is written in place later, directly or
        through a view or alias (``ir.effects``' ``Effects.is_written``): a constant would be
        written by every call.

    **Laws:** semantics kept (the constants hold what the nodes computed); ``state_dict`` keys
    kept (constants are not in it); verify holds. Complexity: O(n) plus the folded arithmetic.
    """
    graph = p.root_module.graph
    if graph is None or not created or any(n.op == CALL_MODULE for n in graph.nodes):
        return p
    specs = {s.name: s for s in p.signature.inputs}
    written = written_state(p)
    effects = graph_effects(p, p.root, graph)
    values: dict[str, Any] = {}
    for n in graph.nodes:
        spec = specs.get(n.name) if n.op == PLACEHOLDER else None
        slot = p.state.get(spec.target) if spec is not None and spec.kind in _STATE_INPUTS else None
        if slot is not None and slot.tensor not in written:
            values[n.name] = p.tensor(spec.target)
    folded: dict[str, Any] = {}
    with torch.no_grad():
        for n in graph.nodes:
            if n.name not in created or n.op != CALL_FUNCTION:
                continue
            if not is_pure(n) or effects.is_written(n.name):
                continue  # a value written in place (through any alias) changes every call
            if not all(r.name in values for r in n.inputs()):
                continue
            result = n.target(*thaw(n.args, lambda r: values[r.name]),
                              **thaw(n.kwargs, lambda r: values[r.name]))
            if not isinstance(result, torch.Tensor):
                continue
            values[n.name] = folded[n.name] = result.detach().clone()
    if not folded:
        return p
    users = graph.users()
    new = NewState(p)
    w = kn.WorkingGraph(graph, indexed=False)  # streamed: the kernel names and places
    for n in graph.nodes:
        if n.name not in folded:
            w.keep(n)
        elif all(u in folded for u in users[n.name]):
            w.drop(n.name)  # only folded values read it
        else:
            read, _ = w.state_read(new, st.CONSTANT, f"_folded_{n.name}", folded[n.name],
                                   mid=p.root, anchor=n, root=True, val=n.meta.get("val"))
            w.add(read)
            w.replace(n.name, read.ref)
    out, renames = w.finish()
    root = p.root_module.replace(graphs=(out, *p.root_module.graphs[1:]))
    return kn.finalised(p, p.replace(modules=p.modules.set(p.root, root)), {p.root: renames}, new)


__all__ = ["fold_into_state"]
