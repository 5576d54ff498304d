"""Stable, readable names: for node targets (printer, alpha key) and fresh node names (passes)."""

from __future__ import annotations

from typing import Any


def target_name(target: Any) -> str:
    """A deterministic readable name for an fx target (operator, function, method or path)."""
    if isinstance(target, str):
        return target
    name = getattr(target, "name", None)
    if callable(name) and type(target).__name__ in ("OpOverload", "OpOverloadPacket"):
        return str(target)
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if qualname is not None:
        return f"{module}.{qualname}" if module else qualname
    return str(target)


def fresh_name(base: str, taken: set[str]) -> str:
    """A name starting with ``base`` that is not in ``taken``; adds it to ``taken``."""
    base = base or "_"
    if base not in taken:
        taken.add(base)
        return base
    i = 1
    while f"{base}_{i}" in taken:
        i += 1
    name = f"{base}_{i}"
    taken.add(name)
    return name

