"""The preserved-call stages: the passes that run on the flat root graph before ``outline``.

A preserved call (``preserve_module_call_signature``) takes exactly its eager ``(args,
kwargs)`` and state, and returns exactly its eager outputs. Export does not keep to that, so
before the outlining walk these listed passes (``DEFAULT_PIPELINE``, ``named_passes``, each
runnable alone: ``purefx --passes fill_call_gaps,repair_call_signatures,...``) make every value
that crosses a preserved boundary either part of its signature or state, in this order:

1. ``fill_call_gaps`` (``transforms.stacks``): one module call is one run of nodes;
2. ``repair_call_signatures`` (``signatures``): signature names that ``run_decompositions``
   left stale are repaired;
3. ``rematerialize`` (``remat``): any other value read across a boundary is read as an alias
   or recomputed on the reading side;
4. ``insert_ivals`` (``ivals``): intermediate values of state read across a boundary are
   written back to the state.

The analysis they share, which values stand for state, is ``state_traffic.state_traffic`` (a
memo on the Program); the preserved-call nesting is ``nesting``; the pytree plumbing the
outlining walk builds at each preserved call is ``pytrees``. Each stage takes a flat program
and raises ``PassError`` for an outlined one.
"""

from __future__ import annotations

from ir.program import Program
from transforms.machinery.frames import FrameOf, node_frames
from transforms.passes.module_stacks import fill_call_gaps
from transforms.preserved.ivals import insert_ivals
from transforms.preserved.remat import rematerialize
from transforms.preserved.signatures import repair_call_signatures

__all__ = [
    "PRESERVED_STAGES",
    "fill_call_gaps",
    "insert_ivals",
    "prepare_outline",
    "rematerialize",
    "repair_call_signatures",
]

#: The stages, in the order the default pipeline runs them before ``outline``.
PRESERVED_STAGES = (fill_call_gaps, repair_call_signatures, rematerialize, insert_ivals)


def prepare_outline(
    program: Program, frames_of: FrameOf = node_frames, *, fill_gaps: bool = True
) -> Program:
    """The preserved-call stages composed (``PRESERVED_STAGES``), with partition key
    ``frames_of``; ``fill_gaps=False`` leaves out ``fill_call_gaps`` (a key other than the
    module stack has no gaps to fill).

    **Laws:** ``prepare_outline(p) == insert_ivals(rematerialize(repair_call_signatures(
    fill_call_gaps(p))))``; each stage returns its input itself (``is``) when it has nothing to
    do, so ``prepare_outline(prepare_outline(p)) == prepare_outline(p)``. Raises ``PassError``
    for an outlined program. Complexity: O(n · d) for n nodes in preserved calls d deep.
    """
    if fill_gaps:
        program = fill_call_gaps(program)
    program = repair_call_signatures(program, frames_of)
    program = rematerialize(program, frames_of)
    return insert_ivals(program, frames_of)
