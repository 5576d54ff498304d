"""A user's module swapped in for a submodule whose calls run different graphs.

The parent's generated code names the graph of each call (``GRAPH_KEYWORD``) only to lowered
modules (``codegen.call_graph``); a user's replacement gets the program's arguments alone, its
hooks fire, and the outputs are eager's — in generated code and in interpreter mode.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ir import import_ep
from lowering import LoweredDispatcher, lower
from lowering.codegen import GRAPH_KEYWORD, call_graph
from tests.test_threads import CallsWithAndWithout  # one graph with y, one without
from tests.zoo import CASES, fresh_export, randn
from transforms import transform


def _with_and_without() -> nn.Module:
    torch.manual_seed(0)
    return CallsWithAndWithout()


# model: (make, inputs, the submodule called several times with different graphs)
SWAPPABLE = {
    "buffer_mutation_repeated": (  # a stateful module: its graphs thread the buffer mutation
        CASES["buffer_mutation_repeated"].make, CASES["buffer_mutation_repeated"].args, "counter"
    ),
    "calls_with_and_without": (_with_and_without, lambda: (randn(3, 4, seed=1),), "block"),
}


def _lowered(name: str, interpreter: bool) -> nn.Module:
    if name not in SWAPPABLE:
        return lower(transform(import_ep(fresh_export(CASES[name]))), interpreter=interpreter)
    make, inputs, sub = SWAPPABLE[name]
    # torch preserves no module whose calls differ in arity (``calls_with_and_without``)
    preserve = (sub,) if name in CASES else ()
    ep = torch.export.export(
        make(), inputs(), strict=False, preserve_module_call_signature=preserve
    ).run_decompositions()
    return lower(transform(import_ep(ep)), interpreter=interpreter)


@pytest.mark.parametrize("interpreter", [False, True], ids=["code", "interpreter"])
@pytest.mark.parametrize("name", sorted(SWAPPABLE))
def test_a_swapped_in_eager_module_gets_the_program_arguments_only(
    name: str, interpreter: bool
) -> None:
    make, inputs, sub = SWAPPABLE[name]
    m, eager = _lowered(name, interpreter), make()
    assert isinstance(getattr(m, sub), LoweredDispatcher)
    setattr(m, sub, copy.deepcopy(getattr(make(), sub)))
    seen = []
    getattr(m, sub).register_forward_hook(lambda mod, args, out: seen.append(len(args)))
    with torch.no_grad():
        for _ in range(2):  # stateful models must agree on every call, not just the first
            torch.testing.assert_close(m(*inputs()), eager(*inputs()))
    assert len(seen) >= 4  # two root calls, each calling the swapped module at least twice


@pytest.mark.parametrize("interpreter", [False, True], ids=["code", "interpreter"])
def test_a_swapped_in_lowered_dispatcher_still_runs_the_graph_its_caller_names(
    interpreter: bool,
) -> None:
    m, eager = _lowered("repeated_diff_flag", interpreter), CASES["repeated_diff_flag"].make()
    m.block = copy.deepcopy(m.block)  # a changed tree: the root runs module by module
    seen = []
    m.block.register_forward_hook(lambda mod, args, out: seen.append(1))
    x = randn(3, 4, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(m(x), eager(x))  # graph 0 alone would not negate
    assert seen == [1, 1]


def test_call_graph_passes_the_keyword_to_lowered_modules_only() -> None:
    received = []

    class Plain(nn.Module):
        def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
            received.append(sorted(kwargs))
            return args[0]

    x = randn(2, seed=1)
    assert call_graph(Plain(), 1, x, y=x) is x
    assert received == [["y"]]
    lowered = _lowered("repeated_diff_flag", False).block
    eager = CASES["repeated_diff_flag"].make().block
    x = randn(3, 4, seed=2)
    with torch.no_grad():
        torch.testing.assert_close(call_graph(lowered, 1, x), eager(x, negate=True))
        torch.testing.assert_close(call_graph(lowered, 0, x), eager(x))
    assert GRAPH_KEYWORD not in received[0]
