"""Smoke test for ``bench/search.py`` at tiny sizes: the suite's first programs run (saturate,
greedy and the exhaustive search; each extracted program checked against the original) and the
scaling run prints its table. No timing is asserted."""

from __future__ import annotations

import io

from bench import search as bench


def test_search_bench_runs_on_two_programs():
    out = io.StringIO()
    rows = bench.run_suite(2, max_states=20, out=out)
    assert [r["name"] for r in rows] == ["chain3_0", "chain3_1"]
    for r in rows:
        assert r["sat"] <= r["before"] and r["sat"] <= r["exh"] * (1 + 1e-9)
    assert rows[1]["chosen"] == "saturate"  # a@(b@c) is cheaper there
    assert "saturate = exhaustive on 2/2" in out.getvalue()


def test_search_bench_scaling_prints_its_table():
    out = io.StringIO()
    points = bench.run_scaling([12], out=out)
    assert points and points[0][0] > 12
    assert "| nodes | e-nodes |" in out.getvalue()


def test_the_suite_holds_at_least_twenty_programs():
    assert len(bench.suite()) >= 20
