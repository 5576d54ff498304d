"""A zero-initialized LoRA adapter on every linear, with plain torch.fx on ``ep.module()``."""

import torch

aten = torch.ops.aten


def add_lora(gm, rank=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    for i, node in enumerate(list(gm.graph.nodes)):
        if node.target is aten.linear.default:
            w = node.args[1].meta["val"]
            a = torch.randn(rank, w.shape[1], generator=g).to(w.dtype) / w.shape[1] ** 0.5
            gm.register_buffer(f"lora_a_{i}", a)
            gm.register_buffer(f"lora_b_{i}", torch.zeros(w.shape[0], rank, dtype=w.dtype))
            with gm.graph.inserting_before(node.next):
                a, b = gm.graph.get_attr(f"lora_a_{i}"), gm.graph.get_attr(f"lora_b_{i}")
                down = gm.graph.call_function(aten.linear.default, (node.args[0], a))
                low = gm.graph.call_function(aten.linear.default, (down, b))
                out = gm.graph.call_function(aten.add.Tensor, (node, low))
            node.replace_all_uses_with(out, delete_user_cb=lambda user, out=out: user is not out)
    gm.recompile()
    return gm
