"""Leaf modules: the copy ``lower`` builds of an opaque module object that a graph calls.

A leaf (``Module.kind == "leaf"``, made by ``import_graph_module`` for ``call_module`` targets)
holds the original module object by reference. ``lower`` never hands that object out: it builds
a copy of it *without* its parameters, buffers and submodules, then registers the Program's state
and child modules on the copy like on any other module, so ties between a leaf's tensors and
other state are kept and the original module and its tensors are never written.
"""

from __future__ import annotations

import copy

import torch

_TABLES = ("_parameters", "_buffers", "_modules")


def leaf_copy(template: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``template`` whose parameter, buffer and submodule tables are empty but for
    ``None`` entries (``Linear(bias=False)`` reads ``self.bias``); every other attribute (sizes,
    flags, hooks, plain tensors) is deep-copied. O(attributes of ``template``)."""
    made = type(template).__new__(type(template))
    memo: dict[int, object] = {}
    for key, value in template.__dict__.items():
        if key in _TABLES:
            made.__dict__[key] = {name: None for name, v in value.items() if v is None}
        elif key == "_non_persistent_buffers_set":
            made.__dict__[key] = set()
        else:
            made.__dict__[key] = copy.deepcopy(value, memo)
    return made
