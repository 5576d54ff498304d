"""Sinking while outlining (``outline_and_sink``): which inputs of a call become state reads.

``sink_state`` after ``outline`` rebuilds every module graph a second time. When each module
sits at one path and no preserved signature passes state, the same decision can be made when
``outline`` closes a call: a state input owned below the call's module (``StateOwners``) is
read with a ``get_attr`` instead of a placeholder. These are the three pieces of that decision.
"""

from __future__ import annotations

from ir.graph import Graph
from ir.node import Node
from ir.program import Program
from ir.signature import STATE_INPUT_KINDS
from transforms.call_builder import OpenCall
from transforms.sink import StateOwners, sunk_reads


def sinks_in_one_pass(program: Program) -> bool:
    """Whether sinking at each call's close matches ``sink_state``: every module id is its one
    path (``sink_state`` names state from a module's first path), and no preserved signature
    passes state in or out (its value would not come from a placeholder chain)."""
    if any(path and path != mid for path, mid in program.walk()):
        return False
    state = {s.name for s in program.signature.inputs if s.kind in STATE_INPUT_KINDS}
    for sig in program.call_signatures.values():
        if any(arg.name in state for arg in sig.inputs + sig.outputs):
            return False
    return True


def sunk_inputs(owners: StateOwners | None, call: OpenCall) -> dict[str, str]:
    """The state inputs of ``call`` read as ``get_attr`` (name -> fqn local to the call's
    module) when sinking (``owners`` given); state owned elsewhere stays an input."""
    if owners is None:
        return {}
    if call.frame is None:
        names: list[str] = [n.name for n in call.placeholders]
    else:
        names = call.inputs + call.extra_inputs
    sunk = {}
    for name in names:
        fqn = owners.fqn_of.get(name)
        if fqn is not None:
            local = owners.local_name(fqn, call.path)
            if local is not None:
                sunk[name] = local
    return sunk


def sunk_graph(placeholders: list[Node], sunk: dict[str, str], body: list[Node]) -> Graph:
    """A call's graph with its ``sunk`` placeholders turned into reads of the state."""
    if not sunk:
        return Graph(tuple(placeholders + body))
    kept = [n for n in placeholders if n.name not in sunk]
    return Graph(tuple(kept + sunk_reads(placeholders, sunk, body) + body))
