"""``move_to_device``: a Program whose code and state live on another device, as a value.

What ``torch.export.passes.move_to_device_pass`` does for an ``ExportedProgram``, done purely on
the IR: every device literal the export recorded in a node's arguments (``device=cpu`` of
``arange``, ``full``, ``zeros``, ``ones``, ``empty``, ``_to_copy``, ...) and every state tensor
(parameters, buffers, lifted constants) go to the target device.
"""

from __future__ import annotations

from typing import Any

import torch
from pyrsistent import pmap

from ir.devices import DeviceMap, device_target, move_device_literals, moved_device
from ir.program import Program, require_program
from ir.state import Opaque


def move_to_device(p: Program, device: DeviceMap) -> Program:
    """``p`` with its device literals and its state on ``device``.

    Parameters:
        p: any Program (flat or outlined; HOP bodies included).
        device: a device (``"cuda:0"``, ``torch.device("meta")``): every literal and tensor goes
            there; or a mapping ``{from: to}`` (``{"cpu": "cuda:1"}``; a key without an index
            matches every index of its type): only what it names moves.

    Returns:
        A Program whose graphs carry the moved device literals and whose tensor table holds, for
        each state tensor on a moved device, a **new** tensor there (``p``'s tensors are never
        written; a parameter stays an ``nn.Parameter`` with its ``requires_grad``; tied fqns keep
        one key, so they stay one tensor). ``meta`` tensors stay ``meta`` (they have no values
        to move; ``lower(q, device=d)`` makes them empty on ``d`` for a checkpoint load).
        Script objects are kept as they are. Node meta (the export's fake values) is kept.

    Raises:
        PassError: naming the argument, for a ``device`` that is neither a device nor a mapping.

    **Laws:** pure (``p`` and its tensors' ``_version`` are untouched); ``p`` itself when
    nothing moves (``is``); idempotent; ``lower(move_to_device(p, d))`` computes what
    ``lower(p, device=d)`` computes. Complexity: O(nodes + argument leaves + state), plus one
    copy per moved tensor.
    """
    require_program(p, "move_to_device")
    target = device_target(device, "move_to_device")
    q = move_device_literals(p, target)
    tensors = dict(p.tensors.items())
    changed = False
    for key, held in tensors.items():
        moved = _moved(held.value, target)
        if moved is not held.value:
            tensors[key] = Opaque(moved)
            changed = True
    return q.replace(tensors=pmap(tensors)) if changed else q


def _moved(value: Any, target: Any) -> Any:
    if not isinstance(value, torch.Tensor) or value.device.type == "meta":
        return value
    where = moved_device(value.device, target)
    if where == value.device:
        return value
    with torch.no_grad():
        if where.type == "meta":
            copied = torch.empty_strided(
                value.size(), value.stride(), dtype=value.dtype, device=where
            )
        else:
            copied = value.detach().to(where, copy=True)
    if isinstance(value, torch.nn.Parameter):
        return torch.nn.Parameter(copied, requires_grad=value.requires_grad)
    return copied


__all__ = ["move_to_device"]
