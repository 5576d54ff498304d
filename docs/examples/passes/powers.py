"""Strength reduction: ``pow(x, n)`` for a small whole ``n`` as ``n - 1`` multiplications."""

import torch

from transforms.edit import rewrite_nodes

aten = torch.ops.aten
FLOATS = (torch.float32, torch.float64)  # in half precision each product rounds: keep pow there


def expand_powers(p, most=4):
    def visit(node, e):
        if (node.target is aten.pow.Tensor_Scalar and e.args[1] in range(2, most + 1)
                and e.val(e.args[0]).dtype in FLOATS):
            y = x = e.args[0]
            for _ in range(int(e.args[1]) - 1):
                y = e.call(aten.mul.Tensor, y, x)
            return y

    return rewrite_nodes(p, visit)
