"""Common subexpression elimination and dead code elimination."""

from ir import ops
from ir.args import IList, Ref
from transforms.edit import rewrite_nodes


def typed(tree):  # 1, 1.0 and True are different literals
    if isinstance(tree, (tuple, IList)):
        return tuple(typed(x) for x in tree)
    return tree if isinstance(tree, Ref) else (type(tree), tree)


def written(graph):  # values some node writes in place, through views too
    found = set()
    for n in reversed(graph.nodes):
        if n.op == "call_function" and ops.is_mutating(n.target):
            found.update(r.name for r in n.inputs())
        if n.name in found and n.op == "call_function" and ops.is_view(n.target):
            found.update(r.name for r in n.inputs()[:1])
    return found


def cse(p):
    seen, writes = {}, {}

    def visit(node, e):
        if node.op != "call_function" or not ops.is_recomputable(node.target):
            return None
        if not e.graph.users()[node.name]:
            return e.drop()
        if id(e.graph) not in writes:
            writes[id(e.graph)] = written(e.graph)
        if node.name in writes[id(e.graph)]:
            return None
        key = (id(e.graph), node.target, typed(e.args), typed(tuple(e.kwargs.items())))
        return seen.setdefault(key, node.ref)

    return rewrite_nodes(p, visit)
