"""``bench.campaign``: the plan (the budget split evenly over the runnable cells, refused
combinations ``n/a`` with the reason), a cell's worker stopped at its hard limit or dying, the
Markdown report from a made-up result, and real tiny cells (a worker process through the
command line, and in this process, deterministic in its seed). No timing is asserted."""

from __future__ import annotations

import json
import sys
import time

import pytest

from bench import campaign
from bench.bounded import Bounded


def test_the_budget_is_split_evenly_over_every_backend_in_every_mode():
    plan = campaign.plan(1.0, jobs=2)
    assert [(c.backend, c.mode) for c in plan.cells] == [
        (b, m) for b in campaign.DEFAULT_BACKENDS for m in ("plain", "sizes3", "grad")]
    assert "aot_inductor" not in {c.backend for c in plan.cells}
    # decompositions under grad is refused (run_decompositions' graph is inference IR)
    assert [(c.backend, c.mode) for c in plan.cells if c.refused] == [("decompositions", "grad")]
    assert len(plan.runnable) == 14 and plan.wall_seconds == 1800.0
    # 14 runnable cells on 2 workers: 7 rounds of 1800 / 7 s fill the 1800 s wall budget
    assert {c.seconds for c in plan.runnable} == {1800.0 / 7} == {plan.cell_seconds}
    assert {c.seconds for c in plan.cells if c.refused} == {0.0}
    assert sum(c.seconds for c in plan.cells) == pytest.approx(3600.0)  # the CPU hour, all of it
    assert campaign.plan(1.0, jobs=2) == plan  # deterministic


def test_a_combination_the_fuzzer_refuses_is_na_with_its_reason_and_costs_no_budget():
    plan = campaign.plan(0.5, jobs=1, backends=["inductor", "aot_inductor"],
                         modes=["plain", "grad"])
    by_name = {c.name: c for c in plan.cells}
    refused = by_name["aot_inductor-grad"]
    assert "inference only" in refused.refused and refused.seconds == 0
    assert [c.name for c in plan.runnable] == ["inductor-plain", "inductor-grad",
                                               "aot_inductor-plain"]
    assert {c.seconds for c in plan.runnable} == {600.0}  # 1800 s over the 3 that run
    assert campaign.refusal("aot_inductor", "sizes3") == ""
    assert "inference only" in campaign.refusal("decompositions", "grad")
    assert all(campaign.refusal(b, m) == "" for b in campaign.DEFAULT_BACKENDS
               for m in campaign.MODES if (b, m) != ("decompositions", "grad"))


@pytest.mark.parametrize("kwargs", [
    {"cpu_hours": 0}, {"cpu_hours": 1, "jobs": 0}, {"cpu_hours": 1, "backends": ["tvm"]},
    {"cpu_hours": 1, "modes": ["sizes2"]}, {"cpu_hours": 1, "modes": []}])
def test_a_bad_plan_is_refused_naming_what(kwargs):
    with pytest.raises(ValueError):
        campaign.plan(**kwargs)


def test_a_cells_worker_command_is_what_the_worker_parses():
    cell = campaign.Cell("aot_eager", "sizes3", 12.5)
    cmd = campaign.worker_command(cell, shrink_seconds=3.0, seed=7, max_examples=4)
    assert cmd[:3] == [sys.executable, "-m", "bench.campaign"]
    args = campaign._parser().parse_args(cmd[3:])
    assert (args.cell, args.cell_seconds, args.shrink_seconds, args.seed, args.max_examples) == (
        "aot_eager:sizes3", 12.5, 3.0, 7, 4)
    assert campaign.cell_timeout(12.5, 3.0) > 12.5 + 3.0


def _python(code: str) -> Bounded:
    return Bounded.start([sys.executable, "-c", code])


def test_a_worker_past_its_hard_limit_is_a_timeout_with_its_last_progress():
    line = "fuzz: 17 programs in 40 s (25.5/min), 1 new, 0 known, 31 operators"
    worker = _python(f"import time; print({campaign._PROGRESS + line!r}, flush=True); "
                     "print('progress: fuzz: shrinking inductor crash at aten.mul', flush=True);"
                     " time.sleep(60)")
    started = time.time()
    rec = campaign.collect(campaign.Cell("inductor", "plain", 1.0), worker, started + 1.0,
                           started)
    assert rec["status"] == "timeout" and "in shrinking" in rec["reason"]
    assert rec["programs"] == 17 and rec["findings"] == []
    assert rec["last_progress"].endswith("shrinking inductor crash at aten.mul")


def test_a_worker_that_dies_is_a_crash_naming_how():
    worker = _python("import sys; print('Segmentation fault in torch'); sys.exit(3)")
    started = time.time()
    rec = campaign.collect(campaign.Cell("unflatten", "grad", 1.0), worker, started + 60.0,
                           started)
    assert rec["status"] == "crashed"
    assert "exit status 3" in rec["reason"] and "Segmentation fault in torch" in rec["reason"]


def _finding(confirmed: bool, cause: str) -> dict:
    return {"backend": "inductor", "kind": "mismatch", "cause": cause, "reproduced": confirmed,
            "confirmed": confirmed,
            "why_unconfirmed": "" if confirmed else "its repro does not show it when run again",
            "count": 2, "summary": f"inductor: mismatch at {cause} (1 ops, seen 2x): output 0",
            "detail": "output 0", "repro_chars": 120, "repro": "import torch\n",
            "repro_path": None}


RESULT = {
    "setting": {"torch": "2.13.0", "seed": 3, "cpu_hours": 1.0, "jobs": 2, "cell_seconds": 600.0,
                "shrink_seconds": 30.0, "max_examples": None, "modes": ["plain", "grad"]},
    "cells": [
        {"backend": "inductor", "mode": "plain", "status": "ok", "reason": "", "programs": 40,
         "search_seconds": 600.2, "seconds": 650.0, "per_minute": 4.0,
         "operators": {"aten.add.Tensor": 30, "aten.relu.default": 12},
         "features": {"inplace_ops": 9, "constants": 4}, "top_features": [["inplace_ops", 9]],
         "raw": 5, "known": {"inductor.precision_casts": 2}, "unsupported": {}, "skipped": {},
         "unrunnable": {}, "refused": 0, "one_size": 0, "cpu_seconds": 610.0,
         "wall_seconds": 660.0,
         "findings": [_finding(True, "aten.add.Tensor"), _finding(False, "aten.sub.Tensor")]},
        {"backend": "inductor", "mode": "grad", "status": "ok", "reason": "", "programs": 30,
         "search_seconds": 600.0, "seconds": 600.0, "per_minute": 3.0,
         "operators": {"aten.add.Tensor": 20, "aten.tanh.default": 5},
         "features": {"constants": 6}, "top_features": [["constants", 6]], "raw": 0,
         "known": {}, "unsupported": {"documented: export.data_dependent": 1},
         "skipped": {"no floating output depends on an input or parameter": 7},
         "unrunnable": {}, "refused": 0, "one_size": 0, "cpu_seconds": 605.0,
         "wall_seconds": 640.0, "unshrunk": 4, "findings": []},
        campaign.outcome_record("aot_inductor", "grad", "n/a", "inference only"),
        campaign.outcome_record("unflatten", "plain", "timeout", "stopped at its hard limit",
                                programs=12, wall_seconds=900.0),
    ],
}


def test_the_report_has_a_row_per_cell_the_totals_and_the_findings():
    text = campaign.render(RESULT)
    lines = text.splitlines()
    assert lines[0] == "## Fuzzing campaign: torch 2.13.0, seed 3"
    assert "modes: plain (`sizes=1`), grad (`grad=True`)" in text
    header = lines.index("| " + " | ".join(campaign._COLUMNS) + " |")
    rows = lines[header + 2:header + 6]
    assert rows[0] == "| `inductor` | plain | 40 in 600 s | 4.0 | 2 | 5 | 2 | 0 | 0 | 1 | 1 |"
    assert rows[1] == "| `inductor` | grad | 30 in 600 s | 3.0 | 2 | 0 | 0 | 1 | 7 | 0 | 0 |"
    assert rows[2].startswith("| `aot_inductor` | grad | n/a: inference only |")
    assert rows[3].startswith("| `unflatten` | plain | timeout: stopped at its hard limit (its "
                              "search had run 12 programs) |")
    # 70 programs, 610 + 605 measured CPU seconds + 900 s of the stopped worker, 3 operators
    assert ("Totals: 70 programs (and 12 in cells stopped before their report); 2115 CPU "
            "seconds used") in text
    assert "3 distinct operators across cells; 1 confirmed findings, 1 unconfirmed" in text
    assert "Features (union over cells): constants 10, inplace_ops 9." in text
    assert "- `inductor` grad: unsupported: documented: export.data_dependent 1; not " \
           "differentiable: no floating output depends on an input or parameter 7; 4 left as " \
           "drawn (the shrink time was spent)" in text
    found = lines[lines.index("### Findings"):]
    assert "| `inductor` | plain | mismatch | `aten.add.Tensor` | yes | inductor: mismatch at " \
           "aten.add.Tensor (1 ops, seen 2x): output 0 |" in found
    assert any("| `aten.sub.Tensor` | no (its repro does not show it when run again) |" in line
               for line in found)
    totals = campaign.totals(RESULT["cells"])
    assert totals["operators"] == ["aten.add.Tensor", "aten.relu.default", "aten.tanh.default"]
    assert totals["cells"] == {"ok": 2, "n/a": 1, "timeout": 1}
    assert campaign.render(RESULT) == text


def test_a_cells_shrinking_stops_in_time_for_its_last_shrink_within_the_hard_limit():
    for shrink in (1.0, 30.0, 60.0):
        search_end = 600.0
        last_start = search_end + campaign.shrink_total(shrink)
        # the last shrink started takes at most about 4 x shrink_seconds, its repro less than one
        assert last_start + 5 * shrink <= campaign.cell_timeout(600.0, shrink) - \
            campaign.START_MARGIN + 1e-9
        assert campaign.shrink_total(shrink) >= 2 * shrink  # at least two findings shrink


def test_a_report_without_findings_says_none():
    result = {"setting": RESULT["setting"], "cells": RESULT["cells"][1:3]}
    assert campaign.render(result).rstrip().endswith("### Findings\n\nNone.")


def test_a_refusal_at_run_time_is_na_and_a_tiny_cell_is_deterministic_in_its_seed():
    refused = campaign.run_cell("aot_inductor", "grad", 5.0, shrink_seconds=1.0, seed=0)
    assert refused["status"] == "n/a" and "inference only" in refused["reason"]
    runs = [campaign.run_cell("aot_eager", "plain", None, shrink_seconds=1.0, seed=5,
                              max_examples=2) for _ in range(2)]
    assert runs[0]["status"] == "ok" and runs[0]["programs"] >= 1
    keep = ("programs", "operators", "features", "raw", "known", "unsupported", "skipped")
    assert {k: runs[0][k] for k in keep} == {k: runs[1][k] for k in keep}


def test_a_real_tiny_campaign_runs_its_cell_in_a_worker_and_writes_its_report(tmp_path, capsys):
    json_path, md_path = tmp_path / "c.json", tmp_path / "c.md"
    assert campaign.main(["--cpu-hours", "0.001", "--jobs", "1", "--backends", "aot_eager",
                          "--modes", "plain", "--max-examples", "2", "--shrink-seconds", "1",
                          "--json", str(json_path), "--markdown", str(md_path),
                          "--out", str(tmp_path / "out")]) == 0
    result = json.loads(json_path.read_text())
    (rec,) = result["cells"]
    assert (rec["backend"], rec["mode"], rec["status"]) == ("aot_eager", "plain", "ok")
    assert rec["programs"] >= 1 and rec["operators"] and rec["top_features"]
    assert rec["cpu_seconds"] > 0 and rec["wall_seconds"] > 0
    for i, finding in enumerate(rec["findings"]):  # aot_eager seldom gives one
        assert (tmp_path / "out" / f"aot_eager-plain-{i}" / "repro.py").exists()
        assert finding["repro_chars"] == len(finding["repro"])
    printed = capsys.readouterr().out
    assert md_path.read_text() in printed
    assert f"| `aot_eager` | plain | {rec['programs']} in " in printed
