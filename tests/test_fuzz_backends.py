"""The fuzzer's backends where torch's bugs live (``lowering.fuzz``, issue 62): the built-ins
``aot_eager``, ``export_roundtrip`` and ``unflatten``; refusals that are not findings
(``lowering.fuzz.refusals``); narrow miscompiles planted as ``aot_autograd`` backends, each
found as itself with a short repro that shows it with torch alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import fuzz_planted_aot as planted
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ir import import_ep
from ir.node import CALL_FUNCTION
from ir.strategies.programs import programs
from lowering.fuzz import BUILTINS, differential
from lowering.fuzz import refusals as refusals_module
from lowering.fuzz.backends import TARGETS, resolve
from lowering.fuzz.fuzz_programs import default_programs
from lowering.fuzz.judge import ACCEPTS_WHAT_EAGER_REFUSES, Setup
from lowering.fuzz.reduce import isolated, reduce
from lowering.fuzz.refusals import Refusals
from lowering.fuzz.repro import check_repro, repro_script, shortest_repro
from lowering.fuzz.search import Finding
from lowering.fuzz.trial import placed, try_program

HERE = os.path.dirname(os.path.abspath(__file__))

PLANTED = {
    # name: (backend, the operators its findings may be at)
    "alpha": (planted.alpha_ignored, {"aten.add.Tensor"}),
    "sub": (planted.sub_doubled, {"aten.sub.Tensor"}),
    "softmax": (planted.softmax_first_dim, {"aten.softmax.int", "aten.log_softmax.int",
                                           "aten._softmax.default",
                                           "aten._log_softmax.default"}),
}
"""Three narrow miscompiles of AOTAutograd's forward graph: add's alpha dropped, sub's other
operand doubled, softmax and log_softmax of a matrix over dim 0."""


def _small_programs() -> st.SearchStrategy:
    """Small programs that hold an add with alpha (``near_duplicates``) and a softmax, and
    subs as most programs do: the planted run's budget, a dozen compiles per backend."""
    return programs(features=(), always={"near_duplicates", "softmax"}, max_modules=1,
                    max_ops=4, max_nodes=24)


@pytest.fixture(scope="module")
def planted_report():
    backends = {name: b for name, (b, _) in PLANTED.items()}
    backends["identity"] = planted.identity
    return differential(backends, programs=_small_programs(), max_examples=6,
                        shrink_seconds=4)


def _model_lines(repro: str) -> list[str]:
    """The model and its inputs (``Repro``, ``make_inputs``), not the fixed settings after them
    (``CALLS``, ``SIZES``, ``DYNAMIC``, ...)."""
    start = repro.index("class Repro(nn.Module):")
    return [line for line in repro[start:repro.index("\nCALLS = ")].splitlines()
            if line.strip()]


def _as_itself(report, name):
    """The findings of planted backend ``name``: each a mismatch at its operators, at least
    one, each shrunk to one operator call with a short repro that showed it here."""
    causes = PLANTED[name][1]
    found = [f for f in report.findings if f.backend == name]
    assert found and all(f.kind == "mismatch" and f.cause in causes for f in found), \
        [f.summary() for f in report.findings]
    for finding in found:
        assert finding.reproduced is True, finding.summary()
        ops = [n for n in finding.program.root_module.graph.nodes if n.op == CALL_FUNCTION]
        assert len(ops) == 1, finding.summary()
        assert len(_model_lines(finding.repro)) < 20, finding.repro
    return found


@pytest.mark.parametrize("name", list(PLANTED))
def test_each_planted_aot_miscompile_is_reported_as_itself_with_a_short_repro(
        planted_report, name):
    _as_itself(planted_report, name)


@pytest.mark.nightly  # the repro ran in-process above; tests/test_fuzz.py runs one alone
@pytest.mark.parametrize("name", list(PLANTED))
def test_the_repro_shows_the_planted_miscompile_with_torch_alone(planted_report, name,
                                                                  tmp_path):
    backend = PLANTED[name][0]
    finding = _as_itself(planted_report, name)[0]
    (tmp_path / "repro.py").write_text(finding.repro)
    shutil.copy(os.path.join(HERE, "fuzz_planted_aot.py"), tmp_path / "fuzz_planted_aot.py")
    check = textwrap.dedent(f"""
        import sys
        import repro, fuzz_planted_aot
        assert not {{"ir", "lowering", "transforms"}} & set(sys.modules), "purefx was imported"
        found = repro.difference(fuzz_planted_aot.{backend.__name__})
        print("\\n".join(found))
        assert repro.difference(fuzz_planted_aot.identity) == []
        sys.exit(3 if found else 0)
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", check], check=False, cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "values differ" in done.stdout


def test_the_identity_aot_backend_gives_no_finding(planted_report):
    assert not [f for f in planted_report.findings if f.backend == "identity"]
    assert planted_report.examples == 6 and not planted_report.unrunnable


def _set_program():
    class M(torch.nn.Module):
        def forward(self, x, y):
            x.add_(1.0)
            x.set_(y)
            return x * 2

    return import_ep(torch.export.export(M(), (torch.randn(3), torch.randn(3))))


def _alpha_program():
    class M(torch.nn.Module):
        def forward(self, x, b):
            return torch.add(torch.tanh(x), b, alpha=-0.5)

    return import_ep(torch.export.export(M(), (torch.randn(2, 3), torch.randn(3))))


def _crash_finding(backend_spec, program):
    backend = resolve({"b": backend_spec})[0]
    trial = try_program(program, (backend,), Setup())
    verdict = trial.verdicts["b"]
    assert verdict is not None and verdict.kind == "crash", verdict
    return Finding("b", verdict.kind, verdict.detail, program, trial.args, cause=verdict.cause,
                   compiler=backend)


def test_aot_autograd_refusing_set_on_an_input_is_documented_unsupported(monkeypatch):
    finding = _crash_finding(planted.identity, _set_program())
    assert Refusals().classify(finding) == "documented: aot_autograd.set_on_mutated_input"
    # without the table row, the identity compiler through aot_autograd shares the refusal
    monkeypatch.setattr(refusals_module, "DOCUMENTED_UNSUPPORTED", ())
    label = Refusals().classify(finding)
    assert label is not None and label.startswith("shared with aot_identity: AssertionError")


def _crash_on_tanh(module):
    def fw_compiler(gm, example_inputs):
        if any(n.target is torch.ops.aten.tanh.default for n in gm.graph.nodes):
            raise RuntimeError("planted: this compiler cannot lower tanh")
        return gm

    from torch._dynamo.backends.common import aot_autograd

    return torch.compile(module, backend=aot_autograd(fw_compiler=fw_compiler))


def test_a_crash_of_the_backend_alone_stays_a_finding():
    finding = _crash_finding(_crash_on_tanh, _alpha_program())
    assert Refusals().classify(finding) is None
    mismatch = Finding("b", "mismatch", "", _alpha_program(), (), compiler=finding.compiler)
    assert Refusals().classify(mismatch) is None


def test_an_unsupported_refusal_never_takes_the_place_of_the_planted_miscompile():
    """Programs with set_ on an input, which AOTAutograd refuses, beside programs the planted
    backend gets wrong: the refusal is counted as unsupported, the miscompile reported."""
    report = differential({"alpha": planted.alpha_ignored},
                          programs=st.sampled_from([_set_program(), _alpha_program()]),
                          max_examples=6, shrink_seconds=2)
    assert [(f.kind, f.cause) for f in report.findings] == [("mismatch", "aten.add.Tensor")]
    assert report.unsupported == {"documented: aot_autograd.set_on_mutated_input":
                                  report.raw - report.findings[0].count}
    assert sum(report.unsupported.values()) >= 1


def test_isolated_keeps_one_call_with_its_computed_operands_as_inputs():
    p = _alpha_program()
    add = next(n for n in p.root_module.graph.nodes if "add" in str(n.target))
    q = isolated(p, add.name)
    ops = [n for n in q.root_module.graph.nodes if n.op == CALL_FUNCTION]
    assert [str(n.target) for n in ops] == ["aten.add.Tensor"]
    trial = try_program(q, resolve({"alpha": planted.alpha_ignored}), Setup())
    assert trial.eager.error is None and len(trial.args) == 3  # x, b and tanh's value
    assert trial.verdicts["alpha"] is not None
    assert reduce(p, lambda c: True, cause="aten.add.Tensor") is not p


def test_short_repro_draws_large_tensors_from_seeds_and_still_shows_the_bug():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(256, 64))

        def forward(self, x):
            return torch.add(torch.nn.functional.linear(x, self.w), 1.0, alpha=3.0)

    args = (torch.randn(4, 64),)
    p = import_ep(torch.export.export(M(), args))
    state = {"w": M().w.detach()}
    exact = repro_script(p, args, {}, state, target="callable", summary="s")
    short = repro_script(p, args, {}, state, target="callable", summary="s", exact=False)
    # the model and its inputs are short; the settings and harness after them are fixed text
    assert len(exact) > 100_000 and len(short[:short.index("\nCALLS = ")]) < 2_000
    assert len(short) < 12_000
    assert "uniform((256, 64), torch.float32, 1)" in short
    assert check_repro(short, planted.alpha_ignored) != []
    assert check_repro(short, planted.identity) == []


def _wrong_when_a_weight_is_large(module):
    def run(*args):
        out = module(*args)
        state = [*module.parameters(), *module.buffers()]
        big = any(float(t.abs().max()) > 100 for t in state)
        return out * 2 if big else out

    return run


def test_a_finding_that_hangs_on_the_values_gets_the_exact_repro():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor([1000.0] + [0.5] * 15))

        def forward(self, x):
            return x + self.w

    args = (torch.randn(16),)
    p = import_ep(torch.export.export(M(), args))
    state = {"w": M().w.detach()}
    text, problems = shortest_repro(p, args, {}, state, target="callable", summary="s",
                                    compile=_wrong_when_a_weight_is_large)
    assert problems and "1000.0" in text and "uniform(" not in text
    text, problems = shortest_repro(p, args, {}, state, target="callable", summary="s",
                                    compile=planted.identity)
    assert problems == [] and "uniform(" not in text  # nothing shown: the exact one, kept


def test_new_builtins_are_named_and_have_a_reference_and_a_repro():
    assert {"aot_eager", "export_roundtrip", "unflatten"} <= set(BUILTINS)
    for name in BUILTINS:
        backend = resolve({"b": name})[0]
        assert "def compile_backend(module):" in TARGETS[name].repro
        assert backend.reference is None or backend.reference.target in TARGETS
    assert resolve({"u": "unflatten"})[0].wants_calls
    assert not resolve({"i": "inductor"})[0].wants_calls


@pytest.mark.parametrize("name", ["aot_eager", "export_roundtrip", "unflatten"])
def test_each_new_builtin_runs_a_program_as_eager_does(name):
    p = _alpha_program()
    trial = try_program(p, resolve({name: name}), Setup())
    assert trial.eager.error is None and trial.verdicts[name] is None


def test_unflatten_runs_programs_with_their_preserved_calls_and_identity_agrees():
    report = differential({"unflatten": "unflatten", "identity": planted.identity},
                          max_examples=2, shrink_seconds=2)
    assert report.examples == 2 and not report.unrunnable
    assert not [f for f in report.findings if f.backend == "identity"]


@pytest.mark.nightly
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_identity_aot_backend_gives_no_finding_in_low_precision(dtype):
    report = differential({"identity": planted.identity}, max_examples=20, dtype=dtype)
    assert report.findings == () and not report.unrunnable


@settings(max_examples=5, deadline=None)
@given(default_programs(resolve({"u": "unflatten"})))
def test_unflatten_draws_programs_with_preserved_calls(program):
    calls = [path for path in program.call_signatures if path != ""]
    assert calls
    assert placed(program, Setup(), keep_calls=True).call_signatures == program.call_signatures
    assert list(placed(program, Setup()).call_signatures) == [""]


@settings(max_examples=4, deadline=None)
@given(programs(features=(), always={"constants", "buffers"}, max_modules=1, max_ops=3,
                max_nodes=16))
def test_export_roundtrip_reads_state_its_graph_does_not_use_from_the_lowered_module(program):
    """Exported, a constant or buffer nothing reads is left out of the module: not a finding
    (its value is the lowered module's, which the call could not write)."""
    trial = try_program(program, resolve({"rt": "export_roundtrip"}), Setup())
    assert trial.eager.error is None and trial.verdicts["rt"] is None, trial.verdicts["rt"]


@settings(max_examples=3, deadline=None)
@given(programs(features=(), always={"symbolic_sizes"}, max_modules=1, max_ops=3,
                max_nodes=16))
def test_export_roundtrip_takes_a_symbolic_program_at_every_size(program):
    """Under ``sizes=2`` the lowered module of a symbolic program is exported once, with its
    range as a named ``Dim``, and called at both sizes as eager is: no crash, no finding."""
    trial = try_program(placed(program, Setup(sizes=2)),
                        resolve({"rt": "export_roundtrip", "ae": "aot_eager"}), Setup(sizes=2))
    assert len(trial.calls) == 2 and trial.eager.error is None
    assert trial.verdicts == {"rt": None, "ae": None}, trial.verdicts


def test_every_repro_compile_uses_the_scripts_size_settings():
    """A repro of ``sizes=k`` compiles as the fuzzer did: ``torch.compile`` targets with
    ``dynamic=DYNAMIC``, exporting ones with ``dynamic_shapes=DYNAMIC_SHAPES``."""
    for name, target in TARGETS.items():
        if "torch.compile(" in target.repro:
            assert "dynamic=DYNAMIC" in target.repro, name
        if "torch.export.export(" in target.repro:
            assert "dynamic_shapes=DYNAMIC_SHAPES" in target.repro, name


def test_a_refusal_naming_addresses_is_one_refusal():
    a = RuntimeError("s26 (<class 'torch.SymInt'>, 140620181006544)is not tracked with proxy "
                     "for <Tracer object at 0x7fe4b4361b50>")
    b = RuntimeError("s3 (<class 'torch.SymInt'>, 1406201)is not tracked with proxy "
                     "for <Tracer object at 0x7f0000aaf0>")
    assert refusals_module.signature_of(a) == refusals_module.signature_of(b)
    assert refusals_module.signature_of(a) != refusals_module.signature_of(RuntimeError("s1"))


@pytest.mark.nightly
@pytest.mark.parametrize("name", ["aot_eager", "export_roundtrip", "unflatten"])
def test_each_new_builtin_fuzzes_without_unrunnable_programs(name):
    report = differential({name: name}, max_examples=30, shrink_seconds=20)
    assert report.examples == 30 and not report.unrunnable
    assert all(f.backend == name for f in report.findings)


@pytest.mark.nightly
def test_planted_aot_miscompiles_are_found_among_default_programs():
    backends = {name: b for name, (b, _) in PLANTED.items()}
    backends["identity"] = planted.identity
    report = differential(backends, max_examples=30, shrink_seconds=20)
    for name in PLANTED:
        _as_itself(report, name)
    assert not [f for f in report.findings if f.backend == "identity"]


def _dead_half_bessel_program():
    class M(torch.nn.Module):
        def forward(self, x):
            torch.special.bessel_y1(x)  # result unused: compiled graphs drop it
            return x * 2

    return import_ep(torch.export.export(M(), (torch.randn(4, dtype=torch.float16),)))


def _accepts_finding(backend_spec, program):
    backend = resolve({"b": backend_spec})[0]
    trial = try_program(program, (backend,), Setup(dtype=torch.float16))
    verdict = trial.verdicts["b"]
    assert verdict is not None and verdict.detail.startswith(ACCEPTS_WHAT_EAGER_REFUSES), verdict
    return Finding("b", verdict.kind, verdict.detail, program, trial.args, cause=verdict.cause,
                   compiler=backend, setup=Setup(dtype=torch.float16))


def test_an_input_eager_refuses_that_the_reference_accepts_too_is_not_the_backends():
    """CPU eager refuses bessel_y1 in float16; in dead code the identity compiler through
    aot_autograd drops it and runs, and so does its reference: the machinery's, not a
    finding."""
    finding = _accepts_finding(planted.identity, _dead_half_bessel_program())
    label = Refusals().classify(finding)
    assert label == "accepted by aot_identity too: NotImplementedError: " \
                    "\"bessel_yN_cpu\" not implemented for 'Half'"


def _refusing_like_eager(module):
    """A backend that runs what eager refuses, where its reference (aot_identity) refuses."""
    from torch._dynamo.backends.common import aot_autograd

    def fw_compiler(gm, example_inputs):
        for node in list(gm.graph.nodes):
            if node.target is torch.ops.aten.special_bessel_y1.default:
                node.target = torch.ops.aten.neg.default
        gm.recompile()
        return gm

    return torch.compile(module, backend=aot_autograd(fw_compiler=fw_compiler))


def test_an_input_eager_refuses_that_only_the_backend_accepts_stays_a_finding():
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.special.bessel_y1(x) * 2

    program = import_ep(torch.export.export(M(), (torch.randn(4, dtype=torch.float16),)))
    finding = _accepts_finding(_refusing_like_eager, program)
    assert Refusals().classify(finding) is None


def test_the_identity_aot_backend_gives_no_finding_where_eager_refuses_dead_code():
    report = differential({"identity": planted.identity}, max_examples=1, dtype=torch.float16,
                          programs=st.just(_dead_half_bessel_program()))
    assert report.findings == ()
    assert report.unsupported == {"accepted by aot_identity too: NotImplementedError: "
                                  "\"bessel_yN_cpu\" not implemented for 'Half'": 1}


def test_a_value_that_differs_is_never_replayed_as_a_refusal(monkeypatch):
    """Only crashes and inputs eager refuses are replayed (``Refusals.classify``); a value that
    differs is a finding at once, at no cost."""
    replays = []
    monkeypatch.setattr(refusals_module, "refusal", lambda *a, **k: replays.append(a))
    backend = resolve({"b": planted.identity})[0]
    for kind, detail in (("mismatch", "output 0: 4 of 4 values differ"),
                         ("grad", "gradient of input 0: 4 of 4 values differ")):
        finding = Finding("b", kind, detail, _alpha_program(), (), compiler=backend)
        assert Refusals().classify(finding) is None
    assert replays == []
