"""How fast the hypothesis strategies draw programs: programs per second and nodes per program.

    python -m bench.strategies              # 300 draws of programs() and of programs_like(MLP)
    python -m bench.strategies --draws 1000

Each strategy is drawn ``--draws`` times in the generate phase only (no shrinking, no example
database, derandomized), hypothesis's own overhead included, on one thread. Against torch in
the same process: the time of one ``torch.export.export`` of the same small MLP, so that the
ratio says how many drawn programs cost one export. Timings are never asserted;
``tests/laws/test_strategies_programs.py`` checks what the draws are.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from bench.threads import one_thread


def draw_rate(strategy: st.SearchStrategy, draws: int) -> tuple[float, float]:
    """Programs per second and mean root nodes per program over ``draws`` draws."""
    drawn: list[Any] = []

    @settings(max_examples=draws, database=None, derandomize=True, phases=[Phase.generate],
              deadline=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def draw(p: Any) -> None:
        drawn.append(p)

    start = time.perf_counter()
    draw()
    seconds = time.perf_counter() - start
    programs = [getattr(p, "program", p) for p in drawn]  # programs_like draws LikeExamples
    nodes = sum(len(p.root_module.graph) for p in programs) / max(1, len(programs))
    return len(drawn) / seconds, nodes


def _mlp() -> tuple[torch.nn.Module, tuple]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return model, (torch.randn(2, 8),)


def export_seconds(make: Callable[[], tuple[torch.nn.Module, tuple]], repeat: int = 3) -> float:
    """The least time of ``repeat`` exports of the model ``make`` gives."""
    best = float("inf")
    for _ in range(repeat):
        model, args = make()
        start = time.perf_counter()
        torch.export.export(model, args)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    """Print each strategy's draw rate (on one torch thread; the caller's count restored)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draws", type=int, default=300)
    ns = parser.parse_args(argv)
    with one_thread():
        sys.stdout.write(_table(ns.draws))
    return 0


def _table(draws: int) -> str:
    from ir.strategies import programs
    from lowering.like import programs_like

    model, args = _mlp()
    ep = torch.export.export(model, args)
    export_s = export_seconds(_mlp)
    lines = ["| strategy | programs/s | nodes each | drawn programs per export |",
             "|---|---:|---:|---:|"]
    for name, strategy in (("programs()", programs()), ("programs_like(MLP)", programs_like(ep))):
        rate, nodes = draw_rate(strategy, draws)
        lines.append(f"| {name} | {rate:.0f} | {nodes:.1f} | {rate * export_s:.1f} |")
    lines.append(f"\none torch.export.export of the MLP: {export_s * 1e3:.1f} ms")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
