"""An abs-max observer buffer after every activation, with plain torch.fx on ``ep.module()``."""

import torch

aten = torch.ops.aten
ACTIVATIONS = {aten.relu.default, aten.gelu.default, aten.silu.default, aten.tanh.default}


def observe_activations(gm):
    g = gm.graph
    for i, node in enumerate(list(g.nodes)):
        if node.op == "call_function" and node.target in ACTIVATIONS \
                and 0 not in node.meta["val"].shape:  # amax needs values
            gm.register_buffer(f"amax_{i}", torch.zeros((), dtype=node.meta["val"].dtype))
            with g.inserting_before(node.next):
                seen = g.get_attr(f"amax_{i}")
                now = g.call_function(aten.amax.default, (g.call_function(aten.abs.default, (node,)),))
                g.call_function(aten.copy_.default, (seen, g.call_function(aten.maximum.default, (seen, now))))
    gm.recompile()
    return gm
