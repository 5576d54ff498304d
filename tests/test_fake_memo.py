"""``ir.fake_memo.FakeMemo``: one fake run per operator and metadata, a new fake tensor (a
storage of its own) for each later call; views, failures and other metadata run again. And
greedy ``rewrite`` on repeated blocks runs each replacement operator once per metadata."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import ir.fake_memo as fake_memo_mod
import transforms.kernel as kernel_mod
from ir import import_ep
from ir.args import IDict, Ref
from ir.fake_memo import FakeMemo
from ir.fake_run import FakeRunFailed, fake_value
from ir.printer import format_program
from ir.torch_seam import new_fake_mode, storage_identity
from transforms.rewrite import Rule
from transforms.rewrite.engine import apply_rules

MM, T = torch.ops.aten.mm.default, torch.ops.aten.t.default


def _vals(**shapes):
    mode = new_fake_mode()
    return {k: mode.from_tensor(torch.ones(*s)) for k, s in shapes.items()}


def test_a_fresh_operator_runs_once_per_metadata_and_each_result_is_its_own():
    vals = _vals(a=(3, 4), b=(4, 5), c=(3, 4))
    memo = FakeMemo()
    args = (Ref("a"), Ref("b"))
    first = memo.value(MM, args, {}, lambda r: vals[r.name])
    again = memo.value(MM, (Ref("c"), Ref("b")), {}, lambda r: vals[r.name])
    ran = fake_value(MM, args, {}, lambda r: vals[r.name])
    assert (memo.runs, memo.made) == (1, 1)
    for out in (first, again):
        assert out.shape == ran.shape and out.stride() == ran.stride()
        assert out.dtype == ran.dtype and out.fake_mode is ran.fake_mode
    assert storage_identity(first) != storage_identity(again)


def test_other_metadata_or_literals_run_again():
    vals = _vals(a=(3, 4), b=(4, 5), w=(4, 6))
    vals["at"] = vals["a"].t().contiguous().t()  # (3, 4) with other strides
    memo = FakeMemo()
    memo.value(MM, (Ref("a"), Ref("b")), {}, lambda r: vals[r.name])
    memo.value(MM, (Ref("a"), Ref("w")), {}, lambda r: vals[r.name])
    memo.value(MM, (Ref("at"), Ref("b")), {}, lambda r: vals[r.name])
    add = torch.ops.aten.add.Tensor
    memo.value(add, (Ref("a"), 1), {}, lambda r: vals[r.name])
    memo.value(add, (Ref("a"), 1.0), {}, lambda r: vals[r.name])  # a float literal: its own
    assert (memo.runs, memo.made) == (5, 0)


def test_a_view_is_never_made_from_a_kept_one():
    vals = _vals(a=(3, 4))
    memo = FakeMemo()
    outs = [memo.value(T, (Ref("a"),), {}, lambda r: vals[r.name]) for _ in range(2)]
    assert (memo.runs, memo.made) == (2, 0)
    assert all(storage_identity(o) == storage_identity(vals["a"]) for o in outs)


def test_an_operator_whose_schema_says_fresh_but_returns_its_argument_is_never_kept():
    # ``type_as`` to the dtype its argument has returns that argument; its schema has no alias
    # annotation. A kept result would stand for a fresh one where the run aliases
    vals = _vals(a=(3, 4), b=(2,), c=(3, 4))
    vals["i"] = vals["a"].to(torch.int64)
    memo = FakeMemo()
    type_as = torch.ops.aten.type_as.default
    outs = [memo.value(type_as, (Ref("a"), Ref("b")), {}, lambda r: vals[r.name]) for _ in range(2)]
    assert (memo.runs, memo.made) == (2, 0)
    assert all(storage_identity(o) == storage_identity(vals["a"]) for o in outs)
    converted = [memo.value(type_as, (Ref(n), Ref("b")), {}, lambda r: vals[r.name])
                 for n in ("i", "i")]  # int64 to float32: a new tensor, kept
    assert (memo.runs, memo.made) == (3, 1)
    assert storage_identity(converted[0]) != storage_identity(converted[1])


def test_a_failure_is_kept_and_raised_again_without_a_run():
    vals = _vals(a=(3, 4), b=(5, 5))
    memo = FakeMemo()
    for _ in range(2):
        with pytest.raises(FakeRunFailed):
            memo.value(MM, (Ref("a"), Ref("b")), {}, lambda r: vals[r.name])
    assert (memo.runs, memo.made) == (1, 0)
    depths = []
    for _ in range(3):  # a kept failure raised again carries only that raise's frames
        with pytest.raises(FakeRunFailed) as info:
            memo.value(MM, (Ref("a"), Ref("b")), {}, lambda r: vals[r.name])
        depths.append(len(info.traceback))
    assert depths[0] == depths[1] == depths[2]
    fits = _vals(a=(3, 4), b=(4, 5))  # other metadata: run, and kept apart from the failure
    assert tuple(memo.value(MM, (Ref("a"), Ref("b")), {}, lambda r: fits[r.name]).shape) == (3, 5)
    assert memo.runs == 2


# --- greedy ``rewrite`` on repeated blocks --------------------------------------------------------

MOVE_SCALE = Rule(lambda a, b, s: (a @ b) * s, lambda a, b, s: (a * s) @ b,
                  (torch.randn(3, 4), torch.randn(4, 5), 0.5), name="move_scale", trusted=True,
                  specials=False)


class _Blocks(torch.nn.Module):
    """Blocks ``relu(((x @ a) @ b) * 0.5)``: the scale is cheaper on the narrow ``x @ a``."""

    def __init__(self, blocks: int) -> None:
        super().__init__()
        self.a = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(8, 2)) for _ in range(blocks)])
        self.b = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(2, 8)) for _ in range(blocks)])

    def forward(self, x):
        for a, b in zip(self.a, self.b):
            x = torch.relu(((x @ a) @ b) * 0.5)
        return x


def _program(blocks: int):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return import_ep(torch.export.export(_Blocks(blocks), (torch.randn(4, 8),)))


def _counted(monkeypatch, run: Callable[[], Any]) -> tuple[int, Any]:
    """How many operators ``run()`` runs on fake values (through the memo or not), and what it
    returns."""
    runs = [0]

    def counting(*a, **k):
        runs[0] += 1
        return fake_value(*a, **k)

    monkeypatch.setattr(fake_memo_mod, "fake_value", counting)
    monkeypatch.setattr(kernel_mod, "fake_value", counting)
    result = run()
    monkeypatch.undo()
    return runs[0], result


def test_greedy_rewrite_of_many_blocks_runs_each_replacement_operator_once(monkeypatch):
    """Eight blocks at one shape: as many fake runs as one block (without the memo, eight
    times as many), and the program, ``val`` s included, that runs without the memo give."""
    p1, p = _program(1), _program(8)
    one, (_, r1) = _counted(monkeypatch, lambda: apply_rules(p1, [MOVE_SCALE]))
    many, (q, r8) = _counted(monkeypatch, lambda: apply_rules(p, [MOVE_SCALE]))
    assert r1.counts["move_scale"] >= 1 and r8.counts["move_scale"] == 8 * r1.counts["move_scale"]
    assert one == many > 0  # each (mul, mm) of a replacement once per metadata

    def plain(self, target, args, kwargs, val_of, *, method=False, mode=None, meta=True):
        return fake_value(target, args, kwargs, val_of, method=method, mode=mode, meta=meta)

    monkeypatch.setattr(FakeMemo, "value", plain)
    q_plain, _ = apply_rules(p, [MOVE_SCALE])
    assert format_program(q) == format_program(q_plain)


def test_saturate_on_many_blocks_runs_as_many_fake_runs_as_on_one(monkeypatch):
    """The whole ``saturate_report`` call (greedy ``rewrite`` compared against, the search,
    the extracted program built by ``edit``) on eight blocks at one shape runs the operators
    on fake values as often as on one block; the eight blocks reach eight times one block's
    cost."""
    from transforms.rewrite import saturate_report

    p1, p8 = _program(1), _program(8)
    one, (_, r1) = _counted(monkeypatch, lambda: saturate_report(p1, [MOVE_SCALE]))
    many, (_, r8) = _counted(monkeypatch, lambda: saturate_report(p8, [MOVE_SCALE]))
    assert r1.chosen == r8.chosen == "saturate"
    assert r8.cost_after == pytest.approx(8 * r1.cost_after)
    assert many == one


def test_a_keyword_argument_that_cannot_be_kept_keeps_nothing():
    """A keyword tensor of no fake mode (a meta tensor) gives the call no key, so two such
    calls never share one."""
    vals = _vals(a=(3, 4))
    vals["m"] = torch.empty(3, 4, device="meta")
    kwargs = IDict((("other", Ref("m")),))
    assert FakeMemo()._key(torch.ops.aten.add.Tensor, (Ref("a"),), kwargs,
                           lambda r: vals[r.name], None) is None
