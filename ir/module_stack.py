"""Module stacks as values: the nested module calls a node runs in, read from its meta.

A node's ``nn_module_stack`` meta lists the module calls it runs inside, outermost first, as
``key -> (path, type)`` entries; the first entry is the root's (path ``""``). Each entry after it
is one ``Frame``: the module's identity key, its path, its class name and which call of it this
is. ``Node.module_frames`` reads a node's frames once (a memo); the passes that repair stacks
live in ``transforms.stacks``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from ir.slot_init import slot_init

EMPTY_STACK_KEY = "_empty_nn_module_stack_from_metadata_hook"


@slot_init
@attrs.frozen(cache_hash=True)
class Frame:
    """One entry of a module stack: call number ``call`` of the module ``key`` at ``path``."""

    key: str
    path: str
    type_name: str | None
    call: int

    @property
    def call_name(self) -> str:
        """The export's name of this call: ``path`` for the first, ``path@n`` after."""
        return self.path if self.call == 0 else f"{self.path}@{self.call}"


class _NoStack:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_STACK"


#: What ``Node.module_frames`` is for a node whose meta has no (or an empty) module stack.
NO_STACK = _NoStack()


def stack_frames(stack: Mapping[str, tuple]) -> tuple[Frame, ...] | None:
    """The frames of a non-empty module stack without its root entry; ``None`` for the "keep
    the current stack" marker that torch's metadata hook leaves. Equal stacks share one tuple
    (remembered by their entries, bounded). O(stack depth)."""
    if len(stack) == 1 and EMPTY_STACK_KEY in stack:
        return None
    entries = tuple(stack.items())
    try:
        found = _FRAMES.get(entries)
    except TypeError:  # an unhashable entry: nothing to share
        return _frames(entries)
    if found is None:
        found = _frames(entries)
        if len(_FRAMES) >= _FRAMES_CACHE_SIZE:
            _FRAMES.clear()
        _FRAMES[entries] = found
    return found


def meta_frames(meta: Mapping[str, object]) -> tuple[Frame, ...] | None | _NoStack:
    """``stack_frames`` of ``meta``'s module stack, or ``NO_STACK`` when it has none."""
    stack = meta.get("nn_module_stack")
    return stack_frames(stack) if stack else NO_STACK  # type: ignore[arg-type]


# Frames by stack entries: the nodes of one module call share equal stacks, so most lookups hit.
_FRAMES: dict[tuple, tuple[Frame, ...]] = {}
_FRAMES_CACHE_SIZE = 1 << 16


def _frames(entries: tuple) -> tuple[Frame, ...]:
    frames = []
    for key, (path, type_name) in entries:
        if not path:
            continue
        base, _, n = key.partition("@")
        frames.append(Frame(base, path, type_name, int(n) if n.isdigit() else 0))
    return tuple(frames)


def common_stack(stacks: Sequence[Mapping[str, tuple]]) -> dict[str, tuple]:
    """The longest module stack that every one of ``stacks`` (at least one) begins with: the
    calls a group of nodes all run in (the root's entry at least, for export's stacks).
    O(total entries)."""
    common = list(stacks[0].items())
    for stack in stacks[1:]:
        items = list(stack.items())
        k = 0
        while k < min(len(common), len(items)) and common[k] == items[k]:
            k += 1
        common = common[:k]
    return dict(common)
