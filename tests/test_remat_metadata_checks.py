"""``rematerialize`` drops a reader that computes nothing read (issue 31, item 4's stretch): the
``_assert_tensor_metadata`` that export puts before a ``.to``, in the caller, reading a value made
inside a preserved call that cannot be recomputed there, is dropped instead of refused (as in
Mixtral with a layer preserved); a real read of that value is still refused."""

from __future__ import annotations

import pytest
import torch

from ir import PassError, import_ep
from ir.node import CALL_FUNCTION
from lowering import lower
from transforms import transform
from transforms.preserved.remat import rematerialize


class Inner(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.cache = torch.rand_like(x) * x  # random: the caller cannot recompute it
        return x + 1


class Outer(torch.nn.Module):
    def __init__(self, use: bool) -> None:
        super().__init__()
        self.inner = Inner()
        self.use = use

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        z = self.inner.cache.float()  # only an _assert_tensor_metadata stays, unless z is used
        return y * 2 + z if self.use else y * 2


def _exported(use: bool):
    return torch.export.export(
        Outer(use), (torch.randn(3),), preserve_module_call_signature=("inner",)
    )


def _targets(p) -> list[str]:
    return [str(n.target) for n in p.root_module.graph.nodes if n.op == CALL_FUNCTION]


def test_a_metadata_check_of_a_value_inside_a_preserved_call_is_dropped_not_refused():
    ep = _exported(use=False)
    flat = import_ep(ep)
    assert "aten._assert_tensor_metadata.default" in _targets(flat)
    out = rematerialize(flat)
    assert "aten._assert_tensor_metadata.default" not in _targets(out)
    assert "aten.rand_like.default" in _targets(out)  # the call's own body is untouched
    p = transform(flat)
    x = torch.randn(3)
    torch.testing.assert_close(lower(p)(x), Outer(False)(x))


def test_a_real_read_of_a_value_that_cannot_be_recomputed_is_still_refused():
    with pytest.raises(PassError, match="cannot be recomputed"):
        transform(import_ep(_exported(use=True)))
