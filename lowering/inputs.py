"""Flattening a call's inputs against the exported input spec, and checking them.

Matches ``ep.module()``: keyword arguments in any order, dict inputs whose keys come in another
order, a ``FlatArgsAdapter`` for other structures, and torch's input-constraint checks.
"""

from __future__ import annotations

import difflib
from typing import Any

import torch

from ir.errors import InputError
from ir.torch_seam import pytree
from lowering.call_path import probe_location
from lowering.constraints import check_inputs
from lowering.lowering_seam import get_keystr


def flatten_inputs(root: Any, args: tuple, kwargs: dict) -> list[Any]:
    """The flat user inputs of a call, in the exported order; raises ``InputError`` on mismatch."""
    in_spec = root._in_spec
    ordered = _reorder(kwargs, in_spec)
    if ordered is None:
        _check_arguments(args, kwargs, in_spec, _forward_names(root))
        raise InputError(f"keyword arguments {sorted(kwargs)} do not match the exported ones")
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
                (
                    (
                        pytree.SequenceKey(idx=i),
                        pytree.GetAttrKey(name=paths[i] if paths else "<unknown location>"),
                    ),
                    v,
                )
                for i, v in enumerate(flat)
            ]
            adapted = True
        else:
            _check_arguments(args, kwargs, in_spec, _forward_names(root))
            raise InputError(
                "There is no flat args adapter specified. Are you sure you are calling this with "
                f"the right arguments? Input treespec: {received}. Exported module treespec: "
                f"{in_spec}"
            )
    root.adapted = root.adapted or adapted
    probe = state_probe(root)
    if root.check_input_constraints:
        state_dtype = probe.dtype if probe is not None and probe.is_floating_point() else None
        check_inputs(root._input_checks, flat_with_path, root._ranges, state_dtype)
    check_devices(flat_with_path, None if probe is None else probe.device, _forward_names(root))
    return [v for _, v in flat_with_path]


def state_probe(root: Any) -> torch.Tensor | None:
    """One tensor of the root's state as it is now (read through the fqn ``lower`` recorded, so
    it follows ``.to(device)``, ``.double()`` and module swaps): its device and dtype are the
    state's. ``None`` for a module without tensor state."""
    where = probe_location(root)
    return None if where is None else where[3]


def check_devices(
    flat_with_path: list, device: torch.device | None, names: tuple[str, ...] = ()
) -> None:
    """Raise ``InputError`` naming the input for a tensor the module cannot run: a ``meta``
    tensor (unless the state is on ``meta`` too), or one on another device than the state
    (0-dim CPU tensors pass, as torch's operators take them anywhere). O(inputs)."""
    for path, arg in flat_with_path:
        if not isinstance(arg, torch.Tensor):
            continue
        where = arg.device
        if device is None:
            if where.type == "meta":
                raise InputError(
                    f"input {_spelled(path, names)} is a meta tensor (no data): the module cannot run "
                    "it; pass a tensor with data"
                )
        elif where != device and not (where.type == "cpu" and arg.dim() == 0):
            raise InputError(
                f"input {_spelled(path, names)} is on {where}, but the module's state is on {device}; "
                f"move the input (.to({str(device)!r})) or the module"
            )


def _spelled(path: Any, names: tuple[str, ...]) -> str:
    """``'x' (*args[0])``: the argument's name where the signature has one, and its key path."""
    if not path:
        return "<input>"
    keys = get_keystr(path)
    head = path[0]
    if len(path) >= 2 and getattr(head, "idx", None) == 0:
        index = getattr(path[1], "idx", None)
        if isinstance(index, int) and index < len(names):
            return f"{names[index]!r} ({keys})"
    if len(path) >= 2 and getattr(head, "idx", None) == 1:
        key = getattr(path[1], "key", None)
        if isinstance(key, str):
            return f"{key!r} ({keys})"
    return keys


def _forward_names(root: Any) -> tuple[str, ...]:
    return type(root).__dict__.get("_forward_names") or ()


def _check_arguments(args: tuple, kwargs: dict, in_spec: Any, names: tuple[str, ...]) -> None:
    """Raise ``InputError`` naming the argument when a call's positional count or keywords
    differ from the exported ``(args, kwargs)`` spec (missing, unexpected or misspelled)."""
    if in_spec.type is not tuple or in_spec.num_children != 2:
        return
    args_spec, kwargs_spec = in_spec.children()
    if args_spec.type is not tuple or kwargs_spec.type is not dict:
        return
    expected = [str(k) for k in kwargs_spec.context]
    count = args_spec.num_children
    shown = ", ".join(names[:count]) if len(names) >= count else f"{count} arguments"
    if len(args) != count:
        raise InputError(
            f"forward() takes {count} positional argument{'s' if count != 1 else ''} "
            f"({shown}) but {len(args)} were given; no flat args adapter is set to map other "
            "inputs (lower(..., flat_args_adapter=...))"
        )
    missing = [k for k in expected if k not in kwargs]
    unexpected = [k for k in kwargs if k not in expected]
    if not (missing or unexpected):
        return
    problems = []
    for key in unexpected:
        close = difflib.get_close_matches(key, missing, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"unexpected keyword argument {key!r}{hint}")
    if missing:
        problems.append(f"missing keyword argument{'s' if len(missing) > 1 else ''} "
                        + ", ".join(repr(k) for k in missing))
    raise InputError(
        f"forward() got {'; '.join(problems)}; it takes the keywords {expected} "
        f"(got {list(kwargs)})"
    )


def _reorder(kwargs: dict, in_spec: Any) -> dict | None:
    """``kwargs`` in the exported key order; ``None`` when their keys differ from it."""
    if not kwargs:
        return kwargs
    if in_spec.type is not tuple or in_spec.num_children != 2:
        return kwargs
    kwargs_spec = in_spec.child(1)
    expected = list(kwargs_spec.context) if kwargs_spec.type is dict else []
    if set(kwargs) != set(expected):
        return None
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
