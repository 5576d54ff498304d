"""Real pipeline schedules over purefx stages: spawned processes on a gloo group (127.0.0.1).

Each test starts one process per rank (``tests/stage_worker.py``), each running several cases
(``ScheduleGPipe`` and ``Schedule1F1B``, float64, 4 micro-batches) and checking on its own
rank: loss equals eager's, every gradient equals eager's by fqn after ``sync_shared_grads``,
the merged state dict after one SGD step equals eager's, stage keys are original fqns. Every
process ends, pass or fail: bounded group timeout, joined with a timeout, killed in ``finally``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stage_worker.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_group(world: int, runs: list[str], timeout: float = 240.0) -> None:
    """Run ``runs`` on ``world`` spawned ranks; fail with the first failing rank's output."""
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    env.pop("MASTER_ADDR", None)
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, str(r), str(world), str(port), ",".join(runs)],
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
    failed = [r for r, proc in enumerate(procs) if proc.returncode != 0]
    if failed:
        # the rank that failed first says why; the others lost their peer
        failed.sort(key=lambda r: "closed by peer" in outputs[r])
        pytest.fail(
            "\n".join(f"rank {r} exited with {procs[r].returncode}:\n{outputs[r][-3000:]}"
                      for r in failed)
        )


def test_two_stages_gpipe_and_1f1b():
    """Two ranks, every two-stage case under both schedules; last, a micro-batch of the wrong
    shape: a purefx InputConstraintError on rank 0 before it sends, and rank 1 fails fast."""
    runs = [
        f"{case}:{sched}"
        for case in ("mlp", "tied_lm", "twice", "local_buffer")
        for sched in ("gpipe", "1f1b")
    ] + ["nograd_edge:1f1b", "bad_batch"]
    _run_group(2, runs)


def test_four_stages():
    _run_group(4, ["fan_out:1f1b", "tied_lm:gpipe"])


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
