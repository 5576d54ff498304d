"""A fuzzing campaign over torch's compilers: every backend in every mode, one process per cell,
in a budget of CPU hours.

    python -m bench.campaign --cpu-hours 2                  # 5 backends x 3 modes, 2 workers
    python -m bench.campaign --cpu-hours 1 --jobs 1 --backends inductor aot_inductor \\
        --modes plain grad --shrink-seconds 30 --seed 7 \\
        --json campaign.json --markdown campaign.md --out campaign-findings

A *cell* is one backend in one mode: ``plain`` (``sizes=1, grad=False``), ``sizes3``
(``sizes=3``: a dynamic batch, each compiled callable called at three sizes) or ``grad``
(``grad=True``: gradients compared too). Its run is one
``lowering.fuzz.differential({backend: backend}, seconds=S, shrink_seconds=N, seed=..., sizes=...,
grad=...)`` in a worker process of its own (``python -m bench.campaign --cell backend:mode``), so
a crash or a hang in torch costs that cell only: the worker runs in a process group of its own
and is killed with it at its hard limit (``bench.bounded``), ``S`` + a shrink allowance +
a start-up margin (:func:`cell_timeout`), and the cell's outcome is then ``timeout`` (with the
search's last progress line). A combination the fuzzer refuses (``grad`` with ``aot_inductor``
or ``decompositions``, which compile for inference only) is no cell to run: it is listed as ``n/a: <reason>``, and so
is a cell whose ``differential`` call raised ``FuzzError``.

The budget: ``--cpu-hours H`` over ``--jobs J`` workers (default 2) is a wall budget of
``H * 3600 / J`` seconds; every runnable cell gets the same search time,
``S = H * 3600 / (J * ceil(n / J))`` for ``n`` runnable cells (:func:`plan`), so the J workers
end the n cells within the wall budget and spend at most H CPU hours searching. Shrinking
(``--shrink-seconds``, per finding) and each worker's start-up come on top, as ``differential``'s
shrinking comes after its ``seconds``. Each worker gets ``OMP_NUM_THREADS = cores // J`` (at
least 1) and ``TORCHINDUCTOR_COMPILE_THREADS=1`` unless they are set.

Default backends: ``inductor``, ``aot_eager``, ``export_roundtrip``, ``unflatten``,
``decompositions`` (``aot_inductor`` compiles a package per program, slow on a CPU: name it in
``--backends``). Default modes: all three. The same ``--seed`` for every cell: a campaign is
deterministic in it where its backends are (the plan always; the programs drawn, up to where
each cell's time runs out).

Prints a line per cell as it ends (stderr), then a Markdown report (stdout; ``--markdown FILE``
too): a table by cell (programs, per minute, operators reached, raw findings, known, unsupported,
skipped, confirmed and unconfirmed findings after shrinking), the totals (programs, CPU seconds,
distinct operators across cells, the union of features), notes per cell (known deviations,
refusals, skipped programs, top features) and a table of the findings (confirmed: shown again
by their own repro, ``lowering.fuzz.confirmed``). ``--json FILE``: the plan and every cell's
record, rewritten as each cell ends. ``--out DIR``: each finding's ``repro.py``, ``program.txt``
and ``summary.txt`` under ``DIR/<backend>-<mode>-<i>/``. ``--max-examples N``: each cell runs N
programs instead of its time share (a smoke run; the hard limit is unchanged).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from bench.bounded import Bounded

if TYPE_CHECKING:
    from lowering.fuzz.search import FuzzReport

ROOT = Path(__file__).resolve().parents[1]

MODES: Mapping[str, tuple[int, bool]] = {"plain": (1, False), "sizes3": (3, False),
                                         "grad": (1, True)}
"""Mode name -> ``(sizes, grad)`` as ``differential`` takes them."""

DEFAULT_BACKENDS = ("inductor", "aot_eager", "export_roundtrip", "unflatten", "decompositions")
"""The built-ins a campaign fuzzes unless told (``aot_inductor`` is slow on a CPU)."""

SHRINK_ALLOWANCE = 15
"""A cell's hard limit allows ``SHRINK_ALLOWANCE * shrink_seconds`` after its search: about
three findings at their worst (``differential`` shrinks one for up to about twice
``shrink_seconds``, then localizes, reduces and localizes again within it each, then runs its
repro)."""

LAST_SHRINK = 5
"""A cell's shrinking stops starting new shrinks ``LAST_SHRINK * shrink_seconds`` before its
allowance ends (``differential``'s ``shrink_total`` is ``(SHRINK_ALLOWANCE - LAST_SHRINK) *
shrink_seconds``): the last one started then still ends, with its repro, within the hard limit,
however many distinct findings the cell met. Those left are reported as drawn (unconfirmed)."""

START_MARGIN = 120.0
"""Seconds a cell's hard limit allows for the worker's start (importing torch, the first
compile) and its report, on a busy machine."""

TOP_FEATURES = 5
"""How many of a cell's features (by programs reaching them) its record names first."""

RESULT = "CAMPAIGN-RESULT "
"""The prefix of the worker's one result line (JSON) on stdout."""

_PROGRESS = "progress: "
_SEARCHED = re.compile(r"fuzz: (\d+) programs in (\d+) s .*?, (\d+) new, (\d+) known, "
                       r"(\d+) operators")


@attrs.frozen
class Cell:
    """One backend in one mode: ``seconds`` (its search's time budget; 0 where refused) and
    ``refused`` (why the fuzzer refuses the combination; ``""``: it runs)."""

    backend: str
    mode: str
    seconds: float = 0.0
    refused: str = ""

    @property
    def name(self) -> str:
        """``<backend>-<mode>``: the cell's folder under ``--out``."""
        return f"{self.backend}-{self.mode}"


@attrs.frozen
class Plan:
    """The cells of a campaign in the order they run (backends, then modes), with its budget:
    ``cpu_hours``, ``jobs`` (workers at once), ``cell_seconds`` (each runnable cell's search)
    and ``wall_seconds`` (``cpu_hours * 3600 / jobs``)."""

    cells: tuple[Cell, ...]
    cpu_hours: float
    jobs: int
    cell_seconds: float
    wall_seconds: float

    @property
    def runnable(self) -> tuple[Cell, ...]:
        """The cells that run (not refused)."""
        return tuple(c for c in self.cells if not c.refused)


def refusal(backend: str, mode: str) -> str:
    """Why ``differential`` refuses ``backend`` in ``mode``, in a sentence; ``""`` when it
    takes it. Mirrors its checks: ``grad=True`` with an inference-only built-in
    (``lowering.fuzz.search.INFERENCE_ONLY``); every built-in takes ``sizes > 1``. O(1)."""
    from lowering.fuzz.search import INFERENCE_ONLY

    _, grad = MODES[mode]
    if grad and backend in INFERENCE_ONLY:
        return (f"{backend} compiles for inference only ({INFERENCE_ONLY[backend]}); "
                "differential refuses grad=True for it")
    return ""


def plan(cpu_hours: float, jobs: int = 2, backends: Sequence[str] = DEFAULT_BACKENDS,
         modes: Sequence[str] = tuple(MODES)) -> Plan:
    """The cells ``backends x modes`` (in that order, duplicates dropped) and their budget: each
    runnable cell searches ``cpu_hours * 3600 / (jobs * ceil(n / jobs))`` seconds (``n``
    runnable cells), so ``jobs`` workers end them within ``cpu_hours * 3600 / jobs`` seconds of
    search; refused cells (:func:`refusal`) get 0. Raises ``ValueError`` for a budget or a
    ``jobs`` that is not positive, an unknown backend or mode, or no cell. Deterministic.
    O(backends * modes)."""
    from lowering.fuzz.backends import BUILTINS

    if not (isinstance(cpu_hours, (int, float)) and cpu_hours > 0):
        raise ValueError(f"cpu_hours must be a positive number, got {cpu_hours!r}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive int, got {jobs!r}")
    backends, modes = tuple(dict.fromkeys(backends)), tuple(dict.fromkeys(modes))
    for backend in backends:
        if backend not in BUILTINS:
            raise ValueError(f"unknown backend {backend!r}; the built-ins are {list(BUILTINS)}")
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; the modes are {list(MODES)}")
    if not backends or not modes:
        raise ValueError("a campaign needs at least one backend and one mode")
    cells = [Cell(b, m, refused=refusal(b, m)) for b in backends for m in modes]
    runnable = sum(1 for c in cells if not c.refused)
    wall = cpu_hours * 3600.0 / jobs
    each = wall / math.ceil(runnable / jobs) if runnable else 0.0
    cells = [c if c.refused else attrs.evolve(c, seconds=each) for c in cells]
    return Plan(tuple(cells), float(cpu_hours), jobs, each, wall)


def shrink_total(shrink_seconds: float) -> float:
    """The seconds a cell spends shrinking all its findings together (``LAST_SHRINK``). O(1)."""
    return (SHRINK_ALLOWANCE - LAST_SHRINK) * shrink_seconds


def cell_timeout(seconds: float, shrink_seconds: float) -> float:
    """A cell's hard wall limit: its search's ``seconds``, ``SHRINK_ALLOWANCE`` times
    ``shrink_seconds`` and ``START_MARGIN``. O(1)."""
    return seconds + SHRINK_ALLOWANCE * shrink_seconds + START_MARGIN


# --- one cell, in its worker --------------------------------------------------------------------


def run_cell(backend: str, mode: str, seconds: float | None, *, shrink_seconds: float,
             seed: int, max_examples: int | None = None, out: str | None = None,
             progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run one cell in this process: ``differential({backend: backend}, ...)`` in ``mode`` for
    ``seconds`` of search (or ``max_examples`` programs where given), and its record
    (:func:`record`); a ``FuzzError`` (the fuzzer refusing the combination) gives an ``n/a``
    record naming it, any other exception an ``error`` record. With ``out``, each finding's
    files go under ``out/<backend>-<mode>-<i>/``. Complexity: ``differential``'s."""
    from lowering.fuzz import FuzzError, differential

    sizes, grad = MODES[mode]
    budget = ({"max_examples": max_examples} if max_examples is not None
              else {"seconds": seconds})
    try:
        report = differential({backend: backend}, shrink_seconds=shrink_seconds, seed=seed,
                              sizes=sizes, grad=grad, progress=progress,
                              shrink_total=shrink_total(shrink_seconds), **budget)
    except FuzzError as refused:
        return outcome_record(backend, mode, "n/a", str(refused))
    except Exception as exc:  # noqa: BLE001 - a crash of the fuzzer is the cell's outcome
        return outcome_record(backend, mode, "error", _one_line(exc))
    return record(backend, mode, report, out)


def record(backend: str, mode: str, report: FuzzReport, out: str | None = None) -> dict[str, Any]:
    """A finished cell's record (JSON-ready) from its ``FuzzReport``: ``status`` ``"ok"``,
    programs, search seconds, programs per minute, operators and features (name -> programs),
    the top ``TOP_FEATURES`` features, raw findings, ``known``, ``unsupported``, ``skipped``,
    ``unrunnable``, ``refused``, ``one_size``, ``unshrunk``, and per finding after shrinking:
    backend, kind, cause, ``reproduced`` (True / False / None), ``confirmed`` (its repro showed it), why not,
    count, summary line, detail, the repro's text and length (and ``repro_path`` where written
    under ``out``). O(operators + features + findings)."""
    from lowering.fuzz.confirmed import why_unconfirmed
    from lowering.fuzz.search import program_text

    findings = []
    for i, finding in enumerate(report.findings):
        path = None
        if out is not None:
            folder = os.path.join(out, f"{backend}-{mode}-{i}")
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, "repro.py")
            Path(path).write_text(finding.repro or "# no repro\n", encoding="utf-8")
            Path(folder, "program.txt").write_text(program_text(finding), encoding="utf-8")
            Path(folder, "summary.txt").write_text(finding.summary() + "\n", encoding="utf-8")
        confirmed = finding.reproduced is True
        findings.append({
            "backend": finding.backend, "kind": finding.kind, "cause": finding.cause,
            "reproduced": finding.reproduced, "confirmed": confirmed,
            "why_unconfirmed": "" if confirmed else why_unconfirmed(finding),
            "count": finding.count, "summary": finding.summary(), "detail": finding.detail,
            "repro_chars": len(finding.repro), "repro": finding.repro, "repro_path": path,
        })
    features = dict(report.features)
    return {
        "backend": backend, "mode": mode, "status": "ok", "reason": "",
        "programs": report.examples, "search_seconds": round(report.search_seconds, 1),
        "seconds": round(report.seconds, 1), "per_minute": round(report.per_minute, 1),
        "operators": dict(sorted(report.operators.items())),
        "features": dict(sorted(features.items())), "top_features": top(features, TOP_FEATURES),
        "raw": report.raw, "known": dict(report.known), "unsupported": dict(report.unsupported),
        "skipped": dict(report.skipped), "unrunnable": dict(report.unrunnable),
        "refused": report.refused, "one_size": report.one_size, "unshrunk": report.unshrunk,
        "findings": findings,
    }


def outcome_record(backend: str, mode: str, status: str, reason: str,
                   **extra: Any) -> dict[str, Any]:
    """The record of a cell with no report: ``status`` ``"n/a"`` (refused), ``"timeout"``,
    ``"crashed"`` (its worker died) or ``"error"`` (``differential`` raised), and why. O(1)."""
    return {"backend": backend, "mode": mode, "status": status, "reason": reason,
            "findings": [], **extra}


def top(counts: Mapping[str, int], n: int) -> list[tuple[str, int]]:
    """The ``n`` largest counts, largest first, ties by name. O(len(counts) log)."""
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"


def _cpu_seconds() -> float:
    """CPU seconds this process and its waited-for children used so far."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def worker(args: argparse.Namespace) -> int:
    """``--cell backend:mode``: run that cell (:func:`run_cell`), its progress lines and
    stderr into stdout (the file ``bench.bounded`` gives it), then one ``RESULT`` line of JSON
    (the record, with ``cpu_seconds``). Exit status 0."""
    os.dup2(sys.stdout.fileno(), sys.stderr.fileno())
    backend, mode = args.cell.split(":")
    rec = run_cell(backend, mode, args.cell_seconds, shrink_seconds=args.shrink_seconds,
                   seed=args.seed, max_examples=args.max_examples, out=args.out,
                   progress=lambda line: print(_PROGRESS + line, flush=True))
    rec["cpu_seconds"] = round(_cpu_seconds(), 1)
    print(RESULT + json.dumps(rec), flush=True)
    return 0


# --- the campaign: workers, one per cell --------------------------------------------------------


def worker_command(cell: Cell, *, shrink_seconds: float, seed: int,
                   max_examples: int | None = None, out: str | None = None) -> list[str]:
    """The command line of ``cell``'s worker (run from the repository root). O(1)."""
    cmd = [sys.executable, "-m", "bench.campaign", "--cell", f"{cell.backend}:{cell.mode}",
           "--cell-seconds", repr(cell.seconds), "--shrink-seconds", repr(shrink_seconds),
           "--seed", str(seed)]
    if max_examples is not None:
        cmd += ["--max-examples", str(max_examples)]
    if out is not None:
        cmd += ["--out", os.path.abspath(out)]
    return cmd


def worker_env(jobs: int) -> dict[str, str]:
    """The workers' environment: this one, with ``OMP_NUM_THREADS`` (the cores over ``jobs``,
    at least 1) and ``TORCHINDUCTOR_COMPILE_THREADS=1`` unless set. O(environment)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (cores or 1) // jobs)))
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    return env


def collect(cell: Cell, running: Bounded, until: float, started: float) -> dict[str, Any]:
    """``cell``'s record from its worker, which ``until`` (``time.time()``) ends: the worker's
    own (``RESULT``) where it printed one, else ``timeout`` (stopped at ``until``; with the
    search's last progress line and the programs it had run) or ``crashed`` (it died: the
    signal or exit status and its last line of output). Adds ``wall_seconds`` (from
    ``started``). Returns by ``until`` plus the kill's time. O(the worker's output)."""
    text, status, stopped = running.finish(until)
    wall = round(time.time() - started, 1)
    lines = text.splitlines()
    for line in reversed(lines):
        if line.startswith(RESULT):
            rec = json.loads(line[len(RESULT):])
            rec["wall_seconds"] = wall
            return rec
    progress = [ln[len(_PROGRESS):] for ln in lines if ln.startswith(_PROGRESS)]
    searched = [m for m in map(_SEARCHED.search, progress) if m]
    extra: dict[str, Any] = {"wall_seconds": wall, "last_progress": progress[-1] if progress
                             else ""}
    if searched:
        extra["programs"] = int(searched[-1].group(1))
    if stopped:
        where = "shrinking" if progress and "shrinking" in progress[-1] else "its run"
        return outcome_record(cell.backend, cell.mode, "timeout",
                              f"stopped at its hard limit of {until - started:.0f} s, in "
                              f"{where}", **extra)
    last = next((ln for ln in reversed(lines) if ln.strip()), "")
    return outcome_record(cell.backend, cell.mode, "crashed",
                          f"its worker died ({death(status)}): {last[:200]}", **extra)


def death(status: int) -> str:
    """How a process with return code ``status`` ended: the signal by name, or the exit
    status. O(1)."""
    if status >= 0:
        return f"exit status {status}"
    try:
        return f"signal {signal.Signals(-status).name}"
    except ValueError:
        return f"signal {-status}"


def run_campaign(the_plan: Plan, *, shrink_seconds: float, seed: int,
                 max_examples: int | None = None, out: str | None = None,
                 on_record: Callable[[dict[str, Any]], None] | None = None,
                 poll: float = 0.2) -> list[dict[str, Any]]:
    """Every cell's record, in the plan's order: refused cells as ``n/a``, the others each run
    by a worker process (:func:`worker_command`), at most ``jobs`` at once, started in the
    plan's order and each stopped at its :func:`cell_timeout` (:func:`collect`).
    ``on_record(rec)`` is called for each refused cell first, then as each cell ends. An
    interruption (``KeyboardInterrupt``) kills the running workers' process groups. Wall time:
    about the plan's ``wall_seconds`` plus shrinking and start-up."""
    records: dict[str, dict[str, Any]] = {}
    for cell in the_plan.cells:
        if cell.refused:
            records[cell.name] = outcome_record(cell.backend, cell.mode, "n/a", cell.refused)
            if on_record is not None:
                on_record(records[cell.name])
    pending = list(the_plan.runnable)
    running: list[tuple[Cell, Bounded, float, float]] = []
    env = worker_env(the_plan.jobs)
    try:
        while pending or running:
            while pending and len(running) < the_plan.jobs:
                cell = pending.pop(0)
                cmd = worker_command(cell, shrink_seconds=shrink_seconds, seed=seed,
                                     max_examples=max_examples, out=out)
                started = time.time()
                running.append((cell, Bounded.start(cmd, cwd=str(ROOT), env=env), started,
                                started + cell_timeout(cell.seconds, shrink_seconds)))
            time.sleep(poll)
            for entry in list(running):
                cell, process, started, until = entry
                if process.returncode is None and time.time() < until:
                    continue
                running.remove(entry)
                rec = collect(cell, process, until, started)
                records[cell.name] = rec
                if on_record is not None:
                    on_record(rec)
    finally:  # interrupted (Ctrl-C): the workers, in sessions of their own, go too
        for _, process, _, _ in running:
            process.kill()
    return [records[c.name] for c in the_plan.cells]


# --- the report ---------------------------------------------------------------------------------


def totals(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The campaign's totals: programs (cells with a report; ``partial_programs``: run by cells
    stopped before their report), CPU seconds (measured in the workers; a cell without a
    measure counted at its wall time), worker wall seconds, the distinct operators across
    cells, the union of features (name -> programs), cells by status, and the findings,
    confirmed and not. O(records x operators)."""
    recs = list(records)
    operators: set[str] = set()
    features: Counter = Counter()
    statuses: Counter = Counter()
    programs = partial = 0
    cpu = wall = 0.0
    confirmed = unconfirmed = 0
    for rec in recs:
        statuses[rec["status"]] += 1
        if rec["status"] == "ok":
            programs += rec["programs"]
            operators.update(rec["operators"])
            features.update(rec["features"])
        else:
            partial += rec.get("programs", 0)
        cpu += rec.get("cpu_seconds", rec.get("wall_seconds", 0.0))
        wall += rec.get("wall_seconds", 0.0)
        confirmed += sum(1 for f in rec["findings"] if f["confirmed"])
        unconfirmed += sum(1 for f in rec["findings"] if not f["confirmed"])
    return {"programs": programs, "partial_programs": partial, "cpu_seconds": round(cpu, 1),
            "wall_seconds": round(wall, 1), "operators": sorted(operators),
            "features": dict(top(features, len(features))), "cells": dict(statuses),
            "confirmed": confirmed, "unconfirmed": unconfirmed}


_MODE_TEXT = {"plain": "`sizes=1`", "sizes3": "`sizes=3`", "grad": "`grad=True`"}

_COLUMNS = ["backend", "mode", "programs", "per minute", "operators", "raw", "known",
            "unsupported", "skipped", "confirmed", "unconfirmed"]


def _cell_row(rec: dict[str, Any]) -> list[str]:
    head = [f"`{rec['backend']}`", rec["mode"]]
    if rec["status"] != "ok":
        what = f"{rec['status']}: {rec['reason']}"
        if rec.get("programs"):
            what += f" (its search had run {rec['programs']} programs)"
        return head + [what] + [""] * (len(_COLUMNS) - 3)
    confirmed = sum(1 for f in rec["findings"] if f["confirmed"])
    return head + [
        f"{rec['programs']} in {rec['search_seconds']:.0f} s", f"{rec['per_minute']:.1f}",
        str(len(rec["operators"])), str(rec["raw"]), str(sum(rec["known"].values())),
        str(sum(rec["unsupported"].values())), str(sum(rec["skipped"].values())),
        str(confirmed), str(len(rec["findings"]) - confirmed)]


def _table(header: list[str], rows: list[list[str]], numeric: int = 0) -> list[str]:
    """A Markdown table; the columns from ``numeric`` on (when positive) right-aligned."""
    rule = "".join("---:|" if numeric and i >= numeric else "---|" for i in range(len(header)))
    lines = ["| " + " | ".join(header) + " |", "|" + rule]
    lines += ["| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in row) + " |"
              for row in rows]
    return lines


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in top(counts, len(counts)))


def _notes(rec: dict[str, Any]) -> str:
    parts = []
    for label, key in (("known", "known"), ("unsupported", "unsupported"),
                       ("not differentiable", "skipped"), ("unrunnable", "unrunnable")):
        if rec.get(key):
            parts.append(f"{label}: {_counts(rec[key])}")
    if rec.get("one_size"):
        parts.append(f"{rec['one_size']} without a dynamic dimension")
    if rec.get("unshrunk"):
        parts.append(f"{rec['unshrunk']} left as drawn (the shrink time was spent)")
    if rec.get("top_features"):
        parts.append("top features: " + ", ".join(f"{k} {v}" for k, v in rec["top_features"]))
    if rec.get("last_progress"):
        parts.append(f"last progress: {rec['last_progress']}")
    return "; ".join(parts)


def render(result: dict[str, Any]) -> str:
    """The campaign's Markdown report from ``result`` (``{"setting": ..., "cells": [record,
    ...]}``, as ``--json`` writes it; ``totals`` is computed here): a heading with the
    setting, the table by cell, the totals, notes per cell and the findings table (backend,
    mode, kind, cause, confirmed or why not, one-line summary). Pure. O(records x
    operators)."""
    setting, recs = result["setting"], result["cells"]
    total = totals(recs)
    lines = [
        f"## Fuzzing campaign: torch {setting.get('torch', '?')}, seed {setting['seed']}",
        "",
        f"{setting['cpu_hours']:g} CPU hours on {setting['jobs']} worker(s): "
        f"{setting['cell_seconds']:.0f} s of search per cell"
        + (f" (or {setting['max_examples']} programs)" if setting.get("max_examples") else "")
        + f", `shrink_seconds={setting['shrink_seconds']:g}`; modes: "
        + ", ".join(f"{m} ({_MODE_TEXT[m]})" for m in setting.get("modes", MODES)) + ".",
        "",
        *_table(_COLUMNS, [_cell_row(r) for r in recs], numeric=2),
        "",
        f"Totals: {total['programs']} programs"
        + (f" (and {total['partial_programs']} in cells stopped before their report)"
           if total["partial_programs"] else "")
        + f"; {total['cpu_seconds']:.0f} CPU seconds used ({total['wall_seconds']:.0f} s of "
        f"worker wall time); {len(total['operators'])} distinct operators across cells; "
        f"{total['confirmed']} confirmed findings, {total['unconfirmed']} unconfirmed; cells: "
        + ", ".join(f"{k} {v}" for k, v in sorted(total["cells"].items())) + ".",
        "",
        f"Features (union over cells): {_counts(total['features']) or 'none'}.",
    ]
    notes = [(r, _notes(r)) for r in recs]
    if any(text for _, text in notes):
        lines += ["", "Per cell:", ""]
        lines += [f"- `{r['backend']}` {r['mode']}: {text}" for r, text in notes if text]
    found = [(r, f) for r in recs for f in r["findings"]]
    lines += ["", "### Findings", ""]
    if not found:
        lines.append("None.")
    else:
        rows = [[f"`{f['backend']}`", r["mode"], f["kind"], f"`{f['cause']}`",
                 "yes" if f["confirmed"] else f"no ({f['why_unconfirmed']})", f["summary"]]
                for r, f in found]
        lines += _table(["backend", "mode", "kind", "cause", "confirmed?", "summary"], rows)
    return "\n".join(lines) + "\n"


# --- the command line ---------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    from lowering.fuzz.backends import BUILTINS

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu-hours", type=float, default=None,
                        help="the budget: CPU hours of search over all cells")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes at once (2)")
    parser.add_argument("--seed", type=int, default=0, help="every cell's seed (0)")
    parser.add_argument("--backends", nargs="+", choices=BUILTINS, default=DEFAULT_BACKENDS,
                        metavar="BACKEND", help=f"built-ins (default: {' '.join(DEFAULT_BACKENDS)})")
    parser.add_argument("--modes", nargs="+", choices=tuple(MODES), default=tuple(MODES),
                        metavar="MODE", help=f"of {' '.join(MODES)} (default: all)")
    parser.add_argument("--shrink-seconds", type=float, default=30.0,
                        help="most seconds shrinking one finding (30)")
    parser.add_argument("--max-examples", type=int, default=None,
                        help="each cell runs this many programs instead of its time share")
    parser.add_argument("--json", default=None, help="write the plan and every record here")
    parser.add_argument("--markdown", default=None, help="write the report here too")
    parser.add_argument("--out", default=None, help="a folder per finding under this one")
    parser.add_argument("--cell", default=None, help=argparse.SUPPRESS)  # backend:mode (worker)
    parser.add_argument("--cell-seconds", type=float, default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a campaign (or, with ``--cell``, one cell as its worker); exit status 0, 2 for bad
    arguments."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.cell is not None:
        return worker(args)
    if args.cpu_hours is None:
        parser.error("--cpu-hours is required")
    try:
        the_plan = plan(args.cpu_hours, args.jobs, args.backends, args.modes)
    except ValueError as err:
        parser.error(str(err))
    import torch

    setting = {"torch": torch.__version__, "seed": args.seed, "cpu_hours": args.cpu_hours,
               "jobs": args.jobs, "backends": list(dict.fromkeys(args.backends)),
               "modes": list(dict.fromkeys(args.modes)), "shrink_seconds": args.shrink_seconds,
               "max_examples": args.max_examples, "cell_seconds": the_plan.cell_seconds,
               "wall_seconds": the_plan.wall_seconds,
               "cell_timeout": cell_timeout(the_plan.cell_seconds, args.shrink_seconds)}
    done: list[dict[str, Any]] = []

    def note(rec: dict[str, Any]) -> None:
        done.append(rec)
        figures = (f"{rec['programs']} programs, {len(rec['operators'])} operators, "
                   f"{len(rec['findings'])} findings" if rec["status"] == "ok"
                   else f"{rec['status']}: {rec['reason']}")
        print(f"campaign: {rec['backend']} {rec['mode']}: {figures} "
              f"({rec.get('wall_seconds', 0):.0f} s)", file=sys.stderr, flush=True)
        if args.json:
            _write_json(args.json, {"setting": setting, "cells": done})

    print(f"campaign: {len(the_plan.runnable)} cells to run of {len(the_plan.cells)}, "
          f"{the_plan.cell_seconds:.0f} s of search each, {args.jobs} at once "
          f"(wall budget {the_plan.wall_seconds:.0f} s)", file=sys.stderr, flush=True)
    recs = run_campaign(the_plan, shrink_seconds=args.shrink_seconds, seed=args.seed,
                        max_examples=args.max_examples, out=args.out, on_record=note)
    result = {"setting": setting, "cells": recs, "totals": totals(recs)}
    text = render(result)
    print(text)
    if args.json:
        _write_json(args.json, result)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


def _write_json(path: str, data: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
