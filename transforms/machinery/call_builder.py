"""The builder of one module call while ``outline`` walks the flat graph.

An ``OpenCall`` collects the nodes of one call of one module (a new graph variant) from the
moment its first node is met until the walk leaves it; then the call is frozen into a
``Graph`` and its caller gets a ``call_module`` node. It is the only mutable value outlining
shares between its parts (``transforms.passes.outline`` walks and reads values,
``transforms.preserved.pytrees`` builds the plumbing of preserved signatures).
"""

from __future__ import annotations

from typing import Any

from ir.module_stack import Frame
from ir.node import Node
from ir.signature import CallSignature


class OpenCall:
    """One open module call: its frame (``None`` for the root), module path, first node's
    position, preserved signature (or ``None``), and the graph being built.

    ``placeholders`` and ``body`` are the new graph's nodes; ``env`` maps a flat value's name to
    its local value in this call; ``inputs`` are the flat values threaded in as placeholders,
    ``extra_inputs`` the state threaded into a preserved call after its positional
    placeholders (``n_positional`` of them); ``defined`` the flat values computed here, which
    the call may return. A plain call (neither the root nor preserved) leaves ``placeholders``
    empty: its placeholders are its ``inputs``, made when it closes (an input sunk into a state
    read gets none).
    """

    def __init__(self, frame: Frame | None, path: str, start: int, sig: CallSignature | None):
        self.frame = frame
        self.path = path
        self.start = start
        self.sig = sig
        self.placeholders: list[Node] = []
        self.body: list[Node] = []
        self.env: dict[str, Any] = {}
        self.inputs: list[str] = []
        self.extra_inputs: list[str] = []
        self.defined: list[str] = []
        self.n_positional = 0

    @property
    def meta(self) -> dict[str, Any]:
        """The meta of the ``call_module`` node that calls this call."""
        return {"purefx_call": self.frame.call_name} if self.frame else {}


def call_base(target: str) -> str:
    """The base of a fresh node name for a ``call_module`` of ``target``
    (``a.b@1`` -> ``a_b_1``)."""
    return target.replace(".", "_").replace("@", "_")
