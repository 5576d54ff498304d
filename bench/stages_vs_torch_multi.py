"""purefx stages vs torch's ``pipeline()`` frontend on several stages per rank (interleaved
and looped schedules) and on pipeline x data parallel (DDP, FSDP2), tried for real.

Each row runs one case (``bench/stage_cases.py`` / ``bench/stage_cases_dist.py``) on a gloo
group of spawned processes on 127.0.0.1 (float64, 4 micro-batches per replica), once with
purefx (``split_stages`` + ``pipeline_stage(..., wrap=)`` + ``sync_shared_grads``) and once with
``torch.distributed.pipelining.pipeline(model, mb_args, mb_kwargs, split_spec)`` +
``build_stage`` (DDP: the stage's ``submod`` wrapped after ``build_stage``; FSDP2: the stage
module sharded in place before it), and compares with eager on the full batch, on every rank:
the loss, every gradient by fqn, the stage ``state_dict`` keys. Prints a markdown table (not a
gating test; ``python bench/stages_vs_torch_multi.py [CASE,...]``).
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.ranks import report_failure, run_ranks

# (row name, case, world, stages, dp, wrap, schedule, what)
ROWS = [
    ("i-mlp", "mlp", 2, 4, 1, "", "interleaved", "MLP, 2 ranks x 2 stages"),
    ("i-tied_plain", "tied_plain", 2, 4, 1, "", "interleaved",
     "LM, embedding tied to the head (stages 0 and 3, two ranks)"),
    ("i-tied3", "tied3", 2, 4, 1, "", "interleaved",
     "a weight tied across stages 0, 2 (one rank) and 3"),
    ("i-tied_lm", "tied_lm", 2, 4, 1, "", "interleaved", "tied LM, mask read by the last stage"),
    ("l-tied3", "tied3", 2, 4, 1, "", "looped", "looped BFS, weight tied across 0, 2 and 3"),
    ("v-mlp", "mlp", 2, 4, 1, "", "zbv", "MLP, V placement (rank 0: stages 0, 3)"),
    ("v-tied3", "tied3", 2, 4, 1, "", "zbv", "ZBV, weight tied across 0, 3 (one rank) and 2"),
    ("ddp-mlp", "mlp", 4, 2, 2, "ddp", "1f1b", "MLP, 2 stages x 2 DDP replicas"),
    ("ddp-tied_plain", "tied_plain", 4, 2, 2, "ddp", "1f1b", "tied LM, 2 stages x 2 DDP replicas"),
    ("fsdp-mlp", "mlp", 4, 2, 2, "fsdp", "gpipe", "MLP, 2 stages x 2 FSDP2 replicas"),
    ("fsdp-tied_plain", "tied_plain", 4, 2, 2, "fsdp", "gpipe",
     "tied LM, 2 stages x 2 FSDP2 replicas"),
]
N_MB = 4


def _worker(frontend: str, row: str, rank: int, port: int) -> None:
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
        SplitPoint,
        pipeline,
    )
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel

    from bench import stage_cases as sc
    from bench import stage_cases_dist as scd
    from ir import import_ep
    from lowering import pipeline_stage, sync_shared_grads
    from transforms import split_stages

    _name, case, world, n, n_dp, wrap, sched, _what = next(r for r in ROWS if r[0] == row)
    schedules = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B,
                 "interleaved": ScheduleInterleaved1F1B, "looped": ScheduleLoopedBFS,
                 "zbv": ScheduleZBVZeroBubble}
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=30))
    try:
        pp = world // n_dp
        replica, pp_rank = divmod(rank, pp)
        pp_groups = [dist.new_group(list(range(r * pp, (r + 1) * pp))) for r in range(n_dp)]
        dp_groups = [dist.new_group([p + r * pp for r in range(n_dp)]) for p in range(pp)]
        group = pp_groups[replica] if n_dp > 1 else None
        dp_group = dp_groups[pp_rank]
        model, ep, at, pos, kw, tgt, loss_fn = scd.build(case, n, N_MB * n_dp)
        v = sched == "zbv"  # V placement: rank r holds r and 2 pp - 1 - r
        mine = [k for k in range(n) if (min(k, 2 * pp - 1 - k) if v else k % pp) == pp_rank]
        if frontend == "purefx":
            wrapper = None
            if wrap == "ddp":
                def wrapper(m):
                    return DistributedDataParallel(m, process_group=dp_group)
            elif wrap == "fsdp":
                def wrapper(m):
                    return fully_shard(m, mesh=DeviceMesh.from_group(dp_group, "cpu"))
            split = split_stages(import_ep(ep), at)
            stages = [pipeline_stage(split, k, torch.device("cpu"), group=group, wrap=wrapper,
                                     placement="v" if v else None) for k in mine]
        else:
            traced, *_ = scd.build(case, n, N_MB * n_dp)
            mb_pos = tuple(torch.tensor_split(t, N_MB * n_dp)[0] for t in pos)
            mb_kw = {k: torch.tensor_split(v, N_MB * n_dp)[0] for k, v in kw.items()}
            pipe = pipeline(traced, mb_pos, mb_kw or None,
                            split_spec={p: SplitPoint.BEGINNING for p in at})
            stages = []
            for k in mine:
                if wrap == "fsdp":
                    fully_shard(pipe.get_stage_module(k),
                                mesh=DeviceMesh.from_group(dp_group, "cpu"))
                st = pipe.build_stage(k, torch.device("cpu"), group=group)
                if wrap == "ddp":
                    st.submod = DistributedDataParallel(st.submod, process_group=dp_group)
                stages.append(st)
        multi = sched in ("interleaved", "looped", "zbv")
        schedule = schedules[sched](stages if multi else stages[0], n_microbatches=N_MB,
                                    loss_fn=loss_fn)
        rows = slice(replica * N_MB * sc.MB, (replica + 1) * N_MB * sc.MB)
        losses: list = []
        first = tuple(t[rows] for t in pos) if 0 in mine else ()
        last = {"target": tgt[rows], "losses": losses} if n - 1 in mine else {}
        schedule.step(*first, **{k: v[rows] for k, v in kw.items()}, **last)
        inner = [st.submod.module if wrap == "ddp" else st.submod for st in stages]
        if frontend == "purefx":
            sync_shared_grads(split, mine, inner, group, placement="v" if v else None)
        names = list(ep.module_call_graph[0].signature.forward_arg_names)
        eager = sc.eager_step(model, pos, kw, names, tgt, loss_fn, N_MB * n_dp)
        problems = []
        if n - 1 in mine:
            want = torch.stack(eager[replica * N_MB:(replica + 1) * N_MB])
            if not torch.allclose(torch.stack(losses), want, rtol=1e-10, atol=1e-12):
                problems.append("wrong loss")
        for m in inner:
            for fqn, prm in m.named_parameters():
                try:
                    want = model.get_parameter(fqn).grad
                except AttributeError:
                    problems.append(f"parameter {fqn!r} is not an eager fqn")
                    continue
                got = prm.grad
                if isinstance(got, DTensor):
                    got = got.full_tensor()
                if got is None or not torch.allclose(got, want, rtol=1e-8, atol=1e-10):
                    err = (got - want).abs().max().item() if got is not None else "none"
                    problems.append(f"wrong gradient of {fqn} (max error {err:.3g})"
                                    if got is not None else f"no gradient of {fqn}")
            keys = [k for k in m.state_dict() if "@" in k or k.startswith("module.")]
            if keys:
                problems.append(f"state_dict keys {keys}")
        print("RESULT " + ("; ".join(problems) if problems else "right"), flush=True)
    except Exception as e:  # noqa: BLE001 (any failure is a row of the table)
        report_failure(e)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _run(frontend: str, row: str, world: int) -> str:
    return run_ranks(__file__, (frontend, row), world, timeout=150)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        frontend, row, rank, port = sys.argv[2:6]
        _worker(frontend, row, int(rank), int(port))
        return
    only = sys.argv[1].split(",") if len(sys.argv) > 1 else None
    print("| case | ranks | schedule | purefx | torch pipeline() |\n|---|---|---|---|---|")
    for name, _case, world, _n, _dp, _wrap, sched, what in ROWS:
        if only and name not in only:
            continue
        ours = _run("purefx", name, world)
        theirs = _run("torch", name, world)
        print(f"| {what} | {world} | {sched} | {ours} | {theirs} |", flush=True)


if __name__ == "__main__":
    main()
