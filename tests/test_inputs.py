"""Inputs follow the module; bad calls name the argument.

After ``.double()``/``.half()``/``.to(dtype)`` inputs of the new floating dtype are accepted (and
the exported one still is); shape and dynamic-dimension checks are unchanged. Missing, extra or
misspelled keywords and a wrong positional count raise ``InputError`` naming the argument; a
``meta`` tensor or a tensor on another device than the state raises ``InputError`` too.
"""

from __future__ import annotations

import copy

import pytest
import torch
from zoo import CASES, eager_model, export_case, randn

from ir import InputConstraintError, InputError, import_ep
from lowering import lower
from transforms import transform

D = 4


def _kwargs_module():
    case = CASES["kwargs"]
    return lower(transform(import_ep(export_case(case)))), eager_model(case)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_inputs_follow_a_dtype_conversion(dtype: torch.dtype) -> None:
    m, eager = _kwargs_module()
    x, b = randn(3, D), randn(D, seed=1)
    m.to(dtype)
    eager.to(dtype)
    got = m(x.to(dtype), bias=b.to(dtype), scale=2.0)
    assert got.dtype == dtype
    assert torch.allclose(got, eager(x.to(dtype), bias=b.to(dtype), scale=2.0))
    with pytest.raises(InputConstraintError, match=r"shape\[1\]"):
        m(randn(3, D + 1).to(dtype), bias=b.to(dtype), scale=2.0)
    with pytest.raises(InputConstraintError, match="int64"):
        m(x.long(), bias=b.to(dtype), scale=2.0)


def test_dynamic_dimension_checks_after_double() -> None:
    case = CASES["dynamic_batch"]
    m = lower(transform(import_ep(export_case(case)))).double()
    assert m(randn(7, D).double()).dtype == torch.float64
    with pytest.raises(InputConstraintError):
        m(randn(7, D + 1).double())


def test_other_float_dtype_than_the_state_is_still_an_error() -> None:
    m, _ = _kwargs_module()
    with pytest.raises(InputConstraintError, match="float32"):
        m(randn(3, D).double(), bias=randn(D), scale=2.0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m, x, b: m(x, bias=b), r"missing keyword argument 'scale'"),
        (lambda m, x, b: m(x), r"missing keyword arguments 'bias', 'scale'"),
        (lambda m, x, b: m(x, bias=b, scal=2.0), r"'scal' \(did you mean 'scale'\?\)"),
        (lambda m, x, b: m(x, bias=b, scale=2.0, extra=1), r"unexpected keyword argument 'extra'"),
        (lambda m, x, b: m(x, x, bias=b, scale=2.0), r"takes 1 positional argument \(x\) but 2"),
        (lambda m, x, b: m(bias=b, scale=2.0), r"takes 1 positional argument \(x\) but 0"),
    ],
)
def test_bad_arguments_are_named(call, message: str) -> None:
    m, _ = _kwargs_module()
    with pytest.raises(InputError, match=message):
        call(m, randn(3, D), randn(D, seed=1))


def test_meta_tensor_input_is_named() -> None:
    m, _ = _kwargs_module()
    with pytest.raises(InputError, match=r"'x' .*meta"):
        m(randn(3, D).to("meta"), bias=randn(D), scale=2.0)
    with pytest.raises(InputError, match=r"'bias' .*meta"):
        m(randn(3, D), bias=randn(D).to("meta"), scale=2.0)


def test_inputs_follow_the_module_to_meta() -> None:
    m, _ = _kwargs_module()
    m = copy.deepcopy(m).to("meta")
    out = m(randn(3, D).to("meta"), bias=randn(D).to("meta"), scale=2.0)
    assert out.is_meta and out.shape == (3, D)
    with pytest.raises(InputError, match=r"'x' .*is on cpu.*state is on meta"):
        m(randn(3, D), bias=randn(D).to("meta"), scale=2.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_inputs_follow_the_module_to_cuda() -> None:
    m, eager = _kwargs_module()
    x, b = randn(3, D), randn(D, seed=1)
    want = eager(x, bias=b, scale=2.0)
    m.cuda()
    assert torch.allclose(m(x.cuda(), bias=b.cuda(), scale=2.0).cpu(), want, atol=1e-5)
    with pytest.raises(InputError, match="'x'"):
        m(x, bias=b.cuda(), scale=2.0)
