"""``ir.literals.scalar_literal``: the one writer of scalars into generated Python (the opset
table and the fuzzer's repro scripts); every scalar survives the round trip through eval/exec."""

from __future__ import annotations

import math

import pytest
import torch

from ir.literals import PRELUDE, scalar_literal
from ir.opset_build import _src
from lowering.fuzz.repro import _literal

SCALARS = [None, True, False, 0, -7, 2**70, "a'b\"c", 1.5, -0.0, 0.0, 1e-310, float("inf"),
           float("-inf"), complex(1.0, -float("inf")), torch.float32, torch.bfloat16,
           torch.int64, torch.bool, torch.device("cpu"), torch.device("cuda", 1),
           torch.strided, torch.sparse_coo, torch.contiguous_format, torch.channels_last,
           torch.preserve_format]


def _names() -> dict:
    scope: dict = {"torch": torch}
    exec(PRELUDE, scope)  # noqa: S102 - the prelude every generated file runs
    return scope


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a)
                                                     == math.copysign(1, b))
    if isinstance(a, complex):
        return _same(a.real, b.real) and _same(a.imag, b.imag)
    return a == b and type(a) is type(b)


@pytest.mark.parametrize("value", SCALARS, ids=repr)
def test_every_scalar_round_trips_through_eval(value):
    text = scalar_literal(value)
    assert text is not None
    assert _same(eval(text, _names()), value), text


def test_nan_and_signed_zero_round_trip_through_exec():
    scope = _names()
    exec(f"x = {scalar_literal(float('nan'))}\ny = {scalar_literal(-0.0)}\n"  # noqa: S102
         f"z = {scalar_literal(complex(float('nan'), -0.0))}", scope)
    assert math.isnan(scope["x"]) and math.copysign(1.0, scope["y"]) == -1.0
    assert math.isnan(scope["z"].real) and math.copysign(1.0, scope["z"].imag) == -1.0


def test_subclasses_are_written_as_the_plain_value():
    class Half(float):
        def __repr__(self) -> str:
            return "Half(...)"

    assert scalar_literal(Half(0.5)) == "0.5"
    assert scalar_literal(torch.tensor(3).item()) == "3"


def test_what_is_not_a_scalar_is_none():
    for value in ([1], (1,), {"a": 1}, torch.ones(1), object(), b"x"):
        assert scalar_literal(value) is None


def test_both_writers_spell_scalars_with_it():
    for value in SCALARS:
        assert _src(value) == scalar_literal(value)
        assert _literal(value) == scalar_literal(value)
    assert _src((1.0, float("nan"))) == "(1.0, nan)"
    assert _literal([float("-inf"), torch.float16]) == "[-inf, torch.float16]"
