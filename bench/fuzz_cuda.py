"""The differential fuzzer against inductor on a GPU: float32, float16 and bfloat16, about three
minutes in all.

    OUT=/some/dir python -m bench.fuzz_cuda [--seconds 40] [--shrink-seconds 12]

For each dtype: ``lowering.fuzz.differential({"inductor": "inductor"}, device="cuda",
dtype=...)`` for ``--seconds`` of search, then its findings shrunk; everything written as text
under ``$OUT/<dtype>/`` (``report.txt``, a folder per finding with ``repro.py``,
``program.txt``, ``summary.txt``) and ``$OUT/summary.txt`` (one block per dtype: programs per
minute, operators reached, known deviations, findings). A finding counts only where its own repro
shows it again (``lowering.fuzz.confirmed``): the others, such as an input eager refuses that
the backend seemed to accept in the fuzzer's run alone, are listed apart as unconfirmed, and
the last line adds up the confirmed ones over the dtypes. A dtype is skipped once the total would
pass ``--total`` seconds. Without CUDA it says so and exits 0. No timing is asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterable

import torch

from lowering.fuzz import differential
from lowering.fuzz.command import DTYPES, report_text, write_report
from lowering.fuzz.confirmed import split, why_unconfirmed
from lowering.fuzz.search import Finding


def findings_lines(findings: Iterable[Finding]) -> list[str]:
    """The findings of one dtype as summary lines: the confirmed ones, then the unconfirmed
    ones apart, each with why. O(findings)."""
    confirmed, unconfirmed = split(findings)
    lines = [f"  confirmed by its repro: {f.summary()}" for f in confirmed]
    lines += [f"  unconfirmed ({why_unconfirmed(f)}; not counted): {f.summary()}"
              for f in unconfirmed]
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the three dtypes; write under ``$OUT`` (or ``--out``). Exit status 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="search per dtype")
    parser.add_argument("--shrink-seconds", type=float, default=12.0, help="per finding")
    parser.add_argument("--total", type=float, default=170.0, help="stop starting dtypes after")
    parser.add_argument("--out", default=os.environ.get("OUT", "fuzz-cuda-out"))
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    summary_path = os.path.join(args.out, "summary.txt")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        with open(summary_path, "w") as f:
            f.write("no CUDA device: nothing run\n")
        print("no CUDA device: nothing run")
        return 0
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    start = time.monotonic()
    blocks = [f"torch {torch.__version__} on {device_name}"]
    counted = {"confirmed": 0, "unconfirmed": 0}
    for name in ("float32", "float16", "bfloat16"):
        left = args.total - (time.monotonic() - start)
        if left < args.seconds:
            blocks.append(f"{name}: skipped ({left:.0f} s left of --total)")
            continue
        report = differential({"inductor": "inductor"}, seconds=args.seconds,
                              device=args.device, dtype=DTYPES[name],
                              shrink_seconds=args.shrink_seconds,
                              progress=lambda line: print(line, file=sys.stderr, flush=True))
        folder = os.path.join(args.out, name)
        write_report(report, folder, f"--dtype {name} --device {args.device}")
        blocks.append(report_text(report, f"--dtype {name} --device {args.device}"))
        blocks.append("\n".join(findings_lines(report.findings)) or "  no finding")
        confirmed, unconfirmed = split(report.findings)
        counted["confirmed"] += len(confirmed)
        counted["unconfirmed"] += len(unconfirmed)
        with open(summary_path, "w") as f:
            f.write("\n\n".join(blocks) + "\n")
    blocks.append(f"findings: {counted['confirmed']} confirmed by their repro, "
                  f"{counted['unconfirmed']} unconfirmed (listed, not counted)")
    text = "\n\n".join(blocks) + "\n"
    with open(summary_path, "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
