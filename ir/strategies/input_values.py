"""Example inputs of a generated (or any imported) program: one tensor per user input, of
the shape and dtype its ``val`` gives, arranged as the root's ``in_spec`` takes them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ir.errors import InputError
from ir.fake_run import hint
from ir.node import Node
from ir.program import Program
from ir.torch_seam import pytree


def program_inputs(
    program: Program, seed: int = 0, sizes: Mapping[str, int] | None = None,
    *, floating: Callable[[tuple[int, ...], torch.dtype], torch.Tensor] | None = None,
) -> tuple[tuple, dict]:
    """Fresh example ``(args, kwargs)`` for ``lower(program)``, deterministic in ``seed``.

    One tensor per user-input placeholder of the root graph, of the shape and dtype its
    ``meta["val"]`` gives (uniform in ``[-1, 1)`` for floating types, ``0..9`` for integer
    ones; a symbolic size takes its hint, or with ``sizes`` (symbol name -> size, ``{"s0": 9}``)
    its expression at those sizes when they give each of its symbols), arranged by the root
    call signature's ``in_spec``
    (positional only when the program has none). ``floating(shape, dtype)``, when given, makes
    each floating tensor in place of a draw from ``seed``. An input
    export recorded as ``None`` (its ``val``) is ``None``. Works on any Program whose root
    keeps ``import_ep``'s placeholders, so also after passes. Raises ``InputError`` naming the
    placeholder whose ``meta["val"]`` says nothing about its value.
    """
    graph = program.root_module.graph
    users = {s.name for s in program.signature.user_inputs()}
    gen = torch.Generator().manual_seed(seed)
    leaves = []
    for node in graph.placeholders:
        if node.name not in users:
            continue
        leaves.append(_example_value(node, gen, sizes, floating))
    sig = program.call_signatures.get("")
    if sig is None:
        return tuple(leaves), {}
    if sig.in_spec.num_leaves != len(leaves):
        raise InputError(
            f"the root in_spec takes {sig.in_spec.num_leaves} inputs but the root graph has "
            f"{len(leaves)} user-input placeholders"
        )
    args, kwargs = pytree.tree_unflatten(leaves, sig.in_spec)
    return tuple(args), dict(kwargs)


def _example_value(node: Node, gen: torch.Generator, sizes: Mapping[str, int] | None,
                   floating: Callable[[tuple[int, ...], torch.dtype], torch.Tensor] | None,
                   ) -> Any:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        shape = tuple(_size(d, sizes) for d in val.shape)
        if val.dtype.is_floating_point and floating is not None:
            return floating(shape, val.dtype)
        if val.dtype.is_floating_point:
            return torch.rand(shape, generator=gen).to(val.dtype) * 2 - 1
        if val.dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=gen).bool()
        return torch.randint(0, 10, shape, generator=gen).to(val.dtype)
    if isinstance(val, (torch.SymInt, int)) and not isinstance(val, bool):
        return _size(val, sizes)
    if isinstance(val, (float, bool, str)) or (val is None and "val" in node.meta):
        return val
    raise InputError(
        f"placeholder {node.name!r} has meta['val'] {val!r}; cannot make an example input for it"
    )


def _size(d: Any, sizes: Mapping[str, int] | None) -> int:
    """``d`` at ``sizes`` (its expression, when they give each of its symbols), else its hint."""
    if sizes and isinstance(d, torch.SymInt):
        expr = d.node.expr
        free = getattr(expr, "free_symbols", ())
        if free and all(str(s) in sizes for s in free):
            return int(expr.xreplace({s: sizes[str(s)] for s in free}))
    return int(hint(d))
