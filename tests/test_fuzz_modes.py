"""The fuzzer's modes (``differential(..., sizes=k, grad=True)``): a planted backend wrong only
at a size other than the first, and one whose forward is right and gradients wrong, are each
found, and their repros show them again with torch alone; a correct backend gives nothing in
either mode; the sizes are picked within the dynamic dimension's range."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import fuzz_planted as planted
import pytest
import torch
from hypothesis import strategies as st

from ir import import_ep
from lowering.fuzz import FuzzError, differential
from lowering.fuzz.backends import resolve
from lowering.fuzz.call_sizes import size_sets
from lowering.fuzz.command import _parser, report_text
from lowering.fuzz.command import main as fuzz_main
from lowering.fuzz.judge import Setup
from lowering.fuzz.trial import try_program

HERE = os.path.dirname(os.path.abspath(__file__))


def _shows_with_torch_alone(finding, backend: str, tmp_path, expect: str) -> str:
    """Run the finding's repro in a subprocess without purefx: it shows the difference with the
    planted backend ``backend`` (an attribute of ``fuzz_planted``) and none with eager."""
    (tmp_path / "repro.py").write_text(finding.repro)
    shutil.copy(os.path.join(HERE, "fuzz_planted.py"), tmp_path / "fuzz_planted.py")
    check = textwrap.dedent(f"""
        import sys
        import repro, fuzz_planted
        assert not {{"ir", "lowering", "transforms"}} & set(sys.modules), "purefx was imported"
        found = repro.difference(fuzz_planted.{backend})
        print("\\n".join(found))
        assert repro.difference(fuzz_planted.eager) == []
        sys.exit(3 if found else 0)
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", check], check=False, cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stdout + done.stderr
    assert expect in done.stdout, done.stdout
    return done.stdout


@pytest.fixture(scope="module")
def modes_report():
    """Both planted backends fuzzed together at three sizes with gradients (each sees the
    programs it would see alone; the modes compose)."""
    return differential({"rows": planted.rows_of_first_call,
                         "grad": planted.scaled_activation_grad},
                        sizes=3, grad=True, max_examples=8, shrink_seconds=1)


def test_a_backend_wrong_only_after_the_first_size_is_found_at_its_call(modes_report, tmp_path):
    found = [f for f in modes_report.findings if f.backend == "rows"]
    assert found and {f.kind for f in found} == {"mismatch"}, \
        [f.summary() for f in modes_report.findings]
    finding = found[0]
    assert finding.call >= 1 and finding.sizes, finding.summary()
    assert len(finding.calls) == finding.call + 1
    assert finding.sizes == finding.calls[-1][0] != finding.calls[0][0]
    assert finding.reproduced is True
    assert f"in call {finding.call}" in finding.summary()
    out = _shows_with_torch_alone(finding, "rows_of_first_call", tmp_path, "call 1 (")
    assert "call 0 (" not in out  # right at the first size
    # called at its first size only, the same backend gives nothing on the shrunk program
    once = try_program(finding.program, (finding.compiler,), Setup())
    assert once.verdicts["rows"] is None and len(once.calls) == 1


def test_a_backend_right_forward_wrong_gradients_is_found_as_grad(modes_report, tmp_path):
    found = [f for f in modes_report.findings if f.backend == "grad"]
    assert found and {f.kind for f in found} == {"grad"}, \
        [f.summary() for f in modes_report.findings]  # the forward is right
    finding = found[0]
    assert "gradient of" in finding.detail and finding.reproduced is True
    assert modes_report.examples == 8 and modes_report.one_size == 0
    _shows_with_torch_alone(finding, "scaled_activation_grad", tmp_path, "gradient of")
    forward = try_program(finding.program, (finding.compiler,), Setup(sizes=3))
    assert forward.verdicts["grad"] is None  # without gradients: nothing


def test_a_correct_backend_gives_no_finding_in_either_mode():
    report = differential({"eager": planted.eager}, sizes=3, grad=True, max_examples=8)
    assert report.findings == () and report.raw == 0, [f.summary() for f in report.findings]
    assert report.examples == 8 and not report.unrunnable and report.one_size == 0
    assert "not differentiable" in report_text(report)


def _program(module: torch.nn.Module, *args: torch.Tensor, dynamic=None):
    return import_ep(torch.export.export(module, args, dynamic_shapes=dynamic))


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        return torch.tanh(x * self.w).sum(0)


def test_sizes_are_picked_in_the_range_first_the_drawn_one():
    batch = torch.export.Dim("batch", min=3, max=6)
    p = _program(_Scaled(), torch.randn(4, 4), dynamic=({0: batch},))
    sets = size_sets(p, 4)
    name = next(iter(sets[0]))
    assert [s[name] for s in sets] == [4, 5, 6, 3]  # hint, above, the top, then below
    assert size_sets(p, 9)[-1][name] == 3 and len(size_sets(p, 9)) == 4  # no two alike
    assert size_sets(_program(_Scaled(), torch.randn(4, 4)), 3) == ({},)  # static: one call
    trial = try_program(p, resolve({"rows": planted.rows_of_first_call}), Setup(sizes=3))
    assert [tuple(c.args[0].shape) for c in trial.calls] == [(4, 4), (5, 4), (6, 4)]


def test_gradients_of_inputs_and_parameters_are_compared_and_skips_counted():
    p = _program(_Scaled(), torch.randn(3, 4))
    trial = try_program(p, resolve({"g": planted.scaled_activation_grad, "e": planted.eager}),
                        Setup(grad=True))
    assert set(trial.eager.grads) == {"input 0", "parameter 'w'"}
    assert all(bool(g.abs().sum() > 0) for g in trial.eager.grads.values())  # both reached
    assert trial.verdicts["e"] is None
    verdict = trial.verdicts["g"]
    assert verdict.kind == "grad" and verdict.cause == "aten.mul.Tensor"  # before localizing
    assert try_program(p, resolve({"g": planted.scaled_activation_grad}),
                       Setup()).verdicts["g"] is None  # forward only: nothing

    class Integers(torch.nn.Module):
        def forward(self, x):
            return x * 2

    ints = _program(Integers(), torch.arange(4))
    skipped = try_program(ints, resolve({"e": planted.eager}), Setup(grad=True))
    assert skipped.skipped is not None and "differentiabl" in skipped.skipped
    report = differential({"e": planted.eager}, programs=st.just(ints), max_examples=1,
                          grad=True)
    assert sum(report.skipped.values()) == 1 and report.findings == ()


def test_bad_mode_arguments_are_named():
    with pytest.raises(FuzzError, match="sizes must be a positive int"):
        differential({"x": planted.eager}, sizes=0)
    with pytest.raises(FuzzError, match="grad must be a bool"):
        differential({"x": planted.eager}, grad="yes")
    with pytest.raises(FuzzError, match="inference only"):
        differential({"x": "aot_inductor"}, grad=True)
    with pytest.raises(FuzzError, match="inference only.*run_decompositions"):
        differential({"x": "decompositions"}, grad=True)  # torch's inference IR: no backward
    args = _parser().parse_args(["--backend", "inductor", "--sizes", "3", "--grad"])
    assert args.sizes == 3 and args.grad is True
    assert fuzz_main(["--backend", "aot_inductor", "--grad"]) == 2  # named, nothing run


def test_inductor_compiles_with_dynamic_true_under_sizes(monkeypatch):
    seen = []
    monkeypatch.setattr(torch, "compile", lambda module, **kw: seen.append(kw) or module)
    p = _program(_Scaled(), torch.randn(3, 4))
    backend = resolve({"inductor": "inductor"})[0]
    backend.build(p, torch.nn.Identity(), Setup(sizes=3))
    backend.build(p, torch.nn.Identity(), Setup())
    assert seen == [{"dynamic": True}, {"dynamic": None}]


@pytest.mark.nightly
def test_inductor_compiles_for_every_size_and_agrees_with_eager():
    """``"inductor"`` under ``sizes > 1`` compiles once with ``dynamic=True``; on a small
    program it agrees with eager at every size, forward and gradients (17 s on 2 cores)."""
    batch = torch.export.Dim("batch", min=2, max=8)
    p = _program(_Scaled(), torch.randn(3, 4), dynamic=({0: batch},))
    trial = try_program(p, resolve({"inductor": "inductor"}), Setup(sizes=3, grad=True))
    assert len(trial.calls) == 3 and trial.verdicts["inductor"] is None


def test_an_exporting_backend_gets_the_programs_dynamic_shapes():
    """``export_dynamic_shapes``: ``torch.export.export`` of the lowered module (keyword inputs
    included) keeps the batch dynamic, and the export runs at every size of ``size_sets``."""
    from lowering.fuzz.call_sizes import export_dynamic_shapes
    from lowering.fuzz.judge import example_inputs, reference_module

    class Keyword(torch.nn.Module):
        def forward(self, x, *, y):
            return torch.relu(x) * y

    batch = torch.export.Dim("batch", min=2, max=8)
    p = _program_kw(Keyword(), (torch.randn(3, 4),), {"y": torch.randn(3, 4)},
                    {"x": {0: batch}, "y": {0: batch}})
    module = reference_module(p, Setup())
    shapes = export_dynamic_shapes(p, module)
    assert set(shapes) == {"x", "y"} and shapes["x"][0] is shapes["y"][0]
    args, kwargs = example_inputs(p, Setup())
    run = torch.export.export(module, args, kwargs, dynamic_shapes=shapes).module()
    for i, sizes in enumerate(size_sets(p, 3)):
        a, k = example_inputs(p, Setup(), sizes, i)
        assert torch.equal(run(*a, **k), module(*a, **k))
    assert export_dynamic_shapes(_program(_Scaled(), torch.randn(3, 4)), module) is None


def _program_kw(module, args, kwargs, dynamic):
    return import_ep(torch.export.export(module, args, kwargs, dynamic_shapes=dynamic))


def test_a_repro_with_gradients_runs_a_buffer_written_from_the_inputs():
    """A buffer written with a value that requires grad: the repro's eager run backpropagates
    (its buffer is a tensor of its own, not a view of its literal) and finds no difference."""
    from lowering.fuzz.judge import reference_module, state_value
    from lowering.fuzz.repro import check_repro, repro_script

    class Buffer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("b", torch.zeros(4))

        def forward(self, x):
            y = torch.tanh(x)
            out = y * 2 + self.b  # reads what the last call wrote
            self.b.copy_(y.mean(0))
            return out

    batch = torch.export.Dim("batch", min=2, max=8)
    p = _program(Buffer(), torch.randn(3, 4), dynamic=({0: batch},))
    trial = try_program(p, resolve({"e": planted.eager}), Setup(grad=True, sizes=3))
    assert trial.verdicts["e"] is None and trial.eager.grads
    assert len(trial.calls) == 3  # the buffer's graph is not carried into the next backward
    module = reference_module(p, Setup())
    state = {fqn: state_value(module, fqn) for fqn in p.state}
    text = repro_script(p, trial.args, trial.kwargs, state, target="callable", summary="s",
                        grad=True)
    assert "GRAD = True" in text
    assert check_repro(text, planted.eager) == []
    found = check_repro(text, planted.scaled_activation_grad)
    assert found and all("gradient of" in line for line in found), found
