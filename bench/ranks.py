"""Running one row of a distributed bench (``bench/stages_vs_torch.py``,
``bench/stages_vs_torch_multi.py``) on a gloo group of processes spawned on 127.0.0.1.

Each rank runs the bench script again as ``script --worker ARGS... RANK PORT``; the worker prints
its verdict as one line ``RESULT right`` or ``RESULT <what went wrong>`` (``report_failure`` for
an exception).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import traceback
from collections.abc import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_ranks(script: str, args: Sequence[str], world: int, timeout: float) -> str:
    """Spawn ``world`` workers of ``script`` (``--worker *args rank port``, one free port for the
    group) and wait up to ``timeout`` seconds for each; ``"right"`` when every rank says so,
    else one rank's complaint (``"rank R: ..."``), a failure that is not a lost peer first.
    Every process is gone on return."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, script, "--worker", *args, str(r), str(port)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              cwd=ROOT) for r in range(world)]
    results = []
    try:
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                results.append("error: timed out")
                continue
            lines = [ln for ln in out.decode(errors="replace").splitlines()
                     if ln.startswith("RESULT ")]
            results.append(lines[-1][7:] if lines else f"error: exit {proc.returncode}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    bad = [f"rank {r}: {x}" for r, x in enumerate(results) if x != "right"]
    # the rank that failed first says why; a lost peer is a consequence
    bad.sort(key=lambda x: "closed by peer" in x or "Connection" in x)
    return "right" if not bad else bad[0]


def report_failure(e: BaseException) -> None:
    """Print the worker's verdict for exception ``e`` (with its cause) on one ``RESULT`` line,
    and its traceback; then end the process at once (status 0: the row says what failed), so
    that a peer's collective cannot hang it."""
    text = " ".join(str(e).split())
    cause = e.__cause__
    if cause is not None:
        text += " <- " + type(cause).__name__ + ": " + " ".join(str(cause).split())
    print(f"RESULT error: {type(e).__name__}: {text[:300]}", flush=True)
    traceback.print_exc()
    os._exit(0)
