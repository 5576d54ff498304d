"""Running a flat Program's root graph on real tensors, node by node: how the rewrite laws
(``check_rule``, ``check_rule_in_context``) see what a program computes, returns and writes.

The ``transforms`` layer may not lower programs (``lowering`` sits above it), and the laws must
run exactly the graph ``rewrite`` produced, so they interpret it: each ``call_function`` node
calls its target on the values of its arguments, as the lowered module's code does, so views
stay views and writes in place reach the tensors they write (a caller's input, a buffer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ir import signature as sg
from ir.args import thaw
from ir.errors import PassError
from ir.graph import Graph
from ir.harness import fresh
from ir.node import CALL_FUNCTION, GET_ATTR, OUTPUT, PLACEHOLDER
from ir.program import Program


def run_graph(graph: Graph, inputs: Sequence[Any]) -> tuple:
    """Run ``graph`` with its placeholders bound to ``inputs`` (in order); its outputs as a tuple.

    Raises ``PassError`` for a node that is neither a placeholder, a ``call_function`` nor the
    output (a graph that calls modules is not flat); an operator's own error propagates as is.
    Complexity: one call per node.
    """
    env: dict[str, Any] = {}
    placeholders = [n for n in graph.nodes if n.op == PLACEHOLDER]
    if len(placeholders) != len(inputs):
        raise PassError(f"run_graph: {len(placeholders)} placeholders, {len(inputs)} inputs given")
    for n, x in zip(placeholders, inputs):
        env[n.name] = x
    return _run(graph, env, None)


def run_program(p: Program, args: Sequence[Any], state: Mapping[str, Any]) -> tuple:
    """Run flat program ``p`` on user inputs ``args`` and state tensors ``state`` (fqn ->
    tensor); return its user outputs as a tuple.

    What the program writes lands where the lowered module would write it: a write in place
    writes the tensor given; a ``buffer_mutation`` / ``user_input_mutation`` output is copied
    into the buffer's / input's tensor at the end. So give copies, and read them afterwards.

    Raises ``PassError`` when ``p`` is not flat (its root graph calls modules), a state fqn is
    missing from ``state``, or ``args`` has the wrong length. Complexity: one call per node.
    """
    graph = p.root_module.graph
    spec = p.signature
    placeholders = [n for n in graph.nodes if n.op == PLACEHOLDER]
    users = [s for s in spec.inputs if s.kind == sg.USER_INPUT]
    if len(users) != len(args):
        raise PassError(f"run_program: the program takes {len(users)} inputs, {len(args)} given")
    env: dict[str, Any] = {}
    by_input: dict[str, Any] = {}
    j = 0
    for n, s in zip(placeholders, spec.inputs):
        if s.kind == sg.USER_INPUT:
            env[n.name] = args[j]
            by_input[s.name] = args[j]
            j += 1
        elif s.target in state:
            env[n.name] = state[s.target]
        else:
            raise PassError(f"run_program: no tensor given for state {s.target!r} ({s.kind})")
    results = _run(graph, env, state)
    outs = []
    for value, o in zip(results, spec.outputs):
        if o.kind in (sg.BUFFER_MUTATION, sg.PARAMETER_MUTATION):
            state[o.target].copy_(value)
        elif o.kind == sg.USER_INPUT_MUTATION:
            by_input[o.target].copy_(value)
        else:
            outs.append(value)
    return tuple(outs)


def program_state(p: Program) -> dict[str, Any]:
    """Fresh copies of ``p``'s state tensors, fqn -> tensor, as ``run_program`` takes them: one
    copy per tensor, shared by every fqn that names it (tied or shared state stays one tensor,
    so a write through one name is seen through the others, as in the lowered module); strides
    kept (``ir.harness.fresh``). ``p`` is not written. O(state elements)."""
    copies: dict[str, Any] = {}
    out: dict[str, Any] = {}
    for fqn, slot in p.state.items():
        value = p.tensors[slot.tensor].value
        if not isinstance(value, torch.Tensor):
            continue
        if slot.tensor not in copies:
            copies[slot.tensor] = fresh(value)
        out[fqn] = copies[slot.tensor]
    return out


def _run(graph: Graph, env: dict, state: Mapping[str, Any] | None) -> tuple:
    def read(r: Any) -> Any:
        return env[r.name]

    out: Any = ()
    for n in graph.nodes:
        if n.op == PLACEHOLDER:
            continue
        if n.op == OUTPUT:
            out = thaw(n.args[0], read)
        elif n.op == CALL_FUNCTION:
            env[n.name] = n.target(*thaw(n.args, read), **thaw(n.kwargs, read))
        elif n.op == GET_ATTR and state is not None and n.target in state:
            env[n.name] = state[n.target]
        else:
            raise PassError(
                f"the laws run flat graphs only; node %{n.name} is a {n.op} ({n.target})"
            )
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


__all__ = ["program_state", "run_graph", "run_program"]
