"""Which names a submodule, parameter, buffer or constant may take on an ``nn.Module``.

torch's ``add_module`` / ``register_parameter`` / ``register_buffer`` refuse a name that is not a
string, is empty, holds a ``.``, or is already an attribute of the module (``forward``,
``training``, ``__class__``, ``_modules``, ``state_dict``, ...): such a program cannot come from
an eager model. Writing the tables directly would *shadow* silently instead (``m.forward`` stays
the method while ``state_dict()`` lists ``forward``), so purefx refuses these names when it
imports or verifies a program, naming the fqn and how to rename it.
"""

from __future__ import annotations

import torch

# Every attribute name of a plain ``torch.nn.Module()``: its class's methods and properties and
# the instance attributes ``__init__`` sets (a constant of the installed torch).
RESERVED_NAMES: frozenset[str] = frozenset(dir(torch.nn.Module())) | frozenset(dir(torch.nn.Module))


def attribute_name_fault(name: object) -> str | None:
    """Why ``name`` cannot name a submodule or state attribute of an ``nn.Module``, or ``None``.

    **Laws:** ``None`` exactly when torch's ``register_buffer(name, t)`` on a fresh
    ``nn.Module()`` succeeds. O(len(name)).
    """
    if type(name) is not str:
        return f"is a {type(name).__name__}, not a string"
    if not name:
        return "is empty"
    if "." in name:
        return "holds a '.'"
    if name in RESERVED_NAMES:
        return f"is an attribute of every nn.Module (torch.nn.Module.{name})"
    return None


def all_attribute_names(names: set[str] | frozenset[str]) -> bool:
    """Whether each of ``names`` (strings without a ``.``, such as the steps of dotted paths)
    can name a submodule or state attribute: ``attribute_name_fault`` is ``None`` for each.
    O(len(names)), in C."""
    return "" not in names and RESERVED_NAMES.isdisjoint(names)


def rename_hint(name: object) -> str:
    """The advice that ends a refused name's message."""
    if type(name) is str and name:
        fixed = name.strip("_").replace(".", "_") or "x"
        return f"rename it in the eager model (e.g. {fixed + '_'!r}) and export again"
    return "rename it in the eager model and export again"


def check_path(path: object, what: str, error: type[Exception]) -> None:
    """Raise ``error`` unless every step of the dotted ``path`` can be an attribute name of an
    ``nn.Module`` (``path_fault``): ``a.forward`` or ``training`` cannot. The message names
    ``what`` (``"state"``, a call graph entry's module path), the step and how to rename it.
    O(len(path))."""
    if type(path) is not str:
        raise error(f"{what} fqn {path!r} is a {type(path).__name__}, not a dotted path")
    found = path_fault(path)
    if found is not None:
        step, fault = found
        raise error(
            f"{what} {path!r}: the name {step!r} {fault}, so torch cannot register it on a "
            f"module; {rename_hint(step)}"
        )


def path_fault(path: str) -> tuple[str, str] | None:
    """The first step of the dotted ``path`` that cannot be an attribute name, with the reason;
    ``None`` when every step can. O(len(path))."""
    steps = path.split(".")
    if RESERVED_NAMES.isdisjoint(steps) and "" not in steps:  # the common case, in C
        return None
    for step in steps:
        fault = attribute_name_fault(step)
        if fault is not None:
            return step, fault
    return None


def first_path_fault(paths: tuple[str, ...] | list[str]) -> tuple[object, str, str] | None:
    """``(path, step, reason)`` for the first of ``paths`` with a step that cannot be an
    attribute name (``path_fault``), or ``None``. O(total length); one C-level pass over all
    steps when every path is fine (the common case)."""
    try:
        steps = ".".join(paths).split(".")
    except TypeError:  # a path that is not a string: found below
        steps = None
    if steps is not None and RESERVED_NAMES.isdisjoint(steps) and ("" not in steps or not paths):
        return None
    for path in paths:
        if type(path) is not str:
            return path, str(path), f"is a {type(path).__name__}, not a string"
        found = path_fault(path)
        if found is not None:
            return (path, *found)
    return None
