"""Higher-order-op bodies: reachable by their owner's code, invisible in the module tree.

A ``cond`` branch, a ``map`` / ``while_loop`` body or a ``wrap_with_set_grad_enabled`` /
``wrap_with_autocast`` body is a graph that its owner passes to a higher-order op; the eager model
has no such submodule. ``lower`` builds each body as a lowered module like any other graph, but
its owner holds it as a plain attribute (in ``__dict__``, outside ``_modules``). So:

- ``named_modules()``, ``named_children()``, ``named_parameters()``, ``named_buffers()`` and
  ``state_dict()`` of the lowered tree list what the eager model's do (bodies hold no state:
  ``torch.export`` passes a body the state it reads as arguments);
- the owner's generated code (``self.true_graph_0``), its direct code (a ``__dict__`` read) and
  ``torch.fx.Interpreter`` (``getattr``) still reach the body, so calls run it;
- ``copy.deepcopy``, ``pickle`` and ``torch.save`` carry it, as part of the owner's ``__dict__``;
- ``print_readable`` prints it under its owner (``held_bodies``).

Assigning a module to a body's name with ``setattr`` registers it as an ordinary child instead,
as ``nn.Module.__setattr__`` does for any module.
"""

from __future__ import annotations

import torch

_NAMES = "_hop_bodies"  # the owner's __dict__ entry listing the names of the bodies it holds


def hold_body(owner: torch.nn.Module, name: str, body: torch.nn.Module) -> None:
    """Make ``body`` reachable as ``owner.<name>`` without registering it as a submodule. O(1)."""
    owner.__dict__[name] = body
    owner.__dict__[_NAMES] = owner.__dict__.get(_NAMES, ()) + (name,)


def held_bodies(owner: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """``(name, body)`` for each body ``owner`` still holds, in the order they were held."""
    state = owner.__dict__
    return [
        (name, state[name])
        for name in state.get(_NAMES, ())
        if isinstance(state.get(name), torch.nn.Module)
    ]
