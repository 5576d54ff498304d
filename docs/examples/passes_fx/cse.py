"""Common subexpression elimination and dead code elimination, with plain torch.fx."""

import torch
from torch.fx import Node


def typed(tree):  # 1, 1.0 and True are different literals; lists are not hashable
    if isinstance(tree, (tuple, list)):
        return tuple(typed(x) for x in tree)
    if isinstance(tree, dict):
        return tuple((k, typed(v)) for k, v in tree.items())
    return tree if isinstance(tree, Node) else (type(tree), tree)


def is_op(node, prop):
    return node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and prop(node.target)


def written(graph):  # values some node writes in place, through views too
    found = set()
    for n in reversed(graph.nodes):
        if is_op(n, lambda t: t._schema.is_mutable):
            found.update(n.all_input_nodes)
        if n in found and is_op(n, lambda t: t.is_view):
            found.update(n.all_input_nodes[:1])
    return found


def cse(gm):
    seen, writes = {}, written(gm.graph)
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.is_impure() or node in writes:  # random ops too
            continue
        key = (node.target, typed(node.args), typed(node.kwargs))
        if key in seen:
            node.replace_all_uses_with(seen[key])
            gm.graph.erase_node(node)
        else:
            seen[key] = node
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm
