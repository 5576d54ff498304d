"""purefx stages vs torch's own pipeline frontend (``torch.distributed.pipelining.pipeline``).

Runs each case of ``bench/stage_cases.py`` through a real schedule on a gloo group of spawned
processes on 127.0.0.1 (ScheduleGPipe, float64, 4 micro-batches), once with purefx's stages
(``split_stages`` + ``pipeline_stage`` + ``sync_shared_grads``) and once with torch's
``pipeline(model, mb_args, mb_kwargs, split_spec)`` + ``build_stage``, and compares with eager on
every rank: the loss, every gradient by fqn, and the stage state_dict keys. Prints a table
(not a gating test; ``python bench/stages_vs_torch.py``, about a minute on 2 cores).
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.ranks import report_failure, run_ranks

CASES = [  # (case, world size, what it checks)
    ("mlp", 2, "MLP"),
    ("tied_lm", 2, "LM, tied embedding / head, mask read by the last stage"),
    ("tied_plain", 2, "the same LM without the mask (tied weights only)"),
    ("cross_buffer", 2, "a buffer updated in stage 0 and read in stage 1"),
    ("nograd_edge", 2, "detached and integer activations next to one with a gradient"),
    ("fan_out", 4, "activation read by two later stages"),
    ("twice", 2, "a block called twice in one stage"),
    ("local_buffer", 2, "a buffer updated and read in one stage"),
    ("bad_batch", 2, "a step whose micro-batch differs from the traced one"),
]
N_MB = 4


def _worker(frontend: str, case: str, rank: int, world: int, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import ScheduleGPipe, SplitPoint, pipeline

    from bench import stage_cases as sc
    from ir import import_ep
    from lowering import pipeline_stage, sync_shared_grads
    from transforms import split_stages

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=30))
    bad = case == "bad_batch"
    name = "mlp" if bad else case
    try:
        model, ep, at, pos, kw, tgt, loss_fn = sc.build(name, world, N_MB)
        if frontend == "purefx":
            stages = split_stages(import_ep(ep), at)
            stage = pipeline_stage(stages, rank, torch.device("cpu"))
        else:
            traced, *_ = sc.build(name, world, N_MB)
            mb_pos = tuple(torch.tensor_split(t, N_MB)[0] for t in pos)
            mb_kw = {k: torch.tensor_split(v, N_MB)[0] for k, v in kw.items()}
            pipe = pipeline(traced, mb_pos, mb_kw or None,
                            split_spec={p: SplitPoint.BEGINNING for p in at})
            stage = pipe.build_stage(rank, torch.device("cpu"))
        sched = ScheduleGPipe(stage, n_microbatches=N_MB, loss_fn=loss_fn)
        losses: list = []
        if bad:
            pos = tuple(torch.cat([t, t[:N_MB]]) for t in pos)
        sc.schedule_step(sched, rank, world, pos, kw, tgt, losses)
        if bad:
            print("RESULT wrong: a step with another micro-batch shape ran", flush=True)
            return
        m = stage.submod
        if frontend == "purefx":
            sync_shared_grads(stages, rank, m)
        names = list(ep.module_call_graph[0].signature.forward_arg_names)
        eager = sc.eager_step(model, pos, kw, names, tgt, loss_fn, N_MB)
        problems = []
        if rank == world - 1 and not torch.allclose(torch.stack(losses), torch.stack(eager),
                                                    rtol=1e-10, atol=1e-12):
            problems.append("wrong loss")
        for fqn, prm in m.named_parameters():
            try:
                want = model.get_parameter(fqn).grad
            except AttributeError:
                problems.append(f"parameter {fqn!r} is not an eager fqn")
                continue
            if prm.grad is None or not torch.allclose(prm.grad, want, rtol=1e-8, atol=1e-10):
                err = (prm.grad - want).abs().max().item() if prm.grad is not None else "none"
                problems.append(f"wrong gradient of {fqn} (max error {err})")
        keys = [k for k in m.state_dict() if "@" in k]
        if keys:
            problems.append(f"state_dict keys {keys}")
        print("RESULT " + ("; ".join(problems) if problems else "right"), flush=True)
    except Exception as e:  # noqa: BLE001 (any failure is a row of the table)
        report_failure(e)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _run(frontend: str, case: str, world: int) -> str:
    return run_ranks(__file__, (frontend, case, str(world)), world, timeout=120)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        frontend, case, world, rank, port = sys.argv[2:7]
        _worker(frontend, case, int(rank), int(world), int(port))
        return
    print("| case | ranks | purefx | torch pipeline() |\n|---|---|---|---|")
    only = sys.argv[1].split(",") if len(sys.argv) > 1 else None
    for case, world, what in CASES:
        if only and case not in only:
            continue
        ours = _run("purefx", case, world)
        theirs = _run("torch", case, world)
        print(f"| {case}: {what} | {world} | {ours} | {theirs} |", flush=True)


if __name__ == "__main__":
    main()
