"""Weight-only fake quantization of the linears with at least ``min_weights`` weights."""

import torch

from transforms.edit import rewrite_nodes

aten = torch.ops.aten
WEIGHT_ARG = {aten.linear.default: 1, aten.addmm.default: 2}  # where each linear op reads its weight


def fake_quant(w):  # symmetric int8, one scale per output row
    scale = w.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 127
    return torch.round(w / scale).clamp(-128, 127) * scale


def quantize_linears(p, min_weights=1024):
    def visit(node, e):
        i = WEIGHT_ARG.get(node.target)
        if i is not None and e.val(e.args[i]).numel() >= min_weights:
            e.args = (*e.args[:i], e.apply(fake_quant, e.args[i]), *e.args[i + 1:])

    return rewrite_nodes(p, visit)
