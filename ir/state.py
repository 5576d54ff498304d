"""State slots and the opaque tensor table.

``Program.state`` maps each state fqn to a ``Slot``; a slot names its tensor by key in
``Program.tensors``, so aliasing (tied weights, shared modules) is explicit: two fqns, one key.
Tensors are held opaquely and never written by the IR.
"""

from __future__ import annotations

from typing import Any

import attrs

from ir.slot_init import slot_init

PARAMETER = "parameter"
BUFFER = "buffer"
CONSTANT = "constant"
CUSTOM_OBJ = "custom_obj"
STATE_KINDS = (PARAMETER, BUFFER, CONSTANT, CUSTOM_OBJ)


@slot_init
@attrs.frozen(cache_hash=True)
class Slot:
    """One piece of module state: its kind, the key of its tensor, and how torch registers it."""

    kind: str
    tensor: str
    persistent: bool = True
    requires_grad: bool = False


class Opaque:
    """An immutable holder compared by the identity of what it holds (tensors, script objects)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        _set_value(self, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Opaque is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)

    def __repr__(self) -> str:
        v = self.value
        shape = getattr(v, "shape", None)
        if shape is not None:
            return f"<{type(v).__name__} {tuple(shape)} {getattr(v, 'dtype', '')}>"
        return f"<{type(v).__name__}>"

    def __reduce__(self):
        return (Opaque, (self.value,))


# The slot's own setter, past the immutable ``__setattr__`` (cheaper than ``object.__setattr__``,
# which looks the slot up by name: an import holds each state tensor in an Opaque)
_set_value = Opaque.value.__set__  # type: ignore[attr-defined]
