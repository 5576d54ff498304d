"""Fold arithmetic with a neutral scalar: ``x * 1``, ``x / 1``, ``x + 0``, ``x - 0`` are ``x``
(where the result keeps ``x``'s dtype and shape: ``int * 1.0`` is a float, and ``x`` is no
input of the graph: the result would become an alias of what the caller passed), and neither
``x`` nor the result is written in place, directly or through a view: ``x * 1`` is a copy, which
a write to either would tell apart)."""

import torch

from ir import effects
from transforms.edit import rewrite_nodes

aten = torch.ops.aten
NEUTRAL = {aten.mul.Tensor: 1, aten.div.Tensor: 1, aten.add.Tensor: 0, aten.sub.Tensor: 0}


def fold_identities(p):
    def visit(node, e):
        if node.target in NEUTRAL and len(e.args) == 2 and e.args[1] == NEUTRAL[node.target]:
            x, out = e.val(e.args[0]), node.meta["val"]
            if x.dtype == out.dtype and x.shape == out.shape and not e.is_input(e.args[0]):
                written = effects.graph_effects(p, e.module_id, e.graph).is_written
                if not written(node.name) and not written(node.args[0].name):
                    return e.args[0]

    return rewrite_nodes(p, visit)
