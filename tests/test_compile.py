"""``torch.compile`` of lowered modules: one compile per input shape class, no graph breaks.

The lowered root checks its inputs and settles its lazily built code eagerly, outside dynamo
(``LoweredRoot._forward_for_dynamo``); dynamo compiles the root graph's code, submodule calls
included, as one frame. Counts come from dynamo's own counters and a counting backend (backend
``eager``: no code generation, so the file stays fast).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters
from zoo import CASES, Case, fresh_export

from ir import import_ep
from lowering import lower
from transforms import transform


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _lowered(case: Case) -> tuple[Any, torch.export.ExportedProgram]:
    ep = fresh_export(case)
    return lower(transform(import_ep(ep))), ep


def _graph_breaks() -> int:
    return sum(counters["graph_break"].values())


def _close(a: Any, b: Any) -> bool:
    flat_a, flat_b = torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)
    return len(flat_a) == len(flat_b) and all(
        torch.allclose(x, y) if isinstance(x, torch.Tensor) else x == y
        for x, y in zip(flat_a, flat_b)
    )


# inputs of every structure, repeated calls with different graphs, mutations, control flow
COMPILED_CASES = (
    "mlp_nested", "kwargs", "nested_inputs", "pytree_outputs", "repeated_diff_flag",
    "buffer_mutation_repeated", "cond", "preserve_nested",
)


@pytest.mark.parametrize("name", COMPILED_CASES)
def test_compiles_once_without_graph_breaks(name: str) -> None:
    case = CASES[name]
    m, ep = _lowered(case)
    want = ep.module()
    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(m, backend=counter, fullgraph=True)
    for _ in range(3):
        got = compiled(*case.args(), **case.kwargs())
        assert _close(got, want(*case.args(), **case.kwargs()))
    assert counter.frame_count == 1  # compiled once: no recompile on later calls
    assert _graph_breaks() == 0
    assert _close(dict(m.state_dict()), dict(want.state_dict()))  # mutations applied alike


def test_not_more_graph_breaks_than_torch_unflatten() -> None:
    case = CASES["helper_method"]
    m, ep = _lowered(case)
    torch.compile(m, backend="eager")(*case.args())
    ours = _graph_breaks()
    torch._dynamo.reset()
    counters.clear()
    torch.compile(torch.export.unflatten(ep), backend="eager")(*case.args())
    assert ours == 0 < _graph_breaks()  # torch's unflatten breaks (and fails with fullgraph)


def test_dynamic_compiles_once_across_sizes() -> None:
    case = CASES["dynamic_batch"]
    m, ep = _lowered(case)
    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(m, backend=counter, dynamic=True, fullgraph=True)
    for batch in (3, 7, 5, 9):
        x = torch.randn(batch, 4)
        assert torch.allclose(compiled(x), ep.module()(x))
    assert counter.frame_count == 1


def test_input_checks_still_run_under_compile() -> None:
    case = CASES["mlp_nested"]
    m, _ = _lowered(case)
    compiled = torch.compile(m, backend="eager", fullgraph=True)
    compiled(*case.args())
    from ir.errors import InputConstraintError

    with pytest.raises(InputConstraintError, match=r"x.*shape\[1\]"):
        compiled(torch.randn(3, 5))


def test_compiling_a_submodule() -> None:
    case = CASES["mlp_nested"]
    m, _ = _lowered(case)
    x = case.args()[0]
    want = m(x)
    counter = CompileCounterWithBackend("eager")
    m.block = torch.compile(m.block, backend=counter, fullgraph=True)
    assert torch.allclose(m(x), want)
    assert torch.allclose(m(x), want)
    assert counter.frame_count == 1


def test_compiled_module_follows_hooks_and_swaps() -> None:
    """Hooks added after compiling are seen as dynamo sees them on any module: only with
    ``skip_nnmodule_hook_guards=False`` (torch's default skips those guards, for its unflatten
    too); hooks present when compiled and module swaps are always honoured."""
    case = CASES["mlp_nested"]
    m, _ = _lowered(case)
    x = case.args()[0]
    want = m(x)
    handle = m.head.register_forward_hook(lambda mod, args, out: out + 1)
    assert torch.allclose(torch.compile(m, backend="eager")(x), want + 1)
    handle.remove()
    torch._dynamo.reset()
    with torch._dynamo.config.patch(skip_nnmodule_hook_guards=False):
        compiled = torch.compile(m, backend="eager")
        assert torch.allclose(compiled(x), want)
        handle = m.block.proj.register_forward_hook(lambda mod, args, out: out * 0)
        assert torch.allclose(compiled(x), m.head.bias.expand_as(want))
        handle.remove()
        assert torch.allclose(compiled(x), want)
    head = m.head
    m.head = torch.nn.Identity()
    assert torch.allclose(compiled(x), m.block(x))
    m.head = head
    assert torch.allclose(compiled(x), want)


def test_inside_a_compiled_parent() -> None:
    """A lowered module inside a compiled model: right answers, no recompile, fewer graph breaks
    than torch's unflatten (dynamo breaks at the root's eager prologue, then compiles its code)."""
    case = CASES["mlp_nested"]
    m, ep = _lowered(case)
    x = case.args()[0]
    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(torch.nn.Sequential(m, torch.nn.ReLU()), backend=counter)
    for _ in range(3):
        assert torch.allclose(compiled(x), torch.relu(ep.module()(x)))
    ours, frames = _graph_breaks(), counter.frame_count
    torch._dynamo.reset()
    counters.clear()
    torch.compile(torch.nn.Sequential(torch.export.unflatten(ep), torch.nn.ReLU()), backend="eager")(x)
    assert ours <= _graph_breaks()
    assert frames <= 2  # the root's code, and the rest of the parent
