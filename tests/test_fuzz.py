"""The differential fuzzer (``lowering.fuzz``): planted narrow miscompiles are found, shrunk and
reproduced by a standalone script; a correct backend gives nothing; the tolerance sees a float32
difference of 1e-4 of the output scale; the known deviations still exist in torch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import attrs
import fuzz_planted as planted
import pytest
import torch

from ir import import_ep
from lowering.fuzz import PRECISION_CASTS, Finding, FuzzError, differential
from lowering.fuzz.backends import resolve
from lowering.fuzz.cli import main as fuzz_main
from lowering.fuzz.cli import write_report
from lowering.fuzz.judge import Setup, Side, compare
from lowering.fuzz.localize import truncated
from lowering.fuzz.trial import try_program

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def alpha_report():
    """The planted miscompile (add's alpha dropped when an operand broadcasts), fuzzed with
    the default budget (200 programs)."""
    return differential({"planted": planted.drop_alpha_when_broadcast}, shrink_seconds=5)


def test_planted_broadcast_alpha_is_found_shrunk_and_localized(alpha_report):
    found = [f for f in alpha_report.findings if f.cause == "aten.add.Tensor"]
    assert alpha_report.examples == 200
    assert found, [f.summary() for f in alpha_report.findings]
    finding = found[0]
    assert finding.kind == "mismatch" and finding.backend == "planted"
    assert finding.reproduced is True
    ops = [n for n in finding.program.root_module.graph.nodes if n.op == "call_function"]
    assert len(ops) <= 3, finding.summary()
    assert "class Repro(nn.Module)" in finding.repro and "def make_inputs()" in finding.repro


def test_repro_shows_the_difference_with_torch_alone(alpha_report, tmp_path):
    finding = next(f for f in alpha_report.findings if f.cause == "aten.add.Tensor")
    (tmp_path / "repro.py").write_text(finding.repro)
    shutil.copy(os.path.join(HERE, "fuzz_planted.py"), tmp_path / "fuzz_planted.py")
    check = textwrap.dedent("""
        import sys
        import repro, fuzz_planted
        assert not {"ir", "lowering", "transforms"} & set(sys.modules), "purefx was imported"
        found = repro.difference(fuzz_planted.drop_alpha_when_broadcast)
        print("\\n".join(found))
        assert repro.difference(fuzz_planted.eager) == []
        sys.exit(3 if found else 0)
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", check], check=False, cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "values differ" in done.stdout
    # run as a script, it compares eager with itself (the callable stands in for your backend)
    plain = subprocess.run([sys.executable, "repro.py"], check=False, cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stdout + plain.stderr


def test_report_counts_and_writes_one_folder_per_finding(alpha_report, tmp_path):
    assert alpha_report.raw >= len(alpha_report.findings) >= 1
    assert "aten.add.Tensor" in alpha_report.operators
    assert "buffer_mutation" in alpha_report.features
    assert alpha_report.per_minute > 0
    text = write_report(alpha_report, str(tmp_path / "out"))
    folders = [d for d in os.listdir(tmp_path / "out") if os.path.isdir(tmp_path / "out" / d)]
    assert len(folders) == len(alpha_report.findings)
    for d in folders:
        assert sorted(os.listdir(tmp_path / "out" / d)) == ["program.txt", "repro.py",
                                                            "summary.txt"]
    assert "programs in" in text and "operators reached" in text


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "cause"), [
    (planted.sum_for_keepdim_mean, "aten.mean.dim"),
    (planted.skip_add_on_clone, "aten.add_.Tensor"),
])
def test_other_planted_miscompiles_are_found(backend, cause):
    report = differential({"planted": backend}, shrink_seconds=5)
    assert cause in {f.cause for f in report.findings}, [f.summary() for f in report.findings]
    assert all(f.reproduced for f in report.findings)


def test_a_correct_backend_gives_no_finding():
    report = differential({"eager": planted.eager}, max_examples=40)
    assert report.findings == () and report.raw == 0
    assert report.examples == 40 and not report.unrunnable


def _sides(want: torch.Tensor, got: torch.Tensor) -> tuple[Side, Side]:
    return Side(outputs=(got,)), Side(outputs=(want,))


def _program():
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x)

    return import_ep(torch.export.export(M(), (torch.ones(2, 4),)))


def test_float32_difference_of_1e_4_of_the_output_scale_is_a_finding():
    p = _program()
    want = torch.linspace(-2.0, 2.0, 8)
    off = want.clone()
    off[3] += 1e-4 * 2.0  # 1e-4 of the output scale (2.0), at a small value
    got, ref = _sides(want, off)
    verdict = compare(p, got, ref)
    assert verdict is not None and verdict.kind == "mismatch" and verdict.where == ("output", 0)
    assert verdict.cause == "aten.relu.default"
    close = want.clone()
    close[3] += 1e-7  # a rounding difference
    assert compare(p, *_sides(want, close)) is None


def test_crash_and_accepting_what_eager_refuses_are_findings():
    p = _program()
    ok = Side(outputs=(torch.ones(2),))
    broken = Side(error=("RuntimeError", "aten::mm shape mismatch"))
    crash = compare(p, broken, ok)
    assert crash.kind == "crash" and crash.cause == "aten.mm"
    accepts = compare(p, ok, broken)
    assert accepts.kind == "mismatch" and "refuses" in accepts.detail
    assert compare(p, broken, broken) is None


def test_truncated_program_returns_the_cut_node():
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.tanh(torch.relu(x) + 1.0)

    p = import_ep(torch.export.export(M(), (torch.ones(2, 4),)))
    relu = next(n for n in p.root_module.graph.nodes if "relu" in str(n.target))
    cut = truncated(p, relu.name)
    trial = try_program(cut, resolve({"eager": planted.eager}), Setup())
    assert trial.eager.error is None
    assert torch.equal(trial.eager.outputs[0], torch.relu(trial.args[0]))


def test_bad_arguments_are_named():
    with pytest.raises(FuzzError, match="unknown built-in 'tvm'"):
        differential({"x": "tvm"})
    with pytest.raises(FuzzError, match="max_examples"):
        differential({"x": planted.eager}, max_examples=0)
    with pytest.raises(SystemExit):
        fuzz_main(["--backend", "tvm"])


def _half_round_trip_program():
    class M(torch.nn.Module):
        def forward(self, x, w):
            h = (x.to(torch.float16) * 3.0).to(torch.float32)
            return h + w

    args = (torch.randn(64), torch.randn(64))
    return import_ep(torch.export.export(M(), args))


@pytest.mark.slow
def test_inductor_precision_cast_elision_still_exists_and_is_classified_known():
    """Inductor keeps a fused float16 intermediate in float32 (documented at
    torch._inductor.config.emulate_precision_casts): the difference is there, and it is gone
    under that setting, so the built-in predicate holds."""
    p = _half_round_trip_program()
    backend = resolve({"inductor": "inductor"})
    trial = try_program(p, backend, Setup())
    verdict = trial.verdicts["inductor"]
    assert verdict is not None and verdict.kind == "mismatch", "the deviation is gone"
    finding = Finding("inductor", verdict.kind, verdict.detail, p, trial.args, trial.kwargs,
                      cause=verdict.cause, compiler=backend[0])
    assert PRECISION_CASTS(finding)


def test_known_predicate_does_not_explain_a_real_bug_in_a_half_program():
    """A difference that survives emulate_precision_casts=True is not the documented one."""
    p = _half_round_trip_program()

    def off_by_one_percent(module):
        return lambda *args: module(*args) * 1.01

    backend = resolve({"planted": off_by_one_percent})[0]
    finding = Finding("planted", "mismatch", "", p, (), compiler=backend)
    assert PRECISION_CASTS(finding) is False
    assert PRECISION_CASTS(attrs.evolve(finding, kind="crash")) is False
    agreeing = Finding("eager", "mismatch", "", p, (), compiler=resolve({"e": planted.eager})[0])
    assert PRECISION_CASTS(agreeing) is True  # no difference left under the setting


@pytest.mark.slow
def test_inductor_drops_add_alpha_after_matmul():
    """torch 2.13 CPU inductor: torch.add(x @ w, b, alpha=2.0) gives x @ w + b (the add fused
    into the matmul loses its alpha). The judge sees it and localizes it at the add."""

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 4))
            self.b = torch.nn.Parameter(torch.randn(4))

        def forward(self, x):
            return torch.add(x @ self.w, self.b, alpha=2.0)

    p = import_ep(torch.export.export(M(), (torch.randn(3, 4),)))
    backend = resolve({"inductor": "inductor"})
    trial = try_program(p, backend, Setup())
    verdict = trial.verdicts["inductor"]
    if verdict is None:
        pytest.skip("this torch's inductor keeps add's alpha after a matmul (fixed upstream)")
    assert verdict.kind == "mismatch" and verdict.error > 0.1
    assert verdict.cause == "aten.add.Tensor"


@pytest.mark.slow
def test_purefx_fuzz_command_writes_its_report(tmp_path, capsys):
    from lowering.cli import main

    out = tmp_path / "out"
    status = main(["fuzz", "--backend", "decompositions", "--seconds", "0",
                   "--max-examples", "3", "--out", str(out)])
    assert status in (0, 1)
    report = (out / "report.txt").read_text()
    assert "3 programs in" in report and "operators reached" in report
    assert capsys.readouterr().out == report
    assert len([d for d in os.listdir(out) if (out / d).is_dir()]) == (status == 1) * len(
        [line for line in report.splitlines() if line.startswith("  ")])


def test_the_time_budget_is_spent_and_user_known_predicates_are_asked():
    asked = []

    def everything_is_known(finding):
        asked.append(finding.key)
        return True

    def always_off(module):
        def run(*args, **kwargs):
            out = module(*args, **kwargs)
            return torch.utils._pytree.tree_map(
                lambda t: t * 1.01 + 0.01 if isinstance(t, torch.Tensor)
                and t.is_floating_point() else t, out)

        return run

    report = differential({"off": always_off}, seconds=4, known=(everything_is_known,))
    assert report.search_seconds >= 4 and report.examples > 3
    assert report.findings == ()
    assert asked and report.known.get("everything_is_known") == len(asked)


def test_repro_leaves_out_inputs_the_program_no_longer_uses():
    from lowering.fuzz.repro import check_repro, repro_script

    class M(torch.nn.Module):
        def forward(self, x, unused, w):
            w.add_(1.0)
            return torch.relu(x)

    args = (torch.randn(3), torch.randn(5), torch.randn(2))
    p = import_ep(torch.export.export(M(), args))
    text = repro_script(p, args, {}, {}, target="callable", summary="s")
    scope: dict = {"__name__": "r"}
    exec(text, scope)  # noqa: S102 - our own generated script
    made = scope["make_inputs"]()
    assert [tuple(t.shape) for t in made] == [(3,), (2,)]  # x read, w written; unused dropped
    assert torch.equal(made[0], args[0]) and torch.equal(made[1], args[1 + 1])
    assert "def forward(self, x, w):" in text
    assert check_repro(text, planted.eager) == []
