"""How many programs a second ``check_laws`` judges, and where its time goes.

    python -m bench.laws_speed                       # 100 examples per cell, this tree
    python -m bench.laws_speed --examples 30         # shorter
    python -m bench.laws_speed --against /work/main  # the same cells on another tree, back to back
    python -m bench.laws_speed --only 'programs\\(\\)'  # cells whose name matches
    python -m bench.laws_speed --against DIR --rounds 3 --clock cpu   # medians of 3 turns

Cells: three passes (``fold_constants``, a default pass; ``relu -> clamp_min`` written with the
editor, ``transforms.edit.rewrite_nodes``; a rule set through ``transforms.rewrite``) on four
strategies (default ``programs()``, ``crossing_programs()``, ``programs_like(ep)`` of two zoo
models). Each cell is one ``check_laws(pass, programs=..., max_examples=N, allow_vacuous=True)``
after a warm-up in the same process (hypothesis reads the source of every loaded module for
constants once per process: about 2 s; a rule set traces each rule once per dtype it meets: 20
examples of ``fold_constants`` on the strategy and 20 of the cell's pass, not counted). Printed
per cell: programs judged a second (``tried / wall``) and the split of the wall time: drawing
(the strategy's draws, overruns included), each law (``check_purity``, ``check_verify``,
``check_determinism``, ``check_semantics``; what ``check_program`` does besides, such as
counting a change, is ``other``) and hypothesis's engine (the rest). The split is measured by
wrapping the law functions of ``lowering.pass_laws`` and the strategy, so it works on any tree
that has them.

``--against DIR`` runs the same cells in a child process whose imports come from ``DIR`` (the
code before a change: ``git worktree`` or ``git stash``), then prints both tables and the ratio
of programs a second, cell by cell; ``--rounds N`` runs each tree N times in child processes,
in turns, and compares the medians (each run starts cold, as a user's process does). Timings
are never asserted; on a shared machine compare
the two columns of one run, or use ``--clock cpu`` (this process's CPU time: programs per CPU
second, steadier when other processes compete for the cores).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.threads import one_thread

_CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_now = _CLOCKS["wall"]

LAW_FUNCTIONS = ("check_purity", "check_verify", "check_determinism", "check_semantics",
                 "check_idempotence")
"""The law functions of ``lowering.pass_laws`` whose time is reported, each on its own."""


class Clock:
    """Seconds spent in wrapped functions, by name; nested calls of one name count once."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self._depth: dict[str, int] = {}

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            depth = self._depth.get(name, 0)
            self._depth[name] = depth + 1
            start = _now()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth[name] = depth
                if depth == 0:
                    self.spent[name] = self.spent.get(name, 0.0) + _now() - start

        return timed


def _timed_strategy(strategy: Any, clock: Clock) -> Any:
    from hypothesis import strategies as st

    @st.composite
    def timed(draw: Any) -> Any:
        start = _now()
        try:
            return draw(strategy)
        finally:  # an overrun raises out of the draw: its time is drawing too
            clock.spent["draw"] = clock.spent.get("draw", 0.0) + _now() - start

    return timed()


def measure(pass_fn: Callable[..., Any], strategy: Any, examples: int) -> dict[str, float]:
    """One ``check_laws`` of ``pass_fn`` over ``strategy``: wall seconds, programs tried and
    the seconds spent drawing, in each law and in ``check_program`` as a whole."""
    import lowering.pass_laws as laws

    clock = Clock()
    saved = {name: getattr(laws, name) for name in (*LAW_FUNCTIONS, "check_program")}
    for name, fn in saved.items():
        setattr(laws, name, clock.wrap(name, fn))
    try:
        start = _now()
        report = laws.check_laws(pass_fn, programs=_timed_strategy(strategy, clock),
                                 max_examples=examples, allow_vacuous=True)
        wall = _now() - start
    finally:
        for name, fn in saved.items():
            setattr(laws, name, fn)
    row = {"wall": wall, "tried": float(report.tried), "changed": float(report.changed)}
    row.update(clock.spent)
    return row


# --- the passes and strategies --------------------------------------------------------------


def fold_constants_pass(p: Any) -> Any:
    """The default pass: ``transforms.fold_constants``."""
    from transforms import fold_constants

    return fold_constants(p)


def relu_as_clamp_min(p: Any) -> Any:
    """A pass written with the editor: every ``relu`` becomes ``clamp_min(x, 0.0)``."""
    from transforms.edit import rewrite_nodes

    aten = torch.ops.aten

    def visit(node: Any, e: Any) -> Any:
        if node.target is aten.relu.default:
            return e.call(aten.clamp_min.default, e.args[0], 0.0)
        return None

    return rewrite_nodes(p, visit)


def rule_set(p: Any) -> Any:
    """A rule set through ``transforms.rewrite``: ``relu(relu(x))``, ``silu`` spelled out,
    ``x * 1``."""
    from transforms.rewrite import rewrite
    from transforms.rewrite_rules import RELU_RELU, SILU, TIMES_ONE

    return rewrite(p, [RELU_RELU, SILU, TIMES_ONE])


PASSES: dict[str, Callable[[Any], Any]] = {
    "fold_constants": fold_constants_pass,
    "editor relu->clamp_min": relu_as_clamp_min,
    "rewrite(rules)": rule_set,
}

LIKE_MODELS = ("mlp_nested", "buffer_mutation")
"""The zoo models (``tests/zoo.py``) whose ``programs_like`` is measured."""


def strategies() -> dict[str, Callable[[], Any]]:
    """Each strategy's name and a function that makes it (a ``programs_like`` exports its model:
    made only when a cell runs on it)."""
    from ir.strategies.programs import crossing_programs, programs
    from lowering.like import programs_like
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from zoo import CASES, export_case  # the test zoo, as bench.model_ops reads it

    found: dict[str, Callable[[], Any]] = {"programs()": programs,
                                           "crossing_programs()": crossing_programs}
    for name in LIKE_MODELS:
        found[f"programs_like({name})"] = functools.partial(
            lambda case: programs_like(export_case(case)), CASES[name])
    return found


# --- the run and its table ------------------------------------------------------------------


def run_cells(examples: int, only: str | None) -> dict[str, dict[str, float]]:
    """Each (pass, strategy) cell measured, on one torch thread (the caller's count restored
    after) and with warnings off inside."""
    with one_thread(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _cells(examples, only)


def _cells(examples: int, only: str | None) -> dict[str, dict[str, float]]:
    cells = {}
    warm = ""
    for sname, make in strategies().items():
        strategy = None
        for pname, pass_fn in PASSES.items():
            cell = f"{pname} on {sname}"
            if only and not re.search(only, cell):
                continue
            strategy = make() if strategy is None else strategy
            if warm != sname:  # hypothesis's one-time constants scan, imports, torch's and
                # the strategy's first calls: 20 examples of each strategy, not measured
                measure(fold_constants_pass, strategy, min(20, examples))
                warm = sname
            if pass_fn is not fold_constants_pass:  # the pass's own one-time work (a rule
                # set traces each rule once per dtype a program brings): 20 examples more
                measure(pass_fn, strategy, min(20, examples))
            cells[cell] = measure(pass_fn, strategy, examples)
            sys.stderr.write(f"{cell}: {cells[cell]['wall']:.1f} s\n")
    return cells


def table(cells: dict[str, dict[str, float]]) -> str:
    head = ("| cell | programs/s | wall s | draw | purity | verify | determinism | semantics "
            "| other laws | engine |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for cell, row in cells.items():
        laws = sum(row.get(n, 0.0) for n in LAW_FUNCTIONS)
        other = row.get("check_program", 0.0) - laws
        engine = row["wall"] - row.get("draw", 0.0) - row.get("check_program", 0.0)
        parts = [row.get("draw", 0.0), row.get("check_purity", 0.0), row.get("check_verify", 0.0),
                 row.get("check_determinism", 0.0), row.get("check_semantics", 0.0), other,
                 engine]
        lines.append(f"| {cell} | {row['tried'] / row['wall']:.1f} | {row['wall']:.2f} | "
                     + " | ".join(f"{x:.2f}" for x in parts) + " |")
    return "\n".join(lines)


def compare(now: dict[str, dict[str, float]], before: dict[str, dict[str, float]]) -> str:
    lines = ["| cell | before programs/s | after programs/s | ratio |", "|---|---:|---:|---:|"]
    for cell, row in now.items():
        if cell not in before:
            continue
        a = before[cell]["tried"] / before[cell]["wall"]
        b = row["tried"] / row["wall"]
        lines.append(f"| {cell} | {a:.1f} | {b:.1f} | {b / a:.2f}x |")
    return "\n".join(lines)


def median_cells(runs: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Each cell's median over ``runs``, figure by figure (each column its own median)."""
    cells: dict[str, dict[str, float]] = {}
    for cell in runs[0]:
        rows = [run[cell] for run in runs if cell in run]
        cells[cell] = {k: statistics.median(r.get(k, 0.0) for r in rows) for k in rows[0]}
    return cells


def _rounds(against: str, argv: list[str], rounds: int) -> tuple[dict, dict]:
    """``rounds`` child processes of ``against`` and of this tree, taken in turns (one of each
    a round, so a slower spell of a shared machine falls on both); the median of each."""
    here = str(Path(__file__).resolve().parent.parent)
    before, after = [], []
    for _ in range(rounds):
        before.append(_against(against, argv))
        after.append(_against(here, argv))
    return median_cells(before), median_cells(after)


def _against(tree: str, argv: list[str]) -> dict[str, dict[str, float]]:
    """The cells measured in a child process importing from ``tree``."""
    with tempfile.TemporaryDirectory() as where:
        out = os.path.join(where, "cells.json")
        env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
        here = os.path.abspath(__file__)
        # run by path without its folder on sys.path (bench/cuda.py would shadow torch's cuda)
        start = ("import runpy, sys; sys.argv = sys.argv[1:]; "
                 "runpy.run_path(sys.argv[0], run_name='__main__')")
        subprocess.run([sys.executable, "-c", start, here, *argv, "--json", out], cwd=tree,
                       env=env, check=True, stdout=subprocess.DEVNULL)  # its table: from the JSON
        with open(out) as f:
            return json.load(f)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--only", default=None, help="regex on '<pass> on <strategy>'")
    parser.add_argument("--against", default=None, help="another tree to measure back to back")
    parser.add_argument("--clock", choices=sorted(_CLOCKS), default="wall",
                        help="wall time, or this process's CPU time (steadier on a busy machine)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="with --against: this many child runs of each tree, in turns; "
                             "the medians")
    parser.add_argument("--json", default=None)
    ns = parser.parse_args(argv)
    global _now
    _now = _CLOCKS[ns.clock]
    passed = ["--examples", str(ns.examples), "--clock", ns.clock] + (
        ["--only", ns.only] if ns.only else [])
    if ns.against and ns.rounds > 1:
        before, cells = _rounds(ns.against, passed, ns.rounds)
    else:
        before = _against(ns.against, passed) if ns.against else None
        cells = run_cells(ns.examples, ns.only)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(cells, f)
    if before is not None:
        sys.stdout.write(f"before ({ns.against}), seconds:\n{table(before)}\n\n")
    sys.stdout.write(f"this tree, seconds:\n{table(cells)}\n")
    if before is not None:
        sys.stdout.write(f"\n{compare(cells, before)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
