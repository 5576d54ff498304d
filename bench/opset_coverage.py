"""What default ``programs()`` draws reach: operators of the verified table, the operators real
models use (``ir/strategies/model_ops.json``, ``python -m bench.model_ops``), symbolic sizes.

    python -m bench.opset_coverage                  # 200 derandomized draws
    python -m bench.opset_coverage --seeds 0,1,2    # and 200 draws under each hypothesis seed

Each run draws in the generate phase only (no shrinking, no database) and prints: operators
reached (of the table's rows), the models' operators reached (and which are missed, marking
those no default program can call: an effectful row, a row whose result is no tensor), draws
with a symbolic size, and the draw rate. ``tests/laws/test_opset_default.py`` checks a sample
of these figures (and, nightly, the 200-draw ones). Timings are never asserted.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings

from ir.opset import table
from ir.strategies import coverage_of, programs
from ir.strategies.opset_steps import model_use

UNREACHABLE = frozenset({
    "aten._print.default",  # effectful: the opset steps draw no effectful row
    "aten._assert_tensor_metadata.default",  # returns None: a step needs a tensor result
    "aten.sym_size.int",  # returns a size, not a tensor
})
"""Operators the models use that no default program calls, and why."""


def draw(n: int, at: int | None = None, strategy: Any = None) -> tuple[list, float]:
    """``n`` programs of ``strategy`` (default ``programs()``), derandomized or under
    hypothesis seed ``at``; with the seconds they took."""
    drawn: list = []

    @settings(max_examples=n, database=None, derandomize=at is None, phases=[Phase.generate],
              deadline=None, suppress_health_check=list(HealthCheck))
    @given(strategy if strategy is not None else programs())
    @seed(at or 0)
    def run(p: Any) -> None:
        drawn.append(p)

    start = time.perf_counter()
    run()
    return drawn, time.perf_counter() - start


def figures(drawn: list) -> dict[str, Any]:
    """Operators reached, the models' operators reached and missed, symbolic draws."""
    reached: set[str] = set()
    symbolic = 0
    for p in drawn:
        c = coverage_of(p)
        reached |= c.operators
        symbolic += "symbolic_sizes" in c.features
    used = set(model_use())
    return {"programs": len(drawn), "operators": len(reached), "rows": len(table()),
            "model_ops": len(used), "model_reached": len(used & reached),
            "model_missed": sorted(used - reached), "symbolic": symbolic}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--seeds", default="", help="hypothesis seeds, comma separated")
    args = parser.parse_args(argv)
    draw(3)  # warm up: the first fake mode imports most of torch
    runs: list[int | None] = [None] + [int(s) for s in args.seeds.split(",") if s]
    for at in runs:
        drawn, seconds = draw(args.draws, at)
        f = figures(drawn)
        missed = ", ".join(m + (" (unreachable)" if m in UNREACHABLE else "")
                           for m in f["model_missed"])
        print(f"{'derandomized' if at is None else f'seed {at}'}: {f['programs']} draws in "
              f"{seconds:.1f} s ({f['programs'] / seconds:.0f}/s): {f['operators']} of "
              f"{f['rows']} operators; {f['model_reached']} of {f['model_ops']} models' "
              f"operators ({f['model_reached'] / max(1, f['model_ops']):.0%}); "
              f"{f['symbolic']} with a symbolic size\n  missed: {missed or 'none'}")


if __name__ == "__main__":
    main()
