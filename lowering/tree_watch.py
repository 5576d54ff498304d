"""When the root may run direct code: the lowered tree is still exactly as ``lower`` built it.

Direct code (``lowering/direct.py``) skips ``nn.Module.__call__`` and ``__getattr__`` for every
submodule, so it is only right while no submodule was swapped, deleted, hooked, compiled or
patched. Every lowered class mixes in ``Watched``: the operations that can change what a call
runs (assigning or deleting a module or ``forward``, ``add_module``, registering a hook,
``compile``, changing ``__class__``) advance a global epoch. The root re-checks its tree only
when the epoch moved since its last check (``tree_unchanged``, O(modules + state reads)), and
runs direct code only if the check passed, no global module hook is set, nothing is tracing or
compiling, and the inputs are plain tensors. Otherwise it runs the ordinary hierarchical code,
which honours all of the above. Writing a parameter or buffer needs no check: direct code reads
them from the owner's tables on every call.
"""

from __future__ import annotations

from typing import Any

import torch

from ir.torch_seam import module_children
from lowering.direct import locate
from lowering.lowering_seam import (
    MODULE_TABLE,
    global_module_hooks_set,
    is_fx_symbolic_tracing,
    jit_tracing,
)

_EPOCH = [0]
_LOWERED_MARK = "_purefx_lowered_class"
# Attribute names whose assignment can change what calling a module runs.
_WATCHED_NAMES = frozenset(
    {
        "forward",
        "__class__",
        "_modules",
        "_compiled_call_impl",
        "_forward_hooks",
        "_forward_pre_hooks",
        "_backward_hooks",
        "_backward_pre_hooks",
    }
)


def changed() -> None:
    """Record that some lowered tree may differ from how it was built."""
    _EPOCH[0] += 1


def epoch_cell() -> list[int]:
    """The one-element list whose item is the current epoch: generated code reads
    ``cell[0]`` instead of calling ``epoch()``."""
    return _EPOCH


def epoch() -> int:
    """The current epoch; a root whose last check saw this epoch need not check again."""
    return _EPOCH[0]


class Watched:
    """Mixin for lowered module classes: advances the epoch on tree-changing operations."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # marked on the class itself (no registry that would keep classes made at run time alive);
        # a user's subclass, defined elsewhere, is not marked: direct code does not know it
        setattr(cls, _LOWERED_MARK, cls.__module__.startswith("lowering."))

    def __setattr__(self, name: str, value: Any) -> None:
        if (
            name in _WATCHED_NAMES
            or isinstance(value, torch.nn.Module)
            or name in self.__dict__.get(MODULE_TABLE, ())
        ):
            changed()
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        changed()
        super().__delattr__(name)


def _watching(name: str) -> Any:
    """A ``Watched`` override of ``nn.Module.<name>`` that advances the epoch first."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        changed()
        return getattr(super(Watched, self), name)(*args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"``nn.Module.{name}``, recorded as a possible change of the tree."
    return method


# Module methods that change what calling a module runs, besides attribute assignment.
for _name in (
    "add_module",
    "register_module",
    "register_forward_hook",
    "register_forward_pre_hook",
    "register_full_backward_hook",
    "register_full_backward_pre_hook",
    "register_backward_hook",
    "compile",
):
    setattr(Watched, _name, _watching(_name))


def snapshot(module: torch.nn.Module, reads: dict[str, Any] | None) -> None:
    """Remember ``module``'s children and where its state reads resolve, as direct code assumes."""
    module.__dict__["_direct_children"] = dict(module_children(module))
    module.__dict__["_direct_reads"] = reads or {}


def tree_unchanged(root: torch.nn.Module) -> bool:
    """Whether every module below ``root`` is a lowered module with its built children, no hooks,
    no compiled or patched call, and state reads that resolve where they did. O(modules + reads).
    """
    seen: set[int] = set()
    stack = [root]
    while stack:
        mod = stack.pop()
        if id(mod) in seen:
            continue
        seen.add(id(mod))
        state = mod.__dict__
        children = state.get("_direct_children")
        lowered_class = type(mod).__dict__.get(_LOWERED_MARK, False)
        if children is None or not lowered_class or module_children(mod) != children:
            return False
        if mod is not root and _intercepted(mod):
            return False
        for target, read in state["_direct_reads"].items():
            if locate(mod, target) != read:
                return False
        stack.extend(m for m in children.values() if m is not None)
    return True


def _intercepted(mod: torch.nn.Module) -> bool:
    state = mod.__dict__
    return bool(
        state["_forward_hooks"]
        or state["_forward_pre_hooks"]
        or state["_backward_hooks"]
        or state["_backward_pre_hooks"]
        or state.get("_compiled_call_impl") is not None
        or "forward" in state
        or "__call__" in state
    )


def plain_call(flat: list[Any]) -> bool:
    """Whether a call with these flat inputs may skip per-module dispatch: no global module hook,
    no tracing or compiling, and no tensor subclass (fake, functional, proxy) among the inputs."""
    if (
        global_module_hooks_set()
        or jit_tracing()
        or is_fx_symbolic_tracing()
        or torch.compiler.is_compiling()
    ):
        return False
    for value in flat:
        kind = type(value)
        if kind is not torch.Tensor and kind is not torch.nn.Parameter and isinstance(
            value, torch.Tensor
        ):
            return False
    return True
