"""Fold arithmetic with a neutral scalar, with plain torch.fx on ``ep.module()``."""

import torch

aten = torch.ops.aten
NEUTRAL = {aten.mul.Tensor: 1, aten.div.Tensor: 1, aten.add.Tensor: 0, aten.sub.Tensor: 0}


def written(gm):  # nodes an in-place op may write: directly, or through a view either way
    ties, found = [], set()
    for n in gm.graph.nodes:
        schema = getattr(n.target, "_schema", None)
        for arg, a in zip(n.args, schema.arguments if schema else ()):
            if isinstance(arg, torch.fx.Node) and a.alias_info is not None:
                ties.append((arg, n))  # n views arg (or writes it and returns it)
                if a.alias_info.is_write:
                    found.add(arg)
    for _ in ties:  # close over the ties until nothing grows
        for a, b in ties:
            if a in found or b in found:
                found.update((a, b))
    return found


def fold_identities(gm):
    w = written(gm)
    for node in list(gm.graph.nodes):
        if node.target in NEUTRAL and len(node.args) == 2 and node.args[1] == NEUTRAL[node.target]:
            x, out = node.args[0].meta["val"], node.meta["val"]
            fresh = node.args[0].op != "placeholder" and node not in w and node.args[0] not in w
            if x.dtype == out.dtype and x.shape == out.shape and fresh:  # x * 1: a copy
                node.replace_all_uses_with(node.args[0])
                gm.graph.erase_node(node)
    gm.recompile()
    return gm
