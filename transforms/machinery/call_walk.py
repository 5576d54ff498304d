"""The walk ``outline`` follows over the flat root graph: where each module call opens and
closes, and how long each value lives.

Both are read off the flat graph alone, apart from the graph building: ``call_steps`` turns the
nodes and their frames (``frames_of``: the nested calls a node runs in, outermost first, or
``None`` to stay in the current call) into a sequence of steps, and ``last_uses`` says up to
which node each value is read, which is what a call returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ir.graph import Graph
from ir.memo import WeakMemo
from ir.module_stack import NO_STACK, Frame
from ir.node import OUTPUT, PLACEHOLDER, Node
from ir.signature import CallSignature
from transforms.machinery.frames import FrameOf, common_prefix, graph_frames, node_frames

# the kinds of step ``call_steps`` yields
INPUT = "input"  # a placeholder of the root
OPEN = "open"  # a call of ``frame`` opens inside the innermost open call
NODE = "node"  # a node that runs in the innermost open call
CLOSE = "close"  # the innermost open call closes before the node at ``at``
RETURN = "return"  # the root's output node (every call closed before it)

Step = tuple[str, int, Any]


def call_steps(graph: Graph, frames_of: FrameOf, copied: Callable[[Node], bool]) -> Iterator[Step]:
    """``(kind, at, what)`` steps over ``graph``'s nodes in order: ``(INPUT, at, node)``,
    ``(OPEN, at, frame)``, ``(NODE, at, node)``, ``(CLOSE, at, None)``, ``(RETURN, at, node)``.

    Before a node, the open calls that are not a prefix of its frames close (innermost first)
    and its remaining frames open (outermost first); a node whose frames are ``None`` stays in
    the innermost open call; a ``copied`` node belongs to no call and yields no step. Every
    open call closes before the output node.

    **Laws:** OPEN and CLOSE steps nest like brackets; the NODE steps are the nodes that are
    neither placeholders, the output nor copied, in order. Complexity: O(n · stack depth).
    """
    open_frames: list[Frame] = []
    # the frames tuple last walked into: ``open_frames`` equals it, so a node that shares it
    # (consecutive nodes of one call share one tuple) opens and closes nothing
    entered: Any = None
    # the module stack's frames are read once per graph (``graph_frames``)
    known = graph_frames(graph) if frames_of is node_frames else None
    for at, node in enumerate(graph.nodes):
        if node.op == PLACEHOLDER:
            yield INPUT, at, node
        elif node.op == OUTPUT:
            for _ in open_frames:
                yield CLOSE, at, None
            open_frames.clear()
            entered = None
            yield RETURN, at, node
        elif copied(node):
            continue
        else:
            frames = frames_of(node) if known is None else known[at]
            if frames is NO_STACK:
                frames = node_frames(node)  # ``None`` for a state read, else its error
            if frames is not None and frames is not entered:
                entered = frames
                depth = common_prefix(open_frames, frames)
                while len(open_frames) > depth:
                    open_frames.pop()
                    yield CLOSE, at, None
                for frame in frames[depth:]:
                    open_frames.append(frame)
                    yield OPEN, at, frame
            yield NODE, at, node


def last_uses(
    graph: Graph, frames_of: FrameOf, call_signatures: Mapping[str, CallSignature]
) -> dict[str, int]:
    """Value name -> position of the last node that reads it.

    With more than one preserved call, a preserved call's signature inputs count as read at
    its first node and its outputs at the node after its last one: the call takes the first
    when it starts and must hand back the second when it ends, even if no node reads them
    there. Complexity: O(n · stack depth).
    """
    last: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        for r in node.inputs():
            last[r.name] = i
    if len(call_signatures) <= 1:
        return last
    first_at, last_at = call_spans(graph, frames_of)
    for name, sig in call_signatures.items():
        if name not in first_at:
            continue
        for arg in sig.inputs:
            if arg.name:
                last[arg.name] = max(last.get(arg.name, -1), first_at[name])
        for arg in sig.outputs:
            if arg.name:
                last[arg.name] = max(last.get(arg.name, -1), last_at[name] + 1)
    return last


def node_positions(graph: Graph) -> dict[str, int]:
    """Node name -> its position in ``graph``: a memo of the graph (``ir.memo.WeakMemo``), read
    by the preserved-call stages, which all ask where values are made; read it, never change
    it. O(n) once per graph, O(1) after."""
    return _POSITIONS(graph)


def _node_positions(graph: Graph) -> dict[str, int]:
    return {n.name: i for i, n in enumerate(graph.nodes)}


_POSITIONS: WeakMemo[Graph, dict[str, int]] = WeakMemo(_node_positions)


def call_spans(graph: Graph, frames_of: FrameOf) -> tuple[dict[str, int], dict[str, int]]:
    """Call name -> the position of its first node, and of its last node.

    Nodes of one call run next to each other, so frames are compared only where they change
    (consecutive nodes of a call share one frames tuple): O(n + changes · stack depth).
    Placeholders, the output and nodes without a module stack take no part. For the module
    stack (``node_frames``) the answer is a memo of the graph, computed once for the stages and
    the walk that read it: the tables are shared, read them only.
    """
    if frames_of is node_frames:
        return _MODULE_CALL_SPANS(graph)
    return _call_spans(graph, frames_of)


def _module_call_spans(graph: Graph) -> tuple[dict[str, int], dict[str, int]]:
    # ``graph_frames`` is ``NO_STACK`` exactly for the nodes ``_call_spans`` leaves out
    frames = graph_frames(graph)
    return _spans((i, f or ()) for i, f in enumerate(frames) if f is not NO_STACK)


def _call_spans(graph: Graph, frames_of: FrameOf) -> tuple[dict[str, int], dict[str, int]]:
    return _spans(
        (i, frames_of(node) or ())
        for i, node in enumerate(graph.nodes)
        if node.op not in (PLACEHOLDER, OUTPUT) and node.meta.get("nn_module_stack")
    )


def _spans(
    runs: Iterator[tuple[int, tuple[Frame, ...]]],
) -> tuple[dict[str, int], dict[str, int]]:
    """``call_spans`` of the (position, frames) of the nodes that take part, in order."""
    first_at: dict[str, int] = {}
    last_at: dict[str, int] = {}
    current: tuple = ()
    current_at = -1  # the last node that ran in ``current``
    for i, frames in runs:
        if frames is not current and frames != current:
            for frame in current:
                last_at[frame.call_name] = current_at
            for frame in frames:
                first_at.setdefault(frame.call_name, i)
            current = frames
        current_at = i
    for frame in current:
        last_at[frame.call_name] = current_at
    return first_at, last_at


_MODULE_CALL_SPANS: WeakMemo[Graph, tuple[dict[str, int], dict[str, int]]] = WeakMemo(
    _module_call_spans
)
