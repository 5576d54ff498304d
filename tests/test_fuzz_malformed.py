"""Malformed programs get a purefx error, at import or ``verify``, never a raw Python error.

Example tests for each class of corruption, then a hypothesis fuzzer that corrupts copies of real
exported programs and checks that each either raises a ``PurefxError`` (from ``import_ep``,
``transform``, ``lower`` or the first call) or lowers to a module that matches ``ep.module()``.
"""

from __future__ import annotations

import pytest
import torch

import ir
from ir import LoweringError
from lowering import lower
from lowering.example_model import example_program


@pytest.mark.parametrize("device", ["nope", "cuda:99", 7])
def test_lower_refuses_a_device_torch_cannot_use(device):
    if device == "cuda:99" and torch.cuda.device_count() > 99:
        pytest.skip("a machine with 100 GPUs")
    program = ir.import_ep(example_program())
    with pytest.raises(LoweringError, match=f"device {device!r} cannot be used"):
        lower(program, device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a CPU-only build or machine")
def test_lower_refuses_cuda_on_a_cpu_machine():
    with pytest.raises(LoweringError, match="device 'cuda' cannot be used"):
        lower(ir.import_ep(example_program()), device="cuda")
