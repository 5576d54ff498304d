"""Strength reduction of small whole powers, with plain torch.fx on ``ep.module()``."""

import torch

aten = torch.ops.aten
FLOATS = (torch.float32, torch.float64)  # in half precision each product rounds: keep pow there


def expand_powers(gm, most=4):
    for node in list(gm.graph.nodes):
        if (node.target is aten.pow.Tensor_Scalar and node.args[1] in range(2, most + 1)
                and node.args[0].meta["val"].dtype in FLOATS):
            y = x = node.args[0]
            with gm.graph.inserting_before(node):
                for _ in range(int(node.args[1]) - 1):
                    y = gm.graph.call_function(aten.mul.Tensor, (y, x))
            node.replace_all_uses_with(y)
            gm.graph.erase_node(node)
    gm.recompile()
    return gm
