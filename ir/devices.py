"""Device literals: the ``torch.device`` values an export recorded in node arguments.

``torch.export`` records the device a factory ran on as a literal: ``torch.arange(n,
device=x.device)`` traced on CPU becomes ``aten.arange.default(n, device=cpu)``, and so do
``full``, ``ones``, ``zeros``, ``empty``, ``scalar_tensor``, ``_to_copy`` / ``to`` with a
device, ``new_*`` with an explicit device, .... A program built on one device and run on
another needs them moved. This module holds the one mapping both ``lower(p, device=d)`` and
``transforms.move_to_device`` use; it touches node arguments only (state is the caller's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from pyrsistent import pmap

from ir.args import IDict, IList
from ir.errors import PassError, shorten
from ir.graph import Graph
from ir.program import Program

DeviceMap = Any  # a torch.device / str (every device literal goes there) or {from: to}


def device_target(location: DeviceMap, where: str) -> Any:
    """``location`` normalised: a ``torch.device``, or a dict ``{torch.device: torch.device}``
    (``"cuda"`` keys match every CUDA index; a key ``"cpu"`` matches ``cpu``). Raises
    ``PassError`` naming ``where`` for a value that is neither. O(entries)."""
    try:
        if isinstance(location, Mapping):
            return {torch.device(k): torch.device(v) for k, v in location.items()}
        return torch.device(location)
    except (TypeError, RuntimeError, ValueError) as err:
        raise PassError(
            f"{where}: device {location!r} is not a torch device or a mapping of devices "
            f"({shorten(' '.join(str(err).split()), 120)}); pass e.g. 'cuda:0' or {{'cpu': 'cuda:0'}}"
        ) from None


def moved_device(device: torch.device, target: Any) -> torch.device:
    """Where the literal ``device`` goes under ``target`` (``device_target``'s value): the
    target device, or the mapping's entry for ``device`` (exact, else by device type), else
    ``device`` unchanged. O(entries)."""
    if isinstance(target, torch.device):
        return target
    found = target.get(device)
    if found is None and device.index is not None:
        found = target.get(torch.device(device.type))
    return device if found is None else found


def _move_tree(tree: Any, target: Any) -> Any:
    """``tree`` with every ``torch.device`` leaf moved; the same object when none changes."""
    kind = type(tree)
    if kind is torch.device:
        new = moved_device(tree, target)
        return tree if new == tree else new
    if kind is tuple:
        items = tuple(_move_tree(x, target) for x in tree)
        return tree if all(a is b for a, b in zip(items, tree)) else items
    if kind is IList:
        items = _move_tree(tree.items, target)
        return tree if items is tree.items else IList(items)
    if kind is IDict:
        pairs = tuple((k, _move_tree(v, target)) for k, v in tree.items)
        return tree if all(a[1] is b[1] for a, b in zip(pairs, tree.items)) else IDict(pairs)
    return tree


def _move_graph(graph: Graph, target: Any) -> Graph:
    changed = False
    nodes = []
    for node in graph.nodes:
        args = _move_tree(node.args, target)
        kwargs = _move_tree(node.kwargs, target)
        if args is not node.args or kwargs is not node.kwargs:
            node = node.replace(args=args, kwargs=kwargs)
            changed = True
        nodes.append(node)
    return Graph.of(nodes) if changed else graph


def move_device_literals(p: Program, location: DeviceMap) -> Program:
    """``p`` with every device literal in every graph (root, submodules, HOP bodies) moved to
    ``location`` (a device: all of them; a mapping ``{from: to}``: those it names).

    State, signature and node meta (the export's fake values) are kept as they are: the
    literals are what the code runs; ``transforms.move_to_device`` also moves the state.

    **Laws:** pure; ``p`` itself when no literal changes (``is``); idempotent; moving to the
    device every literal already has returns ``p``. Complexity: O(nodes + argument leaves).
    """
    target = device_target(location, "move_device_literals")
    modules = dict(p.modules.items())
    changed = False
    for mid, mod in modules.items():
        graphs = tuple(_move_graph(g, target) for g in mod.graphs)
        if any(a is not b for a, b in zip(graphs, mod.graphs)):
            modules[mid] = mod.replace(graphs=graphs)
            changed = True
    if not changed:
        return p
    return p.replace(modules=pmap(modules))


__all__ = ["device_target", "move_device_literals", "moved_device"]
