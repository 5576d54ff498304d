"""Adding constant tensors to a Program's state: the bookkeeping a folding pass shares."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from pyrsistent import pmap

from ir import state as st
from ir.program import Program

__all__ = ["fresh_attr", "with_constants"]


def with_constants(p: Program, added: Sequence[tuple[Sequence[str], torch.Tensor]]) -> Program:
    """``p`` holding each ``(fqns, tensor)`` of ``added`` as a new lifted constant.

    Each tensor gets one ``constant`` slot per fqn (a module reached by several paths holds it
    under each; they share one tensor key, the first fqn), appended to ``state_order``. Graphs
    and signatures are not touched: the caller adds the placeholders (root) or ``get_attr``
    nodes that read them. Constants are outside the state dict, so ``state_dict`` keeps its
    keys. ``p`` itself when ``added`` is empty.

    **Laws:** ``with_constants(p, []) is p``; every fqn given is state of the result, and
    ``p``'s state is kept. Complexity: O(state + added).
    """
    if not added:
        return p
    state = dict(p.state_table())
    tensors = dict(p.tensor_table())
    order = list(p.state_order)
    for fqns, tensor in added:
        key = fqns[0]
        tensors[key] = st.Opaque(tensor)
        for fqn in fqns:
            state[fqn] = st.Slot(st.CONSTANT, key, True, False)
            order.append(fqn)
    return p.replace(state=pmap(state), tensors=pmap(tensors), state_order=tuple(order))


def fresh_attr(base: str, taken: set[str]) -> str:
    """``base``, or ``base_1``, ``base_2``, ... : the first not in ``taken`` (then added)."""
    name, i = base, 1
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name
