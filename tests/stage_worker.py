"""One rank of the spawned pipeline-schedule tests (``tests/test_stages_dist.py``).

``python tests/stage_worker.py RANK WORLD PORT RUNS`` where RUNS is ``;``-separated runs, each
``case:schedule`` (one stage per rank), ``bad_batch`` (last), ``bad:WHAT`` (a wrong argument on
one rank: every rank must raise the same purefx error) or ``key=value`` words for
``run_pipeline`` (several stages per rank, data-parallel replicas, frozen copies, a checkpoint).
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
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleLoopedBFS,
    ScheduleZBVZeroBubble,
)
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from bench import stage_cases as sc
from bench import stage_cases_dist as scd
from ir import import_ep
from ir.errors import InputConstraintError, LoweringError, UnloadedStateError
from lowering import (
    broadcast_shared_state,
    load_stage_state,
    merge_stage_state_dicts,
    pipeline_stage,
    sync_shared_grads,
)
from transforms import split_stages

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B,
             "interleaved": ScheduleInterleaved1F1B, "looped": ScheduleLoopedBFS,
             "zbv": ScheduleZBVZeroBubble}
MULTI = ("interleaved", "looped", "zbv")
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


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of an FSDP2 shard (``DTensor``), else ``t``."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def _detach_use(model: torch.nn.Module, fqn: str) -> None:
    """Eager reference of a copy frozen on one stage: that module's use of the weight is
    detached (its forward reads ``weight.detach()``); Linear and Embedding only."""
    path, _, name = fqn.rpartition(".")
    mod = model.get_submodule(path)
    assert name == "weight", fqn
    if isinstance(mod, torch.nn.Embedding):
        mod.forward = lambda t: torch.nn.functional.embedding(t, mod.weight.detach())
    else:
        mod.forward = lambda x: torch.nn.functional.linear(x, mod.weight.detach(), mod.bias)


def run_pipeline(rank: int, world: int, case: str, sched: str = "gpipe", stages: str = "2",
                 dp: str = "1", wrap: str = "", freeze: str = "", export_frozen: str = "",
                 ckpt: str = "", dyn: str = "", again: str = "") -> None:
    """One schedule step of ``case`` split into ``stages`` stages, on ``world // dp`` pipeline
    ranks (stage ``k`` on pipeline rank ``k % pp``, several per rank for looped and interleaved
    schedules) times ``dp`` replicas (each stage module wrapped by ``wrap``: ``ddp`` over its
    replica group), checked against eager on the full batch: each replica's losses, every
    gradient by fqn after ``sync_shared_grads``, the merged state after one SGD step.

    ``freeze=FQN@K+...``: the copy of FQN in stage K is frozen after the split (eager: that use
    detached). ``export_frozen=PREFIX+...``: those parameters are frozen when the model is
    exported and unfrozen after the split (their gradients must still arrive).
    ``ckpt=DIR``: the program is exported on meta and each rank loads its stages from the
    torch.distributed.checkpoint at DIR (saved from the eager model by the test).
    ``dyn=ROWS``: exported with a dynamic batch dim (micro-batch of ``MB`` rows), stepped with
    micro-batches of ROWS rows. ``again=ROWS``: then the first stage's rank steps the same
    schedule with micro-batches of ROWS rows: an ``InputConstraintError`` before it sends
    anything (the other ranks do not step; the group stays usable)."""
    n, n_dp = int(stages), int(dp)
    pp = world // n_dp
    replica, pp_rank = divmod(rank, pp)
    pp_groups = [dist.new_group(list(range(r * pp, (r + 1) * pp))) for r in range(n_dp)]
    dp_groups = [dist.new_group([p + r * pp for r in range(n_dp)]) for p in range(pp)]
    group = pp_groups[replica] if n_dp > 1 else None
    rows_mb = int(dyn) if dyn else sc.MB
    model, ep, at, pos, kw, tgt, loss_fn = scd.build(case, n, N_MB * n_dp,
                                                      export_on_meta=bool(ckpt),
                                                      rows=rows_mb if dyn else None)
    frozen_at_export = [p for p in export_frozen.split("+") if p]
    if frozen_at_export:  # export with those frozen, then unfreeze (eager and stages)
        assert not kw, "export_frozen takes cases without keyword inputs"
        for fqn, prm in model.named_parameters():
            prm.requires_grad_(not any(fqn.startswith(p + ".") for p in frozen_at_export))
        ep = torch.export.export(model, tuple(torch.tensor_split(t, N_MB * n_dp)[0]
                                              for t in pos))
        for prm in model.parameters():
            prm.requires_grad_(True)
    split = split_stages(import_ep(ep), at)
    # torch's placements: loop (stage k on rank k % pp), V for ZBV (rank r: r and 2 pp - 1 - r)
    where_k = [k % pp if sched != "zbv" else min(k, 2 * pp - 1 - k) for k in range(n)]
    mine = [k for k in range(n) if where_k[k] == pp_rank]
    # pipeline_stage is told "v", the shared-weight calls the same placement as ranks
    placement = "v" if sched == "zbv" else None
    ranks_of = where_k if sched == "zbv" else None
    wrapper = None
    if wrap == "ddp":
        def wrapper(m):
            return DistributedDataParallel(m, process_group=dp_groups[pp_rank])
    elif wrap == "fsdp":
        mesh = DeviceMesh.from_group(dp_groups[pp_rank], "cpu")

        def wrapper(m):
            return fully_shard(m, mesh=mesh)
    sts = [pipeline_stage(split, k, torch.device("cpu"), group=group, wrap=wrapper,
                          placement=placement) for k in mine]
    inner = [st.submod.module if wrap == "ddp" else st.submod for st in sts]
    if ckpt:
        load_stage_state(split, mine, inner, ckpt)
        broadcast_shared_state(split, mine, inner, group, placement=ranks_of)
    if frozen_at_export:
        for m in inner:
            for prm in m.parameters():
                prm.requires_grad_(True)
    for item in (f for f in freeze.split("+") if f):
        fqn, k = item.split("@")
        if int(k) in mine:
            inner[mine.index(int(k))].get_parameter(fqn).requires_grad_(False)
        _detach_use(model, fqn)
    cls = SCHEDULES[sched]
    schedule = cls(sts if sched in MULTI else sts[0], n_microbatches=N_MB, loss_fn=loss_fn)

    rows = slice(replica * N_MB * rows_mb, (replica + 1) * N_MB * rows_mb)
    my_pos = tuple(t[rows] for t in pos)
    my_kw = {k: v[rows] for k, v in kw.items()}
    losses: list[torch.Tensor] = []
    first = my_pos if 0 in mine else ()
    last = {"target": tgt[rows], "losses": losses} if n - 1 in mine else {}
    schedule.step(*first, **my_kw, **last)  # a V rank holds the first and the last stage
    sync_shared_grads(split, mine, [st.submod for st in sts], group, placement=ranks_of)

    names = list(ep.module_call_graph[0].signature.forward_arg_names)
    eager_losses = sc.eager_step(model, pos, kw, names, tgt, loss_fn, N_MB * n_dp)
    where = f"[{case}/{sched} x{n} dp{n_dp} {wrap} freeze={freeze} rank {rank}]"
    if n - 1 in mine:
        want = torch.stack(eager_losses[replica * N_MB:(replica + 1) * N_MB])
        torch.testing.assert_close(torch.stack(losses), want, rtol=1e-12, atol=1e-12,
                                   msg=lambda s: f"{where} loss: {s}")
    for k, m in zip(mine, inner, strict=True):
        for fqn, prm in m.named_parameters():
            want = model.get_parameter(fqn).grad
            if want is None:
                assert prm.grad is None, f"{where} stage {k} {fqn}: a gradient, eager has none"
                continue
            torch.testing.assert_close(_full(prm.grad), want, rtol=1e-10, atol=1e-12,
                                       msg=lambda s, f=fqn, k=k: f"{where} stage {k} {f}: {s}")
    for m in inner:
        torch.optim.SGD(m.parameters(), lr=0.1).step()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    held = {k: {key: _full(v).detach().clone() for key, v in m.state_dict().items()}
            for k, m in zip(mine, inner, strict=True)}
    gathered: list = [None] * pp
    dist.all_gather_object(gathered, held, group=group)
    sds = [next(g[k] for g in gathered if k in g) for k in range(n)]
    merged = merge_stage_state_dicts(split, sds)
    want_sd = model.state_dict()
    assert set(merged) == set(want_sd), f"{where} keys {sorted(merged)} != {sorted(want_sd)}"
    for fqn, t in want_sd.items():
        torch.testing.assert_close(merged[fqn], t, rtol=1e-10, atol=1e-12,
                                   msg=lambda s, f=fqn: f"{where} merged {f}: {s}")
    # every copy of a shared weight is the one weight after the step (trained or frozen)
    for fqn, owners in split.shared.items():
        for k in owners:
            local = split.owner(fqn, k)
            if k in mine and split.source.slot(local).kind == "parameter":
                got = inner[mine.index(k)].get_parameter(local)
                torch.testing.assert_close(_full(got).detach(), want_sd[fqn], rtol=1e-10, atol=1e-12,
                                           msg=lambda s, f=fqn, k=k: f"{where} copy {f}@{k}: {s}")
    if again and 0 in mine:
        wide = tuple(torch.cat([t[:1]] * (N_MB * int(again))) for t in my_pos)
        try:
            schedule.step(*wide, **my_kw)
        except InputConstraintError as e:
            assert "at its first micro-batch" in str(e) and f"({again}," in str(e), str(e)
        else:
            raise AssertionError(f"{where} a step with {again}-row micro-batches ran")
    dist.barrier()  # the groups live until the process group is destroyed at exit


def run_bad_argument(rank: int, world: int, what: str) -> None:
    """A wrong argument on the last rank only: every rank raises the same ``LoweringError``
    (naming it) instead of entering a collective the last rank never reaches."""
    _model, ep, at, *_ = sc.build("tied_lm", world, N_MB)
    split = split_stages(import_ep(ep), at)
    bad = rank == world - 1
    what, _, arg = what.partition("=")
    if what == "index4":  # 2 ranks x 2 stages: the last rank's second stage index is wrong
        _model, ep, at, *_ = scd.build("tied3", 2 * world, N_MB)
        split = split_stages(import_ep(ep), at)
        try:
            for j, k in enumerate(range(rank, 2 * world, world)):
                pipeline_stage(split, 7 if bad and j == 1 else k, torch.device("cpu"))
        except LoweringError as e:
            assert "stage index 7" in str(e) and f"rank {world - 1}" in str(e), str(e)
            dist.barrier()
            return
        raise AssertionError(f"rank {rank}: no LoweringError for a bad index")
    if what == "unloaded":  # a meta export: a copy of a shared weight never loaded is named
        model, ep, at, _pos, kw, *_ = scd.build("tied_lm", world, N_MB, export_on_meta=True)
        split = split_stages(import_ep(ep), at)
        st = pipeline_stage(split, rank, torch.device("cpu"))  # broadcasts nothing: meta
        sd = model.state_dict()
        if rank != world - 1:
            load_stage_state(split, rank, st.submod, sd)
            dist.barrier()
            return
        st.submod.load_state_dict({k: v for k, v in sd.items() if k != "head.weight"},
                                  strict=False)
        act = torch.zeros(sc.MB, 5, 6, dtype=torch.float64)
        try:
            st.submod(act, **{k: torch.tensor_split(v, N_MB)[0] for k, v in kw.items()})
        except UnloadedStateError as e:
            assert "head.weight" in str(e), str(e)
            dist.barrier()
            return
        raise AssertionError("a stage with an unloaded copy of a shared weight ran")
    if what == "dyndict":  # a dynamic export whose last stage returns a dict: refused there
        split = split_stages(import_ep(scd.build("tied_lm", world, N_MB, rows=3)[1]), at)
        try:
            pipeline_stage(split, rank, torch.device("cpu"))
        except LoweringError as e:
            assert "a tuple of tensors as the last stage's output" in str(e), str(e)
            assert f"rank {world - 1}" in str(e) and "rank 0" not in str(e), str(e)
            dist.barrier()
            return
        raise AssertionError(f"rank {rank}: a dynamic dict-returning pipeline was built")
    expect = {"index": "stage index 7", "wrap": "returned NoneType",
              "sync": "holds stages", "ckpt": "no entry 'layers.0.lin.weight'"}[what]
    try:
        if what == "index":
            pipeline_stage(split, 7 if bad else rank, torch.device("cpu"))
        elif what == "wrap":
            pipeline_stage(split, rank, torch.device("cpu"),
                           wrap=(lambda m: None) if bad else None)
        elif what == "sync":
            st = pipeline_stage(split, rank, torch.device("cpu"))
            sync_shared_grads(split, (rank + 1) % world if bad else rank, st.submod)
        elif what == "ckpt":  # every rank finds the fqn missing (stage 0's), not only rank 0
            st = pipeline_stage(split, rank, torch.device("cpu"))
            try:
                load_stage_state(split, rank, st.submod, arg)
            except LoweringError as e:
                assert expect in str(e), str(e)
                dist.barrier()
                return
            raise AssertionError(f"rank {rank}: the checkpoint without {expect} loaded")
        else:
            raise AssertionError(what)
    except LoweringError as e:
        assert expect in str(e) and f"rank {world - 1}" in str(e), str(e)
        dist.barrier()  # the group still works: nobody is stuck in a collective
        return
    raise AssertionError(f"rank {rank}: no LoweringError for a bad {what}")


def main() -> None:
    rank, world, port, runs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=timedelta(seconds=60),
    )
    try:
        for run in runs.split(";"):
            if run == "bad_batch":  # must be the last run: the group is broken after it
                run_bad_batch(rank, world)
                os._exit(0)  # leave at once (no teardown collective): peers see the pair close
            if run.startswith("bad:"):
                run_bad_argument(rank, world, run[4:])
            elif "=" in run:
                run_pipeline(rank, world, **dict(w.split("=", 1) for w in run.split()))
            else:
                case, schedule = run.split(":")
                run_case(rank, world, case, schedule)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
