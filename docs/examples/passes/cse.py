"""Common subexpression elimination and dead code elimination."""

from ir import effects, ops
from ir.args import IList, Ref
from transforms.edit import rewrite_nodes


def typed(tree):  # 1, 1.0 and True are different literals
    if isinstance(tree, (tuple, IList)):
        return tuple(typed(x) for x in tree)
    return tree if isinstance(tree, Ref) else (type(tree), tree)


def cse(p):
    seen = {}

    def visit(node, e):
        if node.op != "call_function" or not ops.is_recomputable(node.target):
            return None
        if not e.graph.users()[node.name]:
            return e.drop()
        # a value written in place (directly or through a view or other alias) may differ
        # between two reads: neither it nor a node reading it is merged
        written = effects.graph_effects(p, e.module_id, e.graph).is_written
        if written(node.name) or any(written(r.name) for r in node.inputs()):
            return None
        key = (id(e.graph), node.target, typed(e.args), typed(tuple(e.kwargs.items())))
        return seen.setdefault(key, node.ref)

    return rewrite_nodes(p, visit)
