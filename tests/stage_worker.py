"""One rank of the spawned pipeline-schedule tests (``tests/test_stages_dist.py``).

``python tests/stage_worker.py RANK WORLD PORT RUNS`` where RUNS is ``case:schedule,...``.
Joins a gloo group on 127.0.0.1 (bounded timeout), runs each case through a real schedule
with the purefx stages, and raises (exit status 1) at the first difference from eager.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.distributed as dist
from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

from ir import import_ep
from ir.errors import InputConstraintError
from lowering import (
    broadcast_shared_state,
    merge_stage_state_dicts,
    pipeline_stage,
    sync_shared_grads,
)
from tests import stage_cases as sc
from transforms import split_stages

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
N_MB = 4


def run_case(rank: int, world: int, case: str, schedule: str) -> None:
    model, ep, at, pos, kw, tgt, loss_fn = sc.build(case, world, N_MB)
    stages = split_stages(import_ep(ep), at)
    stage = pipeline_stage(stages, rank, torch.device("cpu"))
    # a copy of a shared weight that drifted is set back to its first owner's value
    for fqn, owners in stages.shared.items():
        local = stages.owner(fqn, rank)
        if local is not None and rank != owners[0] and stages.source.slot(local).kind == "parameter":
            with torch.no_grad():
                stage.submod.get_parameter(local).add_(1.0)
    broadcast_shared_state(stages, rank, stage.submod)
    sched = SCHEDULES[schedule](stage, n_microbatches=N_MB, loss_fn=loss_fn)
    losses: list[torch.Tensor] = []
    sc.schedule_step(sched, rank, world, pos, kw, tgt, losses)
    m = stage.submod
    sync_shared_grads(stages, rank, m)

    names = list(ep.module_call_graph[0].signature.forward_arg_names)
    eager_losses = sc.eager_step(model, pos, kw, names, tgt, loss_fn, N_MB)
    where = f"[{case}/{schedule} rank {rank}]"
    if rank == world - 1:
        torch.testing.assert_close(
            torch.stack(losses), torch.stack(eager_losses), rtol=1e-12, atol=1e-12,
            msg=lambda s: f"{where} loss: {s}",
        )
    for fqn, prm in m.named_parameters():
        assert "@" not in fqn, f"{where} stage key {fqn!r} is not an original fqn"
        want = model.get_parameter(fqn).grad
        torch.testing.assert_close(
            prm.grad, want, rtol=1e-10, atol=1e-12, msg=lambda s, f=fqn: f"{where} {f}: {s}"
        )
    torch.optim.SGD(m.parameters(), lr=0.1).step()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    sds: list = [None] * world
    dist.all_gather_object(sds, {k: v.detach().clone() for k, v in m.state_dict().items()})
    merged = merge_stage_state_dicts(stages, sds)
    want_sd = model.state_dict()
    assert set(merged) == set(want_sd), f"{where} keys {sorted(merged)} != {sorted(want_sd)}"
    for fqn, t in want_sd.items():
        torch.testing.assert_close(
            merged[fqn], t, rtol=1e-10, atol=1e-12, msg=lambda s, f=fqn: f"{where} {f}: {s}"
        )
    dist.barrier()


def run_bad_batch(rank: int, world: int) -> None:
    """Rank 0 steps with a batch whose micro-batches are not the exported shape: a purefx
    ``InputConstraintError`` before it sends anything; it then leaves, and the other ranks'
    receives fail at once (peer closed) instead of waiting for the group's timeout."""
    _model, ep, at, pos, _kw, tgt, loss_fn = sc.build("mlp", world, N_MB)
    stages = split_stages(import_ep(ep), at)
    stage = pipeline_stage(stages, rank, torch.device("cpu"))
    sched = ScheduleGPipe(stage, n_microbatches=N_MB, loss_fn=loss_fn)
    if rank == 0:
        wide = torch.cat([pos[0], pos[0][: N_MB]])  # 3 rows per micro-batch, exported with 2
        try:
            sched.step(wide)
        except InputConstraintError as e:
            assert "micro-batch 0" in str(e) and "(3, 6)" in str(e), str(e)
            return
        raise AssertionError("a micro-batch of the wrong shape ran")
    try:
        if rank == world - 1:
            sched.step(target=tgt, losses=[])
        else:
            sched.step()
    except RuntimeError:
        return
    raise AssertionError(f"rank {rank} ran a step although rank 0 failed")


def main() -> None:
    rank, world, port, runs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=timedelta(seconds=60),
    )
    try:
        for run in runs.split(","):
            if run == "bad_batch":  # must be the last run: the group is broken after it
                run_bad_batch(rank, world)
                os._exit(0)  # leave at once (no teardown collective): peers see the pair close
            case, schedule = run.split(":")
            run_case(rank, world, case, schedule)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
