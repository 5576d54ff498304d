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


def test_search_bench_lowers_each_result_and_times_it_against_its_input():
    out = io.StringIO()
    rows = bench.run_lowered(1, out=out, rounds=2)
    names = {(r["name"], r["frozen"]) for r in rows}
    assert ("chain3_0", False) in names and ("lora_4rows", True) in names
    assert ("cnn_2_convs_bn", False) in names
    for r in rows:  # the report's cost is what one call of each runs; never dearer
        assert r["after"] <= r["before"] and r["input_us"] > 0 and r["result_us"] > 0
    lora = {r["frozen"]: r for r in rows if r["name"] == "lora_4rows"}
    assert lora[False]["chosen"] == lora[True]["chosen"] == "saturate"
    assert lora[True]["after"] < lora[False]["after"] < lora[False]["before"]
    cnn = {r["frozen"]: r for r in rows if r["name"] == "cnn_2_convs_bn"}
    assert cnn[False]["chosen"] == "original" and cnn[True]["chosen"] == "saturate"
    assert "slower than the input by more than" in out.getvalue()


def test_search_bench_blocks_reach_one_blocks_cost():
    out = io.StringIO()
    rows = bench.run_blocks([42], out=out)
    assert [r["family"] for r in rows] == ["trap", "chain"]
    for r in rows:
        assert r["reached"] and r["after"] < r["before"], r
    assert "| family | nodes | blocks |" in out.getvalue()
