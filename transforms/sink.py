"""Sinking at its public path, ``transforms.sink``: ``sink_state`` (the pass), ``StateOwners``
and the pieces ``outline_and_sink`` shares. They live in ``transforms.passes.state_sinking``.

A door: it only re-exports, for users; the library imports each name from its home.
"""

from transforms.passes.state_sinking import (
    StateOwners,
    finish_sinking,
    input_reads,
    sink_state,
    sinks_in_one_pass,
    sunk_graph,
    sunk_inputs,
    sunk_reads,
)

__all__ = [
    "StateOwners",
    "finish_sinking",
    "input_reads",
    "sink_state",
    "sinks_in_one_pass",
    "sunk_graph",
    "sunk_inputs",
    "sunk_reads",
]
