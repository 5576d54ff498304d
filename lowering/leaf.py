"""Leaf modules: the copy ``lower`` builds of an opaque module object that a graph calls.

A leaf (``Module.kind == "leaf"``, made by ``import_graph_module`` for ``call_module`` targets)
holds the original module object by reference. ``lower`` never hands that object out. It builds
the copy in two steps around state registration:

1. ``leaf_shell``: an object of the leaf's class with empty parameter, buffer and submodule
   tables (a class with its own ``__deepcopy__``, such as ``GraphModule``, is copied that way
   first); ``lower`` then registers the Program's state and child modules on it like on any
   other module (so ties between a leaf's tensors and other state are kept);
2. ``finish_leaf``: every other attribute (sizes, flags, hooks, plain tensors, and lists that
   refer to the module's own tensors, such as an RNN's ``_flat_weights``) is deep-copied, with
   each reference to one of the original's parameters or buffers turned into a reference to the
   copy's.

The original module and its tensors are never written.
"""

from __future__ import annotations

import copy

import torch

from ir.torch_seam import module_buffers, module_children, module_parameters
from lowering.lowering_seam import (
    BUFFER_TABLE,
    MODULE_TABLE,
    NON_PERSISTENT_BUFFERS,
    PARAMETER_TABLE,
)

_TABLES = (PARAMETER_TABLE, BUFFER_TABLE, MODULE_TABLE)
_MADE_BY_SHELL = frozenset(_TABLES + (NON_PERSISTENT_BUFFERS,))


def leaf_shell(template: torch.nn.Module) -> torch.nn.Module:
    """An object of ``template``'s class whose parameter, buffer and submodule tables are empty
    but for ``None`` entries (``Linear(bias=False)`` reads ``self.bias``), without its other
    attributes until ``finish_leaf``. O(entries of the tables)."""
    if _copies_itself(template):  # e.g. a GraphModule: its class is made per object
        made = copy.deepcopy(template)
    else:
        made = object.__new__(type(template))
    for key in _TABLES:
        table = template.__dict__.get(key, {})
        made.__dict__[key] = {name: None for name, value in table.items() if value is None}
    made.__dict__[NON_PERSISTENT_BUFFERS] = set()
    return made


def _copies_itself(template: torch.nn.Module) -> bool:
    """Whether the class knows how to copy itself (``__deepcopy__``): then ``leaf_shell`` starts
    from such a copy and ``finish_leaf`` leaves its attributes as that copy made them."""
    return getattr(type(template), "__deepcopy__", None) is not None


def finish_leaf(made: torch.nn.Module, template: torch.nn.Module) -> None:
    """Deep-copy ``template``'s other attributes onto ``made`` (a ``leaf_shell`` of it with its
    state and submodules registered), mapping the original's tensors to ``made``'s at the same
    paths. O(attributes and tensors of the leaf's subtree)."""
    if _copies_itself(template):
        return
    memo: dict[int, object] = {}
    for path, original in template.named_modules(remove_duplicate=False):
        mine = made.get_submodule(path) if path else made
        for table in (PARAMETER_TABLE, BUFFER_TABLE):
            registered = mine.__dict__.get(table, {})
            for name, value in original.__dict__[table].items():
                if value is not None and registered.get(name) is not None:
                    memo[id(value)] = registered[name]
    registered = (
        set(module_parameters(made)) | set(module_buffers(made)) | set(module_children(made))
    )
    for key, value in template.__dict__.items():
        if key not in _MADE_BY_SHELL and key not in registered:
            made.__dict__[key] = copy.deepcopy(value, memo)
