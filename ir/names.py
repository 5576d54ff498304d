"""Stable, readable names: for node targets (printer, alpha key) and fresh node names (passes)."""

from __future__ import annotations

from typing import Any

from ir import ops


def target_name(target: Any) -> str:
    """A deterministic readable name for an fx target (operator, function, method or path)."""
    if isinstance(target, str):
        return target
    if ops.facts(target).kind in (ops.OVERLOAD, ops.PACKET):
        return str(target)
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if qualname is not None:
        return f"{module}.{qualname}" if module else qualname
    return str(target)


def fresh_name(base: str, taken: Names) -> str:
    """A name starting with ``base`` that is not in ``taken``; adds it to ``taken``.

    Amortized O(1): the next suffix to try for each base is remembered alongside ``taken``
    (so it must be a ``Names`` set, not a plain one: naming k nodes after one base then costs
    O(k), not O(k²)). Raises ``TypeError`` for a plain set.
    """
    if not isinstance(taken, Names):
        raise TypeError(f"fresh_name needs a Names set of taken names, got {type(taken).__name__}")
    base = base or "_"
    if base not in taken:
        taken.add(base)
        return base
    counters = taken.counters
    i = counters.get(base, 1)
    while f"{base}_{i}" in taken:
        i += 1
    counters[base] = i + 1
    name = f"{base}_{i}"
    taken.add(name)
    return name


class Names(set):
    """A set of taken names that also remembers, per base, where ``fresh_name`` stopped."""

    def __init__(self, names=()) -> None:
        super().__init__(names)
        self.counters: dict[str, int] = {}

