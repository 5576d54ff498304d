"""``purefx fuzz``: the differential fuzzer from the command line.

    purefx fuzz --backend inductor --seconds 600 [--device cuda] [--dtype float16]
                [--sizes K] [--grad] [--out DIR]

Prints a progress line now and then (stderr), then one line per finding; writes one directory
per finding under ``--out`` (``repro.py``, ``program.txt``: the purefx program text,
``summary.txt``: one line) and ``report.txt`` (the run's numbers). A finding counts only where
its repro shows it again (``lowering.fuzz.confirmed``); the others are listed apart, as
unconfirmed. Exit status 0: nothing new confirmed, 1: a confirmed finding, 2: bad arguments.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

import torch

from ir.errors import PurefxError
from lowering.fuzz.backends import BUILTINS
from lowering.fuzz.confirmed import split, why_unconfirmed
from lowering.fuzz.search import Finding, FuzzReport, differential, program_text

DTYPES = {"float32": None, "float16": torch.float16, "bfloat16": torch.bfloat16}
"""The ``--dtype`` choices (float32: the programs as drawn)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``purefx fuzz`` with ``argv`` (the arguments after ``fuzz``); the exit status."""
    args = _parser().parse_args(argv)
    try:
        report = differential(
            {name: name for name in args.backend}, seconds=args.seconds or None,
            max_examples=args.max_examples, device=args.device, dtype=DTYPES[args.dtype],
            seed=args.seed, shrink_seconds=args.shrink_seconds,
            progress=lambda line: sys.stderr.write(line + "\n"), sizes=args.sizes,
            grad=args.grad)
    except PurefxError as err:
        sys.stderr.write(f"purefx fuzz: error: {err}\n")
        return 2
    setting = f"--dtype {args.dtype} --device {args.device} --sizes {args.sizes}"
    text = write_report(report, args.out, setting + (" --grad" if args.grad else ""))
    sys.stdout.write(text)
    return 1 if split(report.findings)[0] else 0


def write_report(report: FuzzReport, out: str, setting: str = "") -> str:
    """Write ``report`` under directory ``out`` (a folder per finding, ``report.txt``); the
    report's text: the numbers, then the confirmed findings and, apart, the unconfirmed ones
    (one line each, two spaces in). O(findings)."""
    os.makedirs(out, exist_ok=True)
    lines = [report_text(report, setting)]
    confirmed, unconfirmed = split(report.findings)
    groups = (("findings (each shown again by its own repro):", confirmed),
              ("unconfirmed (not counted; the repro does not show them here):", unconfirmed))
    i = 0
    for title, group in groups:
        if group:
            lines.append(title)
        for finding in group:
            folder = os.path.join(out, f"{i:02d}-{_slug(finding)}")
            i += 1
            os.makedirs(folder, exist_ok=True)
            _write(os.path.join(folder, "repro.py"), finding.repro or "# no repro\n")
            _write(os.path.join(folder, "program.txt"), program_text(finding))
            _write(os.path.join(folder, "summary.txt"), finding.summary() + "\n")
            why = "" if finding.reproduced is True else f" ({why_unconfirmed(finding)})"
            lines.append(f"  {folder}: {finding.summary()}{why}")
    text = "\n".join(lines) + "\n"
    _write(os.path.join(out, "report.txt"), text)
    return text


def report_text(report: FuzzReport, setting: str = "") -> str:
    """The run's numbers in a few lines: programs, rate, operators, features, known, findings."""
    ops = ", ".join(f"{k.removeprefix('aten.')} {v}" for k, v in
                    sorted(report.operators.items(), key=lambda kv: -kv[1]))
    feats = ", ".join(f"{k} {v}" for k, v in sorted(report.features.items()))
    known = ", ".join(f"{k} {v}" for k, v in sorted(report.known.items())) or "none"
    confirmed, unconfirmed = split(report.findings)
    skipped = "".join(f"\nnot differentiable, skipped: {v} x {k}"
                      for k, v in sorted(report.skipped.items(), key=lambda kv: -kv[1]))
    one_size = f", {report.one_size} without a dynamic dimension" if report.one_size else ""
    unsupported = "; ".join(f"{k} {v}" for k, v in sorted(report.unsupported.items())) or "none"
    return (
        f"purefx fuzz {setting}: {report.examples} programs in {report.search_seconds:.0f} s "
        f"({report.per_minute:.1f}/min), {report.seconds:.0f} s with shrinking; "
        f"{report.raw} raw findings, {len(confirmed)} new confirmed by their repro, "
        f"{len(unconfirmed)} unconfirmed, known: {known}; "
        f"{report.refused} refused by eager and backend, "
        f"{sum(report.unrunnable.values())} unrunnable, "
        f"{sum(report.unsupported.values())} unsupported ({unsupported}), "
        f"{sum(report.skipped.values())} not differentiable{one_size}\n"
        f"operators reached ({len(report.operators)}): {ops}\n"
        f"features reached: {feats}{skipped}"
    )


def _slug(finding: Finding) -> str:
    raw = f"{finding.backend}-{finding.kind}-{finding.cause.removeprefix('aten.')}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", raw)[:80]


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="purefx fuzz",
        description="Run generated programs through eager and torch's compilers; report, "
        "shrink and write a standalone repro of every difference (docs/fuzz.md).",
    )
    parser.add_argument("--backend", action="append", choices=BUILTINS, required=True,
                        help="a built-in backend (repeat for several)")
    parser.add_argument("--seconds", type=float, default=600.0,
                        help="the search's time budget (default 600); shrinking comes after")
    parser.add_argument("--max-examples", type=int, default=200,
                        help="programs to run when --seconds is 0 (default 200)")
    parser.add_argument("--device", default="cpu", help="where programs run (default cpu)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32",
                        help="floating state and inputs cast to it (default float32)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis's and the inputs' seed")
    parser.add_argument("--sizes", type=int, default=1,
                        help="call each compiled program at this many sizes of its dynamic "
                        "dimension, the drawn one first (default 1; >1 draws programs with "
                        "one, and inductor compiles with dynamic=True)")
    parser.add_argument("--grad", action="store_true",
                        help="also backpropagate a fixed weighting of the outputs and compare "
                        "every input's and parameter's gradient")
    parser.add_argument("--shrink-seconds", type=float, default=120.0,
                        help="most seconds spent shrinking one finding (default 120)")
    parser.add_argument("--out", default="fuzz-out", help="folder for the findings")
    return parser


__all__ = ["DTYPES", "main", "report_text", "write_report"]
