"""``torch.compile`` of purefx's lowered module against ``ep.module()`` and ``torch.export.unflatten``.

Run from the repository root::

    python -m bench.compile                               # deep:16, gpt:4, inductor
    python -m bench.compile --backend eager --models deep:64
    python -m bench.compile --json compile.json

For each model one ``ExportedProgram`` is made; each library's module is compiled (after
``torch._dynamo.reset()``) and measured for: compile time (the first call, which traces and
compiles), recompiles on the second call, graph breaks (dynamo's counters), whether
``fullgraph=True`` compiles, and the steady-state latency of the compiled module (median of
``--k`` calls, after warm-up). The ratio column is latency over ``ep.module()``'s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch._dynamo.utils import counters

from bench.models import MODELS

LIBRARIES = ("ep.module", "unflatten", "purefx")


def build(library: str, ep: torch.export.ExportedProgram) -> torch.nn.Module:
    """The module ``library`` makes from ``ep``."""
    if library == "ep.module":
        return ep.module()
    if library == "unflatten":
        return torch.export.unflatten(ep)
    from ir import import_ep
    from lowering import lower
    from transforms import transform

    return lower(transform(import_ep(ep)))


def measure(
    module: torch.nn.Module, args: tuple, backend: str, k: int, fullgraph: bool
) -> dict[str, Any]:
    """Compile ``module`` and time its first call, its recompiles and its steady state."""
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(module, backend=backend, fullgraph=fullgraph)
    start = time.perf_counter()
    try:
        compiled(*args)
    except Exception as err:  # noqa: BLE001 -- a library that cannot compile is a result
        return {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"}
    compile_s = time.perf_counter() - start
    frames_first = counters["stats"]["unique_graphs"]
    start = time.perf_counter()
    compiled(*args)
    second_s = time.perf_counter() - start
    recompiles = counters["stats"]["unique_graphs"] - frames_first
    for _ in range(max(3, k // 10)):
        compiled(*args)
    samples = []
    for _ in range(k):
        start = time.perf_counter()
        compiled(*args)
        samples.append(time.perf_counter() - start)
    return {
        "compile_s": compile_s,
        "second_call_ms": 1e3 * second_s,
        "recompiles": recompiles,
        "graph_breaks": sum(counters["graph_break"].values()),
        "latency_us": 1e6 * statistics.median(samples),
    }


def run_model(name: str, n: int, backend: str, k: int) -> dict[str, Any]:
    """Every library's numbers for model ``name`` at size ``n``."""
    spec = MODELS[name]
    model, args = spec.build(n)
    ep = spec.export(model, args)
    row: dict[str, Any] = {"model": name, "n": n, "backend": backend}
    for library in LIBRARIES:
        result = measure(build(library, ep), args, backend, k, fullgraph=False)
        result["fullgraph"] = "error" not in measure(build(library, ep), args, backend, 1, True)
        row[library] = result
    return row


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """A text table of ``rows`` (one line per model and library)."""
    head = (
        f"{'model':<10} {'library':<10} {'compile s':>9} {'2nd call ms':>11} {'recomp':>6} "
        f"{'breaks':>6} {'fullgraph':>9} {'latency us':>10} {'x ep.module':>11}"
    )
    lines = [head]
    for row in rows:
        base = row["ep.module"].get("latency_us")
        for library in LIBRARIES:
            r = row[library]
            label = f"{row['model']}:{row['n']}"
            if "error" in r:
                lines.append(f"{label:<10} {library:<10} {r['error']}")
                continue
            ratio = f"{r['latency_us'] / base:.3f}" if base else "-"
            lines.append(
                f"{label:<10} {library:<10} {r['compile_s']:9.2f} {r['second_call_ms']:11.2f} "
                f"{r['recompiles']:6d} {r['graph_breaks']:6d} {r['fullgraph']!s:>9} "
                f"{r['latency_us']:10.1f} {ratio:>11}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, out: Callable[[str], Any] = print) -> int:
    """Entry point: measure, print the table, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="deep:16,gpt:4", help="name:N pairs")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    parser.add_argument("--k", type=int, default=200, help="timed calls per library")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for item in filter(None, args.models.split(",")):
            name, _, n = item.partition(":")
            rows.append(run_model(name, int(n or 8), args.backend, args.k))
    out(format_rows(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
