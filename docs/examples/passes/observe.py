"""An abs-max observer buffer after every activation, updated on each call."""

import torch

from transforms.edit import rewrite_nodes

aten = torch.ops.aten
ACTIVATIONS = {aten.relu.default, aten.gelu.default, aten.silu.default, aten.tanh.default}


def observe_activations(p):
    def visit(node, e):
        if node.target in ACTIVATIONS and 0 not in e.val(node.ref).shape:  # amax needs values
            seen = e.add_buffer("amax", torch.zeros((), dtype=e.val(node.ref).dtype))
            now = e.call(aten.amax.default, e.call(aten.abs.default, node.ref))
            e.write_buffer(seen, e.call(aten.maximum.default, seen, now))

    return rewrite_nodes(p, visit)
