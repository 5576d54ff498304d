"""Test configuration: parallel by default, hypothesis profiles and shared helpers.

``python -m pytest`` runs on every core with pytest-xdist (``-n auto --dist worksteal``, set in
:func:`pytest_cmdline_main` rather than ``addopts`` so that ``-p no:xdist`` still gives a serial
run); ``-n 0``, ``-n 2`` or ``--dist loadfile`` on the command line win. See docs/testing.md.

Profiles (pick with HYPOTHESIS_PROFILE): ``ci`` (derandomized, no deadline; the default), ``dev``
(random, small) and ``nightly`` (many more examples). None keeps an example database: workers
run at once, and a failure prints its blob (``@reproduce_failure``) instead.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_COMMON = {
    "deadline": None,
    "database": None,
    "print_blob": True,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
settings.register_profile("ci", derandomize=True, **_COMMON)
settings.register_profile("dev", max_examples=20, **_COMMON)
settings.register_profile("nightly", max_examples=1000, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# verdicts reached by the suite go to a store of its own, never the user's cache
# (``transforms.rewrite.verdict_store``); set before xdist starts its workers, which share it
_OWN_STORE = None
if "PUREFX_VERDICTS" not in os.environ:
    _OWN_STORE = tempfile.mkdtemp(prefix="purefx-verdicts-")
    os.environ["PUREFX_VERDICTS"] = _OWN_STORE


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the suite's own verdict store (made at import, in the process that made it)."""
    if _OWN_STORE is not None and not os.environ.get("PYTEST_XDIST_WORKER"):
        shutil.rmtree(_OWN_STORE, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    """In an xdist worker, give torch its share of the cores: ``cores // workers`` intra-op
    threads (at least one). Each worker would otherwise start a thread per core, and two
    workers' threads spinning on two cores slow a small op 10 to 40 times (a softmax on a few
    hundred elements: 2 us alone, about 90 us oversubscribed). The same share goes to the
    processes a test starts (``OMP_NUM_THREADS``, unless set: a CLI run, a law outside pytest, a
    hash-seed run), which would otherwise start a thread per core beside both workers."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if os.environ.get("PYTEST_XDIST_WORKER") and workers:
        import torch

        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)
        share = max(1, cores // int(workers))
        torch.set_num_threads(share)
        os.environ.setdefault("OMP_NUM_THREADS", str(share))


LONG_SETUPS = frozenset({"planted_report", "ci_sample"})
"""Module fixtures that take minutes to build (the planted fuzz reports of ``test_fuzz.py`` and
``test_fuzz_backends.py``, the preserve sweep's sample): the tests that use them run first."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the tests that use a :data:`LONG_SETUPS` fixture first, each file's together and in
    their order (a stable sort: the others keep theirs), so that a worker starts on them while the
    others take the short tests, instead of one worker ending the run alone on a three-minute
    setup; and skip the tests marked ``cuda`` where torch sees no CUDA device (CI has none; the
    device checks run them, and ``python -m bench.cuda``, on a lent GPU)."""
    items.sort(key=lambda item: not LONG_SETUPS & set(getattr(item, "fixturenames", ())))
    if not any(item.get_closest_marker("cuda") for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("cuda"):
            item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Default to ``-n auto --dist worksteal`` where pytest-xdist is loaded and no ``-n`` was
    given (not in a worker, nor under ``--pdb``, which xdist cannot distribute).

    ``worksteal`` hands each worker a contiguous half of the collected tests (so a file's cached
    exports are mostly made once) and lets an idle worker take tests from the other's tail:
    test durations here range from milliseconds to minutes, which a fixed split cannot balance.
    """
    if not config.pluginmanager.hasplugin("xdist") or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if config.option.numprocesses is None and not config.option.usepdb:
        config.option.numprocesses = "auto"
        # at most 8: "auto" counts the CPUs a container may see but not use (a CPU quota), and
        # each worker holds its own torch and cached exports
        if config.option.maxprocesses is None:
            config.option.maxprocesses = 8
        if config.option.dist == "no":
            config.option.dist = "worksteal"
