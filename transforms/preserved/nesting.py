"""Nesting of preserved calls in the flat root graph: which preserved calls each node runs in.

Read by the stages that rewrite reads across preserved call boundaries
(``transforms.preserved.remat``, ``transforms.preserved.ivals``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ir.graph import Graph
from ir.module_stack import NO_STACK, Frame
from ir.node import OUTPUT, PLACEHOLDER, Node
from transforms.machinery.frames import FrameOf, common_prefix, graph_frames, node_frames

__all__ = ["common_prefix", "preserved_chains"]


def preserved_chains(graph: Graph, frames_of: FrameOf, sigs: Any) -> tuple[
    dict[str, tuple[str, ...]], dict[str, tuple[Frame, ...]], dict[str, Any], Callable[[Node], Any]
]:
    """Per node of the flat root graph ``graph``, the preserved calls it runs in.

    ``sigs`` holds the names of the preserved calls. Returns ``(chain, frames_at, root_stack,
    stack_of)``: node name -> the preserved call names it runs in (outermost first); node name
    -> its frames; the root's module stack entries; and a function giving the module stack meta
    a copy made for a reader takes. Complexity: O(n) for n nodes (one tuple per distinct stack).
    """
    chain: dict[str, tuple[str, ...]] = {}
    frames_at: dict[str, tuple[Frame, ...]] = {}
    # frames tuple (by identity: equal stacks share one, and a Frame hashes in Python) -> the
    # tuple itself, so that its id is not reused, and its chain
    by_frames: dict[int, tuple[tuple[Frame, ...], tuple[str, ...]]] = {}
    current: tuple[Frame, ...] = ()
    looked: Any = None  # the frames ``found`` is the chain of
    found: tuple[str, ...] = ()
    root_stack: dict[str, Any] = {}
    # the module stack's frames are read once per graph (``graph_frames``)
    known = graph_frames(graph) if frames_of is node_frames else None
    for i, node in enumerate(graph.nodes):
        if node.op in (PLACEHOLDER, OUTPUT):
            chain[node.name] = ()
            frames_at[node.name] = ()
            continue
        frames = frames_of(node) if known is None else known[i]
        if frames is NO_STACK:
            frames = node_frames(node)  # ``None`` for a state read, else its error
        if frames is not None:
            current = frames
            if not root_stack:
                stack = node.meta.get("nn_module_stack") or {}
                root_stack = {k: v for k, v in stack.items() if not v[0]}
        if current is not looked:  # consecutive nodes of a call share one frames tuple
            known_chain = by_frames.get(id(current))
            if known_chain is None:
                found = tuple(f.call_name for f in current if f.path and f.call_name in sigs)
                by_frames[id(current)] = (current, found)
            else:
                found = known_chain[1]
            looked = current
        chain[node.name] = found
        frames_at[node.name] = current

    def stack_of(reader: Node) -> Any:
        if reader.op == OUTPUT:
            return dict(root_stack)
        return reader.meta.get("nn_module_stack")

    return chain, frames_at, root_stack, stack_of
