"""Delta debugging over a program's nodes, after hypothesis's shrinking.

Hypothesis shrinks the choices a program was drawn from; what is left often still holds nodes
that do not matter. :func:`reduce` then works on the program itself, keeping each step only while
the finding still holds (``still(candidate)``):

1. the program cut after one of its outputs (``lowering.fuzz.localize.truncated``: that
   output alone, the nodes after it dropped), the first output for which the finding holds;
   else dead code dropped (``transforms.passes.dce.eliminate_dead_code``);
2. each compute node, last first, *bypassed*: its uses read one of its own operands of the same
   shape and dtype instead (an in-place node is dropped, its uses reading the tensor it wrote),
   then dead code dropped again.

Every candidate is a valid program: a bypassed node's operand has the node's shape and dtype.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ir.args import Ref, map_refs
from ir.node import CALL_FUNCTION
from ir.ops import is_mutating
from ir.program import Program
from lowering.fuzz.localize import truncated
from transforms import kernel as kn
from transforms.passes.dce import eliminate_dead_code


def reduce(program: Program, still: Callable[[Program], bool], *, seconds: float = 60.0
           ) -> Program:
    """The smallest program reached from ``program`` by the steps of the module docstring,
    each kept only where ``still`` holds for it, within ``seconds``. ``program`` itself when
    no step is kept. O(nodes) calls of ``still``."""
    deadline = time.monotonic() + seconds
    best = program
    for name in _user_outputs(program):
        candidate = _dce(truncated(program, name))
        if candidate is not None and still(candidate):
            best = candidate
            break
    else:
        candidate = _dce(best)
        if candidate is not None and candidate is not best and still(candidate):
            best = candidate
    names = [n.name for n in best.root_module.graph.nodes if n.op == CALL_FUNCTION]
    for name in reversed(names):
        if time.monotonic() > deadline:
            break
        if name not in best.root_module.graph.by_name():
            continue
        candidate = bypassed(best, name)
        if candidate is None:
            continue
        smaller = _dce(candidate) or candidate
        if still(smaller):
            best = smaller
    return best


def bypassed(program: Program, name: str) -> Program | None:
    """``program`` with node ``name`` of its root graph bypassed (module docstring), or
    ``None`` when no operand can stand for it. O(nodes)."""
    graph = program.root_module.graph
    node = graph.node(name)
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    stand_in = None
    for arg in node.inputs():
        other = graph.node(arg.name).meta.get("val")
        if isinstance(other, torch.Tensor) and other.shape == val.shape \
                and other.dtype == val.dtype and other.device == val.device:
            stand_in = arg
            break
    if stand_in is None:
        return None
    if not is_mutating(node.target) and stand_in.name == name:
        return None

    def swap(r: Ref) -> Ref:
        return stand_in if r.name == name else r

    nodes = [n.replace(args=map_refs(n.args, swap), kwargs=map_refs(n.kwargs, swap))
             for n in graph.nodes if n.name != name]
    root = program.root_module
    modules = program.modules.set(program.root,
                                  root.replace(graphs=(kn.built(nodes),) + root.graphs[1:]))
    outputs = kn.renamed_outputs(program.signature, {name: stand_in.name})
    return program.replace(modules=modules, signature=outputs)


def _user_outputs(program: Program) -> list[str]:
    graph = program.root_module.graph
    names = [o.name for o in program.signature.outputs if o.kind == "user_output"]
    return [n for n in dict.fromkeys(names)
            if n in graph.by_name() and graph.node(n).op == CALL_FUNCTION]


def _dce(program: Program) -> Program | None:
    try:
        return eliminate_dead_code(program)
    except Exception:  # noqa: BLE001 - a program dce refuses is kept as it is
        return None


__all__ = ["bypassed", "reduce"]
