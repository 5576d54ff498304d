"""Reading module stacks: the module calls a node runs in, from its ``nn_module_stack`` meta.

A node's module stack lists the module calls it runs inside, outermost first. Each entry is one
``Frame`` (``ir.module_stack``: the module's identity key, its path, its class name and which
call of it this is). The passes that follow the stack (``outline``, ``fill_call_gaps``, the
preserved-call stages, ``split_by_tags``) read it here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ir.errors import PassError
from ir.graph import Graph
from ir.memo import WeakMemo
from ir.module_stack import NO_STACK, Frame
from ir.node import Node

__all__ = ["FrameOf", "common_prefix", "graph_frames", "node_frames", "part_frames"]

#: A partition key: the nested calls a node runs in (outermost first), or ``None`` to keep it in
#: the current call (``node_frames`` reads ``nn_module_stack``; ``split_by_tags`` reads tags).
FrameOf = Callable[[Node], "tuple[Frame, ...] | None"]


def node_frames(node: Node) -> tuple[Frame, ...] | None:
    """The node's module stack without the root entry; ``None`` for the "keep the current stack"
    marker that torch's metadata hook leaves. Raises ``PassError`` naming a node without one.
    O(1) after the first read of a node (``Node.module_frames`` is a memo)."""
    frames = node.module_frames
    if frames is not NO_STACK:
        return frames
    if node.op == "get_attr":
        return None  # a state read (sinking makes these): it computes nothing, it stays put
    raise PassError(
        f"node {node.name!r} ({node.op} {node.target}) has no nn_module_stack, so it cannot be "
        "placed in a module; export the program with torch.export.export"
    )


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many leading calls the chains ``a`` and ``b`` share (frames, or call names).
    O(min(len(a), len(b)))."""
    k = 0
    while k < len(a) and k < len(b) and a[k] == b[k]:
        k += 1
    return k


def part_frames(part: Mapping[str, int], paths: Sequence[str]) -> FrameOf:
    """The partition key of a cut into parts (``outline_parts``: tags, pipeline stages): a node
    of part ``k`` (``part[node.name]``) runs in one call of the module at ``paths[k]``; a node
    without a part stays where it is. O(1) per node."""
    frames = [(Frame(path, path, None, 0),) for path in paths]

    def frames_of(node: Node) -> tuple[Frame, ...] | None:
        k = part.get(node.name)
        return None if k is None else frames[k]

    return frames_of


def graph_frames(graph: Graph) -> tuple[tuple[Frame, ...] | None | object, ...]:
    """Per node of ``graph``, in order: ``Node.module_frames``, the module calls it runs in
    (``None`` for the "keep the current stack" marker, ``NO_STACK`` for a node without a
    stack); ``NO_STACK`` for the placeholders and the output, which run in no call (their
    stacks are never read).

    The stages and the walk that follow the module stack (``fill_call_gaps``, the
    preserved-call stages, ``outline``) each read every node's frames; this gathers them once
    per graph, so each reads an index, not a property per node. A memo of ``graph``
    (``ir.memo.WeakMemo``): read it, never change it. ``node_frames(node)`` is the entry of the
    node, except where that is ``NO_STACK`` (there ``node_frames`` decides: ``None`` for a state
    read, else its ``PassError``). Complexity: O(n) once per graph, O(1) after.
    """
    return _GRAPH_FRAMES(graph)


def _graph_frames(graph: Graph) -> tuple[tuple[Frame, ...] | None | object, ...]:
    return tuple(
        [NO_STACK if n.op in ("placeholder", "output") else n.module_frames for n in graph.nodes]
    )


_GRAPH_FRAMES: WeakMemo[Graph, tuple] = WeakMemo(_graph_frames)
