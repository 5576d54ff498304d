"""Pipeline stages as torch objects: stage modules, ``PipelineStage``s, shared-weight sync.

``transforms.split_stages`` cuts a Program into stage Programs (pure). This module builds what
``torch.distributed.pipelining`` runs from them:

- ``stage_module(stages, i)``: stage ``i`` as an ``nn.Module`` (``lower`` of its Program, so it
  keeps the original module tree and fqns): ``forward(*activations, **root_inputs)``;
- ``pipeline_stage(stages, i, device, group)``: a ``PipelineStage`` around it, with the shapes
  of its inputs and outputs given statically (no shape inference at the first step), a check of
  each micro-batch against the exported shapes, and the shared weights broadcast from their
  first owner;
- ``sync_shared_grads(stages, i, m, group)``: after backward, each copy of a weight held by
  several stages gets the sum of the copies' gradients (what eager's one tensor gets);
- ``merge_stage_state_dicts(stages, sds)``: the stages' state dicts merged back into the eager
  model's keys.

Every rank of the group calls ``pipeline_stage`` and ``sync_shared_grads`` (collectives over the
group in one order, from ``Stages``); stage ``i`` runs on group rank ``i``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage

from ir.errors import InputConstraintError, LoweringError
from ir.stages import Stages
from ir.state import BUFFER, PARAMETER
from ir.torch_seam import pytree
from lowering.lower import lower


def _check_stage(stages: Any, i: Any) -> None:
    if not isinstance(stages, Stages):
        raise LoweringError(
            f"expected the Stages that transforms.split_stages returns, got {type(stages).__name__}"
        )
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


def _examples(
    stages: Stages, names: Sequence[str], device: Any, grad: Sequence[bool] | None = None
) -> tuple[torch.Tensor, ...]:
    by_name = stages.source.root_module.graph.by_name()
    found = []
    for j, name in enumerate(names):
        val = by_name[name].meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise LoweringError(
                f"pipeline_stage: value %{name} has no tensor metadata (meta['val']); "
                "export the model with torch.export so that every stage input has a shape"
            )
        try:
            shape = tuple(int(d) for d in val.shape)
        except TypeError:  # a symbolic dim without a hint
            raise LoweringError(
                f"pipeline_stage: value %{name} has a dynamic shape {tuple(val.shape)}; "
                "export with the micro-batch shape (static dims) for a pipeline"
            ) from None
        t = torch.zeros(shape, dtype=val.dtype, device=device)
        # an activation that carries a gradient (Edge.grad) carries one between stages: the
        # receiving buffer must ask for it
        found.append(t.requires_grad_(bool(grad and grad[j])))
    return tuple(found)


def _output_names(stages: Stages, i: int) -> tuple[str, ...]:
    if i < len(stages) - 1:
        return tuple(e.name for e in stages.edges_from(i))
    return tuple(s.name for s in stages.source.signature.user_outputs() if s.name is not None)


class _CheckedStage(PipelineStage):
    """A ``PipelineStage`` that checks each micro-batch's own inputs (stage 0's positional
    inputs, every stage's keyword inputs) against the exported shapes before it runs it, so a
    wrong batch is a purefx error on that rank before it sends anything for the micro-batch."""

    def __init__(self, *args: Any, expected: Mapping[str, tuple], first: tuple[str, ...],
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.purefx_expected = dict(expected)
        self.purefx_first = first

    def forward_one_chunk(self, fwd_chunk_id: int, args: tuple[Any, ...],
                          kwargs: dict[str, Any] | None = None, save_forward_output: bool = True):
        """Check the micro-batch's inputs, then run torch's ``forward_one_chunk``."""
        given: list[tuple[str, Any]] = list((kwargs or {}).items())
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
            if got != want[0]:
                raise InputConstraintError(
                    f"stage {self.stage_index}, micro-batch {fwd_chunk_id}: input {name!r} has "
                    f"shape {got}, the stage was exported with {want[0]}. Export the model "
                    "with one micro-batch (batch / n_microbatches) and step with "
                    "n_microbatches times that batch"
                )
        output = super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)
        if self.is_last and not isinstance(output, (torch.Tensor, tuple)):
            # torch's stage keeps ``(output,)`` for backward and treats each item as a tensor:
            # keep the output's tensors instead (a dict output stays a dict for the loss)
            _outputs, inputs = self.fwd_cache[fwd_chunk_id]
            leaves = tuple(t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor))
            self.fwd_cache[fwd_chunk_id] = (leaves, inputs)
        return output


def pipeline_stage(stages: Stages, i: int, device: Any, group: Any = None) -> PipelineStage:
    """Stage ``i`` as a ``torch.distributed.pipelining.PipelineStage`` on ``device``.

    The stage module is ``stage_module(stages, i, device)``; the stage's input and output shapes
    come from the exported program (one micro-batch), so the schedule infers nothing at its
    first step. Before each micro-batch runs, its own inputs are checked against those shapes:
    a mismatch raises ``InputConstraintError`` before this rank sends anything for it (other
    ranks waiting on it then fail at the group's timeout). Every rank of ``group`` (default: the
    world) must call this at once: the weights held by several stages are broadcast from their
    first owner (``broadcast_shared_state``), so every copy starts equal.

    **Laws:** builds new objects only (the Stages are untouched). Complexity: ``lower`` of the
    stage plus one broadcast per shared tensor.
    """
    _check_stage(stages, i)
    device = torch.device(device)
    module = stage_module(stages, i, device)
    broadcast_shared_state(stages, i, module, group)
    by_name = stages.source.root_module.graph.by_name()
    expected = {}
    for name in (*(stages.inputs[0] if i == 0 else ()), *stages.root_inputs):
        val = by_name[name].meta.get("val")
        if isinstance(val, torch.Tensor):
            expected[name] = (tuple(val.shape), val.dtype)
    return _CheckedStage(
        module,
        i,
        len(stages),
        device,
        input_args=_examples(
            stages, stages.inputs[i], device, [e.grad for e in stages.edges_from(i - 1)]
        ),
        output_args=_examples(
            stages, _output_names(stages, i), device, [e.grad for e in stages.edges_from(i)]
        ),
        group=group,
        expected=expected,
        first=stages.inputs[0],
    )


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
            "stage_module / pipeline_stage built for stage {i}"
        ) from None


def _global_rank(group: Any, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def broadcast_shared_state(stages: Stages, i: int, m: torch.nn.Module, group: Any = None) -> None:
    """Make every copy of a shared parameter or buffer equal to its first owner's.

    Stage ``i`` runs on rank ``i`` of ``group`` (default: the world); every rank calls this
    with its own stage module ``m``. For each tensor held by several stages, in state order,
    the first owner's value is broadcast and copied into the other owners' copies (ranks that
    hold no copy take part with a scratch tensor). ``pipeline_stage`` calls it once.

    **Laws:** changes only the shared tensors of ``m``, and only where copies differ.
    Complexity: one broadcast per shared tensor.
    """
    _check_stage(stages, i)
    for fqn, owners in _shared_keys(stages, (PARAMETER, BUFFER)):
        mine = _local(stages, i, m, fqn)
        ref = stages.source.tensor(fqn)
        buf = (
            mine.detach().clone()
            if mine is not None
            else torch.empty(ref.shape, dtype=ref.dtype, device=_device_of(m))
        )
        dist.broadcast(buf, src=_global_rank(group, owners[0]), group=group)
        if mine is not None and i != owners[0]:
            with torch.no_grad():
                mine.copy_(buf)


def _device_of(m: torch.nn.Module) -> torch.device:
    for t in m.parameters():
        return t.device
    for t in m.buffers():
        return t.device
    return torch.device("cpu")


def sync_shared_grads(stages: Stages, i: int, m: torch.nn.Module, group: Any = None) -> None:
    """After backward: every copy of a parameter held by several stages gets the sum of the
    copies' gradients, the gradient eager's one tensor gets.

    Stage ``i`` runs on rank ``i`` of ``group`` (default: the world); every rank calls this
    after its schedule step and before the optimizer step, with its stage module ``m``
    (``pipeline_stage(...).submod``). Ranks without a copy take part with zeros. A copy whose
    ``grad`` is ``None`` counts as zero and gets the sum.

    **Laws:** parameters that only one stage holds are untouched; after it, with equal initial
    copies (``pipeline_stage`` broadcasts them), the same optimizer keeps every copy equal.
    Complexity: one all-reduce per shared parameter.
    """
    _check_stage(stages, i)
    for fqn, _owners in _shared_keys(stages, (PARAMETER,)):
        mine = _local(stages, i, m, fqn)
        if mine is not None and not mine.requires_grad:
            continue
        ref = stages.source.tensor(fqn)
        if mine is None:
            grad = torch.zeros(ref.shape, dtype=ref.dtype, device=_device_of(m))
        elif mine.grad is None:
            grad = torch.zeros_like(mine)
        else:
            grad = mine.grad
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=group)
        if mine is not None and mine.grad is None:
            mine.grad = grad


def merge_stage_state_dicts(
    stages: Stages, state_dicts: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The stages' state dicts merged into the eager model's ``state_dict`` keys and order.

    ``state_dicts[k]`` is stage ``k``'s module's ``state_dict()`` (any rank's, gathered by the
    caller). Every parameter and persistent buffer of the program gets the value of the first
    stage that holds its tensor (under its own fqn or a tied one): tied fqns (an embedding and
    its lm head) both appear, with that one value.

    Raises:
        LoweringError: when the number of state dicts is not the number of stages, or no stage's
        dict holds some fqn's tensor.

    **Laws:** ``merge_stage_state_dicts(stages, [stage_module(stages, k).state_dict() ...])``
    equals the program's state dict (``ep.module().state_dict()``). Complexity: O(state * k).
    """
    if not isinstance(stages, Stages):
        raise LoweringError("merge_stage_state_dicts: expected the Stages of split_stages")
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
            if local is not None and local in sd:
                merged[fqn] = sd[local]
                break
        else:
            raise LoweringError(
                f"merge_stage_state_dicts: no stage's state dict holds {fqn!r} (or a tensor "
                "tied to it); pass each stage module's state_dict() in stage order"
            )
    return merged


def _describe(stages: Stages, name: str) -> str:
    val = stages.source.root_module.graph.by_name()[name].meta.get("val")
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
        inputs = ", ".join(_describe(stages, nm) for nm in stages.inputs[k]) or "(none)"
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
                _describe(stages, e.name) + (f" [relay from stage {e.origin}]"
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
    "merge_stage_state_dicts",
    "pipeline_stage",
    "stage_module",
    "sync_shared_grads",
]
