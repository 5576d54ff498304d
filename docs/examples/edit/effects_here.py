"""Asking what the visited graph writes: ir.effects.graph_effects(p, e.module_id, e.graph)."""

import torch

from ir import effects
from transforms.edit import rewrite_nodes

aten = torch.ops.aten


def drop_ones_masks(p):
    """x * mask -> x where mask is state of ones that nothing writes, of x's shape."""

    def visit(node, e):
        if node.target is not aten.mul.Tensor:
            return None
        x, mask = e.args
        held = e.state(mask)
        if held is None or e.val(x).shape != e.val(node.ref).shape:
            return None
        fqn, tensor = held
        here = effects.graph_effects(p, e.module_id, e.graph)  # this graph, memoized per p
        if here.is_written(mask.name) or effects.state_written(p, fqn):
            return None  # a write (here, or in any call of p) may change the ones
        return x if bool((tensor == 1).all()) else None

    return rewrite_nodes(p, visit)
