"""Weight-only fake quantization of the linears, with plain torch.fx on ``ep.module()``."""

import torch

aten = torch.ops.aten
WEIGHT_ARG = {aten.linear.default: 1, aten.addmm.default: 2}  # where each linear op reads its weight


def fake_quant(w):  # symmetric int8, one scale per output row
    scale = w.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 127
    return torch.round(w / scale).clamp(-128, 127) * scale


def quantize_linears(gm, min_weights=1024):
    for node in list(gm.graph.nodes):
        i = WEIGHT_ARG.get(node.target)
        if i is not None and node.args[i].meta["val"].numel() >= min_weights:
            with gm.graph.inserting_before(node):
                node.update_arg(i, gm.graph.call_function(fake_quant, (node.args[i],)))
    gm.recompile()
    return gm
