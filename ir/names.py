"""Stable, readable names for node targets (used by the printer and the alpha key)."""

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
