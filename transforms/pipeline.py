"""``transform(p, passes)``: compose pure passes; the default pipeline."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ir.errors import PassError
from ir.gcpause import gc_paused
from ir.program import Program
from ir.verify import verify
from transforms.machinery.pass_checks import require_program
from transforms.passes.dedup import deduplicate
from transforms.passes.effect_tokens import remove_effect_tokens
from transforms.passes.foreign_state import hold_foreign_state
from transforms.passes.hop_split import split_hop_bodies
from transforms.passes.module_stacks import fix_module_stacks
from transforms.passes.mutations import functional_to_inplace
from transforms.passes.outline import outline, outline_and_sink, prepare_outline_and_sink
from transforms.passes.state_sinking import sink_state
from transforms.preserved import PRESERVED_STAGES

Pass = Callable[[Program], Program]


def pipeline(*, keep_functional: bool = False) -> tuple[Pass, ...]:
    """The passes that turn an imported program into ``torch.export.unflatten``'s shape.

    ``keep_functional=True`` leaves functionalized buffer and input mutations as outputs of the
    root (applied after each call) instead of turning them back into in-place ``copy_``.
    """
    passes: list[Pass] = [remove_effect_tokens]
    if not keep_functional:
        passes.append(functional_to_inplace)
    passes += [
        split_hop_bodies,
        fix_module_stacks,
        # the preserved-call stages (``transforms.preserved``), on the flat root graph
        *PRESERVED_STAGES,
        outline,  # the outlining walk
        sink_state,
        deduplicate,
    ]
    return tuple(passes)


DEFAULT_PIPELINE: tuple[Pass, ...] = pipeline()

# Runs of adjacent passes whose composition has a faster implementation with exactly the same
# result; the longest run that matches is taken.
_FUSED: dict[tuple[Pass, ...], Pass] = {
    # the stages once: ``outline`` would run them again, only to check (``prepare_outline``)
    (*PRESERVED_STAGES, outline, sink_state): prepare_outline_and_sink,
    (outline, sink_state): outline_and_sink,  # one rebuild of each module graph, not two
}
_FUSED_LENGTHS = sorted({len(run) for run in _FUSED}, reverse=True)


def _fuse(passes: Sequence[Pass]) -> list[Pass]:
    passes = tuple(passes)
    fused: list[Pass] = []
    i = 0
    while i < len(passes):
        for n in _FUSED_LENGTHS:
            run = _FUSED.get(passes[i : i + n])
            if run is not None:
                fused.append(run)
                i += n
                break
        else:
            fused.append(passes[i])
            i += 1
    return fused


def named_passes() -> dict[str, Pass]:
    """Pass name -> pass: the names ``transform`` and ``purefx --passes`` accept.

    The default pipeline's passes (both mutation modes), then the inverse and boundary passes
    and the cleanup passes (``eliminate_dead_code``, ``cse``, ``fold_constants`` with its
    default ``max_bytes``) that take a Program alone. One table for the API and the command
    line.
    """
    from transforms.passes.constant_folding import fold_constants
    from transforms.passes.dce import eliminate_dead_code
    from transforms.passes.inlining import inline
    from transforms.passes.subexpressions import cse
    from transforms.passes.tag_split import move_non_tensor_nodes_on_boundary

    table: dict[str, Pass] = {}
    extra = (inline, move_non_tensor_nodes_on_boundary, eliminate_dead_code, cse, fold_constants)
    for p in (*pipeline(), *pipeline(keep_functional=True), *extra):
        table.setdefault(p.__name__, p)
    table.setdefault(hold_foreign_state.__name__, hold_foreign_state)  # sink_state's last step
    return table


def resolve_passes(passes: Sequence[Pass | str]) -> list[Pass]:
    """``passes`` with each name replaced by its pass (``named_passes``); ``PassError`` naming an
    unknown name (and listing the known ones) or an entry that is neither a name nor callable."""
    if isinstance(passes, str):
        passes = [passes]
    table: dict[str, Pass] | None = None
    resolved = []
    for p in passes:
        if isinstance(p, str):
            table = table or named_passes()
            if p not in table:
                raise PassError(f"unknown pass {p!r}; known passes: {', '.join(table)}")
            resolved.append(table[p])
        elif callable(p):
            resolved.append(p)
        else:
            raise PassError(
                f"a pass is a function Program -> Program or its name, not a {type(p).__name__}"
            )
    return resolved


@gc_paused
def transform(
    program: Program, passes: Sequence[Pass | str] | None = None, *, check: bool = False
) -> Program:
    """Apply ``passes`` (default: ``DEFAULT_PIPELINE``) in order and return the final Program.

    A pass is a function ``Program -> Program`` or its name (``"outline"``; see
    ``named_passes``). Pure: ``program`` is not changed. With ``check=True`` every intermediate
    Program is verified. Adjacent passes with an exact fused form (``outline, sink_state``; the
    preserved-call stages before them) run fused unless ``check=True``. A pass list that
    contains ``outline``, given an outlined program (``Program.is_outlined``), starts at
    ``outline``: the passes before it take flat
    programs (the preserved-call stages raise ``PassError`` for an outlined one) and their work
    is done; so the default pipeline is idempotent. Raises ``PassError`` for an unknown pass
    name or a ``program`` that is not a Program. **Laws:** ``transform(p, []) is p``;
    ``transform(p, a + b) == transform(transform(p, a), b)``.
    """
    require_program(program, "transform")
    chosen = DEFAULT_PIPELINE if passes is None else resolve_passes(passes)
    if program.is_outlined and outline in chosen:
        # what comes before ``outline`` runs on flat programs and has run on this one
        chosen = chosen[list(chosen).index(outline) :]
    for run in chosen if check else _fuse(chosen):
        program = run(program)
        if check:
            verify(program)
    return program
