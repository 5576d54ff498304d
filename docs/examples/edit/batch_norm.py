"""Replacing a node that writes state: a train-mode batch norm by explicit operators, its
running statistics written back with e.write_buffer, so that the batch norm goes."""

import torch

from transforms.edit import rewrite_nodes

aten = torch.ops.aten


def explicit_batch_norm(p):
    """Each train-mode aten.batch_norm by mean, var and rsqrt; running_mean and running_var
    moved as BatchNorm moves them (momentum, the unbiased variance)."""

    def visit(node, e):
        if node.target is not aten.batch_norm.default:
            return None
        x, weight, bias, running_mean, running_var, training, momentum, eps = e.args[:8]
        if training is not True or running_mean is None or not isinstance(momentum, float):
            return None  # eval mode writes nothing; momentum=None averages: not this pass's
        rank = e.val(x).dim()
        dims, shape = [0, *range(2, rank)], [1, -1] + [1] * (rank - 2)
        mean = e.call(aten.mean.dim, x, dims)
        var = e.call(aten.var.correction, x, dims, correction=0)
        unbiased = e.call(aten.var.correction, x, dims, correction=1)
        for buffer, batch in ((running_mean, mean), (running_var, unbiased)):  # every write
            kept = e.call(aten.mul.Tensor, buffer, 1 - momentum)
            new = e.call(aten.add.Tensor, kept, e.call(aten.mul.Tensor, batch, momentum))
            e.write_buffer(buffer, new)
        centred = e.call(aten.sub.Tensor, x, e.call(aten.view.default, mean, shape))
        scale = e.call(aten.rsqrt.default, e.call(aten.add.Tensor, var, eps))
        y = e.call(aten.mul.Tensor, centred, e.call(aten.view.default, scale, shape))
        if weight is not None:
            y = e.call(aten.mul.Tensor, y, e.call(aten.view.default, weight, shape))
        if bias is not None:
            y = e.call(aten.add.Tensor, y, e.call(aten.view.default, bias, shape))
        return y

    return rewrite_nodes(p, visit)
