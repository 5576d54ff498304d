"""Benchmark purefx against ``torch.export.unflatten``.

Run from the repository root::

    python -m bench.run --quick                  # smoke run, < 60 s
    python -m bench.run --models deep --json out.json
    python bench/run.py --models gpt --sizes 2,8,32

For every model and size the program is exported once; all measurements of
that size use the same ``ExportedProgram``. See ``bench/README.md`` for what
each number means.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
import tracemalloc
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # Run as ``python bench/run.py``: make the repository root importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench.models import MODELS, Args, ModelSpec

Stage = tuple[str, Callable[[Any], Any]]
Record = dict[str, Any]

SLOPE_RANGE = (128, 1024)
MEMORY_MAX_N = 512
ATOL = 1e-5
ERROR_CHARS = 300
CLOCKS = ("wall", "cpu")
LIBRARIES = ("torch", "purefx")
MIN_K, MAX_K = 5, 200  # latency rounds when --k is not given


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class Options:
    """Knobs shared by every measurement of one run."""

    repeat: int  # timed builds per size and library; the median is reported
    memory_max_n: int  # trace memory only up to this N (0: never)
    latency: bool
    latency_budget_s: float  # wall time aimed at per latency variant
    k: int | None  # fixed number of latency runs, or None for adaptive
    max_build_s: float  # skip larger sizes once a build took longer than this
    clock: str = "wall"  # which of CLOCKS the printed tables and slopes use


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--models",
        default=",".join(MODELS),
        help=f"comma-separated subset of {','.join(MODELS)} (default: all)",
    )
    parser.add_argument(
        "--sizes",
        default=None,
        help="comma-separated sizes N overriding every model's sweep",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes and short latency runs (smoke run)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="timed builds per size and library, median reported (default 3)",
    )
    parser.add_argument(
        "--k",
        type=int,
        default=None,
        help=f"latency rounds, one call per variant each (default: {MIN_K} to {MAX_K}, ~0.3 s per variant)",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc builds")
    parser.add_argument(
        "--memory-max-n",
        type=int,
        default=MEMORY_MAX_N,
        help=f"tracemalloc builds only up to this N (default {MEMORY_MAX_N}; tracing is "
        "4-5x slower than the build and memory grows linearly)",
    )
    parser.add_argument("--no-latency", action="store_true", help="skip forward latency")
    parser.add_argument(
        "--max-build-s",
        type=float,
        default=300.0,
        help="stop growing N for a library once one of its builds took longer (default 300)",
    )
    parser.add_argument(
        "--clock",
        choices=CLOCKS,
        default="wall",
        help="clock for the printed tables and slopes: wall (perf_counter, default) or "
        "cpu (process_time, steadier on a busy machine); the JSON has both",
    )
    parser.add_argument("--json", type=Path, default=None, help="write all results to this file")
    args = parser.parse_args(argv)
    unknown = sorted(set(_split(args.models)) - set(MODELS))
    if unknown:
        parser.error(f"--models: unknown {unknown}; expected names from {list(MODELS)}")
    if args.sizes is not None:
        sizes = _split(args.sizes)
        if not sizes or not all(s.isdigit() and int(s) > 0 for s in sizes):
            parser.error(f"--sizes: expected positive integers like 8,64,512, got {args.sizes!r}")
    return args


def _split(text: str) -> list[str]:
    """Split a comma-separated option, dropping empty items."""
    return [item.strip() for item in text.split(",") if item.strip()]


def options_from(args: argparse.Namespace) -> Options:
    """Turn parsed arguments into :class:`Options`."""
    return Options(
        repeat=args.repeat,
        memory_max_n=0 if args.no_memory else args.memory_max_n,
        latency=not args.no_latency,
        latency_budget_s=0.03 if args.quick else 0.3,
        k=args.k,
        max_build_s=args.max_build_s,
        clock=args.clock,
    )


def sizes_for(spec: ModelSpec, args: argparse.Namespace) -> tuple[int, ...]:
    """The sizes to run for ``spec``: ``--sizes``, else quick or full sweep."""
    if args.sizes:
        return tuple(int(s) for s in _split(args.sizes))
    return spec.quick_sizes if args.quick else spec.sizes


def repeats_for(opts: Options) -> int:
    """How many timed builds to take the median of."""
    return max(1, opts.repeat)


# --------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Send stdout to ``os.devnull`` (torch's unflatten prints debugging noise)."""
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        yield


@contextlib.contextmanager
def stopwatch(into: dict[str, float], key: str) -> Iterator[None]:
    """Add the wall time of the body to ``into[key]`` (bookkeeping, not a result)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        into[key] = into.get(key, 0.0) + time.perf_counter() - t0


def describe_error(exc: BaseException, stage: str) -> str:
    """One line naming the stage, exception type, message and raising frame."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{stage}: {type(exc).__name__}: {message}"[:ERROR_CHARS] + where


def unflatten_module() -> Any:
    """The ``torch.export.unflatten`` *module* (the attribute is the function)."""
    return importlib.import_module("torch.export.unflatten")


def codegen_mode() -> contextlib.AbstractContextManager[None]:
    """Context in which torch's unflatten builds generated-code submodules."""
    return unflatten_module()._disable_interpreter()


def outputs_match(got: Any, want: torch.Tensor) -> bool:
    """Whether a forward result equals the eager reference within ``ATOL``."""
    return (
        isinstance(got, torch.Tensor)
        and got.shape == want.shape
        and torch.allclose(got, want, atol=ATOL)
    )


# --------------------------------------------------------------------------- pipelines


@dataclass(frozen=True)
class Purefx:
    """purefx's three entry points, or why they could not be imported."""

    import_ep: Callable[[Any], Any] | None = None
    transform: Callable[[Any], Any] | None = None
    lower: Callable[[Any], Any] | None = None
    error: str | None = None


def load_purefx() -> Purefx:
    """Import ``ir.import_ep``, ``transforms.transform`` and ``lowering.lower``."""
    try:
        from ir import import_ep
        from lowering import lower
        from transforms import transform
    except Exception as exc:  # noqa: BLE001 - any failure means "not available yet"
        return Purefx(error=describe_error(exc, "import purefx"))
    return Purefx(import_ep, transform, lower)


def first_call(args: Args) -> Stage:
    """The stage that calls the built module once under ``no_grad``."""

    def call(module: Any) -> Any:
        with torch.no_grad():
            return module(*args)

    return ("first_call", call)


def torch_stages(args: Args) -> list[Stage]:
    """``torch.export.unflatten`` and the first forward call."""
    return [("unflatten", torch.export.unflatten), first_call(args)]


def purefx_stages(api: Purefx, args: Args) -> list[Stage]:
    """purefx's import, transform and lower, and the first forward call."""
    return [
        ("import", api.import_ep),
        ("transform", api.transform),
        ("lower", api.lower),
        first_call(args),
    ]


@dataclass
class PipelineRun:
    """Stage times of one build, the built module, its first output, or the error."""

    times: dict[str, float]
    module: Any = None
    output: Any = None
    error: str | None = None


def stage_key(stage: str, clock: str) -> str:
    """Key of a stage's time in a ``times`` dict: ``stage`` (wall) or ``cpu:stage``."""
    return stage if clock == "wall" else f"{clock}:{stage}"


def run_pipeline(stages: list[Stage], start: Any) -> PipelineRun:
    """Feed ``start`` through ``stages``, timing each; stop at the first error.

    Each stage gets its wall time (``perf_counter``) under its name and its
    process CPU time under ``cpu:<name>``; CPU time well below wall time means
    the machine was busy with something else.
    """
    times: dict[str, float] = {}
    value, module = start, None
    for name, fn in stages:
        module = value
        try:
            with quiet():
                c0, t0 = time.process_time(), time.perf_counter()
                value = fn(value)
                times[name] = time.perf_counter() - t0
                times[stage_key(name, "cpu")] = time.process_time() - c0
        except Exception as exc:  # noqa: BLE001 - recorded, the benchmark goes on
            return PipelineRun(times, error=describe_error(exc, name))
    for clock in CLOCKS:
        times[stage_key("total", clock)] = sum(times[stage_key(n, clock)] for n, _ in stages)
    return PipelineRun(times, module=module, output=value)


def timed_builds(
    libraries: dict[str, list[Stage]], ep: Any, repeats: int
) -> dict[str, PipelineRun]:
    """Each library's median stage times over ``repeats`` builds, and its last first output.

    The builds run in rounds, one build of each library per round, so that load
    on a shared machine, which comes and goes over minutes, weighs on both
    libraries' medians alike. No built module is kept: each build starts from
    the same heap (see ``measure_size``). A library whose build raises is not
    built again; its entry is the failed run.
    """
    times: dict[str, list[dict[str, float]]] = {lib: [] for lib in libraries}
    outputs: dict[str, Any] = {}
    failed: dict[str, PipelineRun] = {}
    for _ in range(repeats):
        for lib, stages in libraries.items():
            if lib in failed:
                continue
            gc.collect()
            run = run_pipeline(stages, ep)
            if run.error:
                failed[lib] = run
                continue
            times[lib].append(run.times)
            outputs[lib] = run.output
            del run
    result = dict(failed)
    for lib, runs in times.items():
        if lib not in failed:
            medians = {key: statistics.median(t[key] for t in runs) for key in runs[-1]}
            result[lib] = PipelineRun(medians, output=outputs[lib])
    return result


def peak_memory_mb(stages: list[Stage], ep: Any) -> float | None:
    """Peak Python memory (tracemalloc) of one build incl. first call, in MB."""
    gc.collect()
    tracemalloc.start()
    try:
        run = run_pipeline(stages, ep)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del run
    gc.collect()
    return peak / 2**20


# --------------------------------------------------------------------------- latency


def latency_summary(samples: list[float], cpu_samples: list[float]) -> dict[str, float]:
    """Median and minimum wall latency and median CPU time in µs, and the sample count."""
    return {
        "us": statistics.median(samples) * 1e6,
        "min_us": min(samples) * 1e6,
        "cpu_us": statistics.median(cpu_samples) * 1e6,
        "k": len(samples),
    }


def measure_latencies(
    variants: dict[str, Any], args: Args, reference: torch.Tensor, opts: Options
) -> dict[str, Any]:
    """Latency (µs) and output agreement of each built variant; errors recorded.

    A variant given as a string is a build that failed; the string is its error.
    Each variant is called once (its output checked, and a warm-up); then the
    variants are timed in rounds, one call of each per round, starting from a
    different one each round, so a burst of load on a shared machine falls on
    all of them alike. ``opts.k`` rounds, or else rounds until
    ``opts.latency_budget_s`` per variant is spent (at least ``MIN_K``, at most
    ``MAX_K``).
    """
    result: dict[str, Any] = {}
    runnable: dict[str, Any] = {}
    for name, module in variants.items():
        if isinstance(module, str):
            result[name] = {"us": None, "match": None, "error": module}
            continue
        try:
            with quiet(), torch.no_grad():
                result[name] = {"match": outputs_match(module(*args), reference), "error": None}
            runnable[name] = module
        except Exception as exc:  # noqa: BLE001
            result[name] = {"us": None, "match": False, "error": describe_error(exc, "forward")}
    samples: dict[str, list[float]] = {name: [] for name in runnable}
    cpu_samples: dict[str, list[float]] = {name: [] for name in runnable}
    budget = opts.latency_budget_s * len(runnable)
    gc.collect()
    start = time.perf_counter()
    rounds = 0
    with quiet(), torch.no_grad():
        while runnable and rounds < (opts.k or MAX_K):
            names = list(runnable)
            for name in names[rounds % len(names) :] + names[: rounds % len(names)]:
                module = runnable[name]
                c0, t0 = time.process_time(), time.perf_counter()
                try:
                    module(*args)
                except Exception as exc:  # noqa: BLE001
                    result[name] = {"us": None, "match": False, "error": describe_error(exc, "forward")}
                    del runnable[name]
                    continue
                samples[name].append(time.perf_counter() - t0)
                cpu_samples[name].append(time.process_time() - c0)
            rounds += 1
            spent = time.perf_counter() - start
            if not opts.k and rounds >= MIN_K and spent >= budget:
                break
    for name in runnable:
        result[name] |= latency_summary(samples[name], cpu_samples[name])
    return result


def build_or_error(build: Callable[[], Any]) -> Any:
    """``build()`` with stdout silenced, or the error string if it raised."""
    try:
        with quiet():
            return build()
    except Exception as exc:  # noqa: BLE001
        return describe_error(exc, "build")


# --------------------------------------------------------------------------- one size


def measure_size(
    spec: ModelSpec, n: int, api: Purefx, opts: Options, skip: dict[str, str]
) -> Record:
    """All measurements of ``spec`` at size ``n`` on one exported program.

    ``skip`` maps a library to the reason it is no longer run; a library whose
    build exceeds ``opts.max_build_s`` is added to it for the larger sizes.
    The libraries' timed builds alternate (``timed_builds``), and each starts
    from the same heap (the program and the eager model, nothing the other
    library built: a large live module tree slows the next builds down by
    scattering their allocations); the modules whose latency is measured are
    built afterwards, untimed.
    """
    wall: dict[str, float] = {}
    with stopwatch(wall, "export"):
        model, args, ep = spec.make(n)
    with torch.no_grad():
        reference = model(*args)
    record: Record = {"n": n, "nodes": len(ep.graph.nodes), "export_s": wall["export"]}
    record["wall_s"] = wall
    libraries = {"torch": torch_stages(args)}
    if api.error is None:
        libraries["purefx"] = purefx_stages(api, args)

    measured = {lib: stages for lib, stages in libraries.items() if lib not in skip}
    with stopwatch(wall, "builds"):
        runs = timed_builds(measured, ep, repeats_for(opts))
    for lib, stages in measured.items():
        record[lib] = measure_library(runs[lib], stages, ep, reference, n, opts)
        total = record[lib]["times"].get("total", 0.0)
        if total > opts.max_build_s:
            skip[lib] = f"skipped: build took {total:.1f}s > --max-build-s at N={n}"
    for lib in LIBRARIES:
        record.setdefault(lib, {"error": skip.get(lib)})

    if opts.latency:
        with stopwatch(wall, "latency_builds"):
            built = {lib: _latency_build(libraries.get(lib), ep, record[lib]) for lib in LIBRARIES}
        with stopwatch(wall, "ep_module"):
            ep_module = build_or_error(ep.module)
        record["ep_module_s"] = wall["ep_module"]
        with stopwatch(wall, "codegen_build"):
            codegen = _codegen_build(ep, skip.get("torch"))
        variants = {
            "eager": model,
            "ep_module": ep_module,
            "unflatten_interp": built["torch"],
            "unflatten_codegen": codegen,
            "purefx": built["purefx"],
        }
        with stopwatch(wall, "latency"):
            record["latency"] = measure_latencies(variants, args, reference, opts)
    return record


def measure_library(
    run: PipelineRun,
    stages: list[Stage],
    ep: Any,
    reference: torch.Tensor,
    n: int,
    opts: Options,
) -> Record:
    """One library's record: its timed builds' ``run``, the first-answer check, and the
    peak memory of one more build; ``wall_s`` is what that traced build cost in wall time."""
    wall: dict[str, float] = {}
    ok = run.error is None
    with stopwatch(wall, "memory"):
        peak = peak_memory_mb(stages, ep) if ok and n <= opts.memory_max_n else None
    return {
        "times": run.times,
        "repeats": repeats_for(opts),
        "error": run.error,
        "first_output_match": outputs_match(run.output, reference) if ok else None,
        "peak_mb": peak,
        "wall_s": wall,
    }


def _latency_build(stages: list[Stage] | None, ep: Any, measured: Record) -> Any:
    """A module of the library for the latency runs (untimed), or why there is none."""
    if stages is None or measured.get("error") or "times" not in measured:
        return measured.get("error") or "not measured"
    run = run_pipeline(stages, ep)
    return run.error if run.error else run.module


def _codegen_build(ep: Any, skipped: str | None) -> Any:
    """torch's unflatten built in generated-code mode, or an error string."""
    if skipped:
        return skipped

    def build() -> Any:
        with codegen_mode():
            return torch.export.unflatten(ep)

    return build_or_error(build)


# --------------------------------------------------------------------------- analysis


def loglog_slope(points: Sequence[tuple[int, float]]) -> float | None:
    """Least-squares slope of ``log t`` against ``log N``; None below two points."""
    pts = [(math.log(n), math.log(t)) for n, t in points if t and t > 0]
    if len(pts) < 2:
        return None
    mx = statistics.fmean(x for x, _ in pts)
    my = statistics.fmean(y for _, y in pts)
    var = sum((x - mx) ** 2 for x, _ in pts)
    if var == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in pts) / var


def stage_series(
    records: list[Record], lib: str, stage: str, clock: str
) -> list[tuple[int, float]]:
    """``(N, seconds)`` for one library stage over the records that have it."""
    key = stage_key(stage, clock)
    series = []
    for rec in records:
        times = (rec.get(lib) or {}).get("times") or {}
        if key in times and not rec[lib].get("error"):
            series.append((rec["n"], times[key]))
    return series


SLOPE_SERIES = (
    ("torch", "unflatten"),
    ("torch", "total"),
    ("purefx", "import"),
    ("purefx", "transform"),
    ("purefx", "lower"),
    ("purefx", "total"),
)


def slope_records(records: list[Record]) -> list[Record]:
    """The records to fit: N in ``SLOPE_RANGE`` if it holds 3 or more sizes, else
    the top sizes (N >= max/8).

    The fallback serves sweeps that stop below 512 (``gpt``, ``repeat``,
    ``--quick``): their large sizes, where constant overheads matter least.
    """
    lo, hi = SLOPE_RANGE
    in_range = [r for r in records if lo <= r["n"] <= hi]
    if len(in_range) >= 3:
        return in_range
    top = max((r["n"] for r in records), default=0)
    return [r for r in records if r["n"] * 8 >= top]


def slopes(records: list[Record]) -> dict[str, Any]:
    """Log-log slopes of each build stage, per clock, over :func:`slope_records`."""
    used = slope_records(records)
    result: dict[str, Any] = {"sizes": [r["n"] for r in used]}
    for clock in CLOCKS:
        result[clock] = {
            f"{lib}.{stage}": loglog_slope(stage_series(used, lib, stage, clock))
            for lib, stage in SLOPE_SERIES
        }
    return result


# --------------------------------------------------------------------------- report


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _ratio(num: float | None, den: float | None) -> str:
    return "-" if not num or not den else f"{num / den:.2f}x"


def _total_cell(lib: Record, clock: str) -> str:
    """A library's total build time, ``ERR`` if it failed, ``WRONG`` if its answer was."""
    if lib.get("error"):
        return "ERR"
    if lib.get("first_output_match") is False:
        return "WRONG"
    return _fmt((lib.get("times") or {}).get(stage_key("total", clock)))


def build_table(records: list[Record], clock: str) -> list[str]:
    """Rows of the build-time table (seconds on ``clock``, MB)."""
    header = (
        f"{'N':>5} {'nodes':>6} {'export':>7} | {'torch':>7} {'t.call':>7} | "
        f"{'import':>7} {'transf':>7} {'lower':>7} {'call':>7} {'total':>7} "
        f"{'pfx/tch':>8} | {'tchMB':>7} {'pfxMB':>7}"
    )
    rows = [header, "-" * len(header)]
    for rec in records:
        torch_rec, pfx_rec = rec.get("torch") or {}, rec.get("purefx") or {}
        tt, pt = torch_rec.get("times") or {}, pfx_rec.get("times") or {}

        def cell(times: dict[str, float], stage: str) -> str:
            return _fmt(times.get(stage_key(stage, clock)))

        total = stage_key("total", clock)
        rows.append(
            f"{rec['n']:>5} {rec['nodes']:>6} {_fmt(rec['export_s'], '.2f'):>7} | "
            f"{_total_cell(torch_rec, clock):>7} {cell(tt, 'first_call'):>7} | "
            f"{cell(pt, 'import'):>7} {cell(pt, 'transform'):>7} {cell(pt, 'lower'):>7} "
            f"{cell(pt, 'first_call'):>7} {_total_cell(pfx_rec, clock):>7} "
            f"{_ratio(pt.get(total), tt.get(total)):>8} | "
            f"{_fmt(torch_rec.get('peak_mb'), '.1f'):>7} "
            f"{_fmt(pfx_rec.get('peak_mb'), '.1f'):>7}"
        )
    return rows


LATENCY_COLUMNS = ("eager", "ep_module", "unflatten_interp", "unflatten_codegen", "purefx")
LATENCY_KEY = {"wall": "us", "cpu": "cpu_us"}


def latency_table(records: list[Record], clock: str) -> list[str]:
    """Rows of the latency table: µs on ``clock`` and ratio to ``ep.module()``."""
    key = LATENCY_KEY[clock]
    header = f"{'N':>5} " + " ".join(f"{c:>22}" for c in LATENCY_COLUMNS)
    rows = [header, "-" * len(header)]
    for rec in records:
        lat = rec.get("latency") or {}
        base = (lat.get("ep_module") or {}).get(key)
        cells = []
        for col in LATENCY_COLUMNS:
            cell = lat.get(col) or {}
            if cell.get("error"):
                text = "ERR"
            elif cell.get(key) is None:
                text = "-"
            else:
                text = f"{cell[key]:.0f} ({_ratio(cell[key], base)})"
                if cell.get("match") is False:
                    text += " WRONG"
            cells.append(f"{text:>22}")
        rows.append(f"{rec['n']:>5} " + " ".join(cells))
    return rows


def error_lines(records: list[Record], known: str | None) -> list[str]:
    """Distinct error messages of a model with the sizes they occurred at.

    ``known`` (purefx's import error, printed once at the top) is left out.
    """
    seen: dict[str, set[int]] = {}
    for rec in records:
        errors = [(lib, (rec.get(lib) or {}).get("error")) for lib in ("torch", "purefx")]
        errors += [(v, c.get("error")) for v, c in (rec.get("latency") or {}).items()]
        for where, err in errors:
            if err and err != known:
                seen.setdefault(f"{where}: {err}", set()).add(rec["n"])
    return [f"  [N={','.join(map(str, sorted(ns)))}] {msg}" for msg, ns in seen.items()]


def report(
    spec: ModelSpec, records: list[Record], slope: dict[str, Any], known: str | None, clock: str
) -> str:
    """The text report of one model on ``clock``; ``known`` is an error not to repeat."""
    lines = [
        f"\n=== {spec.name}: {spec.description}",
        f"build s ({clock}), median; torch = unflatten + first call, t.call = that call",
    ]
    lines += build_table(records, clock)
    lines += ["", f"forward latency, µs ({clock}, median), ratio to ep.module()"]
    lines += latency_table(records, clock)
    sizes = slope["sizes"]
    span = f"N={sizes[0]}..{sizes[-1]}" if sizes else "no sizes"
    lines += ["", f"log-log slopes ({clock}) over {span}"]
    lines += [f"  {key:<18} {_fmt(value, '.2f')}" for key, value in slope[clock].items()]
    errors = error_lines(records, known)
    if errors:
        lines += ["errors:"] + errors
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    """Versions and settings that the numbers depend on."""
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "loadavg_1_5_15min": os.getloadavg(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


# --------------------------------------------------------------------------- driver


def warm_up(spec: ModelSpec, api: Purefx) -> None:
    """One untimed pass at N=2 so lazy imports and caches are not billed to N=first."""
    opts = Options(
        repeat=1, memory_max_n=0, latency=True, latency_budget_s=0.0, k=1, max_build_s=1e9
    )
    measure_size(spec, 2, api, opts, initial_skip(api))


def initial_skip(api: Purefx) -> dict[str, str]:
    """Libraries not to run at all: purefx when it cannot be imported."""
    return {"purefx": api.error} if api.error else {}


def run_model(name: str, sizes: Sequence[int], api: Purefx, opts: Options) -> dict[str, Any]:
    """Measure one model over ``sizes`` and print its report."""
    spec = MODELS[name]
    warm_up(spec, api)
    # Move what is alive now (torch, earlier results) out of the collector's
    # view, so each gc.collect() between measurements scans only new objects.
    gc.collect()
    gc.freeze()
    records: list[Record] = []
    skip = initial_skip(api)
    for n in sizes:
        t0 = time.perf_counter()
        records.append(measure_size(spec, n, api, opts, skip))
        print(
            f"  [{name} N={n}: {time.perf_counter() - t0:.1f}s]",
            file=sys.stderr,
            flush=True,
        )
    slope = slopes(records)
    print(report(spec, records, slope, api.error, opts.clock), flush=True)
    return {"description": spec.description, "records": records, "slopes": slope}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m bench.run``."""
    args = parse_args(argv)
    opts = options_from(args)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    api = load_purefx()
    results: dict[str, Any] = {
        "environment": environment(),
        "options": vars(args) | {"json": str(args.json) if args.json else None},
        "purefx_import_error": api.error,
        "models": {},
    }
    print(
        f"torch {torch.__version__}, 1 thread, load average {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} cpus; purefx: {api.error or 'available'}",
        flush=True,
    )
    started = time.perf_counter()
    for name in _split(args.models):
        results["models"][name] = run_model(name, sizes_for(MODELS[name], args), api, opts)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1, default=str))
    results["wall_s"] = time.perf_counter() - started
    results["loadavg_at_end"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
        print(f"\nwrote {args.json}")
    print(f"total wall time {results['wall_s']:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
