"""The four passes of ``docs/passes.md`` (``docs/examples/passes``), so that the doc never rots:
each on an MLP and a tiny GPT-2, flat and outlined, against eager; each with its law test; the
same passes written with plain torch.fx (``docs/examples/passes_fx``) against eager too, and
longer (lines counted as ``bench.edit`` counts them)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import Phase, settings
from torch.overrides import TorchFunctionMode

from bench.edit import code_lines
from docs.examples.passes import cse, fake_quant, fold, models, observe
from docs.examples.passes_fx import cse as cse_fx
from docs.examples.passes_fx import fake_quant as fake_quant_fx
from docs.examples.passes_fx import fold as fold_fx
from docs.examples.passes_fx import observe as observe_fx
from ir import format_program, import_ep, verify
from lowering import lower
from lowering.pass_laws import LawViolation, check_laws, check_program
from tests.examples.beforeafter import program
from tests.outlined_programs import outlined_programs
from transforms import transform

ROOT = Path(__file__).resolve().parents[1]
PASSES = ("fake_quant", "observe", "fold", "cse")
MODELS = ["mlp", pytest.param("gpt2", marks=pytest.mark.skipif(
    inspect.importlib.util.find_spec("transformers") is None, reason="needs transformers"))]


def _logits(y):
    y = y[0] if isinstance(y, (tuple, list)) else y
    y = y["logits"] if isinstance(y, dict) else y
    return getattr(y, "logits", y)


def _programs(name):
    model, args = getattr(models, name)()
    ep = torch.export.export(model, args)
    p = import_ep(ep)
    return model, args, ep, {"flat": p, "outlined": transform(p)}


class _Quantized(TorchFunctionMode):
    """Eager reference of ``quantize_linears``: the large weights of ``linear``/``addmm``."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        at = {F.linear: 1, torch.addmm: 2}.get(func)
        if at is not None and args[at].numel() >= 1024:
            args = (*args[:at], fake_quant.fake_quant(args[at]), *args[at + 1:])
        return func(*args, **(kwargs or {}))


class _Observed(TorchFunctionMode):
    """Eager reference of ``observe_activations``: each activation's abs-max."""

    ACTIVATIONS = (torch.relu, F.relu, F.gelu, F.silu, torch.tanh)

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in self.ACTIVATIONS:
            self.seen.append(float(out.detach().abs().max()))
        return out


@pytest.mark.parametrize("name", MODELS)
def test_the_four_passes_against_eager(name):
    model, args, _, programs = _programs(name)
    with torch.no_grad():
        plain = _logits(model(*args))
        with _Quantized():
            quantized = _logits(model(*args))
        observed = _Observed()
        with observed:
            model(*args)
    for level, p in programs.items():
        for run, want in (
            (fake_quant.quantize_linears, quantized),
            (observe.observe_activations, plain),
            (fold.fold_constants, plain),
            (cse.cse, plain),
        ):
            q = run(p)
            assert q is not p, (level, run.__name__)
            verify(q)
            g = lower(q)
            with torch.no_grad():
                torch.testing.assert_close(_logits(g(*args)), want, msg=f"{level} {run.__name__}")
            if run is observe.observe_activations:
                added = [f for f in q.state_order if f not in p.state]
                got = sorted(float(g.get_buffer(f)) for f in added)
                assert got == pytest.approx(sorted(observed.seen)), level
            if run in (fold.fold_constants, cse.cse):
                assert q.node_count() < p.node_count(), (level, run.__name__)


@pytest.mark.parametrize("name", MODELS)
def test_the_fx_versions_against_eager(name):
    model, args, ep, _ = _programs(name)
    with torch.no_grad():
        plain = _logits(model(*args))
        with _Quantized():
            quantized = _logits(model(*args))
        for run, want in (
            (fake_quant_fx.quantize_linears, quantized),
            (observe_fx.observe_activations, plain),
            (fold_fx.fold_constants, plain),
            (cse_fx.cse, plain),
        ):
            gm = run(ep.module())  # a new GraphModule each call: the fx passes write it
            torch.testing.assert_close(_logits(gm(*args)), want, msg=run.__name__)


def test_purefx_passes_are_shorter_than_fx():
    for name in PASSES:
        ours = code_lines(ROOT / "docs/examples/passes" / f"{name}.py")
        theirs = code_lines(ROOT / "docs/examples/passes_fx" / f"{name}.py")
        assert ours < theirs, (name, ours, theirs)


# --- the law test of each pass ---------------------------------------------------------------------
# Every law, determinism included: new tensors (observer buffers, folded constants) compare by
# value. Fake quantization changes numerics on purpose, so its semantics law has a tolerance.


def _quantize_all(p):
    return fake_quant.quantize_linears(p, min_weights=1)


def test_law_fake_quant():
    from ir.strategies.programs import programs

    matrices = programs(features={"matrices", "large_linears"})  # linears, often large
    report = check_laws(_quantize_all, programs=matrices, max_examples=10, atol=0.1, rtol=0.1)
    assert report.changed > 0
    found = settings(settings.default, phases=[Phase.explicit, Phase.reuse, Phase.generate])
    with pytest.raises(LawViolation, match="semantics"):  # without a tolerance it is caught
        check_laws(_quantize_all, programs=matrices, max_examples=10, settings=found)


@pytest.mark.parametrize("level", ["flat", "outlined"])
def test_laws_on_the_mlp(level):
    p = _programs("mlp")[3][level]
    for run in (observe.observe_activations, fold.fold_constants, cse.cse):
        check_program(run, p)
    check_program(_quantize_all, p, laws=("purity", "verify", "determinism"))
    with pytest.raises(LawViolation, match="semantics"):  # it changes numerics, on purpose
        check_program(_quantize_all, p, laws=("semantics",))


def test_law_observer():
    check_laws(observe.observe_activations, max_examples=15)
    check_laws(observe.observe_activations, programs=outlined_programs(), max_examples=8)


def test_law_fold_constants():
    report = check_laws(fold.fold_constants, max_examples=30)
    assert report.changed > 0  # the generators draw constant builders


def test_law_cse():
    check_laws(cse.cse, max_examples=30, idempotent=True)
    check_laws(cse.cse, programs=outlined_programs(), max_examples=8, allow_vacuous=True)


# the shrunk draw of test_law_cse: call m0.m2 takes add and returns relu, which nothing reads
UNREAD_CALL_RESULT = """\
program:
  inputs:
    %b_m0_m1_b0: buffer m0.m1.b0 persistent=True
    %x0: user_input
  outputs:
    %sub: buffer_mutation m0.m1.b0
    %x0: user_output
  state:
    m0.m1.b0: buffer <Tensor (4,) torch.float32>
  preserved calls:
    '':
      inputs: ()
      outputs: ()
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])
      out_spec: leaf
      forward_arg_names: ('x0',)
    'm0.m2':
      inputs: (%add,)
      outputs: (%relu,)
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])
      out_spec: leaf
  call order: ('', 'm0', 'm0.m1', 'm0.m2')
  module <root>: purefx.generated.Root
    graph 0:
      %b_m0_m1_b0 = placeholder
      %x0 = placeholder
      %mean = call_function[aten.mean.dim](%x0, [0])  # stack: m0, m0.m1
      %sub = call_function[aten.sub.Tensor](%b_m0_m1_b0, %mean)  # stack: m0, m0.m1
      %add = call_function[aten.add.Tensor](%x0, %x0)  # stack: m0
      %relu = call_function[aten.relu.default](%add)  # stack: m0, m0.m2
      %neg = call_function[aten.neg.default](%add)  # stack: m0
      return (%sub, %x0)
  module m0: purefx.generated.M0
  module m0.m1: purefx.generated.M0
  module m0.m2: purefx.generated.M0"""


def test_cse_keeps_a_preserved_calls_unread_result():
    """The example's dead-code step drops neg, nothing else: relu is a result of call m0.m2
    (nothing reads it) and add its argument; both stay, so a second run changes nothing."""
    before = program(UNREAD_CALL_RESULT)
    expected = program(UNREAD_CALL_RESULT.replace(
        "      %neg = call_function[aten.neg.default](%add)  # stack: m0\n", ""))
    after = cse.cse(before)
    verify(after)
    assert format_program(after, vals=False) == format_program(expected, vals=False)
    assert cse.cse(after) is after


def test_the_doc_shows_the_files_as_they_are():
    doc = (ROOT / "docs/passes.md").read_text()
    for name in PASSES:
        text = (ROOT / "docs/examples/passes" / f"{name}.py").read_text()
        body = text.split('"""', 2)[2].strip()  # without the module docstring
        assert f"```python\n{body}\n```" in doc, name


def test_the_readme_pass():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Checking your own pass"):]
    code = section[section.index("```python\n") + 10:section.index("check_laws(drop_relu_of_relu")]
    scope: dict = {}
    exec(code, scope)  # noqa: S102 - the README's own example
    drop = scope["drop_relu_of_relu"]
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.ReLU())
    p = import_ep(torch.export.export(model, (torch.randn(2, 4),)))
    q = drop(p)
    assert sum(n.target is torch.ops.aten.relu.default for n in q.root_module.graph.nodes) == 1
    assert drop(q) is q
    # with activations drawn in every program: a relu of a relu that nothing reads is dead
    # code, and check_laws counts no change there
    from ir.strategies import programs

    assert check_laws(drop, programs=programs(always={"activations"}), max_examples=50).changed


def test_bench_edit_smoke():
    import io

    from bench.edit import lines_table, measure

    out = io.StringIO()
    rows = measure([120, 240], repeat=1, out=out)  # checks that both sides agree
    assert [r["n"] for r in rows] == [122, 242] and "log-log slope" in out.getvalue()
    lines = lines_table(out=out)
    assert all(ours < fx for ours, fx in lines.values())


class _CopiesWritten(torch.nn.Module):
    def forward(self, x):
        a, b = x.clone(), x.clone()  # equal copies, one written later: not one value
        a.add_(1)
        noise = torch.rand(3), torch.rand(3)  # random: never merged, never folded
        return a + b + noise[0] - noise[1]


@pytest.mark.parametrize("level", ["flat", "outlined"])
def test_cse_and_fold_leave_written_copies_and_random_ops(level):
    x = torch.randn(3)
    p = import_ep(torch.export.export(_CopiesWritten(), (x,)))
    p = p if level == "flat" else transform(p)
    for run in (cse.cse, fold.fold_constants):
        q = run(p)
        assert q.node_count() == p.node_count(), run.__name__
        torch.manual_seed(0)
        want = lower(p)(x)
        torch.manual_seed(0)
        torch.testing.assert_close(lower(q)(x), want)
