"""Instructions executed by one purefx build, stage by stage, counted by valgrind's callgrind.

Run from the repository root (needs ``valgrind`` and ``callgrind_control`` on the path)::

    python -m bench.instructions --models deep,deep_decomp,preserved --n 512

CPU and wall time of one build move by 10-30% between runs on a small shared machine; the number
of instructions it executes moves by about 0.01%. So this is the measure for an A/B comparison of
two checkouts (run it in each), and ``bench/run.py`` the measure of speed against torch. Under
callgrind a build runs about 50 times slower: the deep stack at 512 blocks takes about 1.5 min.

For each model the script starts itself under callgrind with instrumentation off. That process
builds the model's program at size 2 (warm-up: imports, torch's caches), freezes what is alive
(``gc.freeze()``, as ``bench/run.py`` does), builds it at ``n``, then builds it again with
instrumentation on, dumping the counts after each stage: ``import_ep``, ``transform``,
``lower`` and the first call, each under ``torch.no_grad()`` and with the same objects alive as
in ``bench/run.py``. Counts are printed in millions.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

STAGES = ("import", "transform", "lower", "call")
TIMEOUT_S = 1800  # one model under callgrind; 1024 blocks of the decomposed stack take ~7 min
_COUNT = re.compile(r"^(?:summary|totals):\s+(\d+)", re.MULTILINE)


class InstructionsError(RuntimeError):
    """valgrind is missing, or a run under it failed or left no counts."""


def stage_counts(dump_texts: Sequence[str]) -> dict[str, int]:
    """The instruction count of each stage from the callgrind dump files, in dump order (one per
    stage, ``STAGES`` order). Raises ``InstructionsError`` naming a file without a count."""
    if len(dump_texts) != len(STAGES):
        raise InstructionsError(f"expected {len(STAGES)} callgrind dumps, found {len(dump_texts)}")
    counts = {}
    for stage, text in zip(STAGES, dump_texts):
        found = _COUNT.search(text)
        if found is None:
            raise InstructionsError(f"the callgrind dump of stage {stage!r} has no count")
        counts[stage] = int(found.group(1))
    return counts


def measure(model: str, n: int) -> dict[str, int]:
    """Instructions per stage of one build of ``model`` at size ``n`` (see the module docstring).
    Raises ``InstructionsError`` when valgrind is missing or the run fails."""
    valgrind = shutil.which("valgrind")
    if valgrind is None or shutil.which("callgrind_control") is None:
        raise InstructionsError("valgrind (with callgrind_control) is not on the path: install it")
    with tempfile.TemporaryDirectory(prefix="purefx-cg-") as tmp:
        out = Path(tmp) / "cg.out"
        command = [
            valgrind, "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
            sys.executable, "-m", "bench.instructions", "--child", model, str(n),
        ]
        root = Path(__file__).resolve().parents[1]
        done = subprocess.run(
            command, cwd=root, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
        if done.returncode != 0:
            raise InstructionsError(f"{model} at {n} under callgrind: exit {done.returncode}\n"
                                    f"{done.stderr[-2000:]}")
        dumps = sorted(Path(tmp).glob("cg.out.*"), key=lambda p: int(p.suffix[1:]))
        return stage_counts([p.read_text() for p in dumps])


def _child(model: str, n: int) -> None:
    """The process under callgrind: warm up, then one counted build (dumps after each stage)."""
    import torch

    from bench.models import MODELS
    from ir import import_ep
    from lowering import lower
    from transforms import transform

    torch.set_num_threads(1)
    spec = MODELS[model]
    for size in (2, n):
        _, args, ep = spec.make(size)
        with torch.no_grad():
            lower(transform(import_ep(ep)))(*args)
        if size == 2:
            gc.collect()
            gc.freeze()  # as bench/run.py after its warm-up: torch and the warm-up not scanned
    gc.collect()  # as bench/run.py between builds
    pid = str(os.getpid())

    def control(*options: str) -> None:
        subprocess.run(["callgrind_control", *options, pid], capture_output=True, check=False)

    stages = (import_ep, transform, lower, lambda module: module(*args))
    value = ep
    control("-z")
    control("-i", "on")
    for name, stage in zip(STAGES, stages):
        control("-z")
        with torch.no_grad():
            value = stage(value)
        control(f"--dump={name}")
    control("-i", "off")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="deep,deep_decomp,preserved", metavar="A,B")
    parser.add_argument("--n", type=int, default=512, help="blocks (default 512)")
    parser.add_argument("--json", metavar="F", help="write the counts to F")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "N"), help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.child:
        _child(opts.child[0], int(opts.child[1]))
        return 0
    results = {}
    print(f"{'model':<12} {'N':>5} " + " ".join(f"{s:>10}" for s in STAGES) + f" {'total':>10}")
    for model in opts.models.split(","):
        try:
            counts = measure(model, opts.n)
        except (InstructionsError, subprocess.TimeoutExpired) as exc:
            print(f"{model}: {exc}", file=sys.stderr)
            return 1
        results[model] = counts
        cells = " ".join(f"{counts[s] / 1e6:>9.1f}M" for s in STAGES)
        print(f"{model:<12} {opts.n:>5} {cells} {sum(counts.values()) / 1e6:>9.1f}M", flush=True)
    if opts.json:
        Path(opts.json).write_text(json.dumps({"n": opts.n, "instructions": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
