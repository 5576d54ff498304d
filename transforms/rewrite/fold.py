"""``fold_into_state``: nodes a rewrite created that read only state become new constants.

A rule such as conv + batch-norm folding computes a new weight from parameters and buffers. In a
graph that is computed on every call; with ``Rule(..., fold_state=True)`` it is computed once,
when the program is rewritten, and held as new constant tensors (``Program.state`` kind
``constant``, outside the state dict, so ``state_dict`` keeps its keys).
"""

from __future__ import annotations

from collections.abc import Collection
from types import MappingProxyType
from typing import Any

import attrs
import torch
from pyrsistent import pmap

from ir import ops
from ir import signature as sg
from ir import state as st
from ir.args import Ref, map_refs, ref, thaw
from ir.graph import Graph
from ir.names import Names, fresh_name
from ir.node import CALL_FUNCTION, CALL_MODULE, PLACEHOLDER, Node
from ir.program import Program

_STATE_INPUTS = (sg.PARAMETER, sg.BUFFER, sg.CONSTANT_TENSOR)


def fold_into_state(p: Program, created: Collection[str]) -> Program:
    """Compute the nodes named in ``created`` that read only state (parameters, buffers,
    constants) or other such nodes, and read their results from new constants instead.

    Parameters:
        p: a flat Program (its root graph holds the computation; an outlined one is returned as
            it is).
        created: names of root-graph nodes that may be folded (the nodes rules with
            ``fold_state=True`` created).

    Returns:
        ``p`` itself when nothing folds; else a Program whose folded nodes are gone, with one
        new ``constant_tensor`` placeholder (before the user inputs) and state entry
        ``<module>._folded_<node>`` for each folded value that something else reads. The
        tensors are computed under ``torch.no_grad`` from the program's tensors, never written.

    **Laws:** semantics kept (the constants hold what the nodes computed); ``state_dict`` keys
    kept (constants are not in it); verify holds. Complexity: O(n) plus the folded arithmetic.
    """
    graph = p.root_module.graph
    if graph is None or not created or any(n.op == CALL_MODULE for n in graph.nodes):
        return p
    specs = {s.name: s for s in p.signature.inputs}
    values: dict[str, Any] = {}
    for n in graph.nodes:
        spec = specs.get(n.name) if n.op == PLACEHOLDER else None
        if spec is not None and spec.kind in _STATE_INPUTS and spec.target in p.state:
            values[n.name] = p.tensor(spec.target)
    folded: dict[str, Any] = {}
    with torch.no_grad():
        for n in graph.nodes:
            if n.name not in created or n.op != CALL_FUNCTION:
                continue
            if not ops.facts(n.target).recomputable:
                continue
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
    frontier = [
        name for name in folded if any(u not in folded for u in users[name])
    ]
    taken = Names(n.name for n in graph.nodes)
    fqns = set(p.state)
    new_placeholders: list[Node] = []
    new_specs: list[sg.InputSpec] = []
    state = dict(p.state.items())
    tensors = dict(p.tensors.items())
    replace: dict[str, Ref] = {}
    for name in frontier:
        node = graph.node(name)
        fqn = _fresh_fqn(_module_path(node), name, fqns)
        pname = fresh_name("c_" + fqn.replace(".", "_"), taken)
        meta = {"val": node.meta["val"]} if "val" in node.meta else {}
        new_placeholders.append(Node(PLACEHOLDER, pname, pname, meta=_frozen(meta)))
        new_specs.append(sg.InputSpec(sg.CONSTANT_TENSOR, pname, fqn))
        state[fqn] = st.Slot(st.CONSTANT, fqn, True, False)
        tensors[fqn] = st.Opaque(folded[name])
        replace[name] = ref(pname)
    # the new placeholders go before the first user input, as export orders inputs
    inputs = list(p.signature.inputs)
    at = next((i for i, s in enumerate(inputs) if s.kind not in _STATE_INPUTS + (sg.CUSTOM_OBJ,)),
              len(inputs))
    placeholders = [n for n in graph.nodes if n.op == PLACEHOLDER]
    nodes = placeholders[:at] + new_placeholders + placeholders[at:]
    for n in graph.nodes:
        if n.op == PLACEHOLDER or n.name in folded:
            continue
        nodes.append(n.replace(
            args=map_refs(n.args, lambda r: replace.get(r.name, r)),
            kwargs=map_refs(n.kwargs, lambda r: replace.get(r.name, r)),
        ))
    root = p.root_module.replace(graphs=(Graph.of(nodes), *p.root_module.graphs[1:]))
    sig = attrs.evolve(p.signature, inputs=tuple(inputs[:at] + new_specs + inputs[at:]))
    return p.replace(
        modules=p.modules.set(p.root, root),
        state=pmap(state),
        state_order=p.state_order + tuple(s.target for s in new_specs),
        tensors=pmap(tensors),
        signature=sig,
    )


def _module_path(node: Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    return list(stack.values())[-1][0]


def _fresh_fqn(path: str, name: str, taken: set[str]) -> str:
    base = f"{path}._folded_{name}" if path else f"_folded_{name}"
    fqn, i = base, 1
    while fqn in taken:
        fqn, i = f"{base}_{i}", i + 1
    taken.add(fqn)
    return fqn


def _frozen(meta: dict) -> Any:
    return MappingProxyType(meta)


__all__ = ["fold_into_state"]
