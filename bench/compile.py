"""``torch.compile`` of purefx's lowered module against ``ep.module()`` and ``torch.export.unflatten``.

Run from the repository root::

    python -m bench.compile                               # deep:16, gpt:4, inductor
    python -m bench.compile --backend eager --models deep:64
    python -m bench.compile --json compile.json

For each model one ``ExportedProgram`` is made; each library's module is compiled and measured
for: compile time (the first call, which traces and
compiles), recompiles on the second call, graph breaks (dynamo's counters), whether
``fullgraph=True`` compiles, and the steady-state latency of the compiled module (median of
``--k`` calls, in rounds; wall and this thread's CPU time). The ratio column is CPU latency over
``ep.module()``'s. inductor's on-disk and in-memory graph caches are turned off and one warm-up
compile runs first, so no library's compile time is paid by, or reused from, another's.
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


def compile_once(module: torch.nn.Module, args: tuple, backend: str) -> dict[str, Any]:
    """Compile ``module``; time its first call (trace and compile) and its second call, and
    count the recompiles of the second call and the graph breaks of the first."""
    breaks_before = sum(counters["graph_break"].values())
    graphs_before = counters["stats"]["unique_graphs"]
    compiled = torch.compile(module, backend=backend)
    start = time.perf_counter()
    try:
        compiled(*args)
    except Exception as err:  # noqa: BLE001 -- a library that cannot compile is a result
        return {"error": f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:120]}"}
    compile_s = time.perf_counter() - start
    graphs_first = counters["stats"]["unique_graphs"]
    start = time.perf_counter()
    compiled(*args)
    second_s = time.perf_counter() - start
    return {
        "compiled": compiled,
        "compile_s": compile_s,
        "second_call_ms": 1e3 * second_s,
        "graphs": graphs_first - graphs_before,
        "recompiles": counters["stats"]["unique_graphs"] - graphs_first,
        "graph_breaks": sum(counters["graph_break"].values()) - breaks_before,
    }


def fullgraph_compiles(module: torch.nn.Module, args: tuple, backend: str) -> bool:
    """Whether ``torch.compile(module, fullgraph=True)`` compiles and runs."""
    try:
        torch.compile(module, backend=backend, fullgraph=True)(*args)
    except Exception:  # noqa: BLE001 -- any failure means "does not compile in one graph"
        return False
    return True


def latency_us(compiled: Any, args: tuple, k: int, rounds: int = 10) -> tuple[float, float]:
    """Median per-call time (us) of ``compiled`` over ``rounds`` rounds of ``k / rounds`` calls:
    ``(wall, cpu)``, cpu being this thread's CPU time (steadier on a machine shared with other
    processes)."""
    per_round = max(1, k // rounds)
    for _ in range(max(3, per_round)):
        compiled(*args)
    wall, cpu = [], []
    for _ in range(rounds):
        start, start_cpu = time.perf_counter(), time.thread_time()
        for _ in range(per_round):
            compiled(*args)
        wall.append((time.perf_counter() - start) / per_round)
        cpu.append((time.thread_time() - start_cpu) / per_round)
    return 1e6 * statistics.median(wall), 1e6 * statistics.median(cpu)


def run_model(name: str, n: int, backend: str, k: int) -> dict[str, Any]:
    """Every library's numbers for model ``name`` at size ``n``; each library is compiled and
    timed alone (``torch._dynamo.reset()`` before each, so no compiled frame is shared)."""
    spec = MODELS[name]
    model, args = spec.build(n)
    ep = spec.export(model, args)
    row: dict[str, Any] = {"model": name, "n": n, "backend": backend}
    for library in LIBRARIES:
        torch._dynamo.reset()
        counters.clear()
        result = compile_once(build(library, ep), args, backend)
        compiled = result.pop("compiled", None)
        if compiled is not None:
            result["latency_us"], result["cpu_us"] = latency_us(compiled, args, k)
        torch._dynamo.reset()
        result["fullgraph"] = fullgraph_compiles(build(library, ep), args, backend)
        row[library] = result
    torch._dynamo.reset()
    return row


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """A text table of ``rows`` (one line per model and library)."""
    head = (
        f"{'model':<10} {'library':<10} {'compile s':>9} {'2nd call ms':>11} {'recomp':>6} "
        f"{'breaks':>6} {'fullgraph':>9} {'wall us':>9} {'cpu us':>9} {'cpu x ep.module':>15}"
    )
    lines = [head]
    for row in rows:
        base = row["ep.module"].get("cpu_us")
        for library in LIBRARIES:
            r = row[library]
            label = f"{row['model']}:{row['n']}"
            if "error" in r:
                lines.append(f"{label:<10} {library:<10} {r['error']}")
                continue
            ratio = f"{r['cpu_us'] / base:.3f}" if base else "-"
            lines.append(
                f"{label:<10} {library:<10} {r['compile_s']:9.2f} {r['second_call_ms']:11.2f} "
                f"{r['recompiles']:6d} {r['graph_breaks']:6d} {r['fullgraph']!s:>9} "
                f"{r['latency_us']:9.1f} {r['cpu_us']:9.1f} {ratio:>15}"
            )
    return "\n".join(lines)


def no_caches() -> None:
    """Turn off the caches that would let one library's compile reuse another's work."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = False
    inductor_config.autotune_local_cache = False
    functorch_config.enable_autograd_cache = False


def main(argv: Sequence[str] | None = None, out: Callable[[str], Any] = print) -> int:
    """Entry point: measure, print the table, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="deep:16,gpt:4", help="name:N pairs")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    parser.add_argument("--k", type=int, default=200, help="timed calls per library")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    no_caches()
    torch.compile(lambda x: x.sin() + 1, backend=args.backend)(torch.ones(2))  # warm-up
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
