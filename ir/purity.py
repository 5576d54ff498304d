"""Fingerprints for checking that nothing was written: exported programs and held tensors."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ir.program import Program
from ir.torch_seam import tensor_version


def tensor_versions(tensors: Iterable[Any]) -> tuple[tuple[int, int], ...]:
    """``(id, _version)`` of every tensor given (other objects are skipped)."""
    return tuple((id(t), tensor_version(t)) for t in tensors if isinstance(t, torch.Tensor))


def _version_of(value: Any) -> int | None:
    return tensor_version(value) if isinstance(value, torch.Tensor) else None


def program_tensor_versions(program: Program) -> tuple[tuple[int, int], ...]:
    """Versions of every tensor a Program holds, in a fixed order."""
    keys = sorted(program.tensors.keys())
    return tensor_versions(program.tensors[k].value for k in keys)


def ep_fingerprint(ep: torch.export.ExportedProgram) -> tuple:
    """Everything about ``ep`` that a pure reader must leave as it was.

    The graph's code and node meta keys, the signature, the module call graph, the graph
    module's meta keys, the state dict and constants (names, tensor identity and ``_version``)
    and the identity of the graph module and its submodules.
    """
    graph = ep.graph_module.graph
    nodes = tuple(
        (n.op, n.name, str(n.target), str(n.args), str(n.kwargs), tuple(sorted(n.meta)))
        for n in graph.nodes
    )
    stacks = tuple(str(n.meta.get("nn_module_stack")) for n in graph.nodes)
    state = tuple((k, id(v), _version_of(v)) for k, v in ep.state_dict.items())
    constants = tuple((k, id(v), _version_of(v)) for k, v in ep.constants.items())
    children = tuple((n, id(m)) for n, m in ep.graph_module.named_children())
    return (
        nodes,
        stacks,
        str(ep.graph_signature),
        str(ep.module_call_graph),
        tuple(sorted(ep.graph_module.meta)),
        state,
        constants,
        children,
        id(ep.graph_module),
        id(graph),
    )
