"""e.call and e.apply on a program with a dynamic batch: both keep the batch dynamic."""

import torch

from transforms.edit import rewrite_nodes

aten = torch.ops.aten


def per_sample_call(p):
    def visit(node, e):
        if node.target is aten.relu.default:
            batch = e.call(aten.sym_size.int, node.ref, 0)  # the batch as a value of the graph
            return e.call(aten.div.Tensor, node.ref, batch)

    return rewrite_nodes(p, visit)


def per_sample_apply(p):
    def visit(node, e):
        if node.target is aten.relu.default:
            return e.apply(lambda x: x / x.shape[0], node.ref)  # traced at a dynamic batch

    return rewrite_nodes(p, visit)


def per_sample_fixed(p):  # refused: int() fixes the batch (PassError naming node and dimension)
    def visit(node, e):
        if node.target is aten.relu.default:
            return e.call(aten.div.Tensor, node.ref, int(e.val(node.ref).shape[0]))

    return rewrite_nodes(p, visit)
