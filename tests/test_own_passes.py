"""Three more passes a researcher writes (``docs/examples/passes``: fold arithmetic with a
neutral scalar, strength-reduce small whole powers, a zero-initialized LoRA adapter on every
linear), each written with ``transforms.edit`` and with plain torch.fx on ``ep.module()``
(``docs/examples/passes_fx``): Before/Expected on the IR text, both versions against eager on a
researcher's block and a tiny GPT-2, flat and outlined, the laws on programs like the user's
own (``programs_like``, not vacuous), and the purefx version shorter (``bench.edit.code_lines``).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch.overrides import TorchFunctionMode

from bench.edit import ROOT, code_lines
from docs.examples.passes import identities, lora, models, powers
from docs.examples.passes_fx import identities as identities_fx
from docs.examples.passes_fx import lora as lora_fx
from docs.examples.passes_fx import powers as powers_fx
from ir import alpha_equivalent, format_program, import_ep, parse_program, verify
from ir.strategies import programs
from lowering import lower
from lowering.like import programs_like
from lowering.pass_laws import check_laws
from transforms import transform

OWN = ("identities", "powers", "lora")
aten = torch.ops.aten
F = torch.nn.functional


class Block(torch.nn.Module):
    """A researcher's block: a residual scale and shift left at their neutral defaults, GELU
    written out with a cube, two linears."""

    def __init__(self, scale: float = 1.0, shift: float = 0.0) -> None:
        super().__init__()
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8)
        self.scale, self.shift = scale, shift

    def forward(self, x):
        h = self.up(x)
        h = 0.5 * h * (1 + torch.tanh(0.7978845608 * (h + 0.044715 * torch.pow(h, 3))))
        return x * self.scale + self.down(h) / 1 + self.shift


def _block():
    torch.manual_seed(0)
    return Block().eval(), (torch.randn(4, 8),)


BLOCK_EP = torch.export.export(*_block())
MODELS = ["block", pytest.param("gpt2", marks=pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="needs transformers"))]


def _logits(y):
    y = y[0] if isinstance(y, (tuple, list)) else y
    y = y["logits"] if isinstance(y, dict) else y
    return getattr(y, "logits", y)


def _model(name):
    return _block() if name == "block" else models.gpt2()


def _count(p, target):
    return sum(n.target is target for _, mid in p.walk()
               for g in p.module_table()[mid].graphs for n in g.nodes)


# --- Before / Expected -------------------------------------------------------------------------

BEFORE = """\
program:
  inputs:
    %x: user_input
    %n: user_input
  outputs:
    %r: user_output
  module <root>: ?
    graph 0:
      %x = placeholder  # float32[2, 3]
      %n = placeholder  # int64[2, 3]
      %h = call_function[aten.neg.default](%x)  # float32[2, 3]
      %a = call_function[aten.mul.Tensor](%h, 1)  # float32[2, 3]
      %b = call_function[aten.add.Tensor](%a, 0.0)  # float32[2, 3]
      %c = call_function[aten.pow.Tensor_Scalar](%b, 3.0)  # float32[2, 3]
      %d = call_function[aten.pow.Tensor_Scalar](%c, 2.5)  # float32[2, 3]
      %m = call_function[aten.mul.Tensor](%n, 1.0)  # float32[2, 3]
      %k = call_function[aten.sub.Tensor](%d, %m)  # float32[2, 3]
      %r = call_function[aten.div.Tensor](%k, 2)  # float32[2, 3]
      return (%r,)"""


def _text(p):
    return format_program(p, vals=False)


def test_fold_identities_before_expected():
    before = parse_program(BEFORE)
    after = identities.fold_identities(before)
    expected = BEFORE.replace("(%a, 0.0)", "(%h, 0.0)").replace("(%b, 3.0)", "(%h, 3.0)")
    expected = "\n".join(line for line in expected.splitlines()
                         if not line.lstrip().startswith(("%a = ", "%b = ")))
    # int64 * 1.0 is a float: that multiplication stays; so do / 2 and the sub of a value
    assert _text(after) == _text(parse_program(expected))
    assert alpha_equivalent(after, parse_program(expected, like=after))
    verify(after, vals=True)
    assert identities.fold_identities(after) is after


def test_fold_identities_keeps_a_fold_of_an_input():
    """``x * 1`` of an input returned stays: folded, the output would be the caller's tensor
    (the semantics law's aliasing check refuses that, on the extra-output variants of
    ``programs_like``)."""
    text = BEFORE.replace("      return (%r,)", "      return (%r, %m2)").replace(
        "    %r: user_output", "    %r: user_output\n    %m2: user_output"
    ).replace("      %r = call_function", "      %m2 = call_function[aten.mul.Tensor](%x, 1)  "
              "# float32[2, 3]\n      %r = call_function")
    after = identities.fold_identities(parse_program(text))
    assert "%m2 = call_function[aten.mul.Tensor](%x, 1)" in _text(after)
    assert "%b = " not in _text(after)


def test_expand_powers_before_expected():
    before = parse_program(BEFORE)
    after = powers.expand_powers(before)
    expected = BEFORE.replace(
        "      %c = call_function[aten.pow.Tensor_Scalar](%b, 3.0)  # float32[2, 3]\n",
        "      %mul = call_function[aten.mul.Tensor](%b, %b)  # float32[2, 3]\n"
        "      %mul_1 = call_function[aten.mul.Tensor](%mul, %b)  # float32[2, 3]\n",
    ).replace("(%c, 2.5)", "(%mul_1, 2.5)")  # 2.5 is no whole power: kept
    assert _text(after) == _text(parse_program(expected))
    verify(after, vals=True)
    assert powers.expand_powers(after) is after


LINEAR = """\
program:
  inputs:
    %w: parameter lin.weight
    %x: user_input
  outputs:
    %r: user_output
  state:
    lin.weight: parameter <Parameter (3, 5) torch.float32> requires_grad
  module <root>: ?
    graph 0:
      %w = placeholder  # float32[3, 5]
      %x = placeholder  # float32[2, 5]
      %y = call_function[aten.linear.default](%x, %w)  # float32[2, 3]
      %r = call_function[aten.relu.default](%y)  # float32[2, 3]
      return (%r,)"""

LINEAR_LORA = """\
program:
  inputs:
    %w: parameter lin.weight
    %b_lora_a: buffer lora_a persistent=True
    %b_lora_b: buffer lora_b persistent=True
    %x: user_input
  outputs:
    %r: user_output
  state:
    lin.weight: parameter <Parameter (3, 5) torch.float32> requires_grad
    lora_a: buffer <Tensor (4, 5) torch.float32>
    lora_b: buffer <Tensor (3, 4) torch.float32>
  module <root>: ?
    graph 0:
      %w = placeholder
      %b_lora_a = placeholder
      %b_lora_b = placeholder
      %x = placeholder
      %linear = call_function[aten.linear.default](%x, %b_lora_a)
      %linear_1 = call_function[aten.linear.default](%linear, %b_lora_b)
      %y = call_function[aten.linear.default](%x, %w)
      %add = call_function[aten.add.Tensor](%y, %linear_1)
      %r = call_function[aten.relu.default](%add)
      return (%r,)"""


def test_add_lora_before_expected():
    before = parse_program(LINEAR)
    after = lora.add_lora(before)
    assert _text(after) == _text(parse_program(LINEAR_LORA, like=after))
    verify(after, vals=True)
    assert not after.tensor("lora_b").any() and after.tensor("lora_a").shape == (4, 5)
    assert torch.equal(lora.add_lora(before).tensor("lora_a"), after.tensor("lora_a"))  # seeded


# --- numerics against eager, flat and outlined, and the fx versions ------------------------------


class _Adapted(TorchFunctionMode):
    """Eager reference of ``add_lora`` with trained adapters: each ``F.linear`` gets
    ``+ (x @ A.T) @ B.T``, the adapters taken in call order."""

    def __init__(self, adapters):
        super().__init__()
        self.adapters = list(adapters)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is F.linear:
            a, b = self.adapters.pop(0)
            out = out + args[0] @ a.T @ b.T
        return out


def _trained(a_b_pairs):
    g = torch.Generator().manual_seed(1)
    return [(a, torch.randn(b.shape, generator=g) / 4) for a, b in a_b_pairs]


@pytest.mark.parametrize("name", MODELS)
def test_the_three_passes_against_eager(name):
    model, args = _model(name)
    p = import_ep(torch.export.export(model, args))
    with torch.no_grad():
        want = _logits(model(*args))
    for level, src in (("flat", p), ("outlined", transform(p))):
        for run, gone in ((identities.fold_identities, None),
                          (powers.expand_powers, aten.pow.Tensor_Scalar), (lora.add_lora, None)):
            q = run(src)
            assert q is not src, (name, level, run.__name__)
            verify(q, vals=True)
            if gone is not None:
                assert _count(q, gone) == 0 < _count(src, gone), (level, run.__name__)
            with torch.no_grad():
                got = _logits(lower(q)(*args))
            torch.testing.assert_close(got, want, msg=f"{name} {level} {run.__name__}")
        q = lora.add_lora(src)  # trained adapters loaded: the adapter's own numerics
        added = [f for f in q.state_order if f not in src.state]
        pairs = _trained((q.tensor(a), q.tensor(b)) for a, b in zip(added[::2], added[1::2]))
        g = lower(q)
        g.load_state_dict({f: t for (a, b), pair in zip(zip(added[::2], added[1::2]), pairs)
                           for f, t in ((a, pair[0]), (b, pair[1]))}, strict=False)
        with torch.no_grad(), _Adapted(pairs):
            adapted = _logits(model(*args))
        with torch.no_grad():
            torch.testing.assert_close(_logits(g(*args)), adapted, msg=f"{name} {level} lora")
        assert not torch.equal(adapted, want)


@pytest.mark.parametrize("name", MODELS)
def test_the_fx_versions_against_eager(name):
    model, args = _model(name)
    ep = torch.export.export(model, args)
    with torch.no_grad():
        want = _logits(model(*args))
        for run in (identities_fx.fold_identities, powers_fx.expand_powers, lora_fx.add_lora):
            gm = run(ep.module())  # a new GraphModule each call: the fx passes write it
            torch.testing.assert_close(_logits(gm(*args)), want, msg=run.__name__)


def test_on_the_block_each_pass_changes_what_it_names():
    p = import_ep(BLOCK_EP)
    q = identities.fold_identities(p)
    assert p.node_count() - q.node_count() == 2  # / 1, + 0.0 (x * 1.0 of the input x stays)
    assert _count(powers.expand_powers(p), aten.mul.Tensor) == _count(p, aten.mul.Tensor) + 2
    assert _count(lora.add_lora(p), aten.linear.default) == 3 * _count(p, aten.linear.default)


# --- laws on programs like the user's own -------------------------------------------------------


def test_laws_fold_identities():
    report = check_laws(identities.fold_identities, programs=programs_like(BLOCK_EP),
                        max_examples=20)
    assert report.changed > 0
    check_laws(identities.fold_identities, max_examples=20, allow_vacuous=True)


def test_laws_expand_powers():
    report = check_laws(powers.expand_powers, programs=programs_like(BLOCK_EP), max_examples=20)
    assert report.changed > 0


def test_laws_add_lora():
    # the adapter adds x A^T B^T with B zero: zero for finite x only (inf * 0 is nan), so the
    # inputs are drawn without the floating-point edges
    like = programs_like(BLOCK_EP, edge_values=False)
    assert check_laws(lora.add_lora, programs=like, max_examples=20).changed > 0
    drawn = programs(features={"matrices"})
    assert check_laws(lora.add_lora, programs=drawn, max_examples=10, allow_vacuous=True)


# --- lines -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", OWN)
def test_the_purefx_version_is_shorter_than_fx(name):
    ours = code_lines(ROOT / "docs/examples/passes" / f"{name}.py")
    theirs = code_lines(ROOT / "docs/examples/passes_fx" / f"{name}.py")
    assert ours < theirs, (name, ours, theirs)
