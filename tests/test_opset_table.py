"""The verified operator table (``ir.opset``) against torch, and the analysis that reads it.

- every row's facts hold on real tensors (``check_entry``, the whole table: about 10 s); a
  torch release that changes an operator fails here; one that removes an operator (2.14 drops
  ``aten.cholesky`` and ``aten.qr``) leaves its row unreachable, not wrong: such rows are left
  out on a torch other than the one the table was built on, and none may be missing there;
- planted wrong facts (a write removed, a view marked non-aliasing, a random operator marked
  deterministic) are caught;
- the norms whose schemas hide their running-statistics writes carry them, conditioned on
  ``training`` / ``use_input_stats``;
- ``ir.effects`` reads the table at node level (``batch_norm(training=True)`` writes its
  running statistics, ``training=False`` is pure) and treats an overload the table lacks as
  writing and aliasing everything; ``state_written`` sees the hidden writes at the training
  IR and at core aten; a ``fold_state`` rule never folds state a train-mode model writes.
"""

from __future__ import annotations

import re

import attrs
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ir import effects, import_ep, ops, opset, opset_table
from lowering import lower
from transforms.rewrite import Rule, rewrite_report
from transforms.rewrite.state_fold import fold_into_state

ROWS = tuple(opset.table().values())
BUILT_ON = re.search(r"^torch: (\S+)$", opset_table.__doc__, re.MULTILINE).group(1)
BUILT_ON = BUILT_ON.split("+")[0]
"""The torch release the table was built on (``ir/opset_table.py``'s header)."""
GONE = tuple(e.name for e in ROWS if opset.resolve(e.name) is None)
"""Rows whose operator this torch no longer has: no program of this torch can call them."""
LIVE = tuple(e for e in ROWS if e.name not in GONE)
NORMS = (
    "aten.batch_norm.default", "aten.native_batch_norm.default",
    "aten._batch_norm_impl_index.default", "aten._native_batch_norm_legit.default",
)


# --- the table agrees with torch ------------------------------------------------------------------


def _agrees(rows: tuple[opset.OpEntry, ...]) -> None:
    wrong = [c for e in rows for c in opset.check_entry(e)]
    assert not wrong, "torch contradicts the table:\n" + "\n".join(wrong[:20])


def test_every_row_agrees_with_torch():
    """The whole table (731 rows: about 10 s on two busy cores, so no sampling), but for the
    rows of operators this torch removed (``GONE``)."""
    _agrees(LIVE)


def test_only_another_torch_than_the_tables_lacks_an_operator_of_it():
    if torch.__version__.split("+")[0] == BUILT_ON:
        assert GONE == ()
    assert len(GONE) <= len(ROWS) // 50, GONE  # a removal or two per release, not a new table


def test_every_row_has_a_sample_and_names_an_operator_of_this_torch():
    for e in LIVE:
        assert e.samples, e.name
        assert opset.resolve(e.name) is not None, e.name
        assert opset.entry(opset.resolve(e.name)) is e


def test_the_table_covers_most_of_core_aten():
    core = [n for n in ROWS if "core" in n.levels]
    assert len(core) >= 150
    for name in ("aten.convolution.default", "aten.addmm.default", "aten.view.default",
                 "aten._native_batch_norm_legit_functional.default", "aten.native_dropout.default"):
        assert name in opset.table(), name


@pytest.mark.parametrize("name", [
    "aten.batch_norm.default", "aten.native_batch_norm.default",
    "aten._batch_norm_impl_index.default", "aten.instance_norm.default",
])
def test_norms_carry_their_hidden_conditional_writes(name):
    e = opset.table()[name]
    flag = 5
    assert {(w.arg, w.when) for w in e.writes} == {(3, ((flag, True),)), (4, ((flag, True),))}
    assert e.hidden and not e.pure
    assert opset.written_at(e, (None,) * 5 + (True,)) == (3, 4)
    assert opset.written_at(e, (None,) * 5 + (False,)) == ()
    assert opset.written_at(e, (None,) * 5 + (object(),)) == (3, 4)  # not a literal: may hold


# --- planted wrong facts --------------------------------------------------------------------------


def test_a_removed_hidden_write_is_caught():
    e = opset.table()["aten.batch_norm.default"]
    found = opset.check_entry(attrs.evolve(e, writes=()))
    assert any("writes argument 3" in c for c in found)
    assert any("writes argument 4" in c for c in found)


def test_a_too_narrow_condition_is_caught():
    e = opset.table()["aten.instance_norm.default"]
    wrong = tuple(attrs.evolve(w, when=((5, False),)) for w in e.writes)
    assert opset.check_entry(attrs.evolve(e, writes=wrong))


@pytest.mark.parametrize("name", ["aten.view.default", "aten.t.default", "aten.add_.Tensor"])
def test_a_view_marked_fresh_is_caught(name):
    e = opset.table()[name]
    found = opset.check_entry(attrs.evolve(e, aliases=()))
    assert any("shares storage" in c for c in found)


def test_a_random_operator_marked_deterministic_is_caught():
    e = opset.table()["aten.rand.default"]
    assert e.random
    assert opset.check_entry(attrs.evolve(e, random=False))


def test_a_row_of_an_operator_torch_lacks_is_caught():
    e = attrs.evolve(opset.table()["aten.add.Tensor"], name="aten.no_such_operator.default")
    assert opset.check_entry(e)


# --- the analysis reads the table -----------------------------------------------------------------


class _BN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x)


class _IN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.InstanceNorm2d(3, affine=True, track_running_stats=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


class _FBN(nn.Module):
    def __init__(self, training: bool) -> None:
        super().__init__()
        self.register_buffer("rm", torch.zeros(3))
        self.register_buffer("rv", torch.ones(3))
        self.training_flag = training

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, self.rm, self.rv, training=self.training_flag)


X = torch.randn(2, 3, 4, 4)


def _program(model: nn.Module, decompose: bool):
    ep = torch.export.export(model, (X,))
    return import_ep(ep.run_decompositions() if decompose else ep)


@pytest.mark.parametrize("decompose", [False, True], ids=["training_ir", "core_aten"])
@pytest.mark.parametrize(("make", "fqns"), [
    (lambda: _BN().train(), ("bn.running_mean", "bn.running_var")),
    (lambda: _IN().train(), ("norm.running_mean", "norm.running_var")),
    (lambda: _FBN(True), ("rm", "rv")),
], ids=["BatchNorm2d", "InstanceNorm2d", "F.batch_norm"])
def test_state_written_sees_train_mode_norms(make, fqns, decompose):
    p = _program(make(), decompose)
    for fqn in fqns:
        assert effects.state_written(p, fqn), fqn


@pytest.mark.parametrize("decompose", [False, True], ids=["training_ir", "core_aten"])
@pytest.mark.parametrize(("make", "fqns"), [
    (lambda: _BN().eval(), ("bn.running_mean", "bn.running_var")),
    (lambda: _FBN(False), ("rm", "rv")),
], ids=["BatchNorm2d", "F.batch_norm"])
def test_state_written_leaves_eval_mode_norms_unwritten(make, fqns, decompose):
    p = _program(make(), decompose)
    for fqn in fqns:
        assert not effects.state_written(p, fqn), fqn


def _node(p, target):
    return next(n for n in p.root_module.graph.nodes if n.op == "call_function"
                and n.target is target)


def test_batch_norm_nodes_write_by_their_training_argument():
    bn = torch.ops.aten.batch_norm.default
    train = _node(_program(_BN().train(), False), bn)
    assert set(effects.written_args(train)) == {a.name for a in train.args[3:5]}
    assert not effects.is_pure(train)
    frozen = _node(_program(_BN().eval(), False), bn)
    assert effects.written_args(frozen) == ()
    assert effects.is_pure(frozen)
    assert ops.impurity(bn)  # the operator alone may write: the node decides


_LIB = torch.library.Library("purefx_opset_test", "DEF")  # operators outside the table
_LIB.define("twice(Tensor x) -> Tensor")
_LIB.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
_LIB.impl("twice", lambda x: torch.empty_like(x), "Meta")
_LIB.define("picky(Tensor x) -> Tensor")  # runs on fake values only: it cannot be observed
_LIB.impl("picky", lambda x: (_ for _ in ()).throw(RuntimeError("no real kernel")),
          "CompositeExplicitAutograd")
_LIB.impl("picky", lambda x: torch.empty_like(x), "Meta")


class _Unknown(nn.Module):
    def __init__(self, op: object) -> None:
        super().__init__()
        self.register_buffer("b", torch.ones(3))
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(self.b) + x


def test_an_overload_outside_the_table_is_observed_where_import_meets_it():
    op = torch.ops.purefx_opset_test.twice.default
    assert opset.entry(op) is None
    p = import_ep(torch.export.export(_Unknown(op), (torch.randn(3),)))
    found = ops.facts(op)
    assert found.verified and found.origin == ops.OBSERVED and not found.writes
    n = _node(p, op)
    assert effects.written_args(n) == () and effects.aliased_args(n) == ()
    assert effects.is_pure(n) and not effects.state_written(p, "b")


def test_an_overload_that_cannot_be_observed_writes_and_aliases_everything():
    op = torch.ops.purefx_opset_test.picky.default
    p = import_ep(torch.export.export(_Unknown(op), (torch.randn(3),)))
    found = ops.facts(op)
    assert not found.verified and found.origin == ops.UNKNOWN and found.writes
    assert "facts unknown for purefx_opset_test.picky.default" in ops.impurity(op)
    assert "no real kernel" in ops.unknown_facts(op)
    n = _node(p, op)
    assert effects.written_args(n) == (n.args[0].name,)
    assert effects.aliased_args(n) == (n.args[0].name,)
    assert not effects.is_pure(n)
    assert effects.state_written(p, "b")


class _TrainBNRsqrt(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(x)
        return y * torch.rsqrt(self.bn.running_var + 1e-5)[None, :, None, None]


_RSQRT_FOLD = Rule(lambda v: torch.rsqrt(v + 1e-5), lambda v: 1.0 / torch.sqrt(v + 1e-5),
                   (torch.rand(3) + 0.5,), name="rsqrt_eps", trusted=True, fold_state=True)


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_fold_state_never_folds_running_statistics_a_train_mode_model_writes(train):
    """docs/rewrite.md's case: ``rsqrt(bn.running_var + eps)`` folds into a constant only when
    nothing writes ``running_var`` (eval mode); in train mode ``aten.batch_norm`` writes it,
    so the rewritten module must keep computing it (it was wrong from the first call)."""
    model = _TrainBNRsqrt().train(train)
    p = import_ep(torch.export.export(model, (X,)))
    q, report = rewrite_report(p, [_RSQRT_FOLD])
    folded = [s for s in q.signature.inputs if "folded" in (s.target or "")]
    assert bool(folded) is (not train)
    if not train:
        assert report.counts == {"rsqrt_eps": 1}
    f, eager = lower(q), _TrainBNRsqrt().train(train)
    eager.load_state_dict(model.state_dict())
    for _ in range(3):
        torch.testing.assert_close(f(X), eager(X))


def test_fold_into_state_leaves_what_reads_train_mode_statistics_computed():
    """The fold step alone, given the nodes over ``running_var`` as a rule's creations."""
    p = import_ep(torch.export.export(_TrainBNRsqrt().train(), (X,)))
    over = {n.name for n in p.root_module.graph.nodes if n.op == "call_function"
            and str(n.target) in ("aten.add.Tensor", "aten.rsqrt.default")}
    assert over
    assert fold_into_state(p, over) is p
    eval_p = import_ep(torch.export.export(_TrainBNRsqrt().eval(), (X,)))
    over = {n.name for n in eval_p.root_module.graph.nodes if n.op == "call_function"
            and str(n.target) in ("aten.add.Tensor", "aten.rsqrt.default")}
    assert fold_into_state(eval_p, over) is not eval_p
