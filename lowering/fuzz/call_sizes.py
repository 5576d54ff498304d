"""The sizes a program is called at under ``differential(..., sizes=k)``.

A program with a dynamic dimension (a root user input whose size is a symbol with a range, as
``torch.export`` makes for a ``Dim``) is called at ``k`` size sets, the drawn one (every
symbol at its hint) first: a compiled callable built once, called again at other sizes, is
where code specialized to the first size shows. The others are picked in a fixed order within
each symbol's range and at least 2 (torch specializes sizes 0 and 1): one above the hint, the
range's top, then the sizes between, then those below the hint.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from ir.program import Program
from lowering.pass_laws import dynamic_symbols

UNBOUNDED_REACH = 8
"""How far above its hint an unbounded symbol is taken (its "top")."""


def size_sets(program: Program, k: int) -> tuple[dict[str, int], ...]:
    """Up to ``k`` size sets (symbol name -> size, as ``program_inputs(..., sizes=)`` takes
    them), the first every symbol at its hint, the others each moving every symbol to its next
    size of the module docstring's order (a symbol whose range is exhausted keeps its hint);
    no two sets alike. ``({},)`` for a program without dynamic dimensions. O(k * symbols)."""
    symbols = dynamic_symbols(program)
    if not symbols:
        return ({},)
    orders = {name: _order(*bounds) for name, bounds in symbols.items()}
    sets = [{name: bounds[0] for name, bounds in symbols.items()}]
    for i in range(1, k):
        step = {name: order[i] if i < len(order) else order[0] for name, order in orders.items()}
        if step in sets:
            break
        sets.append(step)
    return tuple(sets)


def _order(hint: int, lo: int, hi: int | None) -> list[int]:
    top = hi if hi is not None else hint + UNBOUNDED_REACH
    above = [hint + 1, top, *range(hint + 2, top)]
    below = list(range(hint - 1, lo - 1, -1))
    out = [hint]
    for x in above + below:
        if x not in out and x >= lo and (hi is None or x <= hi) and x >= 2:
            out.append(x)
    return out


def sizes_text(sizes: Mapping[str, int]) -> str:
    """``"s0=5, s1=3"``; ``""`` for none. O(symbols)."""
    return ", ".join(f"{k}={v}" for k, v in sizes.items())


def dynamic_dims(program: Program) -> tuple[dict[int, tuple[str, int, int | None]], ...]:
    """Per root user input (flat, in placeholder order): its dimensions that are a symbol of
    :func:`dynamic_symbols`, as ``{dim: (symbol, low, high)}`` (what a repro script's
    ``torch.export.Dim`` spec says). O(root inputs' dims)."""
    graph = program.root_module.graph
    users = {s.name for s in program.signature.user_inputs()}
    symbols = dynamic_symbols(program)
    out = []
    for node in graph.placeholders:
        if node.name not in users:
            continue
        val = node.meta.get("val")
        dims: dict[int, tuple[str, int, int | None]] = {}
        if isinstance(val, torch.Tensor):
            for i, d in enumerate(val.shape):
                name = str(d.node.expr) if isinstance(d, torch.SymInt) else None
                if name in symbols:
                    dims[i] = (name, symbols[name][1], symbols[name][2])
        out.append(dims)
    return tuple(out)


def export_dynamic_shapes(program: Program, module: torch.nn.Module) -> dict[str, Any] | None:
    """The ``dynamic_shapes`` with which ``torch.export.export(module, args, kwargs)``, for
    ``module = lower(program)`` and inputs from ``program_inputs``, keeps ``program``'s dynamic
    dimensions: ``module.forward``'s parameters (the flat user inputs, in order) -> ``{dim:
    torch.export.Dim(symbol, min=, max=)}``, one ``Dim`` per symbol (:func:`dynamic_dims`);
    ``None`` for a program without one. What an exporting backend passes under ``sizes > 1``
    (a static export refuses the second size). O(root inputs' dims)."""
    dims = dynamic_dims(program)
    if not any(dims):
        return None
    names = list(inspect.signature(module.forward).parameters)
    if len(names) != len(dims):
        return None
    made: dict[str, Any] = {}
    shapes: dict[str, Any] = {}
    for name, found in zip(names, dims):
        spec = {}
        for i, (symbol, lo, hi) in found.items():
            if symbol not in made:
                made[symbol] = torch.export.Dim(symbol, min=lo, max=hi) if hi is not None \
                    else torch.export.Dim(symbol, min=lo)
            spec[i] = made[symbol]
        shapes[name] = spec or None
    return shapes


__all__ = ["UNBOUNDED_REACH", "dynamic_dims", "dynamic_symbols", "export_dynamic_shapes",
           "size_sets", "sizes_text"]
