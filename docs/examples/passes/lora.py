"""A LoRA adapter on every linear: ``linear(x, W) + linear(linear(x, A), B)``, with ``B``
zero, so the program computes what it did until trained adapters are loaded."""

import torch

from transforms.edit import rewrite_nodes

aten = torch.ops.aten


def add_lora(p, rank=4, seed=0):
    g = torch.Generator().manual_seed(seed)

    def visit(node, e):
        if node.target is aten.linear.default:
            w = e.val(e.args[1])
            a = torch.randn(rank, w.shape[1], generator=g).to(w.dtype) / w.shape[1] ** 0.5
            a = e.add_buffer("lora_a", a)
            b = e.add_buffer("lora_b", torch.zeros(w.shape[0], rank, dtype=w.dtype))
            low = e.call(aten.linear.default, e.call(aten.linear.default, e.args[0], a), b)
            return e.call(aten.add.Tensor, node.ref, low)

    return rewrite_nodes(p, visit)
