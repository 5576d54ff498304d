"""Smoke test for ``bench/search.py``'s transformers programs at the smallest size: GPT-2 of one
layer, saturate against greedy and the exhaustive search (the extracted program checked against
the original inside ``run_models``). No timing is asserted."""

from __future__ import annotations

import io

import pytest

pytest.importorskip("transformers")

from bench import search as bench


def test_gpt2_attention_fuses_under_saturate_and_costs_less_than_greedy():
    out = io.StringIO()
    rows = bench.run_models(1, max_states=20, out=out, seconds=60.0)
    (row,) = rows
    assert row["name"] == "gpt2_1layer" and row["chosen"] == "saturate"
    assert row["fused"] == (1, 1)  # greedy fuses too, through the unscaled rule, q * s left over
    assert row["sat"] < row["greedy"] < row["before"]
    assert row["sat"] <= row["exh"] * (1 + 1e-9)
    assert row["sizes"][-1] > row["sizes"][0] and len(row["sizes"]) == len(row["classes"])
    assert "| gpt2_1layer |" in out.getvalue()


def test_the_model_suite_names_transformers_programs():
    names = [name for name, _, _ in bench.model_suite()]
    assert any(n.startswith("gpt2") for n in names) and len(names) == len(set(names))
