"""Constant folding, with plain torch.fx on ``ep.module()``."""

import operator

import torch
from torch.fx.node import map_arg


def fold_constants(gm, max_bytes=1 << 20):
    state = dict(gm.named_parameters()) | dict(gm.named_buffers())
    known = {}  # node -> the tensor it always holds
    for i, node in enumerate(list(gm.graph.nodes)):
        if node.op == "get_attr" and node.target not in state:
            known[node] = operator.attrgetter(node.target)(gm)
        if node.op != "call_function" or node.is_impure():  # random ops too
            continue
        if not all(n in known for n in node.all_input_nodes):
            continue
        with torch.no_grad():
            value = node.target(*map_arg(node.args, known.get), **map_arg(node.kwargs, known.get))
        if isinstance(value, torch.Tensor) and value.nbytes <= max_bytes:
            gm.register_buffer(f"_folded_{i}", value, persistent=False)
            with gm.graph.inserting_before(node):
                folded = gm.graph.get_attr(f"_folded_{i}")
            folded.meta = dict(node.meta)
            node.replace_all_uses_with(folded)
            gm.graph.erase_node(node)
            known[folded] = value
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm
