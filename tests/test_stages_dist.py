"""Real pipeline schedules over purefx stages: spawned processes on a gloo group (127.0.0.1).

Each test starts one process per rank (``tests/stage_worker.py``), each running several runs
in one group (float64, 4 micro-batches per replica) and checking on its own rank: loss equals
eager's, every gradient equals eager's by fqn after ``sync_shared_grads``, the merged state
dict (and every copy of a shared weight) after one SGD step equals eager's, stage keys are
original fqns. Runs cover one stage per rank (GPipe, 1F1B), several (interleaved 1F1B, looped
BFS), pipeline x data parallel (DDP, FSDP2), a meta export loaded from a
torch.distributed.checkpoint, frozen and unfrozen weights, dynamic batches and bad arguments.
CI runs a sample (three groups); the matrix is behind ``@pytest.mark.slow`` and
``@pytest.mark.nightly`` (deselected by default: ``python -m pytest -m nightly``), the torchrun
example is ``slow`` only. Groups run in parallel with other tests: each takes a free port (a
port taken before rank 0 listens is retried with another). Every process
ends, pass or fail: 60 s group timeout, joined with a deadline, killed in ``finally``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import warnings

import pytest

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stage_worker.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_was_taken(outputs: list[str]) -> bool:
    """Rank 0 could not listen on the port: another process (another xdist worker's group)
    bound it between ``_free_port`` and the store's start."""
    return any("Address already in use" in out or "EADDRINUSE" in out for out in outputs)


def _run_group(world: int, runs: list[str], timeout: float = 240.0) -> None:
    """Run ``runs`` on ``world`` spawned ranks; fail with the first failing rank's output.

    A port taken between choosing it and listening on it (tests run in parallel) is retried
    with a fresh port, twice at most; every rank is killed before the next try or return."""
    for attempt in range(3):
        procs, outputs = _spawn_group(world, runs, timeout)
        failed = [r for r, proc in enumerate(procs) if proc.returncode != 0]
        if not (failed and _port_was_taken(outputs) and attempt < 2):
            break
    if failed:
        # the rank that failed first says why; the others lost their peer
        failed.sort(key=lambda r: "closed by peer" in outputs[r])
        pytest.fail(
            "\n".join(f"rank {r} exited with {procs[r].returncode}:\n{outputs[r][-3000:]}"
                      for r in failed)
        )


def _spawn_group(world: int, runs: list[str], timeout: float
                 ) -> tuple[list[subprocess.Popen], list[str]]:
    """Start ``world`` ranks on a free port and wait for all (``timeout`` in all): the ended
    processes and their outputs; a rank past the deadline fails the test, all killed first."""
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    env.pop("MASTER_ADDR", None)
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, str(r), str(world), str(port), ";".join(runs)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT,
        )
        for r in range(world)
    ]
    outputs: list[str] = [""] * world
    try:
        deadline = time.monotonic() + timeout
        for r, proc in enumerate(procs):
            left = max(1.0, deadline - time.monotonic())
            try:
                out, _ = proc.communicate(timeout=left)
            except subprocess.TimeoutExpired:
                pytest.fail(f"rank {r} did not finish in {timeout:.0f}s")
            outputs[r] = out.decode(errors="replace")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    return procs, outputs


def test_two_stages_gpipe_and_1f1b():
    """Two ranks, a sample of the two-stage cases under both schedules; last, a micro-batch of
    the wrong shape: a purefx InputConstraintError on rank 0 before it sends, and rank 1 fails
    fast."""
    _run_group(2, ["mlp:gpipe", "tied_lm:1f1b", "twice:gpipe", "nograd_edge:1f1b", "bad_batch"])


@pytest.mark.slow
@pytest.mark.nightly
def test_two_stages_all():
    _run_group(2, [
        f"{case}:{sched}"
        for case in ("mlp", "tied_lm", "twice", "local_buffer")
        for sched in ("gpipe", "1f1b")
    ] + ["nograd_edge:1f1b", "nograd_edge:gpipe", "bad_batch"])


def test_four_ranks_four_stages_and_pipeline_times_data_parallel():
    """4 ranks, one group, in turn: 4 stages (fan-out relayed; the tied LM), one per rank; then
    2 stages x 2 replicas, each stage module wrapped over its replica group with DDP, then with
    FSDP2's fully_shard (it runs on gloo/CPU; the tied weight's copies are summed shard by
    shard): gradients and merged state after one step equal eager on the full batch."""
    _run_group(4, ["fan_out:1f1b", "tied_lm:gpipe",
                   "case=tied_lm sched=1f1b stages=2 dp=2 wrap=ddp",
                   "case=tied_plain sched=gpipe stages=2 dp=2 wrap=fsdp"])


@pytest.mark.slow
def test_torchrun_example():
    """``docs/examples/pipeline_torchrun.py`` under torchrun (2 processes) checks itself."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("torchrun is not installed next to this Python")
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    cmd = [torchrun, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
           str(_free_port()), os.path.join(ROOT, "docs", "examples", "pipeline_torchrun.py")]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)  # torchrun's workers are in its session
            proc.wait(timeout=10)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    assert "merged state_dict equals eager's after one step" in text


def test_several_stages_per_rank_meta_frozen_dynamic_and_bad_arguments(tmp_path):
    """Two ranks, one group, in turn:

    - 2 ranks x 2 stages (loop placement), ScheduleInterleaved1F1B, a weight tied across
      stages 0 and 2 (one rank) and 3 (the other): equals eager (loss, grads by fqn, merged
      state and every copy after SGD); the same with ScheduleZBVZeroBubble (V placement:
      stages 0 and 3 on one rank, 1 and 2 on the other);
    - item 1: the eager model saved with torch.distributed.checkpoint, the program exported on
      meta, each rank loads only its stage (``load_stage_state``), one GPipe step equals eager;
      a copy of the tied weight left unloaded on the last stage is named at its first call
      (``pipeline_stage`` broadcast nothing into it);
    - a tied weight frozen on one stage only: eager's result with that use detached, every
      process ends;
    - a weight frozen at export and unfrozen after the split still gets its gradient through
      the edge (edge gradients decided at run time);
    - a dynamic-batch export stepped with 3-row micro-batches (exported with 2) equals eager, a
      later step with 4 rows is an InputConstraintError before anything is sent;
    - a bad stage index (one stage per rank, and the second of two stages per rank), a wrap
      that returns no module, a sync call with another rank's stage, a checkpoint without an
      fqn of stage 0, each on one rank, and a dynamic export whose last stage returns a dict
      (torch's shape inference takes none): the same LoweringError naming it on every rank, and
      the group still works after it."""
    good, bad = str(tmp_path / "good"), str(tmp_path / "bad")
    _save_checkpoint("tied_lm", 2, 4, good)
    _save_checkpoint("tied_lm", 2, 4, bad, drop="layers.0.lin.weight")
    _run_group(2, [
        "case=tied3 sched=interleaved stages=4",
        "case=tied3 sched=zbv stages=4",
        f"case=tied_lm sched=gpipe ckpt={good}",
        "case=tied_plain sched=gpipe freeze=head.weight@1",
        "case=mlp sched=1f1b export_frozen=layers.0+layers.1",
        "case=mlp sched=gpipe dyn=3 again=4",
        "bad:index", "bad:index4", "bad:wrap", "bad:sync", f"bad:ckpt={bad}", "bad:dyndict",
        "bad:unloaded",
    ])


@pytest.mark.slow
@pytest.mark.nightly
def test_interleaved_and_looped_all():
    _run_group(2, [f"case={case} sched={sched} stages=4"
                   for case in ("tied3", "tied_lm", "mlp", "fan_out")
                   for sched in ("interleaved", "looped", "zbv")])


@pytest.mark.slow
@pytest.mark.nightly
def test_pipeline_times_data_parallel_all():
    _run_group(4, [f"case={case} sched={sched} stages=2 dp=2 wrap={wrap}"
                   for case in ("mlp", "tied_lm", "tied_plain") for sched in ("gpipe", "1f1b")
                   for wrap in ("ddp", "fsdp")])


@pytest.mark.slow
@pytest.mark.nightly
def test_frozen_copies_dynamic_and_bad_arguments_all():
    _run_group(2, [
        "case=tied_plain sched=1f1b freeze=emb.weight@0",
        "case=tied_plain sched=gpipe freeze=emb.weight@0+head.weight@1",
        "case=tied3 sched=interleaved stages=4 freeze=proj.weight@2",
        "case=tied3 sched=looped stages=4 freeze=head.weight@3",
        "case=mlp sched=gpipe export_frozen=layers.0",
        "case=tied3 sched=interleaved stages=4 dyn=3",
        "case=fan_out sched=looped stages=4 dyn=5 again=2",
        "bad:wrap",
    ])


def _save_checkpoint(case: str, n_stages: int, n_mb: int, path: str, drop: str = "") -> None:
    """The eager model of ``case`` (the workers build the same one from the same seed), saved
    with torch.distributed.checkpoint in this process; ``drop``: an fqn left out."""
    import torch.distributed.checkpoint as dcp

    from bench import stage_cases_dist as scd

    model, *_ = scd.build(case, n_stages, n_mb)
    sd = {k: v for k, v in model.state_dict().items() if k != drop}
    with warnings.catch_warnings():  # one process, no group: what no_dist=True means
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(sd, checkpoint_id=path, no_dist=True)


@pytest.mark.slow
@pytest.mark.nightly
def test_meta_export_interleaved_and_dp_from_a_checkpoint(tmp_path):
    good = str(tmp_path / "good")
    _save_checkpoint("tied3", 4, 4, good)
    _run_group(2, [f"case=tied3 sched=interleaved stages=4 ckpt={good}"])
    _save_checkpoint("tied_lm", 2, 8, good + "8")
    _run_group(4, [f"case=tied_lm sched=1f1b dp=2 wrap=ddp ckpt={good}8",
                   f"case=tied_plain sched=gpipe dp=2 wrap=fsdp ckpt={good}8"])
