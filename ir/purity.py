"""Fingerprints for checking that nothing was written: the tensors a Program holds."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ir.program import Program
from ir.torch_seam import tensor_version


def tensor_versions(tensors: Iterable[Any]) -> tuple[tuple[int, int], ...]:
    """``(id, _version)`` of every tensor given (other objects are skipped)."""
    return tuple((id(t), tensor_version(t)) for t in tensors if isinstance(t, torch.Tensor))


def program_tensor_versions(program: Program) -> tuple[tuple[int, int], ...]:
    """Versions of every tensor a Program holds, in a fixed order."""
    keys = sorted(program.tensors.keys())
    return tensor_versions(program.tensors[k].value for k in keys)
