"""Before/Expected examples for ``fold_constants``: what depends on no input and no state that
can change (literal builders, lifted constants nothing writes) is computed once and read from a
new constant; random ops, written values, parameters and buffers, and results over
``max_bytes`` are not folded; a folded value still read is never dropped."""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree
from beforeafter import program

from ir import format_program, import_ep, verify
from ir import signature as sg
from ir.errors import PassError
from ir.state import Opaque
from lowering import lower
from lowering.pass_laws import LawViolation, check_laws, check_program
from transforms import fold_constants, transform
from transforms.passes import constant_folding as folding

# the laws but determinism: a new constant is a new tensor, and ``Opaque`` compares by identity
LAWS = ("purity", "verify", "determinism", "semantics", "idempotence")

BEFORE = """\
program:
  inputs:
    %p_w: parameter w
    %c_k: constant_tensor k
    %c_m: constant_tensor m
    %x: user_input
  outputs:
    %out: user_output
    %full: user_output
  state:
    w: parameter <Parameter (2,) torch.float32>
    k: constant <Tensor (2,) torch.float32>
    m: constant <Tensor (2,) torch.float32>
  module <root>: Top
    graph 0:
      %p_w = placeholder
      %c_k = placeholder
      %c_m = placeholder
      %x = placeholder
      %ones = call_function[aten.ones.default]([2])
      %mul = call_function[aten.mul.Tensor](%ones, %c_k)
      %add = call_function[aten.add.Tensor](%mul, 1)
      %t = call_function[aten.view.default](%c_k, [2])
      %rand = call_function[aten.rand.default]([2])
      %neg = call_function[aten.neg.default](%rand)
      %pw = call_function[aten.mul.Tensor](%p_w, 2)
      %zeros = call_function[aten.zeros.default]([2])
      %w = call_function[aten.add_.Tensor](%zeros, 1)
      %m_1 = call_function[aten.copy_.default](%c_m, %x)
      %big = call_function[aten.ones.default]([64])
      %sum = call_function[aten.sum.default](%big)
      %full = call_function[aten.full.default]([2], 3.0)
      %s = call_function[aten.stack.default]([%add, %t, %neg, %pw, %zeros, %m_1, %x, %x])
      %out = call_function[aten.add.Tensor](%s, %sum)
      return (%out, %full)"""

EXPECTED = """\
program:
  inputs:
    %p_w: parameter w
    %c_k: constant_tensor k
    %c_m: constant_tensor m
    %c__folded_add: constant_tensor _folded_add
    %c__folded_sum: constant_tensor _folded_sum
    %c__folded_full: constant_tensor _folded_full
    %x: user_input
  outputs:
    %out: user_output
    %full: user_output
  state:
    w: parameter <Parameter (2,) torch.float32>
    k: constant <Tensor (2,) torch.float32>
    m: constant <Tensor (2,) torch.float32>
    _folded_add: constant <Tensor (2,) torch.float32>
    _folded_sum: constant <Tensor () torch.float32>
    _folded_full: constant <Tensor (2,) torch.float32>
  module <root>: Top
    graph 0:
      %p_w = placeholder
      %c_k = placeholder
      %c_m = placeholder
      %c__folded_add = placeholder
      %c__folded_sum = placeholder
      %c__folded_full = placeholder
      %x = placeholder
      %t = call_function[aten.view.default](%c_k, [2])
      %rand = call_function[aten.rand.default]([2])
      %neg = call_function[aten.neg.default](%rand)
      %pw = call_function[aten.mul.Tensor](%p_w, 2)
      %zeros = call_function[aten.zeros.default]([2])
      %w = call_function[aten.add_.Tensor](%zeros, 1)
      %m_1 = call_function[aten.copy_.default](%c_m, %x)
      %full = call_function[aten.clone.default](%c__folded_full)
      %s = call_function[aten.stack.default]([%c__folded_add, %t, %neg, %pw, %zeros, %m_1, %x, %x])
      %out = call_function[aten.add.Tensor](%s, %c__folded_sum)
      return (%out, %full)"""


def before_program(text: str = BEFORE):
    """``text`` with ``k = [1, 2]`` and the root's call signature ``(x) -> (out, full)``, so
    that ``lower`` binds the state placeholders to the state."""
    p = program(text)
    _, in_spec = pytree.tree_flatten(((0,), {}))
    _, out_spec = pytree.tree_flatten((0, 0))
    root = sg.CallSignature((), (), in_spec, out_spec, ("x",))
    return p.replace(
        tensors=p.tensors.set("k", Opaque(torch.tensor([1.0, 2.0]))),
        call_signatures=p.call_signatures.set("", root),
    )


def same_outputs(before, after, *args):
    """``lower(after)`` returns what ``lower(before)`` returns, random ops seeded alike."""
    torch.manual_seed(0)
    want = lower(before)(*(a.clone() for a in args))
    torch.manual_seed(0)
    got = lower(after)(*(a.clone() for a in args))
    torch.testing.assert_close(got, want)


def test_constants_fold_and_the_traps_stay():
    """``ones * k + 1`` and ``sum(ones(64))`` fold (their inputs go with them); ``full`` is
    returned, so it is read through a clone of its constant; a view of a constant, ``rand``
    and what reads it, a parameter, a value written in place (``zeros``) and a constant
    written in place (``m``) stay."""
    before = before_program()
    versions = {k: v.value._version for k, v in before.tensors.items()}
    after = fold_constants(before)
    verify(after)
    expected = program(EXPECTED).replace(call_signatures=before.call_signatures)
    assert format_program(after, vals=False) == format_program(expected, vals=False)
    assert {k: v.value._version for k, v in before.tensors.items()} == versions
    assert torch.equal(after.tensor("_folded_add"), torch.tensor([2.0, 3.0]))
    assert torch.equal(after.tensor("_folded_sum"), torch.tensor(64.0))
    same_outputs(before, after, torch.randn(2))
    assert fold_constants(after) is after


def test_a_result_over_max_bytes_stays_computed():
    """With ``max_bytes=7`` a two-float result (8 bytes) stays computed where read; the
    scalar ``sum`` (4 bytes) folds, and ``ones([64])``, read only by it, goes with it."""
    before = before_program()
    after = fold_constants(before, max_bytes=7)
    verify(after)
    text = format_program(after, vals=False)
    assert "%add = call_function[aten.add.Tensor](%mul, 1)" in text
    assert "%full = call_function[aten.full.default]([2], 3.0)" in text
    assert "%big =" not in text
    assert set(after.state) - set(before.state) == {"_folded_sum"}
    same_outputs(before, after, torch.randn(2))
    assert fold_constants(before, max_bytes=0) is before


@pytest.mark.parametrize("bad", [-1, 1.5, "1", True])
def test_max_bytes_is_checked(bad):
    with pytest.raises(PassError, match="max_bytes"):
        fold_constants(before_program(), max_bytes=bad)


def test_nothing_to_fold_is_the_program_itself():
    p = program("""\
program:
  inputs:
    %x: user_input
  outputs:
    %neg: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %rand = call_function[aten.rand.default]([2])
      %neg = call_function[aten.neg.default](%x)
      return (%neg,)""")
    assert fold_constants(p) is p


SHARED = """\
program:
  inputs:
    %x: user_input
  outputs:
    %b: user_output
  state:
    a.k: constant <Tensor (2,) torch.float32>
    b.k: constant <Tensor (2,) torch.float32> = a.k
  module <root>: Top
    graph 0:
      %x = placeholder
      %a = call_module[a](%x)
      %b = call_module[b](%a)
      return (%b,)
  module a: A
    graph 0:
      %x = placeholder
      %k = get_attr[k]()
      %arange = call_function[aten.arange.default](2)
      %mul = call_function[aten.mul.Tensor](%arange, %k)
      %add = call_function[aten.add.Tensor](%x, %mul)
      return %add
  module b: same object as a"""


def test_an_outlined_shared_module_folds_once_with_state_at_each_path():
    before = program(SHARED)
    before = before.replace(tensors=before.tensors.set("a.k", Opaque(torch.tensor([1.0, 2.0]))))
    after = fold_constants(before)
    verify(after)
    expected = """\
program:
  inputs:
    %x: user_input
  outputs:
    %b: user_output
  state:
    a.k: constant <Tensor (2,) torch.float32>
    b.k: constant <Tensor (2,) torch.float32> = a.k
    a._folded_mul: constant <Tensor (2,) torch.float32>
    b._folded_mul: constant <Tensor (2,) torch.float32> = a._folded_mul
  module <root>: Top
    graph 0:
      %x = placeholder
      %a = call_module[a](%x)
      %b = call_module[b](%a)
      return (%b,)
  module a: A
    graph 0:
      %x = placeholder
      %_folded_mul = get_attr[_folded_mul]()
      %add = call_function[aten.add.Tensor](%x, %_folded_mul)
      return %add
  module b: same object as a"""
    assert format_program(after, vals=False) == format_program(program(expected), vals=False)
    assert torch.equal(after.tensor("b._folded_mul"), torch.tensor([0.0, 2.0]))
    same_outputs(before, after, torch.randn(2))
    check_program(fold_constants, before, laws=LAWS, inputs=lambda p: ((torch.randn(2),), {}))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.k = torch.tensor([1.0, 2.0, 3.0, 4.0])  # a lifted constant
        self.register_buffer("n", torch.zeros(4))

    def forward(self, x):
        pos = torch.arange(4.0) * 0.5 + self.k.exp()
        mask = torch.ones(4, 4).triu()
        self.n.add_(1)
        return (self.lin(x) + pos) @ mask + torch.rand(4) * 0 + self.n


@pytest.mark.parametrize("outlined", [False, True], ids=["flat", "outlined"])
def test_numerics_equal_eager(outlined):
    x = torch.randn(3, 4)
    ep = torch.export.export(Model(), (x,))
    p = import_ep(ep)
    if outlined:
        p = transform(p)
    versions = {k: getattr(v.value, "_version", None) for k, v in p.tensors.items()}
    after = fold_constants(p)
    verify(after)
    assert after.node_count() < p.node_count()
    assert len(after.state) == len(p.state) + 2  # pos and mask
    assert {k: getattr(v.value, "_version", None) for k, v in p.tensors.items()} == versions
    eager, lowered = ep.module(), lower(after)
    for _ in range(2):
        torch.testing.assert_close(lowered(x), eager(x))
    assert set(lowered.state_dict()) == set(eager.state_dict())


def test_the_laws_catch_folding_rand(monkeypatch):
    """A planted bug of issue 37: folding ``rand`` returns the same numbers on every call."""
    monkeypatch.setattr(folding, "_foldable", lambda target: True)
    p = program("""\
program:
  inputs:
    %x: user_input
  outputs:
    %add: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %rand = call_function[aten.rand.default]([2])
      %add = call_function[aten.add.Tensor](%x, %rand)
      return (%add,)""")
    after = folding.fold_constants(p)
    with pytest.raises(AssertionError):
        same_outputs(p, after, torch.randn(2))


def test_the_laws_catch_dropping_a_node_still_used(monkeypatch):
    """A planted bug of issue 37: a folded value that a kept node reads, dropped."""
    monkeypatch.setattr(folding, "_needed", lambda *args: set())
    with pytest.raises(LawViolation, match="verify"):
        check_program(folding.fold_constants, before_program(), laws=LAWS,
                      inputs=lambda p: ((torch.randn(2),), {}))


def test_laws_on_hand_built_programs():
    seeded_alike = BEFORE.replace("aten.rand.default", "aten.ones.default")
    check_program(fold_constants, before_program(seeded_alike), laws=LAWS,
                  inputs=lambda p: ((torch.randn(2),), {}))


def test_laws_on_generated_programs():
    check_laws(fold_constants, laws=LAWS, max_examples=60)


class Rotary(torch.nn.Module):
    """A table computed under ``no_grad``: export puts it in a higher-order op's body."""

    @torch.no_grad()
    def forward(self, x):
        pos = torch.arange(x.shape[-2], dtype=torch.float32)
        emb = torch.outer(pos, torch.ones(2)) * 0.5
        return emb.cos()


class RotaryModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rotary = Rotary()
        self.proj = torch.nn.Linear(2, 2)

    def forward(self, x):
        return self.proj(x) * self.rotary(x)


def test_a_higher_order_op_body_holds_no_new_state_and_the_pipeline_still_runs():
    """A body of ``wrap_with_set_grad_enabled`` is not folded (it owns no state; the pipeline
    moves it); folding before the default pipeline gives a program that lowers and is eager."""
    x = torch.randn(3, 2)
    ep = torch.export.export(RotaryModel(), (x,))
    p = import_ep(ep)
    after = fold_constants(p)
    verify(after)
    assert all(not fqn.startswith("submod") for fqn in after.state)
    torch.testing.assert_close(lower(transform(after))(x), ep.module()(x))


def test_two_graphs_of_one_module_get_distinct_attributes():
    """Calls ``a`` and ``a@1`` run two graphs of one module; each folds a node named ``mul``:
    the new attributes are ``_folded_mul`` and ``_folded_mul_1``, never one name twice."""
    before = program("""\
program:
  inputs:
    %x: user_input
  outputs:
    %a_1: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %a = call_module[a](%x)
      %a_1 = call_module[a@1](%a)
      return (%a_1,)
  module a: A
    graph 0:
      %x = placeholder
      %ones = call_function[aten.ones.default]([2])
      %mul = call_function[aten.mul.Tensor](%ones, 2)
      %add = call_function[aten.add.Tensor](%x, %mul)
      return %add
    graph 1:
      %x = placeholder
      %ones = call_function[aten.ones.default]([2])
      %mul = call_function[aten.mul.Tensor](%ones, 3)
      %add = call_function[aten.add.Tensor](%x, %mul)
      return %add""")
    after = fold_constants(before)
    verify(after)
    assert set(after.state) == {"a._folded_mul", "a._folded_mul_1"}
    same_outputs(before, after, torch.randn(2))
