"""The operator at the cause of a finding: the first node whose value already differs.

A backend's intermediate values cannot be read, so the program is cut: :func:`truncated` keeps
the nodes up to one node and returns that node's value alone. :func:`localize` runs the cut
programs, first node first, and names the operator of the first one the backend gets wrong (or
crashes on). A compiler bug that needs what follows the node (a fusion with a later op) shows at
the later node; one that needs nothing after it shows at the node itself.
"""

from __future__ import annotations

import time

import attrs
import torch

from ir.args import Ref
from ir.node import CALL_FUNCTION, OUTPUT
from ir.program import Program
from ir.signature import OutputSpec
from ir.torch_seam import pytree
from lowering.fuzz.backends import Backend
from lowering.fuzz.judge import Setup, operator_of
from lowering.fuzz.trial import try_program
from transforms import kernel as kn

MOST_CUTS = 16
"""The most cut programs :func:`localize` runs (the first nodes of the program)."""


def truncated(program: Program, name: str) -> Program:
    """``program`` cut after node ``name`` of its root graph: the nodes before it and itself,
    returning its value as the only output (no mutation outputs: writes in place before the cut
    still happen). O(nodes)."""
    graph = program.root_module.graph
    kept = []
    for node in graph.nodes:
        if node.op == OUTPUT:
            break
        kept.append(node)
        if node.name == name:
            break
    out = graph.output_node.replace(args=((Ref(name),),))
    root = program.root_module
    graphs = (kn.built((*kept, out)),) + root.graphs[1:]
    modules = program.modules.set(program.root, root.replace(graphs=graphs))
    signature = attrs.evolve(program.signature,
                             outputs=(OutputSpec(kind="user_output", name=name, target=None),))
    calls = program.call_signatures
    if "" in calls:
        leaf = pytree.tree_flatten(0)[1]
        calls = calls.set("", attrs.evolve(calls[""], out_spec=leaf))
    return with_live_calls(program.replace(modules=modules, signature=signature,
                                           call_signatures=calls))


def with_live_calls(program: Program) -> Program:
    """``program`` without the preserved call signatures (the root's kept) that name a value
    its root graph no longer has: what is left of a cut or reduced program's calls, each still
    true to the graph. ``program`` itself when none is dropped. O(nodes + signature specs)."""
    names = program.root_module.graph.by_name()
    calls = program.call_signatures
    stale = [path for path, sig in calls.items() if path != "" and any(
        spec.name is not None and spec.name not in names for spec in (*sig.inputs, *sig.outputs))]
    if not stale:
        return program
    for path in stale:
        calls = calls.discard(path)
    return program.replace(call_signatures=calls)


def localize(program: Program, backend: Backend, setup: Setup, kind: str,
             seconds: float | None = None) -> str | None:
    """The operator of the node :func:`first_wrong` names (``"aten.add.Tensor"``); ``None``
    when it names none. O(cuts * (lower + compile + run))."""
    name = first_wrong(program, backend, setup, kind, seconds)
    return None if name is None else operator_of(program.root_module.graph, name)


def first_wrong(program: Program, backend: Backend, setup: Setup, kind: str,
                seconds: float | None = None) -> str | None:
    """The name of the first node (of the first :data:`MOST_CUTS` tensor-valued compute nodes,
    tried within ``seconds``) whose :func:`truncated` program gives a finding of ``kind`` with
    ``backend``; ``None`` when none does. O(cuts * (lower + compile + run))."""
    tried = 0
    deadline = None if seconds is None else time.monotonic() + seconds
    for node in program.root_module.graph.nodes:
        if deadline is not None and time.monotonic() > deadline:
            return None
        if node.op != CALL_FUNCTION or not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        tried += 1
        if tried > MOST_CUTS:
            return None
        try:
            trial = try_program(truncated(program, node.name), (backend,), setup)
        except Exception:  # noqa: BLE001, S112 - a cut that cannot run says nothing
            continue
        verdict = trial.verdicts[backend.name]
        if trial.eager.error is None and verdict is not None and verdict.kind == kind:
            return node.name
    return None


__all__ = ["MOST_CUTS", "first_wrong", "localize", "truncated", "with_live_calls"]
