"""Smoke tests for the benchmark: every model exports, and the runner runs.

No timing is asserted anywhere; these only keep ``bench/`` from rotting.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import models
from bench.run import loglog_slope

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_model_exports_and_agrees_with_ep_module(name: str) -> None:
    model, args, ep = models.MODELS[name].make(2)
    with torch.no_grad():
        want = model(*args)
        got = ep.module()(*args)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_model_builders_are_deterministic(name: str) -> None:
    (m1, a1), (m2, a2) = models.MODELS[name].build(2), models.MODELS[name].build(2)
    for x, y in zip(a1, a2, strict=True):
        torch.testing.assert_close(x, y)
    for (k1, v1), (k2, v2) in zip(m1.state_dict().items(), m2.state_dict().items(), strict=True):
        assert k1 == k2
        torch.testing.assert_close(v1, v2)


def test_gpt_lm_head_is_tied_to_embedding() -> None:
    model, _ = models.build_gpt(2)
    assert model.lm_head.weight is model.wte.weight


def test_preserved_names_every_other_block() -> None:
    assert models.every_other_block(5) == ("blocks.0", "blocks.2", "blocks.4")
    _, _, ep = models.MODELS["preserved"].make(4)
    fqns = {entry.fqn for entry in ep.module_call_graph}
    assert {"blocks.0", "blocks.2"} <= fqns


def test_loglog_slope_recovers_power_law() -> None:
    points = [(n, 3e-6 * n**1.5) for n in (128, 256, 512, 1024)]
    assert loglog_slope(points) == pytest.approx(1.5)
    assert loglog_slope([(128, 1.0)]) is None


@pytest.mark.slow
def test_runner_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "bench.run", "--models", "repeat", "--sizes", "2"]
    cmd += ["--repeat", "1", "--k", "1", "--no-memory", "--json", str(out)]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=300)
    result = json.loads(out.read_text())
    (record,) = result["models"]["repeat"]["records"]
    assert record["n"] == 2
    assert record["torch"]["error"] is None
    assert record["torch"]["first_output_match"] is True
    assert record["latency"]["ep_module"]["match"] is True
