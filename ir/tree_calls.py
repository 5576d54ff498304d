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

from typing import Any

from ir.torch_seam import pytree, torch_tree_flatten_spec

__all__ = ["flatten_by_spec", "own_equivalent", "torch_equivalent", "unflatten_tree"]


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
