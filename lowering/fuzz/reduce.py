"""Delta debugging over a program's nodes, after hypothesis's shrinking.

Hypothesis shrinks the choices a program was drawn from; what is left often still holds nodes
that do not matter. :func:`reduce` then works on the program itself, keeping each step only while
the finding still holds (``still(candidate)``):

1. where the operator at the cause is known, one call of it *isolated* (:func:`isolated`): the
   program of that node alone, each operand it computed from other nodes made a new user input
   of the same shape and dtype; the first such call for which the finding holds ends the
   reduction (a one-operator bug gives a one-operator program). The node the caller localized
   (``at``: the first whose cut program is wrong, ``lowering.fuzz.localize.first_wrong``) is
   tried first, then the first :data:`MOST_ISOLATED` calls of the operator;
2. the program cut after one of its outputs (``lowering.fuzz.localize.truncated``: that
   output alone, the nodes after it dropped), the first output for which the finding holds;
   else dead code dropped (``transforms.passes.dce.eliminate_dead_code``);
3. compute nodes *bypassed*, last first, in chunks that halve (half the nodes at once, then a
   quarter, ..., then one by one): a bypassed node's uses read one of its own operands of the
   same shape and dtype instead (an in-place node is dropped, its uses reading the tensor it
   wrote), then dead code dropped again;
4. where step 3 made the program smaller, step 1 again on what is left (the call at the cause,
   past the first few in the drawn program, is often among them now).

Every candidate is a valid program: a bypassed node's operand has the node's shape and dtype,
and a preserved call signature naming a value the candidate no longer has is dropped
(``lowering.fuzz.localize.with_live_calls``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs
import torch
from pyrsistent import pmap

from ir.args import Ref, map_refs
from ir.node import CALL_FUNCTION, PLACEHOLDER
from ir.ops import is_mutating
from ir.program import Program
from ir.signature import USER_INPUT, USER_OUTPUT, InputSpec, OutputSpec
from ir.torch_seam import pytree
from lowering.fuzz.localize import truncated, with_live_calls
from transforms import kernel as kn
from transforms.passes.dce import eliminate_dead_code


def reduce(program: Program, still: Callable[[Program], bool], *, seconds: float = 60.0,
           cause: str | None = None, at: str | None = None) -> Program:
    """The smallest program reached from ``program`` by the steps of the module docstring,
    each kept only where ``still`` holds for it, within ``seconds``; ``cause``: the operator
    held to be at the cause (``"aten.add.Tensor"``), whose calls are isolated first; ``at``:
    the node of ``program`` held to be at the cause, isolated before them. ``program`` itself
    when no step is kept. O(nodes) calls of ``still`` (O(log nodes) when most nodes can go),
    plus at most ``2 * MOST_ISOLATED + 1`` isolations."""
    deadline = time.monotonic() + seconds
    alone = isolated_call(program, still, cause, at)
    if alone is not None:
        return alone
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
    names = _compute_nodes(best)[::-1]
    size = max(1, len(names) // 2)
    while names and time.monotonic() < deadline:
        start = 0
        while start < len(names) and time.monotonic() < deadline:
            candidate = best
            for name in names[start:start + size]:
                if name in candidate.root_module.graph.by_name():
                    candidate = bypassed(candidate, name) or candidate
            smaller = None if candidate is best else (_dce(candidate) or candidate)
            if smaller is not None and still(smaller):
                best = smaller
                live = best.root_module.graph.by_name()
                names = [n for n in names if n in live]
            else:
                start += size
        if size == 1:
            break
        size = max(1, size // 2)
    if best is not program:
        alone = isolated_call(best, still, cause, None)
        if alone is not None:
            return alone
    return best


def isolated_call(program: Program, still: Callable[[Program], bool], cause: str | None,
                   at: str | None) -> Program | None:
    """Step 1 of the module docstring: the :func:`isolated` program of the first of node ``at``
    and the first :data:`MOST_ISOLATED` calls of operator ``cause`` (either ``None``: none)
    that ``still`` holds for; ``None`` when none does. O(MOST_ISOLATED) calls of ``still``."""
    nodes = program.root_module.graph.nodes
    calls = [] if cause is None else [n.name for n in nodes
                                      if n.op == CALL_FUNCTION and str(n.target) == cause]
    first = [] if at is None else [at]
    for name in dict.fromkeys([*first, *calls[:MOST_ISOLATED]]):
        candidate = isolated(program, name)
        if candidate is not None and still(candidate):
            return candidate
    return None


MOST_ISOLATED = 3
"""The most calls of the operator at the cause that :func:`reduce` isolates, first first."""


def isolated(program: Program, name: str) -> Program | None:
    """``program`` reduced to node ``name`` of its root graph alone: every operand it reads
    that another node computed becomes a new user input (a placeholder of the operand's name
    and value, after the program's own user inputs), its value the only output, every user
    input positional, no preserved call but the root's. ``None`` when the node is no operator
    call, has no tensor value, or reads a non-tensor computed value. The placeholders the
    program had are kept (a reader leaves out what nothing reads). O(nodes)."""
    graph = program.root_module.graph
    node = graph.node(name)
    if node.op != CALL_FUNCTION or not isinstance(node.meta.get("val"), torch.Tensor):
        return None
    by_name = graph.by_name()
    fresh = []
    for ref in dict.fromkeys(r.name for r in node.inputs()):
        source = by_name[ref]
        if source.op == PLACEHOLDER:
            continue
        val = source.meta.get("val")
        if not isinstance(val, torch.Tensor):
            return None
        fresh.append(kn.carried(PLACEHOLDER, ref, ref, meta={"val": val}))
    out = graph.output_node.replace(args=((Ref(name),),))
    nodes = (*graph.placeholders, *fresh, node, out)
    root = program.root_module
    modules = program.modules.set(program.root,
                                  root.replace(graphs=(kn.built(nodes),) + root.graphs[1:]))
    inputs = (*program.signature.inputs, *(InputSpec(USER_INPUT, n.name) for n in fresh))
    signature = attrs.evolve(program.signature, inputs=inputs,
                             outputs=(OutputSpec(USER_OUTPUT, name),))
    users = tuple(s.name for s in inputs if s.kind == USER_INPUT)
    calls = pmap()
    if "" in program.call_signatures:
        positional = pytree.tree_flatten((users, {}))[1]
        calls = calls.set("", attrs.evolve(program.call_signatures[""], in_spec=positional,
                                           out_spec=pytree.tree_flatten(0)[1],
                                           forward_arg_names=users))
    return program.replace(modules=modules, signature=signature, call_signatures=calls)


def _same_shape(a: torch.Size, b: torch.Size) -> bool:
    """Whether two shapes are the same, a symbolic size only by its expression: never a guard
    (a data-dependent size, ``u0``, cannot be compared with a number without one). O(dims)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        symbolic = isinstance(x, torch.SymInt) or isinstance(y, torch.SymInt)
        if (str(x) != str(y)) if symbolic else (x != y):
            return False
    return True


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
        if isinstance(other, torch.Tensor) and _same_shape(other.shape, val.shape) \
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
    return with_live_calls(program.replace(modules=modules, signature=outputs))


def _compute_nodes(program: Program) -> list[str]:
    return [n.name for n in program.root_module.graph.nodes if n.op == CALL_FUNCTION]


def _user_outputs(program: Program) -> list[str]:
    graph = program.root_module.graph
    names = [o.name for o in program.signature.outputs if o.kind == "user_output"]
    return [n for n in dict.fromkeys(names)
            if n in graph.by_name() and graph.node(n).op == CALL_FUNCTION]


def _dce(program: Program) -> Program | None:
    try:
        return with_live_calls(eliminate_dead_code(program))
    except Exception:  # noqa: BLE001 - a program dce refuses is kept as it is
        return None


__all__ = ["MOST_ISOLATED", "bypassed", "isolated", "isolated_call", "reduce"]
