"""``torch.fx.symbolic_trace`` of the lowered root, in both conventions, for every input structure.

Plain tracing gives a module that takes the eager arguments: named placeholders
(``x, bias, scale``) where every argument is one tensor or scalar; ``*args, **kwargs`` indexed
inside the graph (``args[0][1][0]``, ``kwargs["cfg"]["gain"]``) where some argument is a tuple,
list or dict (fx's flat convention needs that signature). torch's flat convention
(``concrete_args=(PH,) * n_flat_inputs``) gives a module that takes the flat leaves.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.utils._pytree as pytree
from torch import fx
from torch.fx._symbolic_trace import PH
from zoo import CASES, eager_model, export_case

from ir import import_ep
from lowering import lower
from transforms import transform

PLAIN_CASES = ("mlp_nested", "kwargs", "nested_inputs", "pytree_outputs", "preserve_kwargs")
FLAT_CASES = ("mlp_nested", "kwargs", "pytree_outputs", "tied_weights", "nested_inputs")


def _lowered(name: str):
    case = CASES[name]
    return case, lower(transform(import_ep(export_case(case))))


def _same(a, b) -> bool:
    la, lb = pytree.tree_leaves(a), pytree.tree_leaves(b)
    return len(la) == len(lb) and all(
        torch.allclose(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(la, lb)
    )


@pytest.mark.parametrize("name", PLAIN_CASES)
def test_plain_trace_takes_the_eager_arguments(name: str) -> None:
    case, m = _lowered(name)
    traced = fx.symbolic_trace(m)
    args, kwargs = case.args(), case.kwargs()
    want = eager_model(case)(*args, **kwargs)
    assert _same(traced(*args, **kwargs), want)


def test_plain_trace_placeholders() -> None:
    _, m = _lowered("kwargs")
    traced = fx.symbolic_trace(m)
    assert [n.target for n in traced.graph.nodes if n.op == "placeholder"] == [
        "x", "bias", "scale"
    ]
    case, m = _lowered("nested_inputs")
    traced = fx.symbolic_trace(m)
    placeholders = [n.target for n in traced.graph.nodes if n.op == "placeholder"]
    assert placeholders == ["*args", "**kwargs"]
    with pytest.raises(Exception, match="cfg"):
        traced(*case.args())  # the structure is the eager one: cfg is required


@pytest.mark.parametrize("name", FLAT_CASES)
def test_flat_concrete_args_convention(name: str) -> None:
    case, m = _lowered(name)
    args, kwargs = case.args(), case.kwargs()
    flat = pytree.tree_leaves((args, list(kwargs.values())))
    traced = fx.symbolic_trace(m, concrete_args=(PH,) * len(flat))
    # torch's unflatten writes the program it is given: not the cached one other tests read
    want = torch.export.unflatten(copy.deepcopy(export_case(case)))(*args, **kwargs)
    assert _same(traced(*flat), want)
