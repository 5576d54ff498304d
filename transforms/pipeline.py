"""``transform(p, passes)``: compose pure passes; the default pipeline."""

from __future__ import annotations

from typing import Callable, Sequence

from ir.gcpause import gc_paused
from ir.program import Program
from ir.verify import verify
from transforms.dedup import deduplicate
from transforms.effects import remove_effect_tokens
from transforms.mutations import functional_to_inplace
from transforms.outline import outline
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


@gc_paused
def transform(
    program: Program, passes: Sequence[Pass] | None = None, *, check: bool = False
) -> Program:
    """Apply ``passes`` (default: ``DEFAULT_PIPELINE``) in order and return the final Program.

    Pure: ``program`` is not changed. With ``check=True`` every intermediate Program is verified.
    **Laws:** ``transform(p, []) is p``; ``transform(p, a + b) == transform(transform(p, a), b)``.
    """
    for run in DEFAULT_PIPELINE if passes is None else passes:
        program = run(program)
        if check:
            verify(program)
    return program
