"""Smoke tests for the benchmark: every model exports, and the runner runs.

No timing is asserted anywhere; these only keep ``bench/`` from rotting.
"""

from __future__ import annotations

import json
import shutil
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


def test_instruction_counts_are_read_per_stage_in_dump_order() -> None:
    from bench.instructions import STAGES, InstructionsError, stage_counts

    dumps = [f"events: Ir\nsummary: {k * 1000}\n" for k in range(1, len(STAGES) + 1)]
    dumps[-1] = dumps[-1].replace("summary", "totals")
    assert stage_counts(dumps) == {s: k * 1000 for k, s in enumerate(STAGES, 1)}
    with pytest.raises(InstructionsError, match="expected 4 callgrind dumps, found 3"):
        stage_counts(dumps[:3])
    with pytest.raises(InstructionsError, match="stage 'lower' has no count"):
        stage_counts(dumps[:2] + ["events: Ir\n"] + dumps[3:])


# nightly: the benchmark itself under callgrind, ~50 s of CPU (8 min on a busy 2-core machine);
# the dump parsing is checked above without valgrind
@pytest.mark.slow
@pytest.mark.nightly
@pytest.mark.skipif(not shutil.which("valgrind"), reason="valgrind is not installed")
def test_instruction_counts_under_callgrind(tmp_path: Path) -> None:
    out = tmp_path / "counts.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.instructions", "--models", "deep", "--n", "2",
         "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    counts = json.loads(out.read_text())["instructions"]["deep"]
    assert set(counts) == {"import", "transform", "lower", "call"}
    assert all(v > 100_000 for v in counts.values())


def _call_overhead_run() -> None:
    from bench import call_overhead

    call_overhead.run(["linear"], rounds=1, calls=1, with_breakdown=False)


def _strategies_main() -> None:
    from bench import strategies

    assert strategies.main(["--draws", "2"]) == 0


@pytest.mark.parametrize("bench_run", [_call_overhead_run, _strategies_main],
                         ids=["call_overhead", "strategies"])
def test_a_bench_run_in_process_gives_the_callers_thread_count_back(bench_run) -> None:
    """The timed runs use one torch thread and restore the caller's count, raised or not (the
    bench smoke tests, run in a suite's worker, left it one thread of the two it was given)."""
    from bench.threads import one_thread

    caller = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        bench_run()
        assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError, match="inside"), one_thread():
            assert torch.get_num_threads() == 1
            raise RuntimeError("inside")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(caller)


def test_call_overhead_runs_every_caller_on_small_models(tmp_path: Path) -> None:
    """``bench/call_overhead.py`` at its smallest: one round of one call, every caller checked
    against eager, the breakdown's pieces present (no timing is asserted)."""
    from bench import call_overhead

    out = tmp_path / "calls.json"
    assert call_overhead.main(
        ["--models", "linear,dict_kwarg,preserved", "--rounds", "1", "--calls", "1",
         "--json", str(out)]
    ) == 0
    result = json.loads(out.read_text())
    assert set(result) == {"linear", "dict_kwarg", "preserved"}
    for record in result.values():
        assert set(record["us"]) == {"eager", "floor", "ep.module()", "purefx"}
        assert all(v > 0 for v in record["us"].values())
        # one round: the paired ratio is that round's ratio, the ratio of the medians
        assert record["paired"]["purefx / floor"] == pytest.approx(
            record["us"]["purefx"] / record["us"]["floor"]
        )
        assert {"flatten", "checks", "body", "submodules", "unflatten", "entry", "call"} <= set(
            record["breakdown"]
        )


@pytest.mark.slow
def test_call_overhead_builds_the_gpt2_and_transformer_cases() -> None:
    from bench import call_overhead

    result = call_overhead.run(["transformer2", "gpt2"], rounds=1, calls=1, with_breakdown=False)
    assert set(result) == {"transformer2", "gpt2"}


def test_paired_ratio_is_the_median_of_ratios_taken_in_the_same_round() -> None:
    """Round by round: 2/1, 3/2, 40/10 -> median 2.0, where the ratio of the medians is
    3/2 = 1.5 (the slow third round weighs on both callers)."""
    from bench import call_overhead

    samples = {"purefx": [2.0, 3.0, 40.0], "floor": [1.0, 2.0, 10.0]}
    assert call_overhead.paired_ratio(samples, "purefx", "floor") == 2.0
    assert call_overhead.paired_ratio(samples, "floor", "purefx") == 0.5


def test_strategies_bench_draws_both_strategies(capsys: pytest.CaptureFixture[str]) -> None:
    """``bench/strategies.py`` at its smallest: a row per strategy (no timing asserted)."""
    from bench import strategies

    assert strategies.main(["--draws", "3"]) == 0
    out = capsys.readouterr().out
    assert "| programs() |" in out and "| programs_like(MLP) |" in out


def test_cuda_bench_runs_on_the_cpu(tmp_path: Path) -> None:
    """``bench/cuda.py``'s dry run on the CPU (``--device cpu --quick``), two models in two
    dtypes: the cheap routes give eager's outputs exactly, the report is written."""
    from bench import cuda

    out = tmp_path / "cuda.md"
    rc = cuda.main(["--device", "cpu", "--quick", "--models", "mlp,conv_bn_train",
                    "--dtypes", "float32,bfloat16", "--no-attention", "--calls", "1",
                    "--out", str(out)], watchdog=False)
    assert rc == 0
    report = out.read_text()
    cells = json.loads((tmp_path / "cuda.json").read_text())["cells"]
    assert len(cells) == 2 * 2 * len(cuda.CHEAP_ROUTES)
    assert all(c["status"] == "pass" and c["error"] == 0.0 for c in cells), cells
    assert "| conv_bn_train | bfloat16 | export_ep | 0 | pass (exact) |" in report


def test_cuda_bench_skips_what_its_budget_leaves_no_time_for(tmp_path: Path) -> None:
    from bench import cuda

    out = tmp_path / "cuda.md"
    assert cuda.main(["--device", "cpu", "--quick", "--models", "mlp", "--dtypes", "float32",
                      "--budget", "0", "--out", str(out)], watchdog=False) == 0
    report = out.read_text()
    assert report.count("skipped: out of time") == len(cuda.CHEAP_ROUTES)
    assert "attention: out of time" in report


def test_cuda_bench_aoti_cases_put_float32_first() -> None:
    from bench import cuda

    cases = cuda.aoti_cases(["mlp", "gpt2", "bert"], ["bfloat16", "float32"])
    assert cases == [("mlp", "float32"), ("gpt2", "float32"), ("bert", "float32"),
                     ("mlp", "bfloat16"), ("gpt2", "bfloat16")]
    assert cuda.compare({"a": torch.ones(2)}, {"a": torch.ones(2)}, torch.float32)[:2] == (0.0, True)
    err, ok, why = cuda.compare((torch.ones(2),), (torch.zeros(2),), torch.float16)
    assert (err, ok) == (1.0, False) and "output 0" in why


class _Worker:
    """A finished AOTI worker as ``collect_aoti`` sees it (``bench.bounded.Bounded.finish``):
    what it printed, how it ended, whether the deadline stopped it."""

    def __init__(self, cells: list[tuple[str, str]], returncode: int,
                 stopped: bool = False) -> None:
        self.out = "\n".join(json.dumps({"model": m, "dtype": d, "route": "aoti",
                                         "status": "pass"}) for m, d in cells)
        self.returncode = returncode
        self.stopped = stopped

    def finish(self, until: float) -> tuple[str, int, bool]:
        return self.out, self.returncode, self.stopped


def test_cuda_bench_aoti_worker_crash_costs_one_cell_and_restarts() -> None:
    """A worker that dies on a case (a segfault in the load, as on torch 2.11) leaves that cell
    an error naming the signal; a new worker takes the cases after it."""
    import time

    from bench import cuda

    cases = [("mlp", "float32"), ("gpt2", "float32"), ("bert", "float32")]
    started: list[list[tuple[str, str]]] = []

    def restart(rest: list[tuple[str, str]]) -> _Worker:
        started.append(rest)
        return _Worker(rest, 0)

    cells = cuda.collect_aoti(_Worker(cases[:1], -11), cases, time.time() + 60, restart=restart)
    assert [(c.model, c.status) for c in cells] == [
        ("mlp", "pass"), ("gpt2", "error"), ("bert", "pass")]
    assert "SIGSEGV" in cells[1].note
    assert started == [cases[2:]]


def test_cuda_bench_aoti_worker_crash_without_restart_leaves_the_rest_unrun() -> None:
    import time

    from bench import cuda

    cases = [("mlp", "float32"), ("gpt2", "float32")]
    cells = cuda.collect_aoti(_Worker([], 1), cases, time.time() + 60)
    assert cells[0].status == "error" and "exit status 1" in cells[0].note
    assert cells[1].status == "skipped" and "out of time" in cells[1].note
