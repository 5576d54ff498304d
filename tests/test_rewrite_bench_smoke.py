"""Smoke test for ``bench/rewrite.py`` at N=1000: both sides run and reach the same operators
(the bench exits when they differ). No timing is asserted."""

from __future__ import annotations

import io

from bench import rewrite as bench


def test_rewrite_bench_runs_at_1k():
    out = io.StringIO()
    rows = bench.measure([1000], fx_max=1000, repeat=1, out=out)
    assert rows[0]["n"] == 1000 and rows[0]["fx_s"] is not None
    assert "fx/purefx" in out.getvalue()


def test_the_bench_program_rewrites_every_site():
    p = bench.purefx_program(60)
    q = bench.rewrite(p, bench.rules())
    ops = bench.op_counts(q)
    assert ops == {"aten.relu.default": 10, "aten.silu.default": 10, "aten.add.Tensor": 10}
