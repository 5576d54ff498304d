"""``ir.ops``: the table of operator facts, one test per fact on real operators, each with
targets for which it holds and targets for which it does not.

The facts are also checked against torch's own lists where torch keeps one (the functions
``Node.is_impure`` treats as side-effecting, the random Python functions), so that a torch
release that adds to them shows up here.
"""

from __future__ import annotations

import importlib
import math
import operator

import pytest
import torch
import torch.nn.functional as F

from ir import ops

aten = torch.ops.aten
hop = torch.ops.higher_order


# --- kind and schema --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "kind"),
    [
        (aten.add.Tensor, ops.OVERLOAD),
        (aten.add, ops.PACKET),
        (hop.cond, ops.HOP),
        (hop.with_effects, ops.HOP),
        (operator.getitem, ops.FUNCTION),
        (torch.relu, ops.FUNCTION),
        ("add_", ops.METHOD),
    ],
)
def test_kind(target, kind):
    assert ops.facts(target).kind == kind


def test_schema_params_and_results():
    f = ops.facts(aten.add.Tensor)
    assert [p.name for p in f.params] == ["self", "other", "alpha"]
    assert [p.required for p in f.params] == [True, True, False]
    assert [p.type for p in f.params][:2] == ["Tensor", "Tensor"]
    assert [p.type for p in ops.facts(aten.div.Tensor_mode).params][2] == "Optional[str]"
    assert f.results == 1
    assert "aten::add.Tensor" in f.schema
    assert ops.facts(aten.var_mean.correction).results == 2
    assert ops.facts(aten._print.default).results == 0
    for target in (hop.cond, operator.getitem, aten.add, "relu"):  # no schema of their own
        assert ops.facts(target).results is None
        assert ops.facts(target).params == ()


# --- mutating ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "written", "inplace"),
    [
        (aten.add_.Tensor, (0,), True),
        (aten.copy_.default, (0,), True),
        (aten.index_put_.default, (0,), True),
        (aten.add.out, (3,), False),  # writes ``out``, not ``self``
        # train-mode batch norm writes its running statistics, returns new tensors
        (aten._native_batch_norm_legit.default, (3, 4), False),
        (operator.setitem, (0,), False),  # returns None
        (operator.iadd, (0,), True),
        ("mul_", (0,), True),
        ("bernoulli_", (0,), True),
    ],
)
def test_mutating(target, written, inplace):
    assert ops.is_mutating(target)
    assert ops.written_args(target) == written
    assert ops.is_inplace(target) is inplace
    assert not ops.is_recomputable(target)
    assert ops.impurity(target).startswith("mutates its input")


@pytest.mark.parametrize(
    "target",
    [aten.add.Tensor, aten.copy.default, aten._native_batch_norm_legit_functional.default,
     aten.view.default, operator.add, operator.getitem, torch.relu, "add", "__iadd__", hop.cond],
)
def test_not_mutating(target):
    assert not ops.is_mutating(target)
    assert ops.written_args(target) == ()
    assert not ops.is_inplace(target)


@pytest.mark.parametrize(
    ("target", "twin"),
    [
        (aten.add_.Tensor, aten.add.Tensor),
        (aten.relu_.default, aten.relu.default),
        (aten.mul_.Scalar, aten.mul.Scalar),
        (aten.copy_.default, aten.copy.default),
        (aten.index_put_.default, aten.index_put.default),
        (aten.hardtanh_.default, aten.hardtanh.default),
    ],
)
def test_functional_twin(target, twin):
    assert ops.functional_twin(target) is twin
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    if target is aten.add_.Tensor:  # the twin computes what the write leaves
        want = twin(x, y)
        target(x, y)
        torch.testing.assert_close(x, want)


@pytest.mark.parametrize(
    "target",
    [
        aten.add.Tensor,  # not in place
        aten.add.out,  # writes ``out``
        aten.uniform_.default,  # random: ``uniform`` takes other arguments
        aten._native_batch_norm_legit.default,  # writes other arguments
        operator.iadd,  # no schema
        "add_",  # a method name
    ],
)
def test_no_functional_twin(target):
    assert ops.functional_twin(target) is None


# --- effectful --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target",
    [
        hop.with_effects,
        aten._print.default,  # through the effect registry, as torch threads a token for it
        aten._make_dep_token.default,
        aten._assert_async.msg,
        aten._assert_scalar.default,
        aten.sym_constrain_range_for_size.default,
        print,
        torch._assert,
        torch._C._set_grad_enabled,
    ],
)
def test_effectful(target):
    assert ops.is_effectful(target)
    assert not ops.is_recomputable(target)


@pytest.mark.parametrize(
    "target", [aten.add.Tensor, aten.copy_.default, aten.dropout.default, operator.getitem,
               torch.relu, hop.cond, "add_"],
)
def test_not_effectful(target):
    assert not ops.is_effectful(target)


def test_torchs_side_effectful_functions_are_effectful_or_mutating():
    if torch.distributed.is_available():  # adds its send, receive and wait operators
        importlib.import_module("torch.distributed._functional_collectives")
    side_effectful = getattr(torch.fx.node, "_side_effectful_functions", None)
    if side_effectful is None:
        pytest.skip("this torch keeps no list of side-effectful functions")
    missed = [f for f in side_effectful if not (ops.is_effectful(f) or ops.is_mutating(f))]
    assert missed == []


@pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed")
def test_operator_that_torch_marks_side_effectful_on_import_is_seen():
    importlib.import_module("torch.distributed._functional_collectives")
    assert ops.is_effectful(torch.ops._c10d_functional.wait_tensor.default)
    assert not ops.is_recomputable(torch.ops._c10d_functional.wait_tensor.default)


@pytest.fixture
def custom_op():
    """A fresh custom operator ``purefx_ops_test::noisy``, without any registered effect."""
    lib = torch.library.Library("purefx_ops_test", "FRAGMENT")
    lib.define("noisy(Tensor x) -> Tensor")
    lib.impl("noisy", lambda x: x.clone(), "CompositeExplicitAutograd")
    yield torch.ops.purefx_ops_test.noisy.default
    lib._destroy()


def test_effect_registered_after_the_first_lookup_is_seen(custom_op):
    from torch._higher_order_ops.effects import _EffectType, _register_effectful_op

    assert not ops.is_effectful(custom_op)
    # outside the verified operator table: never recomputable, whatever its effects
    assert not ops.facts(custom_op).verified and not ops.is_recomputable(custom_op)
    assert "facts unknown for purefx_ops_test.noisy.default" in ops.impurity(custom_op)
    handle = _register_effectful_op(custom_op, _EffectType.ORDERED)
    try:
        assert ops.is_effectful(custom_op)
        assert ops.impurity(custom_op) == f"has a side effect ({custom_op})"
    finally:
        handle.destroy()
    assert not ops.is_effectful(custom_op)


# --- random -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target",
    [
        aten.dropout.default,
        aten.native_dropout.default,
        aten.bernoulli.p,
        aten.rand.default,
        aten.randn_like.default,
        aten.randint.low,
        aten.normal.Tensor_float,
        hop.run_with_rng_state,
        torch.rand,
        F.dropout,
        "normal_",
    ],
)
def test_random(target):
    assert ops.is_random(target)
    assert not ops.is_recomputable(target)


@pytest.mark.parametrize(
    "target",
    [aten.add.Tensor, aten.native_dropout_backward.default, aten.empty.memory_format, torch.relu,
     hop.cond, operator.mul, "add_"],
)
def test_not_random(target):
    assert not ops.is_random(target)


def test_torchs_random_functions_are_random():
    from torch._library import utils

    random_functions = getattr(utils, "_RANDOM_FUNCTIONS", None)
    if random_functions is None:
        pytest.skip("this torch keeps no list of random functions")
    assert [f for f in random_functions if not ops.is_random(f)] == []


# --- recomputable -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target",
    [aten.add.Tensor, aten.view.default, aten._to_copy.default, aten.sym_size.int,
     aten._native_batch_norm_legit_functional.default, operator.getitem, operator.floordiv,
     torch.sym_max, math.ceil, torch.relu],
)
def test_recomputable(target):
    assert ops.is_recomputable(target)
    assert ops.facts(target).recomputable
    assert ops.impurity(target) == ""


@pytest.mark.parametrize(
    ("target", "why"),
    [
        (hop.cond, "is a higher-order op (cond)"),
        (hop.with_effects, "is a higher-order op (with_effects)"),
        (aten.add_.Tensor, "mutates its input (aten.add_.Tensor)"),
        (aten.native_dropout.default, "is random (aten.native_dropout.default)"),
        (aten._print.default, "has a side effect (aten._print.default)"),
    ],
)
def test_not_recomputable_says_why(target, why):
    assert not ops.is_recomputable(target)
    assert ops.impurity(target) == why


# --- copy-like and alias-like -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "source"),
    [
        (aten.copy_.default, 1),  # writes src into self
        (aten.copy.default, 1),
        (aten._to_copy.default, 0),
        (aten.clone.default, 0),
        (aten.to.dtype, 0),
        (aten.lift_fresh_copy.default, 0),
        ("clone", 0),
    ],
)
def test_copy_of(target, source):
    assert ops.copy_of(target) == source


@pytest.mark.parametrize("target", [aten.add.Tensor, aten.view.default, operator.getitem, hop.cond])
def test_not_copy(target):
    assert ops.copy_of(target) is None


@pytest.mark.parametrize(
    "target",
    [aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.expand.default,
     aten.clone.default, aten.alias.default, aten.contiguous.default, aten._to_copy.default,
     aten.to.dtype, aten.to.device, aten.slice.Tensor, aten.unsqueeze.default, "view"],
)
def test_alias_like(target):
    assert ops.is_alias_like(target)


@pytest.mark.parametrize(
    "target",
    # a permute or transpose of a square tensor keeps its shape but not its value
    [aten.permute.default, aten.transpose.int, aten.t.default, aten.select.int, aten.add.Tensor,
     aten.detach.default, operator.getitem, "permute"],
)
def test_not_alias_like(target):
    assert not ops.is_alias_like(target)


@pytest.mark.parametrize("same", [True, False])
def test_alias_like_ops_return_their_input_when_the_shape_is_kept(same):
    """The law the table promises, on real tensors: same shape, dtype, device => same values."""
    x = torch.arange(12.0).reshape(3, 4)
    calls = [
        (aten.view.default, (x, [3, 4])),
        (aten.reshape.default, (x, [3, 4])),
        (aten.expand.default, (x, [3, 4])),
        (aten.slice.Tensor, (x, 1, 0, 4)),
        (aten._to_copy.default, (x,)),
        (aten.clone.default, (x,)),
    ]
    if not same:  # the same ops changing the shape: the caller's check is what makes them safe
        calls = [(aten.view.default, (x, [4, 3])), (aten.slice.Tensor, (x, 1, 0, 2))]
    for op, args in calls:
        assert ops.is_alias_like(op)
        y = op(*args)
        assert (y.shape == x.shape and torch.equal(y, x)) is same


# --- size arithmetic, getitem, higher-order ops -------------------------------------------------


@pytest.mark.parametrize(
    "target",
    [operator.floordiv, operator.mul, operator.add, operator.eq, torch.sym_max, torch.sym_int,
     math.ceil, aten.sym_size.int, aten.sym_numel.default, aten.sym_stride.int, "size"],
)
def test_size_arithmetic(target):
    assert ops.is_size_arithmetic(target)


@pytest.mark.parametrize(
    "target", [aten.add.Tensor, aten.mul.Tensor, operator.getitem, torch.relu, hop.cond, "add"],
)
def test_not_size_arithmetic(target):
    assert not ops.is_size_arithmetic(target)


def test_getitem():
    assert ops.is_getitem(operator.getitem)
    for target in (operator.setitem, aten.select.int, aten.slice.Tensor, "__getitem__"):
        assert not ops.is_getitem(target)


@pytest.mark.parametrize(
    ("target", "name"),
    [(hop.cond, "cond"), (hop.with_effects, ops.WITH_EFFECTS), (hop.map_impl, "map_impl"),
     (hop.wrap_with_set_grad_enabled, "wrap_with_set_grad_enabled"),
     (aten.add.Tensor, ""), (operator.getitem, ""), ("cond", "")],
)
def test_hop_kind(target, name):
    assert ops.hop_kind(target) == name


# --- state outputs of functionalized ops ------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        # (out, save_mean, save_rstd, running_mean_out, running_var_out): args 3 and 4
        (aten._native_batch_norm_legit_functional.default, {3: 3, 4: 4}),
        (aten._batch_norm_with_update_functional.default, {4: 3, 5: 4}),
        (aten.rrelu_with_noise_functional.default, {1: 1}),
        (aten._native_batch_norm_legit.default, {}),  # writes in place: no new values
        (aten.add.Tensor, {}),
    ],
)
def test_state_outputs(target, expected):
    assert dict(ops.facts(target).state_outputs) == expected


# --- the memo ---------------------------------------------------------------------------------


def test_memo_answers_as_a_fresh_lookup():
    for target in (aten.add_.Tensor, hop.cond, operator.getitem, "add_", aten.to):
        assert ops.facts(target) == ops._facts_of(target)
        assert ops.facts(target) is ops.facts(target)  # a hit


def test_memo_is_bounded():
    functions = [lambda: None for _ in range(ops._MEMO_SIZE + 10)]
    for fn in functions:
        assert ops.facts(fn).recomputable
    assert len(ops._MEMO) <= ops._MEMO_SIZE
    assert ops.facts(aten.add_.Tensor).mutating  # still answered after the table was emptied


def test_memo_is_keyed_by_identity_not_by_a_reused_id():
    class Target:
        def __call__(self):
            return None

    first = Target()
    ops.facts(first)
    assert ops._MEMO[id(first)][0] is first  # the entry keeps its target alive


def test_unhashable_target_is_answered():
    class Unhashable:
        __hash__ = None

        def __call__(self):
            return None

    f = ops.facts(Unhashable())
    assert f.kind == ops.FUNCTION and f.recomputable


def test_facts_are_hashable_values():
    assert hash(ops.facts(aten._native_batch_norm_legit_functional.default)) is not None


@pytest.mark.parametrize("target", [aten.add.Tensor, aten.sum.default, aten.add, hop.cond])
def test_qualname_finds_the_target_again(target):
    """What pickled lowered modules store for an operator: ``torch.ops`` resolves it back."""
    from lowering.portable import _decode_target, _encode_target

    f = ops.facts(target)
    assert f.qualname
    assert _decode_target(_encode_target(target)) is target
