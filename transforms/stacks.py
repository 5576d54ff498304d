"""Module stacks at their public path, ``transforms.stacks``: the passes that repair them
(``fix_module_stacks``, ``fill_call_gaps``: ``transforms.passes.module_stacks``), reading a
node's module calls (``node_frames``, ``graph_frames``, ``FrameOf``:
``transforms.machinery.frames``) and the stack values (``Frame``, ``stack_frames``,
``EMPTY_STACK_KEY``: ``ir.module_stack``).

A door: it only re-exports, for users; the library imports each name from its home.
"""

from ir.module_stack import EMPTY_STACK_KEY, Frame, stack_frames
from transforms.machinery.frames import FrameOf, graph_frames, node_frames
from transforms.passes.module_stacks import fill_call_gaps, fix_module_stacks

__all__ = [
    "EMPTY_STACK_KEY",
    "Frame",
    "FrameOf",
    "fill_call_gaps",
    "fix_module_stacks",
    "graph_frames",
    "node_frames",
    "stack_frames",
]
