"""Module stacks: reading ``nn_module_stack`` meta, and the pass that repairs stacks.

A node's module stack lists the module calls it runs inside, outermost first. Each entry is one
``Frame``: the module's identity key, its path, its class name and which call of it this is.
"""

from __future__ import annotations

import logging

import attrs

from ir.errors import PassError
from ir.graph import Graph
from ir.node import Node
from ir.program import Program

log = logging.getLogger("purefx")

EMPTY_STACK_KEY = "_empty_nn_module_stack_from_metadata_hook"


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


def node_frames(node: Node) -> tuple[Frame, ...] | None:
    """The node's module stack without the root entry; ``None`` for the "keep the current stack"
    marker that torch's metadata hook leaves. Raises ``PassError`` naming a node without one."""
    stack = node.meta.get("nn_module_stack")
    if not stack and node.op == "get_attr":
        return None  # a state read (sinking makes these): it computes nothing, it stays put
    if not stack:
        raise PassError(
            f"node {node.name!r} ({node.op} {node.target}) has no nn_module_stack, so it cannot be "
            "placed in a module; export the program with torch.export.export"
        )
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


def _nesting_prefix(program: Program, items: tuple) -> int:
    """How many leading entries of a module stack nest, each inside the one before."""
    keep = 1
    prev = items[0][1][0]
    for _, (path, _) in items[1:]:
        if not _nests(prev, path) or program.resolve(path) is None:
            break
        keep += 1
        prev = path
    return keep


def _nests(outer: str, inner: str) -> bool:
    return outer == "" or inner.startswith(outer + ".")


def fix_module_stacks(program: Program) -> Program:
    """Cut every root-graph module stack at its first entry that is not inside the one before.

    A call to a sibling of an ancestor leaves a stack such as ``[a, b]`` with ``b`` not inside
    ``a``; such entries and all after them are dropped (the node stays in ``a``) and a warning is
    logged on the ``purefx`` logger, as ``torch.export.unflatten`` does. So are entries whose path
    names no module of the program (strict export may record an access path such as
    ``a.leaf._peer[0]``).

    **Laws:** idempotent; returns ``program`` itself when every stack nests; changes meta only, so
    the result is ``==`` to the input. Complexity: O(n · stack depth).
    """
    root = program.root_module
    graph = root.graph
    nodes = list(graph.nodes)
    changed = False
    nesting: dict[tuple, int] = {}  # stack entries -> how many entries nest (stacks repeat)
    for i, node in enumerate(nodes):
        stack = node.meta.get("nn_module_stack")
        if not stack:
            continue
        items = tuple(stack.items())
        try:
            keep = nesting.get(items)
        except TypeError:  # an unhashable entry: check this stack on its own
            keep = _nesting_prefix(program, items)
        if keep is None:
            keep = nesting[items] = _nesting_prefix(program, items)
        if keep < len(items):
            log.warning(
                "nn_module_stack paths %s of node %s do not nest; dropping the last %d entries",
                [p for _, (p, _) in items],
                node.name,
                len(items) - keep,
            )
            nodes[i] = node.with_meta(nn_module_stack=dict(items[:keep]))
            changed = True
    if not changed:
        return program
    new_root = root.replace(graphs=(Graph(tuple(nodes)),) + root.graphs[1:])
    return program.replace(modules=program.modules.set(program.root, new_root))
