"""Pipeline stages as torch objects: stage modules, ``PipelineStage``s, shared-weight sync.

``transforms.split_stages`` cuts a Program into stage Programs (pure). This module builds what
``torch.distributed.pipelining`` runs from them:

- ``stage_module(stages, i)``: stage ``i`` as an ``nn.Module`` (``lower`` of its Program, so it
  keeps the original module tree and fqns): ``forward(*activations, **root_inputs)``;
- ``pipeline_stage(stages, i, device, group, wrap)``: a ``PipelineStage`` around it (optionally
  wrapped for data parallelism), with the shapes of its inputs and outputs read from its own
  Program (no shape inference at the first step unless a dim is dynamic), a check of each
  micro-batch against them, and every floating activation free to carry a gradient;
- ``load_stage_state(stages, i, m, checkpoint)``: a stage's state from a checkpoint of the
  whole model (a stage of a program exported on ``meta`` is filled without the model ever
  being materialized);
- ``sync_shared_grads(stages, i, m, group)`` / ``broadcast_shared_state``: each copy of a
  weight held by several stages gets the sum of the copies' gradients (what eager's one tensor
  gets) / its first owner's value;
- ``merge_stage_state_dicts(stages, sds)``: the stages' state dicts merged back into the eager
  model's keys.

Stage ``k`` runs on group rank ``k % group size`` (torch's placement, one or several stages per
rank) unless a ``placement`` says otherwise. Who takes part in each shared-weight transfer is
decided from ``Stages`` alone: the ranks holding a copy, point to point, in state order; every
call first checks its arguments and agrees on the result with every rank of the group, so a bad
argument on one rank is the same ``LoweringError`` everywhere instead of a hang.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.tensor import DTensor

from ir.errors import InputConstraintError, LoweringError
from ir.staged import Stages
from ir.state import BUFFER, PARAMETER
from lowering.lower import lower
from lowering.lowering_seam import CheckedPipelineStage, data_parallel_inner
from lowering.unloaded import is_meta


def _check_stages(stages: Any, what: str) -> None:
    if not isinstance(stages, Stages):
        raise LoweringError(
            f"{what}: expected the Stages that transforms.split_stages returns, got "
            f"{type(stages).__name__}"
        )


def _check_stage(stages: Any, i: Any) -> None:
    _check_stages(stages, "stages")
    if not isinstance(i, int) or not 0 <= i < len(stages):
        raise LoweringError(f"stage index {i!r} is not in range(0, {len(stages)})")


def stage_module(stages: Stages, i: int, device: Any = None) -> torch.nn.Module:
    """Stage ``i`` as an ``nn.Module``: ``lower(stages.programs[i], device=device)``.

    Its ``forward(*activations, **root_inputs)`` takes ``stages.inputs[i]`` positionally (stage
    0: the program's inputs not read later; stage ``k``: stage ``k - 1``'s outputs) and every
    name of ``stages.root_inputs`` by keyword. Stages before the last return a tuple of tensors;
    the last returns the program's output structure (a dict stays a dict). Parameters and
    buffers are registered at their original fqns; the state is copied (nothing writes the
    Program's tensors). A call whose inputs do not match the exported shapes (or, for a dynamic
    export, its range constraints) raises ``InputConstraintError`` naming the input. With
    ``device``, the device literals recorded at export run there too.

    For a program exported on ``meta`` and a real ``device``, the state is made **empty**
    (uninitialized) on ``device`` under the original fqns, only this stage's: fill it with
    ``torch.distributed.checkpoint.load(m.state_dict(), ...)`` or ``m.load_state_dict(...)``.
    Until every tensor was written (or replaced), the first call raises
    ``ir.UnloadedStateError`` naming the first fqn not loaded (``lowering.unloaded``).

    **Laws:** running the stage modules in sequence, each on the previous one's outputs and the
    same keyword inputs, computes what ``lower(p)`` computes; ``stage_module(stages, i)
    .state_dict()`` keys are ``stages.state[i]``'s persistent entries. Complexity: that of
    ``lower`` on the stage Program.
    """
    _check_stage(stages, i)
    return lower(stages.programs[i], device=device)


def _values(program: Any, names: Sequence[str], what: str) -> list[torch.Tensor]:
    """The ``meta['val']`` of each named node of ``program``'s root graph (the stage's own
    Program, not the flat source)."""
    by_name = program.root_module.graph.by_name()
    found = []
    for name in names:
        node = by_name.get(name)
        val = node.meta.get("val") if node is not None else None
        if not isinstance(val, torch.Tensor):
            raise LoweringError(
                f"pipeline_stage: {what} %{name} has no tensor metadata (meta['val']); "
                "export the model with torch.export so that every stage input has a shape"
            )
        found.append(val)
    return found


def _dims(val: torch.Tensor) -> tuple[int | None, ...]:
    """The exported shape, ``None`` for a dynamic (symbolic) dim."""
    return tuple(d if isinstance(d, int) else None for d in val.shape)


def _examples(program: Any, names: Sequence[str], device: Any, what: str
              ) -> tuple[torch.Tensor, ...] | None:
    """Zero tensors with the exported shape and dtype of each named value (``None`` when one
    has a dynamic dim: then torch's stage infers them from its first micro-batch). Every floating
    point one asks for a gradient: whether an activation carries one is decided at run time
    (a layer unfrozen after the split still gives earlier stages their gradient; a value that
    carries none is sent back as zeros by torch's stage and ignored by the sender)."""
    found = []
    for val in _values(program, names, what):
        dims = _dims(val)
        if None in dims:  # a dynamic dim: torch's stage infers the shapes at its first step
            return None
        t = torch.zeros(dims, dtype=val.dtype, device=device)
        found.append(t.requires_grad_(val.dtype.is_floating_point))
    return tuple(found)


class _CheckedStage(CheckedPipelineStage):
    """A ``PipelineStage`` that checks each micro-batch's own inputs (stage 0's positional
    inputs, every stage's keyword inputs) against the exported shapes before it runs it, so a
    wrong batch is a purefx error on that rank before it sends anything for the micro-batch.
    (The hook into torch's stage is ``lowering.lowering_seam.CheckedPipelineStage``.)"""

    def __init__(self, *args: Any, expected: Mapping[str, tuple], first: tuple[str, ...],
                 **kwargs: Any) -> None:
        self.purefx_expected = dict(expected)
        self.purefx_first = first
        # a dynamic dim (None in ``expected``) takes the size of the first micro-batch run:
        # torch's stage sizes its receive buffers from that micro-batch
        self.purefx_fixed: dict[str, tuple[int, ...]] = {}
        super().__init__(*args, check=self._check_inputs, **kwargs)

    def _check_inputs(self, chunk: int, args: tuple[Any, ...], kwargs: Mapping[str, Any]
                      ) -> None:
        given: list[tuple[str, Any]] = list(kwargs.items())
        if self.is_first:
            given += list(zip(self.purefx_first, args, strict=False))
        for name, value in given:
            want = self.purefx_expected.get(name)
            if want is None:
                raise InputConstraintError(
                    f"stage {self.stage_index}: keyword input {name!r} is not an input of the "
                    f"program (its keyword inputs: {sorted(self.purefx_expected)})"
                )
            got = tuple(getattr(value, "shape", ()))
            if len(got) != len(want[0]) or any(
                w is not None and g != w for g, w in zip(got, want[0], strict=True)
            ):
                shown = tuple("*" if w is None else w for w in want[0])
                raise InputConstraintError(
                    f"stage {self.stage_index}, micro-batch {chunk}: input {name!r} has "
                    f"shape {got}, the stage was exported with {shown}. Export the model "
                    "with one micro-batch (batch / n_microbatches) and step with "
                    "n_microbatches times that batch"
                )
            if None in want[0]:
                fixed = self.purefx_fixed.setdefault(name, got)
                if got != fixed:
                    raise InputConstraintError(
                        f"stage {self.stage_index}, micro-batch {chunk}: input {name!r} has "
                        f"shape {got}, but this pipeline stage took {fixed} at its first "
                        "micro-batch (a dynamic dim is fixed by the first step: torch's stage "
                        "sizes its buffers then); build a new pipeline_stage and schedule "
                        "for another micro-batch size"
                    )


def _check_group(what: str) -> None:
    if not dist.is_initialized():
        raise LoweringError(
            f"{what}: no process group; call torch.distributed.init_process_group first (every "
            "rank of the pipeline)"
        )


def pipeline_stage(stages: Stages, i: int, device: Any, group: Any = None,
                   wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None, *,
                   placement: Any = None) -> PipelineStage:
    """Stage ``i`` as a ``torch.distributed.pipelining.PipelineStage`` on ``device``.

    The stage module is ``stage_module(stages, i, device)``, then ``wrap(module)`` when ``wrap``
    is given (data parallelism over the stage's replicas: ``lambda m: DistributedDataParallel(m,
    process_group=dp_group)`` or FSDP2's ``fully_shard``); the ``PipelineStage`` runs the
    wrapped module, and torch's schedules skip the wrapper's gradient sync until the step's last
    backward. The stage's input and output shapes come from stage ``i``'s own Program (one
    micro-batch), so the schedule infers nothing at its first step; every floating point
    activation may carry a gradient (decided at run time, not at the split). Before each
    micro-batch runs, its own inputs are checked against those shapes: a mismatch raises
    ``InputConstraintError`` before this rank sends anything for it. A program exported with a
    dynamic dim (a dynamic batch) runs any size its range allows: its stages leave the shapes
    to torch's inference at the first step, and that step's micro-batch size then holds for
    the stage (another size is an ``InputConstraintError``; build a new stage for it).

    ``i`` is a stage index, independent of the rank: a rank may build several stages (one
    call each) for ``ScheduleInterleaved1F1B`` / ``ScheduleLoopedBFS``; stage ``k`` runs on
    group rank ``k % group size``, or ``placement[k]`` (``placement="v"`` for
    ``ScheduleZBVZeroBubble`` / ``ScheduleDualPipeV``: rank ``r`` holds ``r`` and
    ``2 * size - 1 - r``). When every rank of ``group`` (default: the world) holds as many
    stages as the others, every rank builds its stages, each call at once with the other ranks'
    calls: a bad argument on any rank (an index out of
    range, another rank's stage, a ``wrap`` that fails or returns no module) is then the same
    ``LoweringError`` on every rank. With one stage per rank, the weights held by several stages
    are also broadcast from their first owner (``broadcast_shared_state``), so every copy
    starts equal (not for a program exported on ``meta``, whose state is loaded afterwards);
    with several, the copies come from one Program, or call ``broadcast_shared_state(stages,
    [i, j], [m_i, m_j])`` once after loading.

    Raises:
        LoweringError: ``i`` is not a stage index, ``wrap`` returns no ``nn.Module``, or a
        stage value has no tensor metadata.

    **Laws:** builds new objects only (the Stages are untouched). Complexity: ``lower`` of the
    stage plus O(|shared|) point-to-point messages.
    """
    _check_group("pipeline_stage")
    size = dist.get_world_size(group)
    ranks = None
    if isinstance(stages, Stages):
        try:
            ranks = _placement(stages, group, placement)
        except LoweringError:
            ranks = None
    # when every rank builds as many stages as the others, each call is agreed with theirs
    collective = ranks is not None and all(
        ranks.count(r) == len(stages) // size for r in range(size)) and len(stages) % size == 0
    problem = None
    try:
        _check_stage(stages, i)
        _placement(stages, group, placement)
        device = torch.device(device)
        module = stage_module(stages, i, device)
        try:
            wrapped = module if wrap is None else wrap(module)
        except Exception as e:  # any failure of the caller's wrapper, agreed like ours
            raise LoweringError(
                f"pipeline_stage: wrap(module) of stage {i} raised {type(e).__name__}: {e}"
            ) from e
        if not isinstance(wrapped, torch.nn.Module):
            raise LoweringError(
                f"pipeline_stage: wrap(module) of stage {i} returned "
                f"{type(wrapped).__name__}, not an nn.Module; return the wrapped module "
                "(e.g. DistributedDataParallel(module, process_group=dp_group))"
            )
        program = stages.programs[i]
        first = stages.inputs[0]
        names = (*(first if i == 0 else ()), *stages.root_inputs)
        expected = {name: (_dims(val), val.dtype)
                    for name, val in zip(names, _values(program, names, "input"), strict=True)}
        inputs = _examples(program, stages.inputs[i], device, "stage input")
        outs = tuple(s.name for s in program.signature.user_outputs() if s.name is not None)
        outputs = _examples(program, outs, device, "stage output")
        if inputs is None or outputs is None:  # torch infers both at the first step
            inputs = outputs = None
            if i == len(stages) - 1 and not _tuple_output(stages):
                raise LoweringError(
                    f"pipeline_stage: the program has a dynamic dim, so torch's stage infers "
                    f"the stage shapes at its first step, and it takes only a tensor or a "
                    f"tuple of tensors as the last stage's output (this program returns "
                    f"{stages.out_spec.type.__name__ if stages.out_spec.type else 'a tree'}); "
                    "return a tuple, or export with a static micro-batch"
                )
    except LoweringError as e:
        if not collective:
            raise
        problem = str(e)
    if collective:
        me = dist.get_rank(group)
        if problem is None and ranks[i] != me:
            rule = "placement[k]" if placement is not None else "k % group size"
            problem = (
                f"pipeline_stage: stage {i} runs on group rank {ranks[i]} (stage k on rank "
                f"{rule}), not on group rank {me}"
            )
        _agree(problem, group)
        if len(stages) == size and not _from_meta(stages):
            _broadcast(stages, [(i, module)], ranks, group)
    return _CheckedStage(
        wrapped,
        i,
        len(stages),
        device,
        input_args=inputs,
        output_args=outputs,
        group=group,
        expected=expected,
        first=first,
    )


def _tuple_output(stages: Stages) -> bool:
    """Whether the program returns a tensor or a flat tuple / list of tensors."""
    spec = stages.out_spec
    return spec is None or spec.type in (None, tuple, list) and all(
        c.type is None for c in spec.children())


def _from_meta(stages: Stages) -> bool:
    """Whether the program's state has no values (exported under ``torch.device("meta")``)."""
    for fqn in stages.source.state_order:
        t = stages.source.tensor(fqn)
        if isinstance(t, torch.Tensor):
            return t.device.type == "meta"
    return False


def _agree(problem: str | None, group: Any) -> None:
    """Every rank of ``group`` learns whether some rank has a problem (one all-reduce of a
    flag), and then every rank's message: raises the same ``LoweringError`` on every rank when
    one rank has one (so no rank enters a collective that another left)."""
    flag = torch.tensor([0 if problem is None else 1], dtype=torch.int32,
                        device=_collective_device(group))
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    if not flag.item():
        return
    found: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(found, problem, group=group)
    bad = [f"rank {r}: {p}" for r, p in enumerate(found) if p is not None]
    raise LoweringError("; ".join(bad))


def _collective_device(group: Any) -> torch.device:
    """Where the group's backend takes tensors: CPU for gloo, the current CUDA device for NCCL."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _placement(stages: Stages, group: Any, placement: Any) -> tuple[int, ...]:
    """The group rank of each stage of ``stages`` on ``group`` (``stage_ranks``)."""
    return stage_ranks(len(stages), dist.get_world_size(group), placement)


def stage_ranks(n: int, size: int, placement: Any = None) -> tuple[int, ...]:
    """The group rank of each of ``n`` stages on a group of ``size`` ranks.

    ``placement``: ``None`` or ``"loop"`` (torch's placement for one stage per rank and for the
    looped / interleaved schedules: stage ``k`` on rank ``k % size``), ``"v"`` (two stages per
    rank as a V, torch's placement for ``ScheduleZBVZeroBubble`` / ``ScheduleDualPipeV``: rank
    ``r`` holds ``r`` and ``2 * size - 1 - r``) or a sequence of one rank per stage.

    Raises:
        LoweringError: ``"v"`` without exactly two stages per rank, or a sequence that is not
        one rank in ``range(size)`` per stage.

    **Laws:** loop and V give every rank ``n / size`` stages when ``size`` divides ``n``; a
    sequence is returned as it is; V puts stages ``size - 1`` and ``size`` on one rank (the
    turn). Pure; O(n).
    """
    if placement is None or placement == "loop":
        return tuple(k % size for k in range(n))
    if placement == "v":
        if n != 2 * size:
            raise LoweringError(
                f"placement 'v' needs two stages per rank: {n} stages on {size} ranks"
            )
        return tuple(k if k < size else 2 * size - 1 - k for k in range(n))
    ranks = tuple(placement) if isinstance(placement, Sequence) else None
    if (
        ranks is None
        or len(ranks) != n
        or not all(isinstance(r, int) and 0 <= r < size for r in ranks)
    ):
        raise LoweringError(
            f"placement {placement!r} is not 'loop', 'v' or a group rank in range(0, {size}) "
            f"for each of the {n} stages"
        )
    return ranks


def _held(stages: Stages, i: Any, m: Any, what: str) -> list[tuple[int, torch.nn.Module]]:
    """``(stage, module)`` pairs of one rank's call (one stage or sequences of both), checked."""
    indices = list(i) if isinstance(i, (list, tuple)) else [i]
    modules = list(m) if isinstance(m, (list, tuple)) else [m]
    if len(indices) != len(modules):
        raise LoweringError(
            f"{what}: {len(indices)} stage indices but {len(modules)} modules; pass one module "
            "per stage"
        )
    for k in indices:
        _check_stage(stages, k)
    if len(set(indices)) != len(indices):
        raise LoweringError(f"{what}: stage indices {indices} repeat a stage")
    for k, mod in zip(indices, modules, strict=True):
        if not isinstance(mod, torch.nn.Module):
            raise LoweringError(
                f"{what}: the module of stage {k} is a {type(mod).__name__}, not an nn.Module"
            )
    return sorted(zip(indices, (data_parallel_inner(mod) for mod in modules), strict=True),
                  key=lambda km: km[0])


def _prepare(stages: Stages, i: Any, m: Any, group: Any, placement: Any, what: str,
             kinds: tuple[str, ...]) -> tuple[list, tuple[int, ...], list] | None:
    """Check one rank's call and agree on it with every rank of ``group``; ``None`` when the
    program has no shared tensor of ``kinds`` (then no rank communicates)."""
    _check_stages(stages, what)
    keys = _shared_keys(stages, kinds)  # from Stages alone: the same on every rank
    if keys:
        _check_group(what)
    problem = None
    held: list = []
    ranks: tuple[int, ...] = ()
    try:
        held = _held(stages, i, m, what)
        if keys:  # without shared tensors nothing is sent: the placement does not matter
            ranks = _placement(stages, group, placement)
            me = dist.get_rank(group)
            mine = [k for k in range(len(stages)) if ranks[k] == me]
            if [k for k, _ in held] != mine:
                rule = "placement[k]" if placement is not None else "k % group size"
                raise LoweringError(
                    f"{what}: this rank (group rank {me}) holds stages {mine} (stage k runs on "
                    f"group rank {rule}) but was called with stages {[k for k, _ in held]}; "
                    "pass all of its stages and their modules at once"
                )
            for fqn, _owners in keys:
                for k, mod in held:
                    _local(stages, k, mod, fqn)
    except LoweringError as e:
        if not keys:
            raise
        problem = str(e)
    if not keys:
        return None
    _agree(problem, group)
    return held, ranks, keys


def _my_copies(stages: Stages, held: list, ranks: tuple[int, ...], keys: list, me: int
               ) -> Iterator[tuple[int, list[int], list[torch.Tensor]]]:
    """``(first owner's rank, other owners' ranks, this rank's copies)`` per shared tensor of
    ``keys`` (``_shared_keys``) that rank ``me`` holds a copy of, in state order."""
    for fqn, owners in keys:
        lead, others = _owner_ranks(ranks, owners)
        if me == lead or me in others:
            yield lead, others, [_local(stages, k, mod, fqn) for k, mod in held if k in owners]


def _shard(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t``: the local shard of a ``DTensor`` (a parameter or gradient of
    a module sharded with FSDP2's ``fully_shard``), else ``t``."""
    return t.to_local() if isinstance(t, DTensor) else t


def _like(param: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``local`` as a gradient of ``param``: a ``DTensor`` laid out as ``param`` when it is one."""
    if isinstance(param, DTensor):
        return DTensor.from_local(local, param.device_mesh, param.placements,
                                  shape=param.shape, stride=param.stride())
    return local


def _send(t: torch.Tensor, rank: int, group: Any) -> None:
    dist.send(t.contiguous(), dst=_global_rank(group, rank), group=group)


def _recv_like(t: torch.Tensor, rank: int, group: Any) -> torch.Tensor:
    buf = torch.empty_like(t, memory_format=torch.contiguous_format)
    dist.recv(buf, src=_global_rank(group, rank), group=group)
    return buf


def _owner_ranks(ranks: tuple[int, ...], owners: tuple[int, ...]) -> tuple[int, list[int]]:
    """(the first owner's rank, the other owners' ranks in ascending order)."""
    lead = ranks[owners[0]]
    return lead, sorted({ranks[k] for k in owners} - {lead})


def _shared_keys(stages: Stages, kinds: tuple[str, ...]) -> list[tuple[str, tuple[int, ...]]]:
    """(first fqn, owner stages) per shared tensor of a kind in ``kinds``, in state order."""
    table = stages.source.state_table()
    seen: set[str] = set()
    found = []
    for fqn in stages.source.state_order:
        owners = stages.shared.get(fqn)
        slot = table[fqn]
        if owners is None or slot.tensor in seen or slot.kind not in kinds:
            continue
        seen.add(slot.tensor)
        found.append((fqn, owners))
    return found


def _local(stages: Stages, i: int, m: torch.nn.Module, fqn: str) -> torch.Tensor | None:
    local = stages.owner(fqn, i)
    if local is None:
        return None
    slot = stages.source.slot(local)
    try:
        if slot.kind == PARAMETER:
            return m.get_parameter(local)
        return m.get_buffer(local)
    except AttributeError:
        raise LoweringError(
            f"stage {i}'s module has no {slot.kind} {local!r}; pass the module that "
            f"stage_module / pipeline_stage built for stage {i} (its .submod)"
        ) from None


def _global_rank(group: Any, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def broadcast_shared_state(stages: Stages, i: int | Sequence[int],
                           m: torch.nn.Module | Sequence[torch.nn.Module], group: Any = None,
                           *, placement: Any = None) -> None:
    """Make every copy of a shared parameter or buffer equal to its first owner's copy.

    Every rank of ``group`` (default: the world) calls this once, with all of its stages and
    their modules: ``broadcast_shared_state(stages, [i, j], [m_i, m_j])`` (or one stage and one
    module). Stage ``k`` runs on group rank ``k % group size`` (torch's placement for one and for
    interleaved stages per rank), or ``placement[k]`` (``placement="v"`` for V schedules). For
    each tensor held by several stages, in state order, only the ranks that hold a copy take
    part (decided from ``Stages`` alone): the first owner's rank sends its copy to each other
    owner rank, and every rank copies it into its other copies. ``pipeline_stage`` calls it
    once when each rank holds one stage.

    Raises:
        LoweringError: on every rank of ``group``, before any copy is sent, when some rank's
        call is wrong (a stage index out of range, not that rank's stages, a module without
        the stage's fqn).

    **Laws:** changes only the shared tensors of the modules. Complexity: one all-reduce of
    the check (a flag), then 2 x (owner ranks - 1) messages per shared tensor.
    """
    ready = _prepare(stages, i, m, group, placement, "broadcast_shared_state",
                     (PARAMETER, BUFFER))
    if ready is not None:
        _broadcast(stages, *ready[:2], group)


def _broadcast(stages: Stages, held: list[tuple[int, torch.nn.Module]],
               ranks: tuple[int, ...], group: Any) -> None:
    me = dist.get_rank(group)
    keys = _shared_keys(stages, (PARAMETER, BUFFER))
    for lead, others, copies in _my_copies(stages, held, ranks, keys, me):
        copies = [_shard(t) for t in copies]
        if me == lead:
            value = copies[0].detach()  # the first owner's copy (the lead holds it)
            for r in others:
                _send(value, r, group)
        else:
            value = _recv_like(copies[0].detach(), lead, group)
        with torch.no_grad():
            for t in copies:
                if t.data_ptr() != value.data_ptr():
                    t.copy_(value)


def sync_shared_grads(stages: Stages, i: int | Sequence[int],
                      m: torch.nn.Module | Sequence[torch.nn.Module], group: Any = None,
                      *, placement: Any = None) -> None:
    """After backward: every copy of a parameter held by several stages gets the sum of the
    copies' gradients, the gradient eager's one tensor gets.

    Every rank of ``group`` (default: the world) calls this once after its schedule step and
    before the optimizer step, with all of its stages and their modules:
    ``sync_shared_grads(stages, [i, j], [m_i, m_j])`` (``pipeline_stage(...).submod``; a
    ``DistributedDataParallel`` wrapper is unwrapped), or ``sync_shared_grads(stages, i, m)``
    for one. Stage ``k`` runs on group rank ``k % group size`` or ``placement[k]`` (as in
    ``broadcast_shared_state``). Who takes part in each sum is decided from ``Stages`` alone:
    for each shared parameter, in state order, the ranks holding a copy; the first owner's rank
    adds the others' sums to its own in rank order and sends the total back, so every copy gets
    the same bits. A copy whose ``grad`` is ``None`` or that is frozen (``requires_grad=False``)
    contributes zeros, made with its own dtype and device. When at least one copy requires
    grad, every copy gets the total, frozen ones too (they are copies of one weight, which the
    other uses train: the optimizer then moves every copy alike); when none does, no ``grad``
    is touched (eager's frozen weight). Copies on one rank are summed locally.

    Raises:
        LoweringError: on every rank of ``group``, before any gradient is sent, when some
        rank's call is wrong (a stage index out of range, not that rank's stages, a module
        without the stage's fqn).

    **Laws:** parameters that only one stage holds are untouched; with equal initial copies
    (``pipeline_stage`` / ``broadcast_shared_state``), the same optimizer keeps every trained
    copy equal; freezing a copy on one stage gives eager's gradient with that use detached.
    Complexity: one all-reduce of the check (a flag), then 2 x (owner ranks - 1) messages per shared
    parameter.
    """
    ready = _prepare(stages, i, m, group, placement, "sync_shared_grads", (PARAMETER,))
    if ready is None:
        return
    held, ranks, keys = ready
    me = dist.get_rank(group)
    for lead, others, copies in _my_copies(stages, held, ranks, keys, me):
        # the local sum, and in its last element how many copies take part (frozen: none);
        # a sharded copy (FSDP2) adds its own shard: the copies' shards are laid out alike
        ref = _shard(copies[0])
        total = torch.zeros(ref.numel() + 1, dtype=ref.dtype, device=ref.device)
        for t in copies:
            if t.requires_grad:
                total[-1] += 1
                if t.grad is not None:
                    total[:-1] += _shard(t.grad).detach().reshape(-1)
        if me == lead:
            for r in others:
                total += _recv_like(total, r, group)
            for r in others:
                _send(total, r, group)
        else:
            _send(total, lead, group)
            total = _recv_like(total, lead, group)
        if total[-1] == 0:  # every copy is frozen: the weight gets no gradient, as in eager
            continue
        grad = total[:-1].reshape(ref.shape)
        for t in copies:  # frozen copies too: they are copies of the one weight
            if t.grad is None:
                t.grad = _like(t, grad.clone())
            else:
                _shard(t.grad).copy_(grad)


def merge_stage_state_dicts(
    stages: Stages, state_dicts: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The stages' state dicts merged into the eager model's ``state_dict`` keys and order.

    ``state_dicts[k]`` is stage ``k``'s module's ``state_dict()`` (any rank's, gathered by the
    caller; a ``DistributedDataParallel`` wrapper's ``module.`` prefix is dropped). Every
    parameter and persistent buffer of the program gets the value of the first stage that holds
    its tensor (under its own fqn or a tied one): tied fqns (an embedding and its lm head) both
    appear, with that one value.

    Raises:
        LoweringError: when the number of state dicts is not the number of stages, or no stage's
        dict holds some fqn's tensor.

    **Laws:** ``merge_stage_state_dicts(stages, [stage_module(stages, k).state_dict() ...])``
    equals the program's state dict (``ep.module().state_dict()``). Complexity: O(state * k).
    """
    _check_stages(stages, "merge_stage_state_dicts")
    if len(state_dicts) != len(stages):
        raise LoweringError(
            f"merge_stage_state_dicts: {len(stages)} stages but {len(state_dicts)} state dicts"
        )
    src = stages.source
    table = src.state_table()
    merged: dict[str, Any] = {}
    for fqn in src.state_order:
        slot = table[fqn]
        if slot.kind not in (PARAMETER, BUFFER) or not slot.persistent:
            continue
        for k, sd in enumerate(state_dicts):
            local = stages.owner(fqn, k)
            if local is None:
                continue
            if local in sd:
                merged[fqn] = sd[local]
                break
            if "module." + local in sd:  # a DistributedDataParallel wrapper's state dict
                merged[fqn] = sd["module." + local]
                break
        else:
            raise LoweringError(
                f"merge_stage_state_dicts: no stage's state dict holds {fqn!r} (or a tensor "
                "tied to it); pass each stage module's state_dict() in stage order"
            )
    return merged


def load_stage_state(stages: Stages, i: int | Sequence[int],
                     m: torch.nn.Module | Sequence[torch.nn.Module], checkpoint: Any) -> None:
    """Load the state of one rank's stages from a checkpoint of the whole model.

    ``checkpoint`` is a ``torch.distributed.checkpoint`` directory (a path: what
    ``dcp.save(model.state_dict(), checkpoint_id=path)`` wrote) or a mapping keyed by the
    model's fqns (a ``state_dict``). Non-persistent buffers (which ``state_dict`` leaves out)
    are loaded when the checkpoint holds them, and must be there for a meta export (save
    ``{**dict(model.named_buffers()), **model.state_dict()}``). Each stage module
    (``stage_module`` / ``pipeline_stage`` ``.submod``, a ``DistributedDataParallel`` wrapper is
    unwrapped) reads only the entries of
    its own state, under the original fqns: a stage of a program exported on ``meta`` gets its
    values without the whole model ever being materialized. A directory is read with
    ``dcp.load(..., no_dist=True)``: no collective, each rank reads its own entries.

    Raises:
        LoweringError: when the checkpoint lacks an fqn of any stage (not only this rank's, so
        every rank raises the same error, before loading anything): a parameter, a persistent
        buffer, or a non-persistent buffer of a meta export; or a mapping's entry has another
        shape or dtype.

    **Laws:** writes only the given modules' parameters and persistent buffers (in place).
    Complexity: O(state of all stages) to check, plus reading this rank's entries.
    """
    held = _held(stages, i, m, "load_stage_state")
    # imported here: about half a second that ``import lowering`` need not pay
    import torch.distributed.checkpoint as dcp

    if isinstance(checkpoint, Mapping):
        available: Mapping[str, Any] = checkpoint
    else:
        try:
            reader = dcp.FileSystemReader(checkpoint)
            available = reader.read_metadata().state_dict_metadata
        except (OSError, TypeError, ValueError) as e:
            raise LoweringError(
                f"load_stage_state: cannot read a torch.distributed.checkpoint at "
                f"{checkpoint!r} ({type(e).__name__}: {e}); pass its directory or a state_dict"
            ) from None
    table = stages.source.state_table()
    for k, fqns in enumerate(stages.state):
        for fqn in fqns:
            slot = table[fqn]
            if slot.kind not in (PARAMETER, BUFFER) or fqn in available:
                continue
            if slot.persistent:
                raise LoweringError(
                    f"load_stage_state: the checkpoint has no entry {fqn!r} (state of stage "
                    f"{k}); save the whole model's state_dict (its keys: {len(available)} "
                    "entries), or pass a mapping that holds every stage's fqns"
                )
            if is_meta(stages.source.tensor(fqn)):
                raise LoweringError(
                    f"load_stage_state: the checkpoint has no entry {fqn!r}, a non-persistent "
                    f"buffer of stage {k} that state_dict() leaves out and a meta export holds "
                    "no value of; save {**dict(model.named_buffers()), **model.state_dict()}"
                )
    for k, mod in held:
        wanted = mod.state_dict(keep_vars=True)
        for fqn in stages.state[k]:  # non-persistent buffers the checkpoint holds too
            slot = table[fqn]
            if slot.kind == BUFFER and not slot.persistent and fqn in available:
                wanted.setdefault(fqn, mod.get_buffer(fqn))
        if isinstance(checkpoint, Mapping):
            with torch.no_grad():
                for fqn, t in wanted.items():
                    value = checkpoint[fqn]
                    if tuple(value.shape) != tuple(t.shape) or value.dtype != t.dtype:
                        raise LoweringError(
                            f"load_stage_state: stage {k}'s {fqn!r} is {tuple(t.shape)} "
                            f"{t.dtype}, the checkpoint's is {tuple(value.shape)} {value.dtype}"
                        )
                    t.copy_(value)
        else:
            with warnings.catch_warnings():  # no_dist=True is meant: each rank reads its own
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                dcp.load({fqn: t.detach() for fqn, t in wanted.items()},
                         checkpoint_id=checkpoint, no_dist=True)


def _describe(stages: Stages, k: int, name: str) -> str:
    """``name`` with its shape and dtype, read from stage ``k``'s own Program, where ``name``
    is an input (an edge keeps its name in the stage that receives it)."""
    node = stages.programs[k].root_module.graph.by_name().get(name)
    val = node.meta.get("val") if node is not None else None
    if isinstance(val, torch.Tensor):
        dtype = str(val.dtype).removeprefix("torch.")
        return f"{name} {tuple(val.shape)} {dtype}"
    return name


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "0.0%"


def _shares(stages: Stages, k: int) -> str:
    """Stage ``k``'s share of the state bytes held over all stages and of the estimated FLOPs;
    the balanced measure first, marked, for a split by ``n=``."""
    parts = []
    for measure, values, what in (
        ("params", stages.params, "state bytes"),
        ("flops", stages.flops, "FLOPs"),
    ):
        if not values:
            continue
        mark = " (balanced)" if stages.balance == measure else ""
        parts.append((stages.balance != measure,
                      f"{_percent(values[k], sum(values))} of {what}{mark}"))
    return ", ".join(text for _, text in sorted(parts, key=lambda x: x[0])) or "(unknown)"


def format_stage_plan(stages: Stages, max_modules: int = 12) -> str:
    """The stage plan as text (what ``purefx MODEL.pt2 --stages A,B`` or ``--stages auto:K``
    prints): how it was split (the paths, or the balanced measure and its largest stage), then
    per stage its inputs, the modules whose calls run there (the first ``max_modules``), the
    state it holds (tensors, elements, bytes; tied fqns counted once; shared tensors named with
    their other owners), its share of the state bytes and of the estimated FLOPs, and what it
    sends to the next stage. Deterministic; O(state + edges + modules)."""
    _check_stage(stages, 0)
    src = stages.source
    table = src.state_table()
    lines: list[str] = []
    n = len(stages)
    if stages.balance:
        values = stages.params if stages.balance == "params" else stages.flops
        unit = _size(max(values)) if stages.balance == "params" else f"{max(values)} FLOPs"
        lines.append(
            f"{n} stages balanced by {stages.balance}, cut at {', '.join(stages.at) or '(none)'}:"
            f" largest stage {unit} ({_percent(max(values), sum(values))})"
        )
    for k in range(n):
        inputs = ", ".join(_describe(stages, k, nm) for nm in stages.inputs[k]) or "(none)"
        lines.append(f"stage {k}" + (f" (begins at {stages.at[k - 1]})" if k else "") + ":")
        lines.append(f"  inputs: {inputs}")
        if stages.root_inputs:
            lines.append(f"  keyword inputs: {', '.join(stages.root_inputs)}")
        mods = stages.modules[k]
        more = f", ... ({len(mods) - max_modules} more)" if len(mods) > max_modules else ""
        lines.append(f"  modules: {', '.join(mods[:max_modules]) or '(root only)'}{more}")
        keys: dict[str, None] = {}
        for fqn in stages.state[k]:
            keys.setdefault(table[fqn].tensor, None)
        tensors = [src.tensor_table()[key].value for key in keys]
        numel = sum(t.numel() for t in tensors if isinstance(t, torch.Tensor))
        nbytes = sum(
            t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor)
        )
        lines.append(f"  state: {len(keys)} tensors, {numel} elements, {_size(nbytes)}")
        for fqn in stages.state[k]:
            owners = stages.shared.get(fqn)
            if owners is not None:
                others = ", ".join(str(o) for o in owners if o != k)
                lines.append(f"    shared: {fqn} (also in stage {others})")
        lines.append(f"  share: {_shares(stages, k)}")
        if k < n - 1:
            sent = ", ".join(
                _describe(stages, e.dst, e.name) + (f" [relay from stage {e.origin}]"
                                             if e.origin < k else "")
                for e in stages.edges_from(k)
            )
            lines.append(f"  sends to stage {k + 1}: {sent}")
        else:
            lines.append("  returns: the program's outputs")
    return "\n".join(lines)


__all__ = [
    "broadcast_shared_state",
    "format_stage_plan",
    "load_stage_state",
    "merge_stage_state_dicts",
    "pipeline_stage",
    "stage_module",
    "stage_ranks",
    "sync_shared_grads",
]
