"""``transform(p, passes)``: compose pure passes; the default pipeline."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ir.gcpause import gc_paused
from ir.program import Program
from ir.verify import verify
from transforms.dedup import deduplicate
from transforms.effects import remove_effect_tokens
from transforms.mutations import functional_to_inplace
from transforms.outline import outline, outline_and_sink
from transforms.sink import sink_state
from transforms.stacks import fix_module_stacks

Pass = Callable[[Program], Program]


def pipeline(*, keep_functional: bool = False) -> tuple[Pass, ...]:
    """The passes that turn an imported program into ``torch.export.unflatten``'s shape.

    ``keep_functional=True`` leaves functionalized buffer and input mutations as outputs of the
    root (applied after each call) instead of turning them back into in-place ``copy_``.
    """
    passes: list[Pass] = [remove_effect_tokens]
    if not keep_functional:
        passes.append(functional_to_inplace)
    passes += [fix_module_stacks, outline, sink_state, deduplicate]
    return tuple(passes)


DEFAULT_PIPELINE: tuple[Pass, ...] = pipeline()

# Adjacent passes whose composition has a faster implementation with exactly the same result.
_FUSED: dict[tuple[Pass, Pass], Pass] = {
    (outline, sink_state): outline_and_sink,  # one rebuild of each module graph, not two
}


def _fuse(passes: Sequence[Pass]) -> list[Pass]:
    fused: list[Pass] = []
    i = 0
    while i < len(passes):
        both = _FUSED.get(tuple(passes[i : i + 2])) if i + 1 < len(passes) else None
        fused.append(both or passes[i])
        i += 2 if both else 1
    return fused


@gc_paused
def transform(
    program: Program, passes: Sequence[Pass] | None = None, *, check: bool = False
) -> Program:
    """Apply ``passes`` (default: ``DEFAULT_PIPELINE``) in order and return the final Program.

    Pure: ``program`` is not changed. With ``check=True`` every intermediate Program is verified.
    Adjacent passes with an exact fused form (``outline, sink_state``) run fused unless
    ``check=True``. **Laws:** ``transform(p, []) is p``;
    ``transform(p, a + b) == transform(transform(p, a), b)``.
    """
    chosen = DEFAULT_PIPELINE if passes is None else passes
    for run in chosen if check else _fuse(chosen):
        program = run(program)
        if check:
            verify(program)
    return program
