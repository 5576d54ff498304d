"""The pytree functions that IR graphs call around a preserved call, owned by purefx.

``outline`` builds a preserved call's inputs with ``unflatten_tree(leaves, in_spec)`` and reads
its results with ``flatten_by_spec(result, out_spec)`` (and the callee flattens its arguments
the same way). The IR names these two functions rather than torch's private
``torch.utils._pytree.tree_unflatten`` and ``torch.fx._pytree.tree_flatten_spec``, so a program's
text and its node targets do not depend on where torch keeps them. Lowering writes torch's own
functions into the fx graphs it builds (``torch_equivalent``), as ``torch.export.unflatten``
does, and importing a graph that calls torch's maps them here (``own_equivalent``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ir.args import IDict, Ref
from ir.node import CALL_FUNCTION, GET_ATTR
from ir.torch_seam import pytree, torch_tree_flatten_spec

if TYPE_CHECKING:
    from ir.graph import Graph

__all__ = [
    "flatten_by_spec",
    "flattened_arguments",
    "own_equivalent",
    "torch_equivalent",
    "unflatten_tree",
]


def unflatten_tree(leaves: Any, spec: pytree.TreeSpec) -> Any:
    """The structure ``spec`` describes with ``leaves`` at its leaves, as torch's
    ``tree_unflatten``; ``leaves`` is any sequence of ``spec.num_leaves`` values.

    Law: ``flatten_by_spec(unflatten_tree(xs, s), s) == list(xs)``. O(size of the tree).
    """
    return pytree.tree_unflatten(list(leaves), spec)


def flatten_by_spec(tree: Any, spec: pytree.TreeSpec) -> list[Any]:
    """The leaves of ``tree`` in the order ``spec`` gives them, as torch's ``tree_flatten_spec``:
    a dict is read by the keys of ``spec`` (so its own key order does not matter).

    Law: ``flatten_by_spec(unflatten_tree(xs, s), s) == list(xs)``. O(size of the tree).
    """
    return torch_tree_flatten_spec(tree, spec)


def flattened_arguments(graph: Graph) -> tuple[tuple[Ref, ...], IDict] | None:
    """``(positional, keywords)`` when the first computation of ``graph`` (after its
    placeholders and its state reads, ``get_attr``) is ``flatten_by_spec(((p0, p1, ...),
    {"k": k, ...}), in_spec)`` over references only, as the graph of a preserved call takes its
    arguments; else ``None``.

    Which placeholders the references name is the caller's to check (all of them, or the
    first ones). Reads no node name, so graphs with equal alpha keys get answers equal up to
    the names referred to. O(placeholders + state reads + arguments).
    """
    nodes = graph.nodes
    at = len(graph.placeholders)
    while at < len(nodes) and nodes[at].op == GET_ATTR:
        at += 1
    if at == len(nodes):
        return None
    first = nodes[at]
    if first.op != CALL_FUNCTION or first.target is not flatten_by_spec or not first.args:
        return None
    tree = first.args[0]
    if type(tree) is not tuple or len(tree) != 2 or type(tree[0]) is not tuple:
        return None
    positional, keywords = tree
    if not isinstance(keywords, IDict):
        return None
    if not all(isinstance(r, Ref) for r in (*positional, *keywords.values())):
        return None
    return positional, keywords


_TORCH = {unflatten_tree: pytree.tree_unflatten, flatten_by_spec: torch_tree_flatten_spec}
_OWN = {theirs: ours for ours, theirs in _TORCH.items()}


def torch_equivalent(target: Any) -> Any:
    """torch's own function for a target of this module (what an fx graph or an
    ``ExportedProgram`` of torch's calls there); any other target as it is. O(1)."""
    try:
        return _TORCH.get(target, target)
    except TypeError:  # an unhashable target is none of ours
        return target


def own_equivalent(target: Any) -> Any:
    """This module's function for torch's ``tree_unflatten`` or ``tree_flatten_spec``; any
    other target as it is. O(1)."""
    try:
        return _OWN.get(target, target)
    except TypeError:
        return target
