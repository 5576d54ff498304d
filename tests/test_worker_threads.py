"""The suite's share of the cores (``tests/conftest.py``): a worker runs torch on
``cores // workers`` threads and passes that share to the processes its tests start."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

IN_WORKER = bool(os.environ.get("PYTEST_XDIST_WORKER")) and bool(
    os.environ.get("PYTEST_XDIST_WORKER_COUNT"))


@pytest.mark.skipif(not IN_WORKER, reason="a serial run keeps torch's own thread count")
def test_a_worker_and_the_processes_it_starts_take_one_share_of_the_cores():
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    share = max(1, cores // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    assert torch.get_num_threads() == share
    child = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        capture_output=True, text=True, timeout=120, check=True,
    )
    expected = int(os.environ.get("OMP_NUM_THREADS", share))
    assert int(child.stdout.split()[-1]) == expected
