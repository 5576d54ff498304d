"""Flattening a call's inputs against the exported input spec, and checking them.

Matches ``ep.module()``: keyword arguments in any order, dict inputs whose keys come in another
order, a ``FlatArgsAdapter`` for other structures, and torch's input-constraint checks.
"""

from __future__ import annotations

from typing import Any

import torch.utils._pytree as pytree
from torch.utils._pytree import GetAttrKey, SequenceKey

from ir.errors import InputError
from lowering.constraints import check_inputs


def flatten_inputs(root: Any, args: tuple, kwargs: dict) -> list[Any]:
    """The flat user inputs of a call, in the exported order; raises ``InputError`` on mismatch."""
    in_spec = root._in_spec
    ordered = _reorder(kwargs, in_spec)
    flat_with_path, received = pytree.tree_flatten_with_path((args, ordered))
    adapted = False
    if received != in_spec:
        if _same_modulo_dict_order(received, in_spec):
            flat_with_path = _flatten_like(args, ordered, in_spec)
        elif root.flat_args_adapter is not None:
            flat = root.flat_args_adapter.adapt(
                target_spec=in_spec,
                input_spec=received,
                input_args=[v for _, v in flat_with_path],
                metadata=root.meta,
                obj=args,
            )
            if len(flat) != in_spec.num_leaves:
                raise InputError(
                    f"Flat args adaption failed, number of args mismatch Adapted: {len(flat)} \n"
                    f"Exported module: {in_spec.num_leaves}"
                )
            paths = root.flat_args_adapter.get_flat_arg_paths() or []
            flat_with_path = [
                ((SequenceKey(idx=i), GetAttrKey(name=paths[i] if paths else "<unknown location>")), v)
                for i, v in enumerate(flat)
            ]
            adapted = True
        else:
            raise InputError(
                "There is no flat args adapter specified. Are you sure you are calling this with "
                f"the right arguments? Input treespec: {received}. Exported module treespec: "
                f"{in_spec}"
            )
    root.adapted = root.adapted or adapted
    if root.check_input_constraints:
        check_inputs(root._input_checks, flat_with_path, root._ranges)
    return [v for _, v in flat_with_path]


def _reorder(kwargs: dict, in_spec: Any) -> dict:
    if not kwargs:
        return kwargs
    if in_spec.type is not tuple or in_spec.num_children != 2:
        return kwargs
    kwargs_spec = in_spec.child(1)
    expected = list(kwargs_spec.context) if kwargs_spec.type is dict else []
    if set(kwargs) != set(expected):
        raise InputError(
            f"keyword arguments {sorted(kwargs)} do not match the exported ones {sorted(expected)}"
        )
    return {k: kwargs[k] for k in expected}


def _same_modulo_dict_order(a: Any, b: Any) -> bool:
    if a.type is not b.type or a.num_children != b.num_children:
        return False
    if a.type is dict:
        if set(a.context) != set(b.context):
            return False
        by_key = dict(zip(a.context, a.children()))
        return all(_same_modulo_dict_order(by_key[k], c) for k, c in zip(b.context, b.children()))
    if a.context != b.context:
        return False
    return all(_same_modulo_dict_order(x, y) for x, y in zip(a.children(), b.children()))


def _flatten_like(args: tuple, kwargs: dict, spec: Any) -> list:
    """Flatten with paths, reading dicts in ``spec``'s key order."""

    def reorder(tree: Any, s: Any) -> Any:
        if s.type is dict and isinstance(tree, dict):
            return {k: reorder(tree[k], c) for k, c in zip(s.context, s.children())}
        if type(tree) in (list, tuple):
            return type(tree)(reorder(x, c) for x, c in zip(tree, s.children()))
        return tree

    ordered = reorder((args, kwargs), spec)
    flat_with_path, _ = pytree.tree_flatten_with_path(ordered)
    return flat_with_path
