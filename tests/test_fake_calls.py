"""The generator's fake runs kept across programs (``ir.strategies.fake_calls``): a kept run
stands for a dispatch exactly (metadata, mode, a storage of its own), nothing that aliases,
is symbolic or failed differently is kept, the table is bounded, and the programs drawn are
the same with the table as without it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings

from ir.args import EMPTY_DICT, IDict, IList, Ref
from ir.printer import format_program
from ir.strategies import crossing_programs, fake_calls, programs
from ir.strategies.fake_calls import fake_call, kept_count
from ir.torch_seam import new_fake_mode, new_symbolic_size, storage_identity

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def empty_table(monkeypatch):
    monkeypatch.setattr(fake_calls, "_kept", {})


def _dispatches(monkeypatch) -> list:
    """The dispatches of fake modes from now on, counted."""
    seen: list = []
    real = type(new_fake_mode()).__torch_dispatch__

    def counted(self, func, types, args=(), kwargs=None):
        seen.append(func)
        return real(self, func, types, args, kwargs)

    monkeypatch.setattr(type(new_fake_mode()), "__torch_dispatch__", counted)
    return seen


def _vals(mode, **shapes):
    with mode:
        return {k: torch.empty(s) for k, s in shapes.items()}


def test_a_fresh_operator_runs_once_per_key_and_a_kept_run_stands_for_the_dispatch(monkeypatch):
    first_mode, later_mode = new_fake_mode(), new_fake_mode()
    a = _vals(first_mode, x=(3, 4), w=(4, 5))
    b = _vals(later_mode, x=(3, 4), w=(4, 5))
    ran = fake_call(first_mode, aten.mm.default, (Ref("x"), Ref("w")), EMPTY_DICT,
                    lambda r: a[r.name])
    seen = _dispatches(monkeypatch)
    made = [fake_call(later_mode, aten.mm.default, (Ref("x"), Ref("w")), EMPTY_DICT,
                      lambda r: b[r.name]) for _ in range(2)]
    assert seen == [] and kept_count() == 1
    for out in made:
        assert type(out) is type(ran) and out.fake_mode is later_mode  # the caller's mode
        assert (out.shape, out.stride(), out.dtype, out.device) == (
            ran.shape, ran.stride(), ran.dtype, ran.device)
        assert out.storage_offset() == 0
    assert len({storage_identity(t) for t in (*made, b["x"], b["w"])}) == 4


def test_other_metadata_or_literals_are_other_keys(monkeypatch):
    mode = new_fake_mode()
    v = _vals(mode, x=(3, 4), y=(3, 5))
    v["xt"] = v["x"].t().contiguous().t()  # (3, 4), other strides
    v["xi"] = v["x"].to(torch.int64)
    for name in ("x", "y", "xt", "xi"):
        fake_call(mode, aten.sum.dim_IntList, (Ref(name), IList((1,))), EMPTY_DICT,
                  lambda r: v[r.name])
    fake_call(mode, aten.sum.dim_IntList, (Ref("x"), IList((0,))), EMPTY_DICT,
              lambda r: v[r.name])
    fake_call(mode, aten.sum.dim_IntList, (Ref("x"), IList((1,))), IDict((("keepdim", True),)),
              lambda r: v[r.name])
    fake_call(mode, aten.add.Tensor, (Ref("x"), 1), EMPTY_DICT, lambda r: v[r.name])
    fake_call(mode, aten.add.Tensor, (Ref("x"), 1.0), EMPTY_DICT, lambda r: v[r.name])
    assert kept_count() == 8
    kept = fake_call(mode, aten.sum.dim_IntList, (Ref("x"), IList((1,))),
                     IDict((("keepdim", True),)), lambda r: v[r.name])
    assert kept.shape == (3, 1) and kept_count() == 8


def test_what_aliases_an_argument_is_never_kept(monkeypatch):
    mode = new_fake_mode()
    v = _vals(mode, x=(3, 4), b=(2,))
    for _ in range(2):  # a view, then ``type_as`` to the dtype it has (a fresh schema)
        t = fake_call(mode, aten.t.default, (Ref("x"),), EMPTY_DICT, lambda r: v[r.name])
        same = fake_call(mode, aten.type_as.default, (Ref("x"), Ref("b")), EMPTY_DICT,
                         lambda r: v[r.name])
        assert storage_identity(t) == storage_identity(same) == storage_identity(v["x"])
    assert kept_count() == 0


def test_a_failure_is_kept_and_raised_again_alike(monkeypatch):
    mode = new_fake_mode()
    v = _vals(mode, x=(3, 4), w=(5, 5))
    with pytest.raises(RuntimeError) as ran:
        fake_call(mode, aten.mm.default, (Ref("x"), Ref("w")), EMPTY_DICT, lambda r: v[r.name])
    seen = _dispatches(monkeypatch)
    with pytest.raises(type(ran.value)) as again:
        fake_call(mode, aten.mm.default, (Ref("x"), Ref("w")), EMPTY_DICT, lambda r: v[r.name])
    assert seen == [] and str(again.value) == str(ran.value)
    with pytest.raises(type(ran.value)) as third:
        fake_call(mode, aten.mm.default, (Ref("x"), Ref("w")), EMPTY_DICT, lambda r: v[r.name])
    assert third.value is not again.value  # a new copy each time: no raise's frames shared
    (kept,) = fake_calls._kept.values()
    # nothing of the program that raised is held: no frames, no context, no cause
    assert kept.__traceback__ is None and kept.__context__ is None and kept.__cause__ is None


def test_whether_the_mode_has_a_shape_env_is_part_of_the_key():
    # without a shape env an operator of a data-dependent size raises; with one it returns an
    # unbacked size: a failure kept in one kind of mode is not raised in the other
    op = aten.repeat_interleave.self_Tensor
    static = new_fake_mode()
    dynamic, _, _ = new_symbolic_size("b", 4, 2, 64)
    vals = {}
    for mode in (static, dynamic):
        with mode:
            vals[mode] = {"x": torch.empty(4), "r": torch.empty(4, dtype=torch.int64)}
    args = (Ref("x"), Ref("r"))
    with pytest.raises(RuntimeError):
        fake_call(static, op, args, EMPTY_DICT, lambda r: vals[static][r.name])
    out = fake_call(dynamic, op, args, EMPTY_DICT, lambda r: vals[dynamic][r.name])
    assert not isinstance(out.shape[0], int)  # an unbacked size
    assert kept_count() == 1  # the failure; the unbacked result is never kept


def test_a_tensor_of_another_mode_keeps_nothing():
    ours, theirs = new_fake_mode(), new_fake_mode()
    v = _vals(theirs, x=(3, 4))
    for _ in range(2):  # run each time, whatever torch makes of the mix
        try:
            fake_call(ours, aten.relu.default, (Ref("x"),), EMPTY_DICT, lambda r: v[r.name])
        except Exception:  # noqa: BLE001, S110 - a torch that refuses to mix modes
            pass
    assert kept_count() == 0


def test_symbolic_sizes_constants_and_grad_always_run(monkeypatch):
    mode, batch, _ = new_symbolic_size("b", 4, 2, 64)
    with mode:
        v = {"s": torch.empty(batch, 3), "c": mode.from_tensor(torch.ones(3, 3))}
    v["c"].constant = torch.ones(3, 3)
    plain = new_fake_mode()
    with plain:
        v["g"] = torch.empty(3, 3, requires_grad=True)
    for _ in range(2):
        fake_call(mode, aten.relu.default, (Ref("s"),), EMPTY_DICT, lambda r: v[r.name])
        fake_call(mode, aten.relu.default, (Ref("c"),), EMPTY_DICT, lambda r: v[r.name])
        fake_call(plain, aten.relu.default, (Ref("g"),), EMPTY_DICT, lambda r: v[r.name])
    assert kept_count() == 0
    with mode:  # inside an active fake mode: run there
        fake_call(mode, aten.relu.default, (Ref("s"),), EMPTY_DICT, lambda r: v[r.name])
        v["x"] = torch.empty(2, 2)
        fake_call(mode, aten.relu.default, (Ref("x"),), EMPTY_DICT, lambda r: v[r.name])
    assert kept_count() == 0


def test_the_table_is_bounded(monkeypatch):
    monkeypatch.setattr(fake_calls, "KEPT_LIMIT", 3)
    mode = new_fake_mode()
    v = _vals(mode, x=(3, 4))
    counts = []
    for k in range(5):
        fake_call(mode, aten.add.Tensor, (Ref("x"), k), EMPTY_DICT, lambda r: v[r.name])
        counts.append(kept_count())
    assert counts == [1, 2, 3, 1, 2]


def _drawn(strategy, n: int) -> list[str]:
    texts: list[str] = []

    @settings(max_examples=n, database=None, derandomize=True, phases=[Phase.generate],
              deadline=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(p):
        texts.append(format_program(p))

    run()
    return texts


@pytest.mark.parametrize("strategy", [programs(), crossing_programs()], ids=["programs",
                                                                             "crossing"])
def test_the_programs_drawn_are_the_same_with_the_table_as_without_it(monkeypatch, strategy):
    without = None
    with monkeypatch.context() as m:
        m.setattr(fake_calls, "_key", lambda *a: None)
        without = _drawn(strategy, 30)
    with_table = _drawn(strategy, 30)
    assert kept_count() > 20  # the table was used
    again = _drawn(strategy, 30)  # now mostly made from kept runs
    assert with_table == without and again == without


def test_the_default_dtype_is_part_of_the_key():
    mode = new_fake_mode()
    v = _vals(mode, x=(3,))
    v["i"] = v["x"].to(torch.int64)
    full = (aten.full.default, (IList((2,)), 1.5))
    div = (aten.div.Tensor, (Ref("i"), 2))
    made = [fake_call(mode, *full, EMPTY_DICT, lambda r: v[r.name]),
            fake_call(mode, *div, EMPTY_DICT, lambda r: v[r.name])]
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        wide = [fake_call(mode, *full, EMPTY_DICT, lambda r: v[r.name]),
                fake_call(mode, *div, EMPTY_DICT, lambda r: v[r.name])]
    finally:
        torch.set_default_dtype(saved)
    assert [t.dtype for t in made] == [torch.float32] * 2
    assert [t.dtype for t in wide] == [torch.float64] * 2
    assert kept_count() == 4
